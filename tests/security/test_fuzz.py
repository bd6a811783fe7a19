"""Coverage-guided fuzzing (atheris, libFuzzer) of what a neighbour or an operator hands
us as bytes: the ingest's datagram parser (and the SDK's refusal parser), the web config
parser, and both exposition writers (label values a sender chose, any float).

Each target runs for a bounded time (:data:`SECONDS`) from the seeds kept in
``tests/security/corpus/<target>/`` (what earlier runs found, regressions included; the
web config target also starts from exporter-toolkit's test data). A target stops at the
first exception or broken invariant; its input is written under the test's tmp dir and
its base64 printed in the failure: add it to the corpus once fixed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.attacker import attacker_env

SECONDS = 20  # per target: 60 s of the suite for the three (the issue asks 60 s in CI)
CORPUS = REPO / "tests" / "security" / "corpus"
EXTRA_SEEDS = {"webconfig": [REPO / "tests" / "fixtures" / "exporter-toolkit"]}


@pytest.mark.timeout(SECONDS * 4 + 60)
@pytest.mark.parametrize("target", ["datagram", "webconfig", "exposition"])
def test_the_fuzz_target_finds_nothing(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    found = tmp_path / "found"  # new inputs go here, never into the repository
    found.mkdir()
    seeds = [CORPUS / target, *EXTRA_SEEDS.get(target, [])]
    done = subprocess.run(
        [sys.executable, "-m", f"tests.security.fuzz.{target}", f"-max_total_time={SECONDS}",
         "-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1",
         f"-artifact_prefix={tmp_path}/", str(found), *map(str, seeds)],
        capture_output=True, text=True, env=attacker_env(), timeout=SECONDS * 4 + 30,
        check=False,
    )  # fmt: skip
    crashes = sorted(p.name for p in tmp_path.glob("crash-*"))
    assert done.returncode == 0 and not crashes, done.stderr[-4000:]
    stats = done.stderr.splitlines()
    runs = [line for line in stats if line.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, done.stderr[-2000:]
    shutil.rmtree(found)
