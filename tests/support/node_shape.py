"""The node shape the series budget is counted on: 8 simulated GPUs and 8 ranks of one job.

``stepscope serve --simulate 8`` with its ingest on a loopback UDP port, and 8 ranks of
job ``budget`` reporting real steps through the SDK (``StepReporter``, one per rank, each
on its own GPU, or naming no GPU as a rank on a machine without CUDA does). The
exposition is read once the diagnosis judges every rank, so every family a busy node
serves is there. :func:`series_by_family` counts the series of each family as Prometheus
stores them (a histogram's ``_bucket``/``_sum``/``_count`` are its series).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.exporter import Exporter, start_exporter
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.samples import parse_samples

GPUS = 8
RANKS = 8
JOB = "budget"
H100_BF16 = 989.4e12


def series_by_family(text: str) -> Counter[str]:
    """Series per metric family of a text exposition (samples grouped under their
    ``# TYPE`` line, so a histogram's or summary's samples count for the family)."""
    counts: Counter[str] = Counter()
    family = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            counts[family if family and name.startswith(family) else name] += 1
    return counts


def table(counts: Counter[str], top: int | None = None) -> str:
    """``series  family`` lines, biggest first, and the total."""
    rows = [f"{n:6d}  {name}" for name, n in counts.most_common(top)]
    return "\n".join([*rows, f"{sum(counts.values()):6d}  total"])


@contextmanager
def busy_node(*, ranks_name_gpus: bool = True, steps: int = 8) -> Iterator[Exporter]:
    """A serving exporter with 8 simulated GPUs, 8 ranks of one job reporting through
    the SDK, and the diagnosis' verdict on every rank (stopped on exit)."""
    from stepscope.train import StepReporter

    ingest = f"udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
    exp = start_exporter(["--simulate", str(GPUS), "--hostname", "node-budget",
                          "--interval", "0.5", "--ingest", ingest])  # fmt: skip
    reporters: list[StepReporter] = []
    try:
        up = parse_samples(exp.metrics())["stepscope_gpu_up"]
        uuids = [lbl["UUID"] for lbl, _ in sorted(up, key=lambda s: int(s[0]["gpu"]))]
        reporters = [
            StepReporter(JOB, rank=r, local_rank=r, world_size=RANKS, ingest=ingest,
                         flops_per_token=6 * 7e9, warmup_steps=2, cuda=False,
                         gpu_uuid=uuids[r] if ranks_name_gpus else None)
            for r in range(RANKS)
        ]  # fmt: skip
        for _ in range(steps):
            for rep in reporters:
                with rep.step(tokens=4096):
                    pass

        def judged() -> bool:
            fams = parse_samples(exp.metrics())
            ranks = {lbl.get("rank") for lbl, _ in fams.get("stepscope_bottleneck", [])}
            measured = [v for _, v in fams.get("stepscope_step_duration_seconds_count", [])]
            return {str(r) for r in range(RANKS)} <= ranks and len(measured) == RANKS and all(
                v > 0 for v in measured)

        wait_for(judged, timeout=30, interval=0.25)
        yield exp
    finally:
        for rep in reporters:
            rep.close()
        exp.stop()
