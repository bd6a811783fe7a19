"""The diagnosis on a GPU, class by class: a confusion table of verdicts (issue 13).

    python -m validation.gpu_diagnose_wave2 --out DIR            # on a CUDA GPU
    python -m validation.gpu_diagnose_wave2 --out DIR --cpu      # rehearsal, simulated GPU

Each class is a small training loop made to have one bottleneck, reporting every step
through the SDK (``StepReporter``: CUDA event timing on a GPU) to a ``stepscope serve``
that this script starts for the class (detached: the exporter must not be a child of the
training process, which stepscope reads for its DataLoader workers). After the
diagnosis window has filled, the rank's verdict is read from ``/api/v1/diagnosis`` once
a second for ``--seconds``; the counts per verdict make the row of the table.

- ``compute``: bf16 matmuls of 8192 x 8192; expected ``compute``.
- ``fp32_no_tensor``: fp32 matmuls, TF32 off; ``compute`` + ``fp32_no_tensor``.
- ``launch_bound``: a 16-layer MLP of width 64, batch 8, 4 micro-batches a step with
  ``loss.item()`` after each; ``host_bound``.
- ``memory_bound``: layer norm, GELU, residual adds and softmax on a 16384 x 8192 bf16
  tensor; ``compute`` + ``memory_bound``.
- ``input``: batches made in the training process (``num_workers=0``), CPU-heavy;
  ``input``.
- ``input_workers``: the same preprocessing in CPUs/4 workers, CPUs free; ``input``.
- ``input_cpu``: pinned to 4 CPUs with 4 workers, heavier preprocessing; ``input_cpu``.
- ``input_io``: 2 workers reading samples from a store throttled to 2 MB/s; ``input_io``.
- ``input_contended``: the ``input_workers`` loader with 2 workers on a host whose CPUs
  ``--burners`` unrelated processes (default one per CPU; detached, so outside the rank's
  process tree) keep busy: ``host_contended`` (issue 34: it read ``input_cpu``, "the
  DataLoader workers have the CPUs pegged", with 16 processes pegging the H100 host's 16
  CPUs and the rank's 2 workers on 1.5 cores). Not in the default classes.

``--cpu`` runs the same loops on the CPU against an exporter with one simulated GPU
whose scenario plays what the GPU would show for the class (``launch_bound``: SM active
~2% with kernels 40% of the time; ``memory_bound``: ``kernels: elementwise``; input
classes: a sawtooth of a GPU waiting for data): the host side (the SDK's timing, the
process's and workers' CPU, the loader) is real, the GPU side is scripted. It proves the
script and the host rules; only a GPU run checks the GPU rules.

Writes ``confusion.md``, ``confusion.json`` and each class's exporter log to ``--out``
(default ``$OUT``). About 30 s a class, 4 minutes in all on a 2-CPU machine with
``--cpu``; ``--budget`` (default 290 s) skips the classes that would start after it, so a
run ends within about 6 minutes whatever happens.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._local import start_detached, stop_pid
from tests.support import REPO
from validation._classes import (
    ExporterDidNotStart,
    VerdictPolls,
    class_gpu_uuid,
    pick_device,
    start_class_exporter,
    tally,
)

# class -> (expected kind, expected modifier or None)
EXPECTED: dict[str, tuple[str, str | None]] = {
    "compute": ("compute", None),
    "fp32_no_tensor": ("compute", "fp32_no_tensor"),
    "launch_bound": ("host_bound", None),
    "memory_bound": ("compute", "memory_bound"),
    "input": ("input", None),
    "input_workers": ("input", None),
    "input_cpu": ("input_cpu", None),
    "input_io": ("input_io", None),
    "input_contended": ("host_contended", None),
}
# --cpu: what the simulated GPU shows for each class (docs/scenarios.md)
WAITING_GPU = {"activity": "sawtooth", "period": 1.0, "duty": 0.3}
CPU_SCENARIOS: dict[str, dict[str, Any]] = {
    "compute": {},
    "fp32_no_tensor": {"precision": "fp32"},
    "launch_bound": {"activity": "sawtooth", "period": 0.01, "duty": 0.4, "level": 0.05},
    "memory_bound": {"kernels": "elementwise", "level": 0.99},
    "input": WAITING_GPU,
    "input_workers": WAITING_GPU,
    "input_cpu": WAITING_GPU,
    "input_io": WAITING_GPU,
    "input_contended": WAITING_GPU,
}
WINDOW = 8.0  # diagnosis window (s): short, so a class is judged soon after it starts
SAMPLE = 3 * 64 * 64  # bytes of one stored sample (input_io)


# ------------------------------------------------------------------ loaders (picklable:
# DataLoader workers are spawned, and spawn re-imports this module)


class Preprocessed:
    """Synthetic images made and augmented on the CPU per item (blur passes)."""

    def __init__(self, passes: int, size: int = 96) -> None:
        self.passes, self.size = passes, size

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> Any:
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(i)
        x = torch.rand(1, 3, self.size, self.size, generator=g)
        kernel = torch.full((3, 1, 5, 5), 1 / 25)
        for _ in range(self.passes):  # blur + jitter: CPU work per sample
            x = F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), kernel, groups=3) * 1.01
        return x[0, :, :64, :64].contiguous()


class SlowStore:
    """Samples read from a file through a reader throttled to ``mbps`` MB/s."""

    def __init__(self, path: str, mbps: float) -> None:
        self.path, self.mbps = path, mbps

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> Any:
        import torch

        with open(self.path, "rb") as f:
            f.seek((i * SAMPLE) % max(1, os.path.getsize(self.path) - SAMPLE))
            raw = f.read(SAMPLE)
        time.sleep(len(raw) / (self.mbps * 1e6))  # the store's bandwidth
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, 64, 64).float() / 255


# ------------------------------------------------------------------ the classes' loops


def _loop_factory(name: str, device: str, tmp: Path) -> tuple[Callable[[], Any], Any, str]:
    """(one training step without the reporter, the loader or None, the precision)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    cuda = device == "cuda"
    if name == "compute":
        n = 8192 if cuda else 768
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        return (lambda: [a @ b for _ in range(4)]), None, "bf16"
    if name == "fp32_no_tensor":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        n = 4096 if cuda else 768
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        return (lambda: [a @ b for _ in range(4)]), None, "fp32"
    if name == "launch_bound":
        layers: list[nn.Module] = []
        for _ in range(16):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model = nn.Sequential(*layers).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def tiny() -> float:
            total = 0.0
            for _ in range(4):  # 4 micro-batches a step: ~800 tiny kernels, 4 host syncs
                x = torch.randn(8, 64, device=device)
                loss = model(x).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.item())  # a host sync, as logging code does
            return total

        return tiny, None, "fp32"
    if name == "memory_bound":
        rows, cols = (16384, 8192) if cuda else (1024, 1024)
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)

        def elementwise() -> Any:
            with torch.no_grad():
                y = x
                for _ in range(4):  # norm, activation, residual, softmax: all DRAM-bound
                    h = F.layer_norm(y, (cols,))
                    h = F.gelu(h) * 0.5
                    y = (y + h).softmax(dim=-1) * cols
            return y

        return elementwise, None, "bf16"
    # input classes: a small conv net on the GPU, batches from a loader; on the CPU a
    # linear layer, so the training process stays as light as it is beside a GPU
    net = (nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10)) if cuda else
           nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 10))).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    cpus = len(os.sched_getaffinity(0))
    spawn = "spawn" if cuda else None  # forked workers break on inherited CUDA state
    if name == "input":
        workers, dataset = 0, Preprocessed(passes=6)
    elif name == "input_workers":
        workers, dataset = max(1, cpus // 4), Preprocessed(passes=6)
    elif name == "input_contended":
        workers, dataset = 2, Preprocessed(passes=6)
    elif name == "input_cpu":
        workers, dataset = cpus, Preprocessed(passes=12)
    else:  # input_io
        store = tmp / "store.bin"
        if not store.exists():
            store.write_bytes(os.urandom(64 * SAMPLE))
        workers, dataset = 2, SlowStore(str(store), mbps=2.0)  # type: ignore[assignment]
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=16, num_workers=workers, persistent_workers=workers > 0,
        multiprocessing_context=spawn if workers else None, prefetch_factor=2 if workers else None)

    def conv(batch: Any) -> None:
        loss = net(batch.to(device, non_blocking=True)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return conv, loader, "fp32"  # type: ignore[return-value]


BURN = "while True: pass"  # one unrelated process pegging a CPU


def run_class(name: str, device: str, seconds: float, tmp: Path, out: Path,
              env: dict[str, str], burners: int = 0) -> dict[str, Any]:  # fmt: skip
    """Start an exporter for the class, run its loop, poll its verdict; the row."""
    import torch

    from stepscope.train import StepReporter

    try:
        exporter, doc = start_class_exporter(name, device, tmp, out / f"exporter-{name}.log",
                                             env, WINDOW, CPU_SCENARIOS[name])  # fmt: skip
    except ExporterDidNotStart as err:
        return {"class": name, "error": "exporter did not start", "log": str(err)}
    affinity = os.sched_getaffinity(0)
    # the class's noisy neighbours: detached, so not the rank's children (its workers)
    noisy = [start_detached([sys.executable, "-c", BURN], Path(os.devnull), env)
             for _ in range(burners if name == "input_contended" else 0)]  # fmt: skip
    try:
        uuid = class_gpu_uuid(device, torch, doc)
        if name == "input_cpu" and len(affinity) > 4:
            os.sched_setaffinity(0, set(sorted(affinity)[:4]))  # workers inherit it
        step, loader, precision = _loop_factory(name, device, tmp)
        rep = StepReporter(name, ingest=exporter.ingest, gpu_uuid=uuid, precision=precision,
                           warmup_steps=3)  # fmt: skip
        polls = VerdictPolls(exporter, WINDOW, seconds)
        poller = polls.start()
        t0 = time.perf_counter()
        steps = 0
        batches: Iterator[Any] = iter(rep.timed(loader)) if loader is not None else iter(())
        while not polls.stop.is_set() and time.perf_counter() - t0 < seconds + WINDOW + 30:
            if loader is not None:
                batch = next(batches)
                with rep.step():
                    step(batch)  # type: ignore[call-arg]
            else:
                with rep.step():
                    step()
            steps += 1
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        polls.stop.set()
        poller.join(timeout=5)
        rep.close()
        # the loader's workers must be gone before the next class: they would count as
        # its DataLoader workers (the same training process)
        del loader, batches, step
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    finally:
        for pid in noisy:
            stop_pid(pid)
        os.sched_setaffinity(0, affinity)
        exporter.stop()
    return tally(name, EXPECTED[name], polls.polls, steps, elapsed, SIGNALS)


SIGNALS = ("sm_active", "gpu_util", "dram_active", "tensor_active", "fp32_active",
           "main_cpu_cores", "data_wait_share", "compute_share", "dataloader_cpu_cores",
           "cpu_busy", "job_cpu_share", "outside_cpu_share")  # fmt: skip


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def render(rows: list[dict[str, Any]], device_name: str, cpus: int) -> str:
    """The confusion table: rows are classes, columns the verdict kinds seen."""
    from stepscope.diagnose.model import KINDS

    seen = [k for k in KINDS if any(k in r.get("counts", {}) for r in rows)]
    out = [f"# Diagnosis confusion table on {device_name} ({cpus} CPUs)", "",
           "Polls of the rank's verdict, one a second after the diagnosis window "
           f"({WINDOW:g} s) filled. **right**: the expected kind with its modifier.", "",
           "| class | expected | " + " | ".join(seen) + " | right | steps/s | SM | DRAM | "
           "tensor | main CPU |", "|---|---|" + "---|" * (len(seen) + 6)]  # fmt: skip
    for r in rows:
        if "error" in r:
            out.append(f"| {r['class']} | {r.get('expected', '')} | error: {r['error']} |")
            continue
        s = r["signals"]
        cells = [str(r["counts"].get(k, "")) for k in seen]
        main = s.get("main_cpu_cores")
        out.append(
            f"| {r['class']} | `{r['expected']}` | " + " | ".join(cells)
            + f" | **{r['right']}/{r['polls']}** | {r['steps_per_s']:.1f} | "
            f"{_pct(s.get('sm_active'))} | {_pct(s.get('dram_active'))} | "
            f"{_pct(s.get('tensor_active'))} | {'-' if main is None else f'{main:.2f}'} |"
        )
    out += ["", "Verdicts with modifiers, advice and evidence (last poll):", ""]
    for r in rows:
        if "error" in r:
            continue
        out.append(f"- **{r['class']}**: {r['verdicts']}; advice: {r['advice']}")
        out += [f"  - {e}" for e in r["evidence"]]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cpu", action="store_true", help="rehearse on the CPU, simulated GPU")
    ap.add_argument("--seconds", type=float, default=12.0, help="verdict polls per class")
    ap.add_argument("--classes", nargs="*", choices=list(EXPECTED),
                    default=[c for c in EXPECTED if c != "input_contended"])  # fmt: skip
    ap.add_argument("--budget", type=float, default=290.0,
                    help="seconds after which no further class starts")
    ap.add_argument("--burners", type=int, default=len(os.sched_getaffinity(0)),
                    help="unrelated CPU-bound processes of input_contended (default one "
                    "per CPU)")  # fmt: skip
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    picked = pick_device(args.cpu, "gpu_diagnose_wave2")
    if picked is None:
        return 2
    device, device_name = picked
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    cpus = len(os.sched_getaffinity(0))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    text = render(rows, device_name, cpus)
    with tempfile.TemporaryDirectory(prefix="stepscope-wave2-") as tmp:
        for name in args.classes:
            if time.monotonic() - started > args.budget:
                rows.append({"class": name, "expected": "", "error": "skipped: over --budget"})
                continue
            try:
                row = run_class(name, device, args.seconds, Path(tmp), args.out, env,
                                args.burners)  # fmt: skip
            except Exception as exc:  # one broken class must not lose the others
                row = {"class": name, "expected": "", "error": repr(exc)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("evidence", "log")}),
                  flush=True)  # fmt: skip
            # written after every class: a run cut short still leaves its rows
            text = render(rows, device_name, cpus)
            (args.out / "confusion.md").write_text(text)
            (args.out / "confusion.json").write_text(json.dumps(
                {"device": device_name, "cpus": cpus, "window": WINDOW, "rows": rows},
                indent=2))  # fmt: skip
    print(text)
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
