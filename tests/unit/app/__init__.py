"""Tests of stepscope.app: the command, its configuration, the wiring."""
