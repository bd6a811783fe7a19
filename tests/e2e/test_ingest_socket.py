"""The ingest socket of a running exporter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import Exporter, parse_samples, start_exporter
from tests.support.ingest import NOBODY, value


def test_the_exporter_refuses_an_attacker_owned_directory_and_keeps_serving(
    base: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another uid owns needs root")
    theirs = base / "stepscope"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    exp: Exporter = start_exporter(["--simulate", "1", "--ingest", f"unix://{theirs}/s.sock"])
    try:
        fams = parse_samples(exp.metrics())
        assert value(fams, "stepscope_ingest_up") == 0
        assert value(fams, "DCGM_FI_DEV_GPU_UTIL", gpu="0") is not None
        assert any("belongs to uid 65534" in ln for ln in exp.stderr_lines)
        assert exp.stop() == 0
    finally:
        if exp.proc.poll() is None:
            exp.proc.kill()
