"""Prove the framework integrations on a GPU: each trains the same tiny model for N steps
against a running exporter, and the exporter's /metrics plus a JSON summary are kept.

Runs tests/workers/integration_worker.py (the workload the CPU tests use) once per
mode — plain-ddp (the plain-loop reference), lightning-ddp, hf-trainer, accelerate,
plain-fsdp, lightning-fsdp — on ``--ranks`` processes against one ``stepscope serve``
started here: the real NVML backend on ``--device cuda``, simulated GPUs on
``--device cpu`` (gloo; Lightning refuses FSDP on the CPU, so lightning-fsdp is skipped
there). Writes to ``--out`` (default ``$OUT``): ``metrics.txt`` (the last scrape),
``summary.json`` (per mode and rank: what /metrics serves and what the worker said),
``exporter.log`` and one ``MODE.log`` per mode; prints a table.

    python -m validation.gpu_integrations_validation --device cuda --out out/
    python -m validation.gpu_integrations_validation --device cpu --ranks 2 --out /tmp/v
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks._local import free_port, scrape, wait_for_exporter
from stepscope.shared.datagram import PHASES
from tests.support import REPO
from tests.workers.integration_worker import MODES, launch

ORDER = ("plain-ddp", "lightning-ddp", "hf-trainer", "accelerate", "plain-fsdp",
         "lightning-fsdp")
SERIES = {  # summary key: served family (prometheus_client's names, counters as *_total)
    "steps": "stepscope_steps_total",
    "warmup": "stepscope_warmup_steps_total",
    "tokens": "stepscope_tokens_total",
    "flops": "stepscope_model_flops_total",
    "step_count": "stepscope_step_duration_seconds_count",
    "step_seconds": "stepscope_step_duration_seconds_sum",
    "mfu": "stepscope_mfu_ratio",
    "dropped": "stepscope_sdk_dropped_datagrams_total",
}


def per_rank(text: str, job: str) -> dict[str, dict[str, Any]]:
    """What /metrics serves for ``job``, by rank."""
    out: dict[str, dict[str, Any]] = {}
    wanted = {name: key for key, name in SERIES.items()}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("training_job", s.labels.get("job")) != job:
                continue
            row = out.setdefault(s.labels["rank"], {"phases": {}})
            if s.name == "stepscope_step_phase_seconds_total":
                row["phases"][s.labels["phase"]] = s.value
            elif s.name in wanted:
                row[wanted[s.name]] = s.value
            if s.name == "stepscope_training_rank_info":
                row["info"] = dict(s.labels)
    return out


def gpu_uuids(text: str) -> dict[str, str]:
    """The exporter's GPUs' UUIDs by index (the simulated ones on the CPU)."""
    return {s.labels["gpu"]: s.labels["UUID"] for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "stepscope_gpu_up"}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--ranks", type=int, default=0,
                    help="processes per mode (default: the GPUs, at most 2; 2 on the CPU)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--collate-sleep", type=float, default=0.0,
                    help="seconds the loader sleeps per batch (a slow loader)")
    ap.add_argument("--modes", default=",".join(ORDER))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {sorted(MODES)}")
    if args.device == "cpu" and "lightning-fsdp" in modes:
        modes.remove("lightning-fsdp")  # Lightning: "strategy fsdp requires a GPU"
        print("lightning-fsdp skipped: Lightning runs FSDP on GPUs only")
    ranks = args.ranks
    if ranks <= 0:
        if args.device == "cuda":
            import torch

            ranks = min(2, torch.cuda.device_count())
            if ranks == 0:
                print("gpu_integrations_validation: no CUDA device", file=sys.stderr)
                return 2
        else:
            ranks = 2

    port = free_port()
    # a short path: a Unix socket's name is limited to 107 bytes, --out may be longer
    ingest = f"unix://{tempfile.mkdtemp(prefix='ss-val-')}/ingest.sock"
    serve = [sys.executable, "-m", "stepscope", "serve", "--listen", f"127.0.0.1:{port}",
             "--ingest", ingest, "--mfu-window", "600"]
    if args.device == "cpu":
        serve += ["--simulate", str(ranks)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    log_path = args.out / "exporter.log"
    with open(log_path, "w") as log:
        # its own session: the workers' signals and exits never reach it
        exporter = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
    try:
        if not wait_for_exporter(port, exporter, log_path):
            return 1
        # on the GPU the ranks report their own UUIDs (torch knows the device)
        uuids = gpu_uuids(scrape(port)) if args.device == "cpu" else {}
        workers: dict[str, Any] = {}
        for mode in modes:
            result = args.out / f"{mode}.jsonl"
            result.unlink(missing_ok=True)
            start = time.monotonic()
            procs = launch(mode, mode, result, ingest, ranks=ranks, steps=args.steps,
                           collate_sleep=args.collate_sleep, device=args.device, uuids=uuids)
            outs = [p.communicate(timeout=900)[0] for p in procs]
            (args.out / f"{mode}.log").write_text("\n".join(outs))
            lines = result.read_text().splitlines() if result.exists() else []
            workers[mode] = {"returncodes": [p.returncode for p in procs],
                             "wall_seconds": round(time.monotonic() - start, 2),
                             "ranks": [json.loads(x) for x in lines]}
        deadline = time.monotonic() + 15
        while True:  # until every rank's last step has been scraped (or the deadline)
            text = scrape(port)
            served = {m: per_rank(text, m) for m in modes}
            complete = all(len(served[m]) == ranks and all(
                r.get("steps") == args.steps for r in served[m].values()) for m in modes)
            if complete or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        exporter.terminate()
        exporter.wait(timeout=15)
    (args.out / "metrics.txt").write_text(text)
    summary = {"device": args.device, "ranks": ranks, "steps": args.steps,
               "collate_sleep": args.collate_sleep, "complete": complete,
               "modes": {m: {"worker": workers[m], "served": served[m]} for m in modes}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))

    print(f"{'mode':15} {'rank':>4} {'steps':>5} {'tokens':>7} {'GFLOP':>8} {'step ms':>8} "
          + " ".join(f"{p:>9}" for p in PHASES) + f" {'sum/step':>8} {'MFU':>9}")
    ok = complete
    for mode in modes:
        ok = ok and all(rc == 0 for rc in workers[mode]["returncodes"])
        for rank, row in sorted(served[mode].items()):
            count = row.get("step_count") or 0.0
            seconds = row.get("step_seconds") or 0.0
            phases = [row["phases"].get(p, float("nan")) for p in PHASES]
            ratio = sum(phases) / seconds if seconds else float("nan")
            mfu = row.get("mfu")
            print(f"{mode:15} {rank:>4} {row.get('steps', 0):5.0f} {row.get('tokens', 0):7.0f} "
                  f"{row.get('flops', 0) / 1e9:8.3f} {1e3 * seconds / max(count, 1):8.2f} "
                  + " ".join(f"{1e3 * v / max(count, 1):7.2f}ms" for v in phases)
                  + f" {ratio:8.4f} " + (f"{mfu:9.2e}" if mfu is not None else f"{'-':>9}"))
    print(f"wrote {args.out}/metrics.txt and summary.json; complete={complete}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
