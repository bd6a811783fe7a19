"""The ingest socket of a running exporter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.exporter import refused_start
from tests.support.ingest import NOBODY


def test_the_exporter_refuses_an_attacker_owned_directory(base: Path) -> None:
    """Configured explicitly, the refused socket stops the start in one line (issue 36:
    a configured feature that cannot start is an error, not a warning)."""
    if os.geteuid() != 0:
        pytest.skip("making a directory another uid owns needs root")
    theirs = base / "stepscope"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    code, stderr = refused_start(["--simulate", "1", "--ingest", f"unix://{theirs}/s.sock"])
    assert code == 2
    assert stderr.count("\n") == 1 and "belongs to uid 65534" in stderr, stderr
    assert not (theirs / "s.sock").exists()
