"""Tests of stepscope.diagnose."""
