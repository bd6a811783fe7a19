"""Issue 33 item 2, as an attacker: a sender's clock does not set the bill.

On main before the fix, as `nobody` on a 0666 Unix ingest, three steps with ``t`` = 1.0
put 57 years of GPU-seconds in a job's books after 17 s, and 200 steps with ``dur`` of a
day 13.8 M GPU-seconds in 4 s; each takeover started a fresh book. Here the same steps,
sent twice by two processes of `nobody` in turn (the second takes the rank over), leave
the books within the wall time observed, and the clamped counter says why.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support import Exporter, wait_for
from tests.support.attacker import NOBODY, needs_setpriv, run_as, serve_0666
from tests.support.ingest import scrape, value

ATTACK = """
import json, os, socket, sys
ingest = sys.argv[1]
pid = os.getpid()
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    def send(i, t, dur):
        d = {"v": 1, "type": "step", "job": "bill", "rank": 0, "local_rank": 0, "pid": pid,
             "step": i, "t": t, "dur": dur, "compute": dur}
        s.sendto(json.dumps(d).encode(), ingest)
    for i in range(3):
        send(i, 1.0, 1.0)  # 1970
    import time
    for i in range(3, 203):
        send(i, time.time(), 86400.0)  # a day a step
"""


def books(exp: Exporter) -> float:
    fams = scrape(exp)
    total = value(fams, "stepscope_job_goodput_gpu_seconds_total", training_job="bill") or 0.0
    for lbl, v in fams.get("stepscope_job_badput_gpu_seconds_total", []):
        if lbl.get("training_job") == "bill":
            total += v
    return total


def test_a_senders_clock_does_not_set_the_bill(box: Path, exporters: list[Exporter]) -> None:
    needs_setpriv()
    sock = box / "ingest.sock"
    start = time.monotonic()
    exp = serve_0666(box)
    exporters.append(exp)
    for _ in range(2):  # the second process takes the rank over once the first has exited
        run_as(NOBODY, ATTACK, str(sock))

    def clamped() -> dict[str, float]:
        return {lbl["reason"]: v for lbl, v in scrape(exp)["stepscope_ingest_clamped_total"]}

    wait_for(lambda: clamped()["longer_than_seen"] >= 400)
    # the job's books served, through a few passes after the last step
    wait_for(lambda: books(exp) > 0.0)
    collected = value(scrape(exp), "stepscope_last_collect_timestamp_seconds") or 0.0
    wait_for(lambda: (value(scrape(exp), "stepscope_last_collect_timestamp_seconds") or 0.0)
             > collected + 1.0)  # five more passes booked  # fmt: skip
    held = books(exp)
    wall = time.monotonic() - start  # the wall time observed: the rank held at most this
    assert 0.0 < held <= wall, (held, wall)
    got = clamped()
    assert got["clock_behind"] >= 6 and got["longer_than_seen"] >= 400, got
    assert value(scrape(exp), "stepscope_training_restarts_total", training_job="bill") == 1.0
