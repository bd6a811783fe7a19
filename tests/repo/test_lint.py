"""ruff and mypy are part of the suite: the style guide says both stay clean.

mypy reads torch's and transformers' types (the training integrations use them): ~35 s
of one core with nothing cached, as in CI. Its result does not depend on when it runs,
so in a run that holds the scale-out tier's wait it is queued on the background lane then
(:func:`queue_early`, tests/support/background.py), and test_clean[mypy] reads what it
printed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import REPO, background
from tests.support.background import Lane

LINTS = {
    "ruff": ["ruff", "check", "exporter", "tests", "benchmarks", "validation", "generate"],
    "mypy": ["mypy"],
    # Grafana's SDK types need 3.11 (pyproject.toml's [tool.mypy] says why)
    "mypy-dashboards": ["mypy", "--python-version", "3.11", "generate/dashboards.py"],
}
EARLY = "mypy"  # the one worth running early


def command(cmd: list[str]) -> list[str]:
    exe = shutil.which(cmd[0]) or shutil.which(cmd[0], path=str(REPO / ".venv" / "bin"))
    # without the executable on PATH, run the module from this interpreter
    return [sys.executable, "-m", *cmd] if exe is None else [exe, *cmd[1:]]


def queue_early(lane: Lane) -> None:
    """Queue :data:`EARLY` on the background lane, for its test to read."""
    lane.add(f"lint {EARLY}", command(LINTS[EARLY]), REPO)


@pytest.mark.parametrize("name", list(LINTS))
def test_clean(name: str) -> None:
    done = background.result(f"lint {name}")
    if done is None:
        result = subprocess.run(command(LINTS[name]), cwd=REPO, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        returncode, output = result.returncode, result.stdout + result.stderr
    else:
        returncode, output = done.returncode, done.output
    assert returncode == 0, output
