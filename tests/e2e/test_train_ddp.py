"""Two real torch.distributed ranks (gloo, CPU) training a DDP model with the SDK.

The test starts this file twice as a script, the way torchrun would (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment); each rank

1. checks the comm hook against DDP's own all-reduce: same gradients, bit for bit;
2. trains ``NORMAL`` steps with ``StepReporter`` + ``watch_ddp``;
3. trains ``DELAYED`` more steps in which rank 1 sleeps before its backward (a
   straggler), which rank 0 must see as exposed communication.

The ranks send their datagrams to a Unix socket this test reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO
from tests.support.collector import Collector
from tests.support.ports import free_port

NORMAL = 6
DELAYED = 4
DELAY = 0.3  # seconds rank 1 sleeps before each backward in the delayed phase
WARMUP = 2
TOKENS = 512


def worker(result_path: str) -> None:  # pragma: no cover - runs in the rank processes
    """One rank: hook correctness, then normal and delayed training steps."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepscope.train import StepReporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 10),
    )  # fmt: skip
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    batches = [(torch.randn(32, 64, generator=gen), torch.randn(32, 10, generator=gen))]
    batches += [
        (torch.randn(32, 64, generator=gen), torch.randn(32, 10, generator=gen))
        for _ in range(NORMAL + DELAYED)
    ]

    # 1. the hook reduces exactly like DDP's built-in all-reduce (several buckets)
    plain = DDP(copy.deepcopy(base), bucket_cap_mb=0.1)
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=0.1)
    rep = StepReporter("ddp-test", flops_per_token=1000.0, warmup_steps=WARMUP)
    watched = rep.watch_ddp(hooked)
    again = rep.watch_ddp(hooked)  # a second hook is refused, not raised
    x, y = batches[0]
    for model in (plain, hooked):
        torch.nn.functional.mse_loss(model(x), y).backward()
    identical = all(
        torch.equal(a.grad, b.grad)
        for a, b in zip(plain.parameters(), hooked.parameters(), strict=True)
    )
    reduced = hooked.module[0].weight.grad.clone()
    dist.all_reduce(reduced)  # equal on both ranks iff the grads were averaged
    hooked.zero_grad()

    # 2. and 3. training with the reporter
    opt = torch.optim.SGD(hooked.parameters(), lr=0.01)
    for i, (x, y) in enumerate(rep.timed(batches[1:])):
        with rep.step(tokens=TOKENS):
            loss = torch.nn.functional.mse_loss(hooked(x), y)
            if i >= NORMAL and rank == 1:
                time.sleep(DELAY)  # the workload: a straggler before its all-reduce
            loss.backward()
            opt.step()
            opt.zero_grad()
    rep.close(timeout=5)
    result = {
        "watched": watched,
        "again": again,
        "identical": identical,
        "reduced_sum": float(reduced.sum()),
        "dropped": rep.dropped,
        "steps": rep.steps,
    }
    Path(result_path).write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def run() -> Iterator[dict[str, Any]]:
    """Both ranks' datagrams by rank, and each rank's own result."""
    pytest.importorskip("torch")
    tmp = tempfile.mkdtemp(prefix="ss-ddp-")
    collector = Collector(os.path.join(tmp, "ingest.sock"))
    repo = REPO
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "STEPSCOPE_INGEST": f"unix://{tmp}/ingest.sock",
            "PYTHONPATH": os.pathsep.join([str(repo / "exporter"), str(repo)]),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, os.path.join(tmp, f"result{rank}.json")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    try:
        for p, out in zip(procs, outputs, strict=True):
            assert p.returncode == 0, out
        results = [json.loads(Path(tmp, f"result{r}.json").read_text()) for r in range(2)]
        expected = NORMAL + DELAYED
        deadline = time.monotonic() + 10
        while len(collector.got) < 2 * expected and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the collector thread with a deadline
    finally:
        collector.close()
        shutil.rmtree(tmp, ignore_errors=True)
    by_rank = {r: sorted((d for d in collector.got if d["rank"] == r), key=lambda d: d["step"])
               for r in range(2)}  # fmt: skip
    yield {"results": results, "steps": by_rank}


def test_the_hook_reduces_exactly_like_ddp(run: dict[str, Any]) -> None:
    for res in run["results"]:
        assert res["watched"] is True
        assert res["again"] is False
        assert res["identical"] is True
    # the averaged gradient is the same on both ranks
    assert run["results"][0]["reduced_sum"] == run["results"][1]["reduced_sum"]


def test_both_ranks_report_every_step(run: dict[str, Any]) -> None:
    for rank in range(2):
        steps = run["steps"][rank]
        assert [d["step"] for d in steps] == list(range(NORMAL + DELAYED))
        assert run["results"][rank]["dropped"] == 0
        for d in steps:
            assert (d["job"], d["local_rank"], d["world_size"]) == ("ddp-test", rank, 2)
            assert d["tokens"] == TOKENS and d["flops"] == 1000.0 * TOKENS
            assert d["warmup"] is (d["step"] < WARMUP)
            assert d["data"] + d["compute"] + d["comm"] <= d["dur"] + 1e-8


def test_all_reduce_shows_as_comm_on_both_ranks(run: dict[str, Any]) -> None:
    for rank in range(2):
        normal = run["steps"][rank][:NORMAL]
        assert all(d["comm"] > 0 for d in normal), normal


def test_a_straggler_shows_as_the_other_ranks_comm(run: dict[str, Any]) -> None:
    fast, slow = run["steps"][0], run["steps"][1]
    base = max(d["comm"] for d in fast[WARMUP:NORMAL])
    for d in fast[NORMAL:]:
        assert d["comm"] > base + 0.5 * DELAY, (base, d)
        assert d["comm"] < d["dur"]
    for d in slow[NORMAL:]:
        # the straggler waited for no one: its delay is its own (compute)
        assert d["comm"] < 0.5 * DELAY, d
        assert d["compute"] >= DELAY, d


if __name__ == "__main__":
    worker(sys.argv[1])
