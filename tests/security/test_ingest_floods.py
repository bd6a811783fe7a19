"""What a neighbour's flood and a reused pid cost the ingest (docs/security.md).

- 150,000 refused datagrams from ``nobody`` for another user's job, with a new rank and
  job name in each, used to write 134,496 log lines in about 5 s: the limit was per key
  and the sender chose the keys. Now the lines are bounded by the reason's budget while
  ``stepscope_ingest_rejected_total`` counts every datagram (30,000 here to keep the suite
  short; benchmarks/bench_ingest_flood.py sends the 150,000).
- A squatter placed on a dead owner's pid (same pid, another uid) used to block the real
  user's takeover until it exited: "the owner has exited" read neither the process's
  start time nor its uid.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import Exporter, wait_for
from tests.support.attacker import (
    NOBODY,
    REFUSED_FLOOD,
    SECOND_UID,
    as_uid_command,
    attacker_env,
    needs_setpriv,
    run_as,
    serve_0666,
)
from tests.support.ingest import scrape, step, value

# a rank of SECOND_UID: reports one step of rank 0 of job "resumed" (argv: ingest path,
# step), then lives until its stdin closes; the same user's next process takes it over
REPORT_ONCE = """
import json, os, socket, sys, time
d = {"v": 1, "type": "step", "job": "resumed", "rank": 0, "local_rank": 0,
     "pid": os.getpid(), "step": int(sys.argv[2]), "t": time.time(), "dur": 0.5}
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(json.dumps(d).encode(), sys.argv[1])
print(os.getpid(), flush=True)
sys.stdin.read()
"""

SQUAT = "import sys; print('up', flush=True); sys.stdin.read()"


def rejected_total(exp: Exporter) -> float:
    return sum(v for _, v in scrape(exp).get("stepscope_ingest_rejected_total", []))


def test_a_flood_of_refused_datagrams_writes_a_bounded_number_of_lines(box: Path) -> None:
    needs_setpriv()
    exp = serve_0666(box)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(json.dumps(step("held", 0, 0, time.time(), None)).encode(),
                        str(box / "ingest.sock"))  # fmt: skip
        wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="held") == 1)
        before = len(exp.stderr_lines)
        flood = run_as(NOBODY, REFUSED_FLOOD, str(box / "ingest.sock"), "30000", timeout=300)
        sent = json.loads(flood.stdout)["sent"]
        # every refused datagram is counted, whatever the log says
        accepted = lambda: value(scrape(exp), "stepscope_ingest_datagrams_total") or 0.0  # noqa: E731
        # wait until the exporter has counted what it received (the count holds still)
        seen: list[float] = []

        def settled() -> bool:
            seen.append(rejected_total(exp) + accepted())
            return len(seen) > 20 and seen[-1] == seen[-21] and seen[-1] > 0

        wait_for(settled, timeout=90, interval=0.1)
        counted = seen[-1] - 1  # root's own step
        lines = exp.stderr_lines[before:]
    finally:
        exp.stop()
    assert sent == 30_000
    assert counted == sent  # every datagram counted, whatever the log says
    refused = [line for line in lines if "ingest: refused" in line]
    # a handful of reasons (not_owner, cap_uid, cap_jobs, cap_ranks), each a burst of 5
    assert 1 <= len(refused) <= 25, "".join(refused)
    assert len(lines) <= 40, "".join(lines)


def pid_for_next_fork(pid: int) -> None:
    """Make ``pid`` the next pid the kernel hands out (root: ``ns_last_pid``)."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))


def test_a_squatter_on_a_dead_owners_pid_does_not_block_the_owners_restart(box: Path) -> None:
    needs_setpriv()
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("placing a process on a chosen pid needs a writable ns_last_pid")
    exp = serve_0666(box)
    ingest = str(box / "ingest.sock")
    squatter = None
    try:
        rank = subprocess.Popen(
            as_uid_command(SECOND_UID, REPORT_ONCE, ingest, "1"), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=attacker_env(),
        )  # fmt: skip
        assert rank.stdout is not None
        owner = int(rank.stdout.readline())
        wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="resumed") == 1)
        rank.communicate("")  # the rank's process exits (a crash, a preemption)
        # nobody's process on the dead owner's pid (a few tries: other forks race us)
        for _ in range(50):
            pid_for_next_fork(owner)
            squatter = subprocess.Popen(
                as_uid_command(NOBODY, SQUAT), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, env=attacker_env(),
            )  # fmt: skip
            if squatter.pid == owner:
                break
            squatter.kill()
            squatter.wait()
            squatter = None
        if squatter is None:
            pytest.skip("could not place a process on the owner's pid")
        assert squatter.stdout is not None and squatter.stdout.readline() == "up\n"
        assert os.stat(f"/proc/{owner}").st_uid == NOBODY  # the squatter holds the pid
        # the owner's user restarts the rank: its new process takes it over
        subprocess.run(as_uid_command(SECOND_UID, REPORT_ONCE, ingest, "2"), input="",
                       env=attacker_env(), check=True, capture_output=True, text=True)  # fmt: skip
        restarts = lambda: value(  # noqa: E731
            scrape(exp), "stepscope_training_restarts_total", training_job="resumed"
        )
        wait_for(lambda: restarts() == 1, timeout=20)
        fams = scrape(exp)
        assert value(fams, "stepscope_ingest_rejected_total", reason="not_owner") == 0
    finally:
        if squatter is not None:
            squatter.kill()
            squatter.wait()
        exp.stop()
