"""Tests of stepscope.host and stepscope.net."""
