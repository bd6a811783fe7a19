"""Fixtures of the SDK's tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A directory for Unix sockets: their paths are limited to 108 bytes, and pytest's
    tmp_path can be longer."""
    path = tempfile.mkdtemp(prefix="ss-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
