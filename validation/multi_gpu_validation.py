"""Issue 7: stepscope on every GPU of one host, with a real DDP job and a real straggler.

One script, two modes:

- GPU (default; an ``nvidia-h200-x2/x4/x8`` machine): ``stepscope serve`` on real NVML,
  a DDP job over ``--ranks`` GPUs (default all) with NCCL, one process per GPU, a bf16
  MLP of ~270 MB of gradients so the all-reduce is visible.
- ``--cpu``: the same logic with gloo, ``--ranks`` processes, ``stepscope serve
  --simulate N`` as the exporter; each rank reports a simulated GPU's UUID through
  ``StepReporter(gpu_uuid=...)`` and MFU is against a configured ``STEPSCOPE_PEAK_FLOPS``.

Checks (PASS / FAIL / SKIP each; exit 0 only when none FAILs):

1. labels: every GPU's series distinct (``gpu``, ``UUID``, ``device``, ``pci_bus_id``
   unique across GPUs, one label set per GPU in every ``DCGM_*`` family).
2. bytes (GPU only): NVLink or PCIe bytes/s of every GPU in use above its idle
   baseline during the DDP phase.
3. ddp: per rank, steps received, phases summing to step time, comm measured (> 0),
   MFU served with ``mfu_status="ok"`` and within 15% of FLOPs / step time / peak, the
   rank joined with the GPU it ran on.
4. straggler: one rank sleeps before each backward; ``/api/v1/diagnosis`` and
   ``stepscope diagnose --exporter URL --json`` read ``waiting_on_peer`` for every other
   rank with the slowed rank named in the evidence, and the slowed rank not waiting.
5. rules: the scraped step counters of the straggler phase become a promtool unit test
   of ``deploy/prometheus/rules/stepscope-recording.yml``: the slowed rank's
   ``training_job_rank:stepscope_straggler_score:ratio`` is the job's unique maximum.
6. nccl: ``stepscope nccl-check`` over the DDP phase's per-rank ``NCCL_DEBUG=INFO`` files
   (SKIP with ``--cpu``: gloo writes no NCCL log).

Writes to ``--out`` (default ``$OUT``): ``multi_gpu_validation.md`` (also printed),
``multi_gpu_validation.json``, ``straggler_rules_test.yml`` with a copy of the rule file
beside it (``cd OUT && promtool test rules straggler_rules_test.yml`` re-runs the rule
check anywhere), and ``raw.tar.gz`` (exporter and rank logs, NCCL logs, scrapes,
diagnosis documents, promtool output). NVLink multicast stays off in every process
started here (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from benchmarks._local import scrape
from validation.multi_gpu.ddp import check_ddp
from validation.multi_gpu.gpus import check_bytes, check_labels
from validation.multi_gpu.nccl import check_nccl
from validation.multi_gpu.report import table
from validation.multi_gpu.rules import check_rules
from validation.multi_gpu.run import JOB_DDP, JOB_SLOW, MULTICAST_OFF, Run
from validation.multi_gpu.straggler import check_straggler


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    os.environ.update(MULTICAST_OFF)
    if not args.cpu:
        if not torch.cuda.is_available():
            print("multi_gpu_validation: CUDA not available (use --cpu)", file=sys.stderr)
            return 2
        args.ranks = args.ranks or torch.cuda.device_count()
        if args.ranks > torch.cuda.device_count():
            print(
                f"multi_gpu_validation: {args.ranks} ranks, {torch.cuda.device_count()} GPUs",
                file=sys.stderr,
            )
            return 2
    args.ranks = args.ranks or 2
    if args.ranks < 2:
        print("multi_gpu_validation: a straggler needs at least 2 ranks", file=sys.stderr)
        return 2
    args.window = args.window or (8 if args.cpu else 15)
    args.seconds = args.seconds or (12.0 if args.cpu else 30.0)
    args.slow_seconds = args.slow_seconds or args.window + (6.0 if args.cpu else 10.0)
    args.seconds = max(args.seconds, args.window + 4)
    args.slow_seconds = max(args.slow_seconds, args.window + 4)
    args.delay = args.delay or (0.15 if args.cpu else 0.1)
    args.slow_rank = args.ranks - 1 if args.slow_rank < 0 else args.slow_rank
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    rep = run.rep
    t_start = time.monotonic()
    code = 1
    try:
        if not run.start_exporter():
            print((run.raw / "exporter.log").read_text())
            rep.check("exporter", False, "stepscope serve did not come up")
            return finish(run, time.monotonic() - t_start)
        idle = []
        for _ in range(3):
            idle.append(scrape(run.port))
            time.sleep(1.0)
        (run.raw / "metrics-idle.txt").write_text(idle[-1])
        info = check_labels(run, idle[-1])
        sim_uuids = [g["UUID"] for g in sorted(info, key=lambda g: int(g["gpu"]))]
        ddp = run.run_phase(JOB_DDP, args.seconds, 0.0, sim_uuids)
        (run.raw / "metrics-ddp-end.txt").write_text(ddp["scrapes"][-1][1])
        (run.raw / "ddp-diagnosis.json").write_text(json.dumps(ddp["diagnosis"], indent=2))
        used = check_ddp(run, ddp, info)
        check_bytes(run, idle, ddp["scrapes"], used)
        slow = run.run_phase(JOB_SLOW, args.slow_seconds, args.delay, sim_uuids)
        (run.raw / "metrics-straggler-end.txt").write_text(slow["scrapes"][-1][1])
        rep.data["straggler_results"] = slow["results"]
        check_straggler(run, slow)
        check_rules(run, slow)
        check_nccl(run)
        served = [
            line
            for line in slow["scrapes"][-1][1].splitlines()
            if line.startswith(("stepscope_training_rank_info{", "stepscope_mfu_ratio{"))
            or (line.startswith("stepscope_bottleneck{") and line.endswith(" 1"))
        ]
        rep.add(
            "## What was served at the end of the straggler phase (excerpt)",
            "",
            "```",
            *served,
            "```",
            "",
        )
        code = finish(run, time.monotonic() - t_start)
    finally:
        run.stop_exporter()
        shutil.rmtree(run.tmp, ignore_errors=True)
    return code


def finish(run: Run, elapsed: float) -> int:
    a, rep = run.args, run.rep
    failed = [c for c in rep.checks if c.status == "FAIL"]
    mode = (
        f"CPU rehearsal: gloo, {a.ranks} processes, `stepscope serve --simulate {a.ranks}`"
        if a.cpu
        else f"{a.ranks} GPUs, NCCL, `stepscope serve` on NVML"
    )
    head = [
        "# Multi-GPU validation (issue 7)",
        "",
        f"Mode: {mode}. Host: {os.uname().nodename}, {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}, torch {_torch_version()}. Took {elapsed:.0f} s.",
        "",
        "Command: `python -m validation.multi_gpu_validation " + " ".join(sys.argv[1:]) + "`",
        "",
        f"Exporter: `stepscope {rep.data.get('exporter_cmd', '').split('stepscope ', 1)[-1]}`"
        " (config: `interval: 1`, `mfu_window: 600`, `diagnosis: {window: "
        f"{a.window}}}`, ingest on a Unix socket in a temp dir). Every rank's environment: "
        + ", ".join(f"`{k}={v}`" for k, v in MULTICAST_OFF.items())
        + ("" if a.cpu else ", `NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE` per rank")
        + ".",
        "",
        f"**Result: {'PASS' if not failed else 'FAIL'}**",
        "",
        *table(
            ["check", "status", "detail"],
            [[c.name, f"**{c.status}**", c.detail.replace("|", "/")] for c in rep.checks],
        ),
        "",
    ]
    text = "\n".join(head + rep.sections) + "\n"
    (a.out / "multi_gpu_validation.md").write_text(text)
    rep.data["checks"] = [c.__dict__ for c in rep.checks]
    rep.data["args"] = {k: str(v) for k, v in vars(a).items()}
    (a.out / "multi_gpu_validation.json").write_text(json.dumps(rep.data, indent=2, default=str))
    with tarfile.open(a.out / "raw.tar.gz", "w:gz") as tar:
        tar.add(run.raw, arcname="raw")
    shutil.rmtree(run.raw, ignore_errors=True)
    print(text)
    return 0 if not failed else 1


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return "absent"


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cpu", action="store_true", help="gloo + simulated GPUs (no CUDA)")
    ap.add_argument("--ranks", type=int, default=0, help="ranks (GPU default: all GPUs; CPU: 2)")
    ap.add_argument("--seconds", type=float, default=0.0, help="measured s of the DDP phase")
    ap.add_argument(
        "--slow-seconds",
        type=float,
        default=0.0,
        help="measured s of the straggler phase (default window + 6/10)",
    )
    ap.add_argument("--window", type=int, default=0, help="diagnosis window s (CPU 8, GPU 15)")
    ap.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="s the slowed rank sleeps before each backward (CPU 0.15, GPU 0.1)",
    )
    ap.add_argument("--slow-rank", type=int, default=-1, help="default: the last rank")
    ap.add_argument("--promtool", default="", help="promtool binary (default: on PATH)")
    ap.add_argument("--startup-timeout", type=float, default=150.0)
    return orchestrate(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
