"""Checks of the repository as a whole: layering, lint and types, the docs against the code."""
