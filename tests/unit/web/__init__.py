"""Tests of stepscope.web."""
