"""What the attacks share: a directory every uid can reach, removed afterwards."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.attacker import shared_dir


@pytest.fixture
def box() -> Iterator[Path]:
    """A fresh directory under /tmp that other users can reach (pytest's are 0700)."""
    path = shared_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
