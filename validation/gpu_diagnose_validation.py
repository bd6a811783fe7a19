"""docs/field-guide.md's preprocessing × num_workers example on a GPU, a verdict per row.

resnet18 (fp32) on synthetic images, light (resize only) or heavy preprocessing (512
resize + RandomResizedCrop + ColorJitter + rotation + blur, on the CPU), for several
``num_workers``; a ``stepscope serve`` started here watches it through the SDK
(``StepReporter``, CUDA event timing). Per row it records steps/s (counted here, between
two ``torch.cuda.synchronize()``), GPU util and SM active (the exporter's
``DCGM_FI_DEV_GPU_UTIL`` / ``DCGM_FI_PROF_SM_ACTIVE`` for the GPU, averaged over the
row's scrapes), the data-wait share and stepscope's verdict at the end of the row.

Writes ``diagnose_validation.md`` (a markdown table) and ``.json`` to ``--out``
(default ``$OUT``). About 9 rows x (``--seconds`` + start-up): under 5 minutes at the
default 18 s. ``--cpus N`` pins the run (and its workers) to N CPUs, like the
reference's 4-vCPU T4 machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._local import free_port, pid_alive, start_detached_exporter, stop_pid
from benchmarks._local import get as get_url
from tests.support import REPO


def get(port: int, path: str) -> bytes:
    return get_url(f"http://127.0.0.1:{port}{path}")


def gpu_value(text: str, name: str, uuid: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'UUID="{uuid}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


class Synthetic:
    """Random RGB images of ``size`` made per item (no disk), and a label."""

    def __init__(self, heavy: bool, size: int = 256) -> None:
        import torchvision.transforms as T

        self.size = size
        if heavy:
            self.tf = T.Compose([
                T.Resize(512), T.RandomResizedCrop(224), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                T.RandomRotation(15), T.GaussianBlur(5), T.ToTensor(),
            ])  # fmt: skip
        else:
            self.tf = T.Compose([T.Resize((224, 224)), T.ToTensor()])

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch
        import torchvision.transforms.functional as TF

        g = torch.Generator().manual_seed(i)
        img = TF.to_pil_image(torch.randint(0, 256, (3, self.size, self.size), generator=g,
                                            dtype=torch.uint8))  # fmt: skip
        return self.tf(img), i % 1000


def run_row(heavy: bool, workers: int, seconds: float, port: int, ingest: str,
            uuid: str) -> dict[str, Any]:  # fmt: skip
    import torch
    import torchvision

    from stepscope.train import StepReporter

    job = f"{'heavy' if heavy else 'light'}-w{workers}"
    model = torchvision.models.resnet18().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(
        Synthetic(heavy), batch_size=64, num_workers=workers, pin_memory=True,
        persistent_workers=workers > 0, prefetch_factor=2 if workers else None,
        # this process has initialised CUDA: forked workers crash on inherited CUDA
        # state (seen on the H200: "CUDA error: initialization error"), so spawn them
        multiprocessing_context="spawn" if workers else None,
    )  # fmt: skip
    rep = StepReporter(job, precision="fp32", warmup_steps=5, ingest=ingest)
    scrapes: list[tuple[float | None, float | None]] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(1.0):
            text = get(port, "/metrics").decode()
            scrapes.append((gpu_value(text, "DCGM_FI_DEV_GPU_UTIL", uuid),
                            gpu_value(text, "DCGM_FI_PROF_SM_ACTIVE", uuid)))  # fmt: skip

    it = iter(rep.timed(loader))

    def train_step(batches: Any) -> None:
        x, y = next(batches)
        with rep.step(tokens=64):
            loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)),
                                                     y.cuda(non_blocking=True))  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for _ in range(5):  # warm-up (cuDNN autotune, workers starting)
        train_step(it)
    torch.cuda.synchronize()
    th = threading.Thread(target=scraper, daemon=True)
    th.start()
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        train_step(it)
        steps += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    time.sleep(1.5)  # let the last steps' events and a sampling pass reach the exporter
    stop.set()
    th.join()
    doc = json.loads(get(port, "/api/v1/diagnosis"))
    verdict = next((v for v in doc["verdicts"] if v["subject"]["job"] == job), None)
    rep.close()
    del loader, it
    utils = [u for u, _ in scrapes if u is not None]
    sms = [s for _, s in scrapes if s is not None]
    sig = verdict["signals"] if verdict else {}
    return {
        "preprocessing": "heavy" if heavy else "light",
        "num_workers": workers,
        "steps_per_s": steps / elapsed,
        "gpu_util": sum(utils) / len(utils) if utils else None,
        "sm_active": sum(sms) / len(sms) if sms else None,
        "data_wait_share": sig.get("data_wait_share"),
        "dataloader_cpu_cores": sig.get("dataloader_cpu_cores"),
        "cpu_busy": sig.get("cpu_busy"),
        "verdict": (verdict["kind"] + "".join(f"+{m}" for m in verdict["modifiers"]))
        if verdict else "none",
        "evidence": verdict["evidence"] if verdict else [],
    }


def fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.0f}%"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--seconds", type=float, default=18.0, help="measured seconds per row")
    ap.add_argument("--cpus", type=int, default=0, help="pin to this many CPUs (0: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("gpu_diagnose_validation: CUDA not available", file=sys.stderr)
        return 2
    if args.cpus:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cpus]))
    cpus = len(os.sched_getaffinity(0))
    torch.set_num_threads(cpus)  # intra-op threads beyond the pinned CPUs only spin
    torch.backends.cudnn.benchmark = True
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-diag-"))
    ingest = f"unix://{tmp}/ingest.sock"
    (tmp / "stepscope.yaml").write_text(
        f"interval: 1\ningest: {ingest}\nmax_jobs: 16\ndiagnosis: {{window: 10}}\n"
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    exporter_pid = start_detached_exporter(
        ["--listen", f"127.0.0.1:{port}", "--config", str(tmp / "stepscope.yaml")],
        args.out / "diagnose_exporter.log", env)

    def exporter_alive() -> bool:
        return pid_alive(exporter_pid)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(port, "/readyz")
                break
            except OSError:
                if not exporter_alive() or time.monotonic() > deadline:
                    print((args.out / "diagnose_exporter.log").read_text())
                    return 1
                time.sleep(0.2)
        torch.cuda.init()
        from stepscope.train._env import cuda_device_uuid

        torch.cuda.set_device(0)
        uuid = cuda_device_uuid(torch, 0) or ""
        rows: list[dict[str, Any]] = []
        plan = [(False, w) for w in (0, 2, 4, 8)] + [(True, w) for w in (0, 1, 2, 3)]
        plan.append((True, cpus))  # every CPU a worker: the CPUs are the limit
        for heavy, workers in plan:
            try:
                row = run_row(heavy, workers, args.seconds, port, ingest, uuid)
            except Exception as exc:  # one broken row must not lose the others
                row = {"preprocessing": "heavy" if heavy else "light", "num_workers": workers,
                       "steps_per_s": 0.0, "gpu_util": None, "sm_active": None,
                       "data_wait_share": None, "dataloader_cpu_cores": None,
                       "cpu_busy": None, "verdict": f"error: {exc}", "evidence": []}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "evidence"}), flush=True)
    finally:
        stop_pid(exporter_pid)
    gpu = torch.cuda.get_device_name(0)
    lines = [
        f"# Diagnosis on {gpu}: the field guide's preprocessing × num_workers example "
        f"(resnet18 fp32, batch 64, synthetic 256 px images, {cpus} CPUs)",
        "",
        "| preprocessing | num_workers | steps/s | GPU util | SM active | data wait | "
        "loader CPU cores | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preprocessing']} | {r['num_workers']} | {r['steps_per_s']:.2f} | "
            f"{fmt(r['gpu_util'] / 100 if r['gpu_util'] is not None else None, True)} | "
            f"{fmt(r['sm_active'], True)} | {fmt(r['data_wait_share'], True)} | "
            f"{fmt(r['dataloader_cpu_cores'])} | `{r['verdict']}` |"
        )
    lines += ["", "Evidence per row:", ""]
    for r in rows:
        lines.append(f"- {r['preprocessing']}, num_workers={r['num_workers']}: "
                     + "; ".join(r["evidence"]))  # fmt: skip
    text = "\n".join(lines) + "\n"
    (args.out / "diagnose_validation.md").write_text(text)
    (args.out / "diagnose_validation.json").write_text(json.dumps(rows, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
