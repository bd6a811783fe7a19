"""Tests of stepscope.shared."""
