"""Tests of stepscope.aws."""
