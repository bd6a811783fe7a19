"""The ranks of one synchronous data-parallel job spread over several exporters.

One thread per rank, each with its own ``StepReporter`` pointed at its node's exporter
(``--rank INGEST_URL,GPU_UUID``, rank = position). Each step: wait for the next batch
(``timed()``: ``--data`` s), compute (``--compute`` s of sleep), then the all-reduce, a
barrier across all ranks, timed as exposed communication (``add_time("comm")``). As in
real DDP, a slow rank makes every other rank wait in the barrier: the straggler looks
compute-bound, its peers communication-bound.

``--slow-rank R --slow-compute S --slow-after T``: from T s after start, rank R computes
S s per step; the wall time of that moment is printed as ``onset <epoch>``. Runs until
killed or ``--seconds``. Standard library plus stepscope.train.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator

from stepscope.train import StepReporter


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--job", default="fleet-llm")
    p.add_argument("--rank", action="append", required=True, metavar="INGEST,UUID")
    p.add_argument("--compute", type=float, default=0.30)
    p.add_argument("--data", type=float, default=0.01)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-compute", type=float, default=0.45)
    p.add_argument("--slow-after", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=3600.0)
    return p.parse_args()


def main() -> int:
    args = _args()
    n = len(args.rank)
    barrier = threading.Barrier(n)
    stop = threading.Event()
    start = time.monotonic()
    onset = threading.Event()

    def batches(seconds: float) -> Iterator[int]:
        i = 0
        while True:
            time.sleep(seconds)  # the loader hands over the next batch
            yield i
            i += 1

    def rank(r: int, ingest: str, uuid: str) -> None:
        rep = StepReporter(args.job, ingest=ingest, gpu_uuid=uuid, rank=r, local_rank=0,
                           world_size=n, warmup_steps=2, cuda=False, precision="bf16")
        for _ in rep.timed(batches(args.data)):
            slow = r == args.slow_rank and time.monotonic() - start >= args.slow_after
            if slow and not onset.is_set():
                onset.set()
                print(f"onset {time.time():.3f}", flush=True)
            with rep.step(tokens=4096):
                time.sleep(args.slow_compute if slow else args.compute)
                t0 = time.perf_counter()
                try:
                    barrier.wait(timeout=30)  # the all-reduce: everyone waits for the last
                except threading.BrokenBarrierError:
                    return
                rep.add_time("comm", t0, time.perf_counter())
            if stop.is_set():
                break
        rep.close()

    threads = []
    for r, spec in enumerate(args.rank):
        ingest, uuid = spec.split(",", 1)
        threads.append(threading.Thread(target=rank, args=(r, ingest, uuid), daemon=True))
    for t in threads:
        t.start()
    print("ready", flush=True)
    stop.wait(args.seconds)
    stop.set()
    barrier.abort()
    for t in threads:
        t.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
