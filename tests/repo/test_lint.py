"""ruff and mypy are part of the suite: the style guide says both stay clean."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import REPO


@pytest.mark.parametrize(
    "cmd",
    [
        ["ruff", "check", "exporter", "tests", "benchmarks", "validation", "generate"],
        ["mypy"],
        # Grafana's SDK types need 3.11 (pyproject.toml's [tool.mypy] says why)
        ["mypy", "--python-version", "3.11", "generate/dashboards.py"],
    ],
    ids=["ruff", "mypy", "mypy-dashboards"],
)
def test_clean(cmd: list[str]) -> None:
    exe = shutil.which(cmd[0]) or shutil.which(cmd[0], path=str(REPO / ".venv" / "bin"))
    # without the executable on PATH, run the module from this interpreter
    full = [sys.executable, "-m", *cmd] if exe is None else [exe, *cmd[1:]]
    result = subprocess.run(full, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
