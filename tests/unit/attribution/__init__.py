"""Tests of stepscope.attribution."""
