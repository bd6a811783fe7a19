"""A training loop that blocks on a checkpoint every few steps, judged by a real exporter.

The loop is the SDK as a script uses it (no torch: the step body sleeps 50 ms, the
"save" sleeps 1 s every 5 steps), reporting over the exporter's Unix socket. With
``reporter.phase("checkpoint")`` around the save the verdict names the checkpoint; without
it, it still reads ``between_steps`` (issue 26: it read ``unknown``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import REPO, Exporter, start_exporter

LOOP = """
import sys, time
from stepscope.train import StepReporter
job, named = sys.argv[1], sys.argv[2] == "named"
rep = StepReporter(job, warmup_steps=1, cuda=False)
for i in range(100000):
    if i % 5 == 0 and i:
        if named:
            with rep.phase("checkpoint"):
                time.sleep(1.0)
        else:
            time.sleep(1.0)
    with rep.step(tokens=1024):
        time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, str]]:
    tmp = tmp_path_factory.mktemp("between")
    sock = f"unix://{tmp / 'ingest.sock'}"
    cfg = tmp / "stepscope.yaml"
    cfg.write_text(
        f"interval: 0.5\nslow_interval: 1\nsimulate: 1\ningest: {sock}\n"
        "diagnosis: {window: 8, min_steps: 3}\n"
    )
    exp = start_exporter(["--config", str(cfg)])
    yield exp, sock
    exp.stop()


def _verdict(exp: Exporter, job: str) -> dict[str, Any] | None:
    _, _, body = exp.get("/api/v1/diagnosis")
    for v in json.loads(body)["verdicts"]:
        if v["subject"]["job"] == job:
            return v  # type: ignore[no-any-return]
    return None


def _settled(exp: Exporter, sock: str, job: str, named: bool) -> tuple[dict[str, Any], str]:
    """Run the loop until its verdict covers a full window (4 saves); the verdict and
    the exporter's /metrics then."""
    return _settle(exp, sock, job, ["-c", LOOP, job, "named" if named else "plain"])


def _settle(exp: Exporter, sock: str, job: str, argv: list[str]) -> tuple[dict[str, Any], str]:
    """Run ``python ARGV`` until the job's verdict reads between_steps three times in a
    row over at least 25 steps; the verdict and the exporter's /metrics then."""
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=REPO, env={**os.environ, "STEPSCOPE_INGEST": sock, "PYTHONWARNINGS": "ignore"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60.0
        kinds: list[str] = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            v = _verdict(exp, job)
            # a window that spans 8 s holds at least 6 saves' worth of steps
            if v is not None and (v["signals"].get("steps") or 0) >= 25:
                kinds.append(v["kind"])
                if kinds[-3:] == ["between_steps"] * 3:
                    _, _, metrics = exp.get("/metrics")
                    return v, metrics.decode()
            time.sleep(0.5)
        raise AssertionError(f"never settled on between_steps: {kinds}, {_verdict(exp, job)}")
    finally:
        proc.kill()
        proc.wait()


def test_a_save_named_with_phase_reads_between_steps_checkpoint(
    exporter: tuple[Exporter, str],
) -> None:
    exp, sock = exporter
    v, metrics = _settled(exp, sock, "ckpt-named", named=True)
    assert v["modifiers"] == ["checkpoint"] and "async_save" in v["advice"]
    # 1 s of every 1.25 s: 80%, less the loop's own overhead
    assert 0.7 <= v["signals"]["between_steps_share"] <= 0.85
    assert any(e.startswith("checkpoint: ") for e in v["evidence"]), v["evidence"]
    line = next(x for x in metrics.splitlines()
                if x.startswith("stepscope_job_span_seconds_total{")
                and 'training_job="ckpt-named"' in x and 'span="checkpoint"' in x)  # fmt: skip
    assert float(line.rsplit(" ", 1)[1]) >= 4.0  # at least 4 saves of 1 s, counted


def test_an_unnamed_blocking_save_reads_between_steps_not_unknown(
    exporter: tuple[Exporter, str],
) -> None:
    exp, sock = exporter
    v, metrics = _settled(exp, sock, "ckpt-plain", named=False)
    assert v["modifiers"] == [] and v["advice"] != "Not enough data to tell; see the evidence."
    assert any("in no named span" in e for e in v["evidence"]), v["evidence"]
    assert 'training_job="ckpt-plain"' not in "".join(
        x for x in metrics.splitlines() if x.startswith("stepscope_job_span_seconds_total")
    )


def test_unnamed_evaluation_between_steps_reads_between_steps_not_compute(
    exporter: tuple[Exporter, str],
) -> None:
    """Issue 34: a real torch loop that evaluates every 4 steps without naming it. Its
    step bodies take more of the wall time than the evaluation (~57% to ~43%), which read
    `compute` ("the GPU is the limit"); the time between steps is the largest loss."""
    exp, sock = exporter
    pytest.importorskip("torch")
    argv = ["-m", "tests.support.workloads", "evaluate", "--job", "eval-plain",
            "--seconds", "60"]  # fmt: skip
    v, _ = _settle(exp, sock, "eval-plain", argv)
    s = v["signals"]
    assert v["modifiers"] == [] and "GPU is the limit" not in v["advice"], v
    assert s["between_steps_share"] >= 0.3 and s["between_steps_intervals"] >= 2, s
    # the body is the larger share: the policy, not the old "most of the step", decides
    assert s["compute_share"] > s["between_steps_share"], s
    assert any("in no named span" in e for e in v["evidence"]), v["evidence"]
