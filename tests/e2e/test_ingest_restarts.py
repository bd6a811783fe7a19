"""A job restarted under the same name, as it happens on a cluster: real SDK processes
report to a real ``stepscope serve``. The restarted rank is served from its first step
(not refused for five minutes); a live owner keeps its rank and the newcomer's log says
why, once; the exporter's log names the refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO, Exporter, start_exporter, wait_for
from tests.support.ingest import scrape, value

# One rank of `job`: `steps` steps of 20 ms, then (hold) wait for stdin to close, or stay
# half a second so the sender thread can read an answer; prints what the exporter said.
RANK = """
import logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from stepscope.train import StepReporter
job, ingest, steps, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
rep = StepReporter(job, ingest=ingest, rank=0, local_rank=0, world_size=1, cuda=False,
                   warmup_steps=0)
for _ in range(steps):
    with rep.step(tokens=10):
        time.sleep(0.02)
if hold:
    print("holding", flush=True)
    sys.stdin.read()
else:
    time.sleep(0.5)
rep.close()
print("refusal", rep.refusal.reason if rep.refusal else None, flush=True)
"""


def rank(ingest: str, job: str, steps: int, hold: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return subprocess.Popen(
        [sys.executable, "-c", RANK, job, ingest, str(steps), "hold" if hold else "go"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip


def finished(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out, err


def serve(base: Path, exporters: list[Exporter]) -> tuple[Exporter, str]:
    ingest = f"unix://{base}/ingest.sock"
    exp = start_exporter(["--simulate", "1", "--ingest", ingest, "--interval", "0.2"])
    exporters.append(exp)
    return exp, ingest


def test_a_rank_restarted_after_a_crash_is_served_from_its_first_step(
    base: Path, exporters: list[Exporter]
) -> None:
    exp, ingest = serve(base, exporters)
    first = rank(ingest, "restarted", 5)
    out, _ = finished(first)
    assert out.strip() == "refusal None"
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="restarted") == 5)

    started = time.monotonic()
    second = rank(ingest, "restarted", 3)
    fams = wait_for(
        lambda: (f := scrape(exp))
        and value(f, "stepscope_training_restarts_total", training_job="restarted") == 1
        and f,
        timeout=10,
    )
    took = time.monotonic() - started
    out, err = finished(second)
    assert out.strip() == "refusal None" and "refuses" not in err
    assert value(fams, "stepscope_ingest_rejected_total", reason="not_owner") == 0
    # the rank is the new process's, its counters from its own first step
    (info,) = [lbl for lbl, _ in fams["stepscope_training_rank_info"]
               if lbl["training_job"] == "restarted"]
    assert info["pid"] == str(second.pid)
    assert took < 10  # the series showed at the exporter's next passes, not after expiry


def test_a_live_owner_keeps_its_rank_and_the_newcomer_is_told_why_once(
    base: Path, exporters: list[Exporter]
) -> None:
    exp, ingest = serve(base, exporters)
    owner = rank(ingest, "held", 5, hold=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "holding"
        intruder = rank(ingest, "held", 20)
        out, err = finished(intruder)
        assert out.strip() == "refusal not_owner"
        told = [line for line in err.splitlines() if "refuses" in line]
        assert told == [
            "stepscope: the exporter refuses rank 0 of job 'held': not_owner (this job or rank "
            "is held by another process (a live one of the same user, or another user's); a "
            "restarted rank takes over once the old process has exited); steps of this "
            "reason are dropped by the exporter"
        ]
        fams = scrape(exp)
        assert value(fams, "stepscope_ingest_rejected_total", reason="not_owner") == 20
        assert value(fams, "stepscope_training_restarts_total", training_job="held") == 0
        logged = [line for line in exp.stderr_lines if "ingest: refused" in line]
        assert len(logged) == 1 and (
            f"rank 0 of job 'held' from uid {os.getuid()} pid {intruder.pid}: not_owner"
        ) in logged[0]
    finally:
        out, err = owner.communicate(input="", timeout=60)  # its stdin closes: it exits
    assert owner.returncode == 0 and out.strip() == "refusal None", err
    # the owner has exited: the next process takes the rank over
    finished(rank(ingest, "held", 2))
    wait_for(lambda: value(scrape(exp), "stepscope_training_restarts_total",
                           training_job="held") == 1)
