"""The training SDK on a real GPU: the GPU UUID it reports, and its step timing from CUDA
events against known GPU work (the check behind docs/validation/h200-2026-12-02/
sdk-cuda-check.json).

    python -m validation.sdk_cuda_check --out DIR          # a GPU: cuda:0, NCCL
    python -m validation.sdk_cuda_check --out DIR --cpu    # rehearsal of the harness

- UUID: the SDK's GPU UUID (``cuda_device_uuid``) against NVML's for the same device.
- Four loops of 12 steps, each a known number of bf16 matmuls (~40 ms of GPU work), fed by
  a loader that sleeps 10 ms (hidden behind the GPU) or 80 ms (~40 ms exposed), each with
  CUDA events (the default) and with ``sync=True``: the datagrams' step time, data wait
  and compute (medians over the steps after warm-up) against the expected GPU time.
- The cost of an empty ``step()`` on the CUDA path (20,000 steps: p50, p99).
- DDP with NCCL, world size 1: ``watch_ddp`` attaches, gradients stay identical to an
  unwatched twin, and the steps carry their communication time.

The datagrams are read from a Unix socket of its own, with the exporter's parser. Writes
``cuda_check.json`` to ``--out`` (default ``$OUT``) and prints each part. ``--cpu`` runs
the same loops on the CPU (fp32, smaller matmuls, gloo for DDP, no UUID or CUDA events):
it checks the harness, not the GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepscope.shared.datagram import Limits, StepRecord, parse_datagram
from stepscope.train import StepReporter


class Datagrams:
    """The step datagrams sent to a Unix socket of this process, parsed as the exporter
    parses them, read by a thread of their own."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ingest.sock"
        self.url = f"unix://{self.path}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.2)
        self.steps: list[StepRecord] = []
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            record = parse_datagram(data, Limits())
            if isinstance(record, StepRecord) and not record.tail:
                self.steps.append(record)

    def wait(self, n: int, timeout: float = 5.0) -> list[StepRecord]:
        """The steps received once ``n`` have come (or ``timeout`` passed), then cleared."""
        deadline = time.monotonic() + timeout
        while len(self.steps) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        got, self.steps = self.steps, []
        return got

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


def uuids(torch: Any) -> dict[str, Any]:
    """The SDK's GPU UUID for device 0 against NVML's."""
    import pynvml

    from stepscope.train._env import cuda_device_uuid

    ours = cuda_device_uuid(torch, 0)
    pynvml.nvmlInit()
    nvml = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    nvml = nvml.decode() if isinstance(nvml, bytes) else nvml
    return {
        "uuid_torch_raw": str(torch.cuda.get_device_properties(0).uuid),
        "uuid_ours": ours,
        "uuid_nvml": nvml,
        "uuid_match": ours == nvml,
    }


def loader(n: int, sleep_s: float) -> Iterator[int]:
    """A data loader whose every batch costs ``sleep_s`` of host time."""
    for i in range(n):
        time.sleep(sleep_s)
        yield i


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cpu", action="store_true", help="rehearse the harness on the CPU")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    import torch

    if not a.cpu and not torch.cuda.is_available():
        print("sdk_cuda_check: no CUDA device (use --cpu to rehearse)", file=sys.stderr)
        return 2
    device = "cpu" if a.cpu else "cuda"
    size, dtype = (512, torch.float32) if a.cpu else (8192, torch.bfloat16)
    out: dict[str, Any] = {"device": device}
    if not a.cpu:
        torch.cuda.set_device(0)
        torch.zeros(1, device=device)
        out.update(uuids(torch))
        print("UUID", json.dumps(out), flush=True)

    def sync() -> None:
        if not a.cpu:
            torch.cuda.synchronize()

    tmp = Path(tempfile.mkdtemp(prefix="stepscope-sdk-check-"))
    datagrams = Datagrams(tmp)
    x = torch.randn(size, size, device=device, dtype=dtype)
    y = torch.randn(size, size, device=device, dtype=dtype)

    def work_ms(k: int) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(k):
            x @ y
        sync()
        return (time.perf_counter() - t) * 1e3

    for _ in range(3):
        work_ms(10)
    per_mm = work_ms(50) / 50
    out["matmul_ms"] = per_mm
    print("matmul ms", per_mm, flush=True)

    k = max(1, round(40 / per_mm))
    for name, sleep_s, synced in (
        ("gpu_bound_events", 0.010, False),  # a 10 ms loader hidden behind ~40 ms of work
        ("gpu_bound_sync", 0.010, True),
        ("data_bound_events", 0.080, False),  # an 80 ms loader: ~40 ms exposed a step
        ("data_bound_sync", 0.080, True),
    ):
        steps = 12
        rep = StepReporter(f"check-{name}", ingest=datagrams.url, warmup_steps=2, sync=synced,
                           flops_per_step=2 * size**3 * k, cuda=not a.cpu)  # fmt: skip
        host_body = []
        for _ in rep.timed(loader(steps, sleep_s)):
            t = time.perf_counter()
            with rep.step(tokens=1):
                for _ in range(k):
                    x @ y
            host_body.append(time.perf_counter() - t)
        sync()
        rep.close(timeout=2)
        got = datagrams.wait(steps)
        rows = [s for s in got if not s.warmup]
        out[name] = {
            "n": len(got),
            "dropped": rep.dropped,
            "uuid": got[0].uuid if got else None,
            "expected_gpu_ms": k * per_mm,
            "loader_ms": sleep_s * 1e3,
            "host_body_ms_median": statistics.median(host_body) * 1e3,
            "dur_ms": statistics.median(s.dur for s in rows) * 1e3,
            "data_ms": statistics.median(s.data_wait for s in rows) * 1e3,
            "compute_ms": statistics.median(s.compute for s in rows) * 1e3,
            "tflops_from_datagrams": statistics.median(s.flops / s.dur for s in rows) / 1e12,
        }
        print(name, json.dumps(out[name]), flush=True)

    # the cost of an empty step on this path
    rep = StepReporter("overhead", ingest=datagrams.url, warmup_steps=0, cuda=not a.cpu)
    costs = []
    for i in range(20000):
        t0 = time.perf_counter_ns()
        with rep.step(tokens=i):
            pass
        costs.append(time.perf_counter_ns() - t0)
    rep.close()
    datagrams.wait(20000, timeout=2)
    q = statistics.quantiles(costs, n=100)
    out["step_overhead_us"] = {"p50": q[49] / 1e3, "p99": q[98] / 1e3}
    print("step overhead", out["step_overhead_us"], flush=True)

    out.update(ddp(torch, device, datagrams, a.cpu))
    print("ddp", out["ddp_watched"], out["ddp_identical"], out["ddp_steps"], flush=True)
    datagrams.close()
    (a.out / "cuda_check.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


def ddp(torch: Any, device: str, datagrams: Datagrams, cpu: bool) -> dict[str, Any]:
    """DDP, world size 1 (NCCL on a GPU, gloo on the CPU): a watched model and an unwatched
    twin get the same gradients; the watched one's steps carry their communication."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks._local import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")  # fmt: skip
    dist.init_process_group("gloo" if cpu else "nccl")
    width = 256 if cpu else 4096
    base = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).to(device)
    plain = DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    watched = DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    rep = StepReporter("ddp-check", ingest=datagrams.url, warmup_steps=1, cuda=not cpu)
    out: dict[str, Any] = {"ddp_watched": rep.watch_ddp(watched)}
    batch = torch.randn(64 if cpu else 256, width, device=device)
    plain(batch).sum().backward()
    watched(batch).sum().backward()
    out["ddp_identical"] = all(
        torch.equal(p.grad, q.grad)
        for p, q in zip(plain.parameters(), watched.parameters(), strict=True)
    )
    watched.zero_grad()
    for _ in range(8):
        with rep.step(tokens=batch.shape[0]):
            watched(batch).sum().backward()
    if not cpu:
        torch.cuda.synchronize()
    rep.close(timeout=2)
    out["ddp_steps"] = [
        {"step": s.step, "dur": s.dur, "compute": s.compute, "comm": s.comm}
        for s in datagrams.wait(8)
    ]
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    sys.exit(main())
