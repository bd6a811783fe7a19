"""The real tools the tests use, found on PATH (skipped without them unless CI asks)."""

from __future__ import annotations

import os
import shutil


def promtool() -> str:
    """Path of promtool; skips the test without it unless CI demands it."""
    import pytest  # here, not above: scripts import tests.support where pytest may be absent

    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("STEPSCOPE_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is required (STEPSCOPE_REQUIRE_PROMTOOL is set)")
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path
