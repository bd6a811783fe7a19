"""One rank of the same tiny workload, trained by a plain loop or through a framework.

The integration tests and ``validation/gpu_integrations_validation.py`` start this
script once per rank with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); ``--mode`` picks who drives the loop:

- ``plain-ddp``, ``plain-fsdp``: a hand-written loop with ``StepReporter`` (the
  reference) around a DDP or FSDP model;
- ``lightning-ddp``, ``lightning-fsdp``: Lightning with ``StepscopeCallback``;
- ``hf-trainer``: the Hugging Face Trainer with ``StepscopeCallback.attach``;
- ``accelerate``: an Accelerate loop with ``AcceleratorReporter``.

Every mode trains the same model on the same number of batches of the same size; the
collate function sleeps ``--collate-sleep`` seconds per batch (a slow loader). With
WORLD_SIZE=1 it runs one process (the GPU validation). Writes one JSON line of
results to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, DIM, SEQ, BATCH = 64, 64, 16, 8
TOKENS = SEQ * BATCH  # per step and rank
# model FLOPs per token (6 per weight per token: forward + backward), for every mode
N_PARAMS = DIM * DIM + DIM * VOCAB  # the two Linear layers' weights
FLOPS_PER_TOKEN = 6.0 * N_PARAMS


class TinyLM(nn.Module):
    """Embedding → Linear → ReLU → Linear over token ids; returns {"loss"} as
    transformers models do, so the HF Trainer accepts it unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM, bias=False)
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.out(torch.relu(self.hidden(self.embed(input_ids))))
        loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))
        return {"loss": loss}


def samples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=gen)
    return [{"input_ids": row[:-1], "labels": row[1:]} for row in ids]


def make_collate(sleep: float) -> Any:
    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if sleep:
            time.sleep(sleep)  # the workload: a loader slower than the step
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    return collate


def to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def fsdp_wrap(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    # one FSDP unit per Linear and the root: several reduce-scatters per backward
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                    device_id=device, use_orig_params=True)


def fsdp_grads_identical(device: torch.device, rank: int) -> bool:
    """One backward through FSDP with and without the stepscope hook: bit-identical
    sharded gradients (the hook reduces exactly as FSDP does)."""
    import copy

    from stepscope.train import StepReporter
    from stepscope.train.fsdp import watch_fsdp

    torch.manual_seed(0)
    base = TinyLM()
    default, hooked = (fsdp_wrap(copy.deepcopy(base), device) for _ in range(2))
    # a reporter that never steps sends nothing; it only receives the hook's timing
    assert watch_fsdp(StepReporter("grad-check", ingest="udp://127.0.0.1:9"), hooked)
    batch = to(make_collate(0.0)(samples(BATCH, 7 + rank)), device)
    for model in (default, hooked):
        model(**batch)["loss"].backward()
    return all(torch.equal(a.grad, b.grad) for a, b in
               zip(default.parameters(), hooked.parameters(), strict=True))


def plain(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.train import StepReporter

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # fp32: what the frameworks report for this float32 model (the SDK defaults to bf16)
    rep = StepReporter(args.job, flops_per_token=FLOPS_PER_TOKEN, precision="fp32",
                       gpu_uuid=args.uuid or None)
    identical = None
    if args.mode == "plain-fsdp":
        identical = fsdp_grads_identical(device, rank)
    torch.manual_seed(0)
    model: nn.Module = TinyLM().to(device)
    if args.mode == "plain-fsdp":
        from stepscope.train.fsdp import watch_fsdp

        model = fsdp_wrap(model, device)
        watched = watch_fsdp(rep, model) is not None
    else:
        model = DistributedDataParallel(model)
        watched = rep.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        samples(args.steps * BATCH, 100 + rank), batch_size=BATCH,
        collate_fn=make_collate(args.collate_sleep))
    for batch in rep.timed(loader):
        with rep.step(tokens=TOKENS):
            model(**to(batch, device))["loss"].backward()
            opt.step()
            opt.zero_grad()
    rep.close(timeout=5)
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "steps": rep.steps, "dropped": rep.dropped,
            "errors": 0, "comm_watched": bool(watched), "grads_identical": identical}


def lightning(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from stepscope.train.lightning import StepscopeCallback

    fsdp = args.mode == "lightning-fsdp"
    world = int(os.environ.get("WORLD_SIZE", "1"))

    class Module(pl.LightningModule):
        # Lightning's ThroughputMonitor convention, which the callback reads
        flops_per_batch = FLOPS_PER_TOKEN * TOKENS

        def __init__(self) -> None:
            super().__init__()
            self.lm: nn.Module = TinyLM()

        def configure_model(self) -> None:
            if fsdp and device.type == "cpu":
                # Lightning's FSDP passes device_id=None on the CPU, which torch's FSDP
                # refuses; wrapped here, Lightning keeps our wrapping.
                self.lm = fsdp_wrap(self.lm, device)

        def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.lm(**batch)["loss"]
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    cb = StepscopeCallback(args.job, gpu_uuid=args.uuid or None)
    strategy: Any = "auto"
    if world > 1:
        strategy = FSDPStrategy(process_group_backend="gloo" if device.type == "cpu" else None,
                                auto_wrap_policy={nn.Linear}, use_orig_params=True,
                                ) if fsdp else DDPStrategy()
    trainer = pl.Trainer(
        accelerator=device.type, devices=world, num_nodes=1, strategy=strategy, max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[cb])
    loader = torch.utils.data.DataLoader(
        samples(args.steps * BATCH * world, 100), batch_size=BATCH,
        collate_fn=make_collate(args.collate_sleep))
    trainer.fit(Module(), loader)
    rep = cb.reporter
    assert rep is not None
    return {"rank": trainer.global_rank, "world": world, "steps": rep.steps,
            "dropped": rep.dropped, "errors": cb.errors, "comm_watched": bool(cb._comm)}


def hf_trainer(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from stepscope.train.hf import StepscopeCallback

    world = int(os.environ.get("WORLD_SIZE", "1"))
    targs = TrainingArguments(
        output_dir=str(Path(args.result).parent / "hf-out"), per_device_train_batch_size=BATCH,
        max_steps=args.steps, learning_rate=0.01, use_cpu=device.type == "cpu",
        report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, ddp_backend="gloo" if device.type == "cpu" else None,
        lr_scheduler_type="constant", seed=0)
    torch.manual_seed(0)
    trainer = Trainer(model=TinyLM(), args=targs,
                      train_dataset=samples(args.steps * BATCH * world, 100),
                      data_collator=make_collate(args.collate_sleep))
    cb = StepscopeCallback.attach(trainer, args.job, flops_per_token=FLOPS_PER_TOKEN,
                                  gpu_uuid=args.uuid or None)
    trainer.train()
    rep = cb.reporter
    assert rep is not None
    comm = type(trainer.model_wrapped).__name__ == "DistributedDataParallel" and bool(
        getattr(trainer.model_wrapped, "_comm_hooks", None))
    return {"rank": targs.process_index, "world": world, "steps": rep.steps,
            "dropped": rep.dropped, "errors": cb.errors, "comm_watched": comm}


def accelerate(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from accelerate import Accelerator

    from stepscope.train.accelerate import AcceleratorReporter

    accelerator = Accelerator(cpu=device.type == "cpu")
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        samples(args.steps * BATCH * accelerator.num_processes, 100), batch_size=BATCH,
        collate_fn=make_collate(args.collate_sleep))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    steps = AcceleratorReporter(accelerator, args.job, model=model,
                                flops_per_token=FLOPS_PER_TOKEN, gpu_uuid=args.uuid or None)
    for batch in steps.timed(loader):
        with accelerator.accumulate(model), steps.step(tokens=TOKENS):
            accelerator.backward(model(**batch)["loss"])
            opt.step()
            opt.zero_grad()
    steps.close(timeout=5)
    accelerator.wait_for_everyone()
    comm = bool(getattr(model, "_comm_hooks", None))
    accelerator.end_training()
    return {"rank": accelerator.process_index, "world": accelerator.num_processes,
            "steps": steps.reporter.steps, "dropped": steps.reporter.dropped,
            "errors": steps.errors, "comm_watched": comm}


MODES = {"plain-ddp": plain, "plain-fsdp": plain, "lightning-ddp": lightning,
         "lightning-fsdp": lightning, "hf-trainer": hf_trainer, "accelerate": accelerate}


def launch(mode: str, job: str, result: Path, ingest: str, *, ranks: int, steps: int,
           collate_sleep: float, device: str = "cpu", uuids: dict[str, str] | None = None,
           ) -> list[subprocess.Popen[str]]:
    """Start this script once per rank, torchrun-style, appending results to ``result``.
    ``uuids``: the GPU UUID each rank reports, by rank (CUDA ranks find their own)."""
    from tests.support.ports import free_port  # the test's process imports this, not a rank

    port = free_port()
    exporter_pkg = Path(__file__).resolve().parents[2] / "exporter"
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
               "OMP_NUM_THREADS": "1", "STEPSCOPE_INGEST": ingest,
               "PYTHONPATH": str(exporter_pkg),
               # transformers and Lightning: offline, no telemetry
               "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, __file__, "--mode", mode, "--job", job, "--result", str(result),
               "--steps", str(steps), "--collate-sleep", str(collate_sleep), "--device", device,
               "--uuid", (uuids or {}).get(str(rank), "")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--mode", choices=sorted(MODES), required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--collate-sleep", type=float, default=0.0)
    ap.add_argument("--uuid", default="", help="the rank's GPU UUID to report")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    start = time.monotonic()
    result = MODES[args.mode](args, device)
    result["seconds"] = round(time.monotonic() - start, 3)
    with open(args.result, "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0 if result["dropped"] == 0 and result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
