"""ruff and mypy are part of the suite: the style guide says both stay clean.

mypy reads torch's and transformers' types (the training integrations use them): ~35 s
of one core with nothing cached, as in CI. Its result does not depend on when it runs,
so in a run that holds the scale-out tier's wait it starts then, in the background
(tests/e2e/conftest.py calls :func:`start_early`: that wait leaves most of 2 cores idle),
and test_clean[mypy] reads what it printed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

LINTS = {
    "ruff": ["ruff", "check", "exporter", "tests", "benchmarks", "validation", "generate"],
    "mypy": ["mypy"],
    # Grafana's SDK types need 3.11 (pyproject.toml's [tool.mypy] says why)
    "mypy-dashboards": ["mypy", "--python-version", "3.11", "generate/dashboards.py"],
}
EARLY = "mypy"  # the one worth starting early


def command(cmd: list[str]) -> list[str]:
    exe = shutil.which(cmd[0]) or shutil.which(cmd[0], path=str(REPO / ".venv" / "bin"))
    # without the executable on PATH, run the module from this interpreter
    return [sys.executable, "-m", *cmd] if exe is None else [exe, *cmd[1:]]


@dataclass
class Started:
    """A lint started early: its process and the file its output goes to."""

    proc: subprocess.Popen[bytes]
    output: Path


_STARTED: dict[str, Started] = {}


def start_early(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start :data:`EARLY` now, in the background, for its test to read."""
    output = tmp_path_factory.mktemp("lint") / f"{EARLY}.out"
    with output.open("wb") as out:
        proc = subprocess.Popen(command(LINTS[EARLY]), cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    _STARTED[EARLY] = Started(proc, output)


def wait_early(timeout: float = 300) -> None:
    """Wait for the lint started early to end (its test reads it later)."""
    for started in _STARTED.values():
        started.proc.wait(timeout=timeout)


def stop_early() -> None:
    """Stop a lint started early whose test never read it (the run ended before)."""
    while _STARTED:
        _, started = _STARTED.popitem()
        if started.proc.poll() is None:
            started.proc.kill()
        started.proc.wait()


@pytest.mark.parametrize("name", list(LINTS))
def test_clean(name: str) -> None:
    started = _STARTED.pop(name, None)
    if started is None:
        result = subprocess.run(command(LINTS[name]), cwd=REPO, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        returncode, output = result.returncode, result.stdout + result.stderr
    else:
        returncode = started.proc.wait(timeout=300)
        output = started.output.read_text(errors="replace")
    assert returncode == 0, output
