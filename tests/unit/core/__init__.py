"""Tests of stepscope.core."""
