"""Tests of stepscope.train (the SDK)."""
