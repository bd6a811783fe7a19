"""Steps as the SDK sends them, and the training series as the exporter serves them."""

from __future__ import annotations

import os
from typing import Any

from tests.support import Exporter, parse_samples

H100_BF16 = 989.4e12

Samples = dict[str, list[tuple[dict[str, str], float]]]


def step(job: str, rank: int, i: int, t: float, uuid: str | None, **extra: Any) -> dict[str, Any]:
    # pid: this process's, as the SDK sends it (the exporter checks it against the kernel's)
    obj: dict[str, Any] = {
        "v": 1, "type": "step", "job": job, "rank": rank, "local_rank": rank, "world_size": 2,
        "pid": os.getpid(), "step": i, "t": t, "dur": 1.0, "data": 0.25, "compute": 0.5,
        "comm": 0.125, "tokens": 4096, "flops": 0.4 * H100_BF16, "warmup": False,
    }
    if uuid is not None:
        obj["uuid"] = uuid
    obj.update(extra)
    return obj


def scrape(exp: Exporter) -> Samples:
    return parse_samples(exp.metrics())


def value(fams: Samples, name: str, **labels: str) -> float | None:
    for lbl, v in fams.get(name, []):
        if all(lbl.get(k) == want for k, want in labels.items()):
            return v
    return None


# The uid of nobody: an attacker who is not the exporter's user.
NOBODY = 65534
