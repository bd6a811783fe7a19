"""stepscope's tests; shared helpers are in tests.support."""
