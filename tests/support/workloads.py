"""Real PyTorch training loops (CPU) that reproduce each bottleneck, for the diagnosis tests.

Run from the repository root, ``python -m tests.support.workloads MODE --seconds S [...]``,
with ``STEPSCOPE_INGEST`` pointing at the exporter. Modes:

- ``loader``: a small CNN on synthetic images from a DataLoader, the worked example of
  docs/field-guide.md: ``--aug light`` (normalize only) or ``heavy`` (resize, blur, rotation,
  colour jitter, all on the CPU), ``--workers N``; ``--store-mbps X`` reads every
  sample from a file through a reader throttled to X MB/s (a slow store).
- ``evaluate``: a small MLP's training steps and, every ``--every`` steps, an evaluation
  pass that no ``phase()`` names (``--eval-batches`` forward passes without gradients,
  each read back with ``float()`` as a metric is): CPU-busy work between steps, ~40% of
  the wall time while the step bodies take the rest.
- ``ddp``: two gloo ranks (RANK/WORLD_SIZE/MASTER_* from the environment) training a
  DDP model with ``watch_ddp``; ``--slow-rank R --delay S`` makes rank R compute S
  seconds longer per step; ``--big-grad N`` adds a parameter of N floats whose
  gradient makes every all-reduce large (a slow network).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("mode", choices=("loader", "ddp", "evaluate"))
    p.add_argument("--job", default="workload")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--aug", choices=("light", "heavy"), default="light")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--store-mbps", type=float, default=0.0)
    p.add_argument("--store", default="")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--big-grad", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--eval-batches", type=int, default=12)
    return p.parse_args()


class Images:
    """Synthetic 3x64x64 images (or 3x128x128 before a heavy pipeline), made per item."""

    def __init__(self, aug: str, store: str = "", mbps: float = 0.0) -> None:
        self.aug, self.store, self.mbps = aug, store, mbps

    def __len__(self) -> int:
        return 1 << 20

    def _read(self, index: int) -> bytes:
        """One sample's bytes from the store, no faster than ``mbps`` MB/s."""
        size = 3 * 64 * 64
        with open(self.store, "rb") as f:
            f.seek((index * size) % max(1, os.path.getsize(self.store) - size))
            out = b""
            while len(out) < size:
                chunk = f.read(4096)
                if not chunk:
                    f.seek(0)
                    continue
                out += chunk
                time.sleep(len(chunk) / (self.mbps * 1e6))  # the store's bandwidth
        return out[:size]

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(index)
        if self.store:
            raw = torch.frombuffer(bytearray(self._read(index)), dtype=torch.uint8)
            x = raw.view(3, 64, 64).float() / 255
        elif self.aug == "light":
            x = torch.rand(3, 64, 64)
        else:
            x = torch.rand(1, 3, 192, 192, generator=g)
            for _ in range(6):  # rotation + crop, blur, colour jitter: CPU-heavy
                theta = torch.tensor([[[math.cos(0.3), -math.sin(0.3), 0.05],
                                       [math.sin(0.3), math.cos(0.3), -0.05]]])  # fmt: skip
                grid = F.affine_grid(theta, list(x.shape), align_corners=False)
                x = F.grid_sample(x, grid, align_corners=False)
                x = F.conv2d(x, torch.full((3, 1, 9, 9), 1 / 81), padding=4, groups=3)
                x = (x * 1.1 + 0.02).clamp(0, 1)
            x = F.interpolate(x, size=(64, 64), mode="bilinear", align_corners=False)[0]
        return (x - 0.5) / 0.25, torch.randint(0, 10, (), generator=g)


def _model() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 16 * 16, 10),
    )  # fmt: skip


def _worker_init(_: int) -> None:
    import torch

    torch.set_num_threads(1)


def loader(a: argparse.Namespace) -> None:
    import torch

    from stepscope.train import StepReporter

    torch.set_num_threads(a.threads)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(
        Images(a.aug, a.store, a.store_mbps), batch_size=a.batch, num_workers=a.workers,
        worker_init_fn=_worker_init if a.workers else None,
        persistent_workers=a.workers > 0,
    )  # fmt: skip
    rep = StepReporter(a.job, precision="fp32", warmup_steps=2)
    end = time.monotonic() + a.seconds
    for x, y in rep.timed(data):
        with rep.step(tokens=a.batch):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if time.monotonic() > end:
            break
    rep.close()


def evaluate(a: argparse.Namespace) -> None:
    import torch

    from stepscope.train import StepReporter

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    rep = StepReporter(a.job, warmup_steps=2, cuda=False)
    end = time.monotonic() + a.seconds
    step = 0
    while time.monotonic() < end:
        with rep.step(tokens=64):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        step += 1
        if step % a.every == 0:  # evaluation, not named: the loop's own work
            with torch.no_grad():
                for _ in range(a.eval_batches):
                    float(model(x).sum())
    rep.close()


def ddp(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepscope.train import StepReporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    if a.big_grad:
        big = torch.nn.Parameter(torch.zeros(a.big_grad))
        base.register_parameter("big", big)
    model = DDP(base)
    rep = StepReporter(a.job, warmup_steps=2)
    rep.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 64, generator=gen), torch.randn(64, 10, generator=gen)
    end = time.monotonic() + a.seconds
    stop = torch.zeros(1)
    while True:
        with rep.step(tokens=64):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
            if a.big_grad:
                loss = loss + 0.0 * base.big.sum()
            if rank == a.slow_rank:
                time.sleep(a.delay)  # this rank computes longer: the straggler
            opt.zero_grad()
            loss.backward()
            opt.step()
        stop[0] = 1.0 if time.monotonic() > end else 0.0
        dist.all_reduce(stop)  # both ranks stop on the same step
        if stop[0] > 0:
            break
    rep.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = _args()
    {"loader": loader, "ddp": ddp, "evaluate": evaluate}[args.mode](args)
    sys.exit(0)
