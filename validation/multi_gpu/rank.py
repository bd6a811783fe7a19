"""One DDP rank of the multi-GPU validation, started once per GPU (or CPU process) by
``python -m validation.multi_gpu_validation``: trains a bias-free MLP reporting each
step through ``StepReporter`` + ``watch_ddp``, and writes what it did as JSON.

    python -m validation.multi_gpu.rank --job JOB --ingest URL --seconds S --started FILE \
        --result FILE [--delay S --slow-rank R] [--cpu --uuid UUID]

torchrun-style environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from validation.multi_gpu.run import WARMUP


def worker(args: argparse.Namespace) -> int:
    """One DDP rank: torchrun-style env (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.train import StepReporter
    from stepscope.train._env import cuda_device_uuid

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = not args.cpu
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
        hidden, layers, batch, dtype = 4096, 8, 8192, torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        hidden, layers, batch, dtype = 512, 4, 256, torch.float32
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden, bias=False), nn.ReLU()]
    model = DistributedDataParallel(
        nn.Sequential(*mods).to(device, dtype), device_ids=[local] if cuda else None
    )
    n_params = sum(p.numel() for p in model.parameters())
    # bias-free linear layers: 2 FLOPs per weight per row forward, 4 backward
    flops_per_step = 6.0 * n_params * batch
    # On CUDA the SDK finds the rank's GPU itself (what users rely on); the UUID read here
    # only lets the orchestrator check that the exporter joined the rank with that GPU.
    uuid = args.uuid or (cuda_device_uuid(torch, local) if cuda else None)
    rep = StepReporter(
        job=args.job,
        flops_per_step=flops_per_step,
        precision="bf16",
        ingest=args.ingest,
        gpu_uuid=args.uuid or None,
        warmup_steps=WARMUP,
    )
    hooked = rep.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    xs = [torch.randn(batch, hidden, device=device, dtype=dtype, generator=gen) for _ in range(4)]
    slow = rank == args.slow_rank and args.delay > 0
    flag = torch.zeros(1, device=device)
    deadline = float("inf")
    step = 0
    t_measured = time.monotonic()
    while True:
        with rep.step(tokens=batch):
            loss = model(xs[step % 4]).float().pow(2).mean()
            if slow:
                time.sleep(args.delay)  # the straggler: late to every backward
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step += 1
        if step == WARMUP:
            t_measured = time.monotonic()
            deadline = t_measured + args.seconds
            if rank == 0:
                Path(args.started).write_text(str(time.time()))
        if step > WARMUP and step % 5 == 0:  # every rank stops at the same step
            flag.fill_(1.0 if time.monotonic() > deadline else 0.0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
    if cuda:
        torch.cuda.synchronize()
    wall = time.monotonic() - t_measured
    rep.close(timeout=5)
    dist.barrier()
    dist.destroy_process_group()
    result = {
        "rank": rank,
        "local_rank": local,
        "uuid": uuid,
        "steps": rep.steps,
        "dropped": rep.dropped,
        "failed": rep.failed,
        "invalid": rep.invalid,
        "hooked": hooked,
        "n_params": n_params,
        "flops_per_step": flops_per_step,
        "tokens_per_step": batch,
        "measured_wall_s": wall,
        "slow": slow,
        "device": torch.cuda.get_device_name(local) if cuda else "cpu",
    }
    Path(args.result).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--ingest", required=True)
    ap.add_argument("--seconds", type=float, required=True, help="measured s after warm-up")
    ap.add_argument("--delay", type=float, default=0.0,
                    help="s the slowed rank sleeps before each backward")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--started", required=True, help="rank 0 writes the warm-up's end here")
    ap.add_argument("--result", required=True, help="this rank's JSON result")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU")
    ap.add_argument("--uuid", default="", help="the simulated GPU this rank reports (--cpu)")
    return worker(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
