"""What the training SDK costs the training process, per step and per batch.

Times ``with rep.step(tokens=...)`` around an empty body (so only the SDK's own work
is measured) in three conditions, and ``timed()``'s per-item overhead over a plain
iterator; prints p50 / p99 / max microseconds. The design target is <= 10 us per
step at p99. Host timing (no CUDA); the figures include the perf_counter pair
around each call, shown on the ``timer alone`` row. Steps are paced ``--gap-us``
apart by a busy loop (the "training" holds the GIL, as real Python does), so the
SDK's sending thread competes with the loop as it would in a job; the notes say how
many datagrams were received and dropped.

- receiver present: an exporter stand-in in another process drains a Unix socket;
- exporter absent: nothing at the ingest path (steps dropped and counted);
- full socket: a receiver that never reads, tiny buffer (EAGAIN, dropped).

``--device cuda`` times the CUDA-event path instead (torch with a GPU; the reporter
records events at each boundary and reads them later): the same cases, an empty body
(the GPU idles, so events complete at once), and where that cost goes: the same loop
with only one or two ``torch.Event.record()`` calls in place of the step (no SDK), and
the SDK with Python stand-ins for its events (its Python alone). ``--sdk DIR``
benchmarks the SDK found in DIR (another checkout's ``exporter/``, e.g. a release before
a change) with this same harness. ``--out DIR`` also writes the table and a JSON of the
figures there.

    python3 -m benchmarks.bench_sdk [--steps 20000] [--gap-us 200] [--device cpu|cuda]
                                    [--sdk DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.paths import EXPORTER

RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
s.bind(sys.argv[1])
print("ready", flush=True)
n = 0
while True:
    if s.recv(4096) == b"stop":
        break
    n += 1
print(n, flush=True)
"""

Row = tuple[str, list[float], str]


def percentiles(samples_ns: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max in microseconds."""
    q = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return q[49] / 1e3, q[98] / 1e3, max(samples_ns) / 1e3


def time_steps(rep: Any, steps: int, gap_ns: int) -> list[float]:
    """Nanoseconds of each empty ``with rep.step()``, steps ``gap_ns`` apart."""
    clock = time.perf_counter_ns
    out: list[float] = []
    append = out.append
    for i in range(steps):
        until = clock() + gap_ns
        while clock() < until:  # the training work between steps
            pass
        t0 = clock()
        with rep.step(tokens=i):
            pass
        append(clock() - t0)
    return out


def time_timer(steps: int) -> list[float]:
    clock = time.perf_counter_ns
    out: list[float] = []
    append = out.append
    for _ in range(steps):
        t0 = clock()
        append(clock() - t0)
    return out


def time_next(it: Iterator[int], items: int) -> list[float]:
    """Nanoseconds of each ``next(it)``."""
    clock = time.perf_counter_ns
    out: list[float] = []
    append = out.append
    for _ in range(items):
        t0 = clock()
        next(it)
        append(clock() - t0)
    return out


def reporter(path: str, cuda: bool = False) -> Any:
    from stepscope.train import StepReporter

    return StepReporter(
        "bench", flops_per_token=1e9, ingest=f"unix://{path}", warmup_steps=0, cuda=cuda
    )


class FakeEvent:
    """A stand-in for a timing event: Python calls, no CUDA."""

    __slots__ = ()

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return 0.0


def cuda_floors(steps: int, gap_ns: int, absent: str) -> list[Row]:
    """The step's two parts measured apart: event records alone, the SDK's Python alone."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    pool = [torch.Event(device, enable_timing=True) for _ in range(64)]
    for ev in pool:
        ev.record()
    torch.cuda.synchronize()

    class Records:  # quacks like a reporter whose step() is n records
        def __init__(self, n: int) -> None:
            self.n, self.i = n, 0

        def step(self, tokens: int = 0) -> Records:
            return self

        def __enter__(self) -> None:
            if self.n == 2:
                pool[self.i % 64].record()
                self.i += 1

        def __exit__(self, *exc: object) -> None:
            pool[self.i % 64].record()
            self.i += 1

    rows: list[Row] = [
        ("floor: 2 x torch.Event.record()", time_steps(Records(2), steps, gap_ns), "no SDK"),
        ("floor: 1 x torch.Event.record()", time_steps(Records(1), steps, gap_ns), "no SDK"),
    ]
    from stepscope.train import reporter as module

    real = module._event_factory
    module._event_factory = lambda torch: FakeEvent
    try:
        rep = reporter(absent, cuda=True)
        samples = time_steps(rep, steps, gap_ns)
        rep.close()
    finally:
        module._event_factory = real
    rows.append(("step(): events faked (Python only)", samples, "exporter absent"))
    return rows


def run(steps: int, gap_ns: int, cuda: bool = False) -> list[Row]:
    rows: list[Row] = [("timer alone (perf_counter_ns pair)", time_timer(steps), "")]
    tmp = tempfile.mkdtemp(prefix="ssb")

    present = os.path.join(tmp, "present.sock")
    proc = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, present], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    rep = reporter(present, cuda)
    samples = time_steps(rep, steps, gap_ns)
    rep.close()
    dropped = rep.dropped
    stop = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    while True:  # the receiver's queue may be full: retry until "stop" lands
        try:
            stop.sendto(b"stop", present)
            break
        except BlockingIOError:
            time.sleep(0.01)
    received = int(proc.stdout.readline())
    proc.wait()
    rows.append(("step(): receiver present", samples, f"received {received}, dropped {dropped}"))

    rep = reporter(os.path.join(tmp, "absent.sock"), cuda)
    samples = time_steps(rep, steps, gap_ns)
    rep.close()
    rows.append(("step(): exporter absent", samples, f"dropped {rep.dropped}"))

    full = os.path.join(tmp, "full.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sink.bind(full)
    rep = reporter(full, cuda)
    samples = time_steps(rep, steps, gap_ns)
    rep.close(timeout=0.1)
    rows.append(("step(): socket full (never read)", samples, f"dropped {rep.dropped}"))
    sink.close()

    if cuda:
        rows.extend(cuda_floors(steps, gap_ns, os.path.join(tmp, "absent.sock")))

    data = list(range(steps))
    plain = time_next(iter(data), steps)
    wrapped = time_next(iter(reporter(os.path.join(tmp, "absent.sock")).timed(data)), steps)
    rows.append(("next(): plain list iterator", plain, ""))
    rows.append(("next(): through timed()", wrapped, ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--gap-us", type=int, default=200, help="busy time between steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: host timing; cuda: CUDA-event timing (needs a GPU)")
    parser.add_argument("--sdk", type=Path, default=EXPORTER,
                        help="the directory holding the stepscope package to benchmark")
    parser.add_argument("--out", type=Path, help="also write sdk-DEVICE.txt and .json here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.sdk.resolve()))
    cuda = args.device == "cuda"
    header = [f"SDK from {args.sdk}, device {args.device}"]
    if cuda:
        import torch

        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")  # initialize CUDA: the reporter times with events
        header.append(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    rows = run(args.steps, args.gap_us * 1000, cuda)
    lines = [*header, f"{args.steps} steps each, {args.gap_us} us of busy work between steps",
             f"{'case':<36} {'p50 us':>8} {'p99 us':>8} {'max us':>9}  note"]  # fmt: skip
    figures: dict[str, Any] = {"device": args.device, "sdk": str(args.sdk), "steps": args.steps,
                               "gap_us": args.gap_us, "rows": {}}  # fmt: skip
    for name, samples, note in rows:
        p50, p99, peak = percentiles(samples)
        lines.append(f"{name:<36} {p50:8.2f} {p99:8.2f} {peak:9.1f}  {note}")
        figures["rows"][name] = {"p50_us": p50, "p99_us": p99, "max_us": peak, "note": note}
    plain_p50 = percentiles(rows[-2][1])[0]
    timed_p50 = percentiles(rows[-1][1])[0]
    lines.append(f"timed() overhead per item, p50: {timed_p50 - plain_p50:.2f} us")
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"sdk-{args.device}.txt").write_text("\n".join(lines) + "\n")
        (args.out / f"sdk-{args.device}.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
