"""Goodput and badput of real SDK loops, booked by a real exporter.

Each loop is the SDK as a script uses it (no torch: sleeps stand in for the loader, the
step body, checkpoint saves and evaluation), reporting over the exporter's Unix socket,
and measures its own time in each part with its own clock. Once its process has exited,
the exporter's books for the job must add up to the time the loop held its GPU (from its
process's start to its exit) within 1%, and each cause must be what the loop measured.
A restarted loop that resumes from an earlier step books the steps it redoes as
``wasted_progress_from_disruption``. A final save after the last step is booked as a
checkpoint, whether the loop closes its reporter or leaves it to the interpreter's exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stepscope.diagnose.goodput import END_GRACE
from tests.support import REPO, Exporter, parse_samples, start_exporter

LOOP = """
import json, sys, time
from stepscope.train import StepReporter
job, steps, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mine = dict(data=0.0, compute=0.0, checkpoint=0.0, evaluation=0.0)
clock = time.monotonic

def loader():
    while True:
        t = clock(); time.sleep(0.02); mine["data"] += clock() - t
        yield 0

time.sleep(0.5)  # loading the model and the checkpoint: before the first step
rep = StepReporter(job, warmup_steps=2, cuda=False, start_step=start)
t0 = clock()
batches = rep.timed(loader())
for i in range(start, start + steps):
    next(batches)
    with rep.step(tokens=1024):
        t = clock(); time.sleep(0.05); mine["compute"] += clock() - t
    if i % 10 == 9:
        with rep.phase("checkpoint"):
            t = clock(); time.sleep(0.3); mine["checkpoint"] += clock() - t
    if i % 20 == 19:
        with rep.phase("evaluation"):
            t = clock(); time.sleep(0.2); mine["evaluation"] += clock() - t
next(batches)  # the batch the next step would have used: its wait ends with no step
with rep.step(tokens=1024):
    time.sleep(0.05)
rep.close()
print(json.dumps(dict(mine, t0=t0)), flush=True)
"""


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, str]]:
    tmp = tmp_path_factory.mktemp("goodput")
    sock = f"unix://{tmp / 'ingest.sock'}"
    cfg = tmp / "stepscope.yaml"
    cfg.write_text(f"interval: 0.1\nslow_interval: 1\nsimulate: 1\ningest: {sock}\n")
    exp = start_exporter(["--config", str(cfg)])
    yield exp, sock
    exp.stop()


FINAL_SAVE = """
import json, sys, time
from stepscope.train import StepReporter
job, close = sys.argv[1], sys.argv[2] == "close"
rep = StepReporter(job, warmup_steps=2, cuda=False)
for i in range(20):
    with rep.step(tokens=1024):
        time.sleep(0.03)
t = time.monotonic()
with rep.phase("checkpoint"):  # the final save, after the last step
    time.sleep(1.0)
saved = time.monotonic() - t
if close:
    rep.close()
print(json.dumps(dict(checkpoint=saved, t0=time.monotonic())), flush=True)
"""


def _run(sock: str, job: str, steps: int = 0, start: int = 0,
         script: str = LOOP, *args: str) -> dict[str, float]:  # fmt: skip
    """The loop, to its end: what it measured of itself, ``held``: from its process's
    launch to its exit, and ``before_loop``: from the launch to its first step (its
    imports; time.monotonic is one clock for every process here)."""
    launch = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", script, job, *(args or (str(steps), str(start)))],
        cwd=REPO, env={**os.environ, "STEPSCOPE_INGEST": sock},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    mine: dict[str, float] = json.loads(out.stdout)
    mine["held"] = time.monotonic() - launch
    mine["before_loop"] = mine["t0"] - launch
    return mine


def _books(exp: Exporter, job: str) -> dict[str, float]:
    """The job's goodput (key ``goodput``) and badput by type, from /metrics."""
    _, _, body = exp.get("/metrics")
    books: dict[str, float] = {}
    samples = parse_samples(body.decode())
    for labels, value in samples.get("stepscope_job_goodput_gpu_seconds_total", []):
        if labels.get("training_job") == job:
            books["goodput"] = value
    for labels, value in samples.get("stepscope_job_badput_gpu_seconds_total", []):
        if labels.get("training_job") == job:
            books[labels["badput_type"]] = value
    return books


def _settled(exp: Exporter, job: str) -> dict[str, float]:
    """The books once the job's end is booked: its rank reads ``finished``, and the
    ledger closes a finished rank a grace period later (late datagrams)."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        _, _, body = exp.get("/api/v1/diagnosis")
        kinds = {v["kind"] for v in json.loads(body)["verdicts"] if v["subject"]["job"] == job}
        if kinds == {"finished"}:
            time.sleep(END_GRACE + 0.5)
            return _books(exp, job)
        time.sleep(0.1)
    raise AssertionError(f"the job never read finished: {kinds}")


def test_a_jobs_books_add_up_to_the_time_it_held_its_gpu_within_one_percent(
    exporter: tuple[Exporter, str],
) -> None:
    exp, sock = exporter
    mine = _run(sock, "goodput-sum", steps=120)
    books = _settled(exp, "goodput-sum")
    total = sum(books.values())
    assert total == pytest.approx(mine["held"], rel=0.01), f"{books} {mine}"
    # each cause is what the loop measured of itself (the loop's own overhead, ~1 ms a
    # step, lands in "other" and "compute")
    assert books["unproductive_checkpoint_save_time"] == pytest.approx(
        mine["checkpoint"], rel=0.05)
    assert books["evaluation"] == pytest.approx(mine["evaluation"], rel=0.05)
    # the process's start-up before its first step (the interpreter, its imports) and
    # two warm-up steps (their loader waits included) are program startup
    assert books["program_startup"] == pytest.approx(mine["before_loop"] + 0.15, abs=0.1)
    assert mine["before_loop"] >= 0.5  # the loop's "model loading"
    measured = 120 - 2 + 1
    assert books["data_loading_sync"] == pytest.approx(0.02 * measured, rel=0.25)
    assert books["goodput"] == pytest.approx(0.05 * measured, rel=0.25)
    # from the last step's end to the exit seen (a pass is 0.1 s)
    assert books["idle"] < 0.3
    assert books["wasted_progress_from_disruption"] == 0.0  # served, at zero
    # /api/v1/diagnosis says the same, with what is pending and the ratio
    _, _, body = exp.get("/api/v1/diagnosis")
    (doc,) = [j for j in json.loads(body)["goodput"] if j["job"] == "goodput-sum"]
    assert doc["live_ranks"] == 0 and doc["pending_gpu_seconds"] == 0.0
    assert doc["held_gpu_seconds"] == pytest.approx(total, abs=1e-3)
    assert doc["goodput_ratio"] == pytest.approx(books["goodput"] / total, abs=1e-4)
    assert doc["badput_gpu_seconds"]["idle"] == pytest.approx(books["idle"], abs=1e-5)


def test_a_restart_that_resumes_from_an_earlier_step_books_the_redone_steps(
    exporter: tuple[Exporter, str],
) -> None:
    exp, sock = exporter
    first = _run(sock, "goodput-restart", steps=40)  # steps 0..40, then it "crashes"
    _settled(exp, "goodput-restart")
    # resumed from the checkpoint of step 19: steps 20..40 are done again
    second = _run(sock, "goodput-restart", steps=40, start=20)
    books = _settled(exp, "goodput-restart")
    # the new process's steps 22..40 (its two warm-up steps are startup): 19 steps of
    # ~0.075 s, with the checkpoints after steps 29 and 39 and the evaluation after 39
    wasted = books["wasted_progress_from_disruption"]
    assert 19 * 0.07 + 0.8 <= wasted <= 19 * 0.08 + 0.8 + 0.1, books
    total = sum(books.values())
    held = first["held"] + second["held"]
    assert total == pytest.approx(held, rel=0.01), f"{books} {first} {second}"
    _, _, body = exp.get("/metrics")
    restarts = [v for lbl, v in parse_samples(body.decode())["stepscope_training_restarts_total"]
                if lbl.get("training_job") == "goodput-restart"]  # fmt: skip
    assert restarts == [1.0]


@pytest.mark.parametrize("end", ["close", "exit"])
def test_a_final_save_after_the_last_step_is_booked_as_checkpoint_not_idle(
    exporter: tuple[Exporter, str], end: str
) -> None:
    exp, sock = exporter
    job = f"goodput-final-{end}"
    mine = _run(sock, job, 0, 0, FINAL_SAVE, job, end)
    books = _settled(exp, job)
    assert books["unproductive_checkpoint_save_time"] == pytest.approx(
        mine["checkpoint"], rel=0.05), books
    # from the save's end to the exit seen (a pass is 0.1 s): not the save
    assert books["idle"] < 0.3, books
    # a 2 s run: its launch and teardown are a larger share than in the runs above
    assert sum(books.values()) == pytest.approx(mine["held"], abs=0.1), f"{books} {mine}"
