"""The real tools the tests use, found on PATH (skipped without them unless CI asks)."""

from __future__ import annotations

import os
import shutil


def require_tool(name: str, package: str, required_by: str) -> str:
    """Path of the command ``name``; without it the test skips, or fails when the
    environment variable ``required_by`` is set (CI sets it: a missing install step
    must not pass as a skip)."""
    path = shutil.which(name)
    if path is None:
        import pytest  # here: scripts import tests.support where pytest may be absent

        if os.environ.get(required_by):
            pytest.fail(f"{name} is required ({required_by} is set; Debian package {package})")
        pytest.skip(f"{name} not installed (Debian package {package})")
    return path


def promtool() -> str:
    """Path of promtool (Debian package prometheus)."""
    return require_tool("promtool", "prometheus", "STEPSCOPE_REQUIRE_PROMTOOL")


def prometheus_binary() -> str:
    """Path of the Prometheus server (Debian package prometheus)."""
    return require_tool("prometheus", "prometheus", "STEPSCOPE_REQUIRE_PROMTOOL")



def image_tools() -> None:
    """buildah and mmdebstrap: the image test builds with the first on a base made with
    the second (Debian packages of the same names)."""
    for tool in ("buildah", "mmdebstrap"):
        require_tool(tool, tool, "STEPSCOPE_REQUIRE_BUILDAH")
