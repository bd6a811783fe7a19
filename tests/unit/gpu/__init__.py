"""Tests of stepscope.gpu."""
