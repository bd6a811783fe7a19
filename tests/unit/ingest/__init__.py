"""Tests of stepscope.ingest."""
