"""Coverage-guided fuzzing (atheris, libFuzzer) of what a neighbour or an operator hands
us as bytes: the ingest's datagram parser (and the SDK's refusal parser), the web config
parser, and both exposition writers (label values a sender chose, any float).

Each target runs for a bounded time (:data:`SECONDS`) from the seeds kept in
``tests/security/corpus/<target>/`` (what earlier runs found, regressions included; the
web config target also starts from exporter-toolkit's test data). A target stops at the
first exception or broken invariant; its input is written under the target's tmp dir and
its base64 printed in the failure: add it to the corpus once fixed.

The three targets run side by side (one libFuzzer process each, started together): each
still fuzzes for :data:`SECONDS`, and the suite waits ~20 s for the three instead of ~60 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.attacker import attacker_env

SECONDS = 20  # per target, the three side by side: 60 s of fuzzing (the issue asks 60 s in CI)
CORPUS = REPO / "tests" / "security" / "corpus"
EXTRA_SEEDS = {"webconfig": [REPO / "tests" / "fixtures" / "exporter-toolkit"]}
TARGETS = ["datagram", "webconfig", "exposition"]


@dataclass
class Run:
    """One target's libFuzzer run: its exit status and stderr, and its tmp dir (crashes
    are written there as ``crash-*``, new inputs under ``found/``)."""

    returncode: int
    stderr: str
    tmp: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Every target, started together and run to its end."""
    pytest.importorskip("atheris")
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for target in TARGETS:
            tmp = tmp_path_factory.mktemp(f"fuzz-{target}")
            found = tmp / "found"  # new inputs go here, never into the repository
            found.mkdir()
            seeds = [CORPUS / target, *EXTRA_SEEDS.get(target, [])]
            with (tmp / "stderr").open("wb") as log:  # a file: no pipe to fill while waiting
                proc = subprocess.Popen(
                    [sys.executable, "-m", f"tests.security.fuzz.{target}",
                     f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
                     "-print_final_stats=1", f"-artifact_prefix={tmp}/", str(found),
                     *map(str, seeds)],
                    stdout=subprocess.DEVNULL, stderr=log, env=attacker_env(),
                )  # fmt: skip
            procs[target] = (proc, tmp)
        out = {}
        for target, (proc, tmp) in procs.items():
            proc.wait(timeout=SECONDS * 4 + 30)
            stderr = (tmp / "stderr").read_text(errors="replace")
            out[target] = Run(proc.returncode, stderr, tmp)
        yield out
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(SECONDS * 4 + 60)
@pytest.mark.parametrize("target", TARGETS)
def test_the_fuzz_target_finds_nothing(target: str, runs: dict[str, Run]) -> None:
    done = runs[target]
    crashes = sorted(p.name for p in done.tmp.glob("crash-*"))
    assert done.returncode == 0 and not crashes, done.stderr[-4000:]
    stats = done.stderr.splitlines()
    units = [line for line in stats if line.startswith("stat::number_of_executed_units")]
    # it fuzzed, not only replayed its seeds: at least as many mutated inputs as seeds (a
    # count, not a rate: the web config target ran 611 inputs in 20 s on a 2-core
    # machine, where a floor of 1,000 failed it)
    seeds = sum(1 for d in (CORPUS / target, *EXTRA_SEEDS.get(target, []))
                for p in d.rglob("*") if p.is_file())  # fmt: skip
    assert units and int(units[0].split(":")[-1]) >= 2 * seeds, done.stderr[-2000:]
    shutil.rmtree(done.tmp / "found")
