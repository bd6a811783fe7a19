"""Prove the NVML path on a real GPU: what the exporter serves under known loads.

Runs, on a machine with an NVIDIA GPU and PyTorch:

1. ``stepscope serve`` (from this checkout) as an unprivileged user (uid/gid 65534),
   so the run also shows whether NVML and GPM work without root;
2. phases of known work on GPU 0 via PyTorch: idle, a bf16 matmul loop (tensor
   cores), an fp32 matmul loop with TF32 off (FP32 pipe, no tensor cores), idle again;
3. near the end of each phase, three scrapes one interval apart; the median of the
   relevant series goes into a Markdown table.

Writes ``validation.md`` (commands, the table, the exporter's log) and the raw
scrapes to the output directory (``$OUT`` or ``--out``). Exit status 2 with one
line if there is no GPU or no torch.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks._local import free_port, scrape, wait_for_exporter
from tests.support import REPO

WORKLOAD = textwrap.dedent(
    """
    import sys, time, torch
    kind, seconds = sys.argv[1], float(sys.argv[2])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[kind]
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    end = time.monotonic() + seconds
    iters = 0
    t0 = time.monotonic()
    while time.monotonic() < end:
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        iters += 10
    dt = time.monotonic() - t0
    print(f"{kind}: {iters} matmuls of {n}^3 in {dt:.1f} s = {2*n**3*iters/dt/1e12:.0f} TFLOP/s")
    """
)

SERIES = [
    ("GPU util %", "DCGM_FI_DEV_GPU_UTIL"),
    ("SM active", "DCGM_FI_PROF_SM_ACTIVE"),
    ("SM occupancy", "DCGM_FI_PROF_SM_OCCUPANCY"),
    ("GR engine", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("tensor", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("HMMA", "stepscope_gpu_pipe_tensor_hmma_active_ratio"),
    ("FP32", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    ("FP16", "DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
    ("DRAM", "DCGM_FI_PROF_DRAM_ACTIVE"),
    ("SM MHz", "DCGM_FI_DEV_SM_CLOCK"),
    ("power W", "DCGM_FI_DEV_POWER_USAGE"),
    ("temp C", "DCGM_FI_DEV_GPU_TEMP"),
    ("reasons", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
]


def value(text: str, name: str, gpu: str = "0", extra: str = "") -> float | None:
    pat = re.compile(rf'^{re.escape(name)}\{{[^}}]*gpu="{gpu}"[^}}]*{extra}[^}}]*\}} (\S+)$',
                     re.M)
    m = pat.search(text)
    return float(m.group(1)) if m else None


def active_reasons(text: str, gpu: str = "0") -> str:
    pat = re.compile(
        rf'^stepscope_gpu_clock_event_active\{{[^}}]*gpu="{gpu}"[^}}]*reason="(\w+)"\}} 1$', re.M)
    return ",".join(pat.findall(text)) or "none"


def drop_privileges() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--phase", type=float, default=25.0, help="seconds per load phase")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA not available")
    except Exception as exc:
        print(f"gpu_validation: no usable GPU/torch: {exc}", file=sys.stderr)
        return 2

    port = free_port()
    as_root = os.geteuid() == 0
    src = REPO / "exporter"
    if as_root:  # the checkout may sit under /root: give the unprivileged user a readable copy
        import shutil

        src = Path("/tmp/stepscope-src")
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(REPO / "exporter", src)
        for p in [src, *src.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}
    log_path = out / "exporter.log"
    with open(log_path, "w") as log:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "stepscope", "serve", "--listen", f"127.0.0.1:{port}",
             "--interval", "1", "--slow-interval", "5"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
            preexec_fn=drop_privileges if as_root else None,
        )
    try:
        if not wait_for_exporter(port, exporter, log_path):
            return 1
        status = Path(f"/proc/{exporter.pid}/status").read_text()
        uid_line = next(ln for ln in status.splitlines() if ln.startswith("Uid:"))

        rows: list[tuple[str, dict[str, str], str]] = []
        workload_log: list[str] = []
        phases = [("idle", None), ("bf16 matmul", "bf16"), ("fp32 matmul (TF32 off)", "fp32"),
                  ("idle after", None)]
        for label, kind in phases:
            proc = None
            if kind is not None:
                proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, kind, str(args.phase)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
                time.sleep(args.phase - 6)
            else:
                time.sleep(6)
            texts = []
            for _ in range(3):
                texts.append(scrape(port))
                time.sleep(1.05)
            if proc is not None:
                workload_log.append(proc.communicate(timeout=120)[0].strip())
            slug = re.sub(r"\W+", "_", label).strip("_")
            (out / f"metrics_{slug}.txt").write_text(texts[-1])
            cells: dict[str, str] = {}
            for title, name in SERIES:
                vals = [v for t in texts if (v := value(t, name)) is not None]
                if not vals:
                    cells[title] = "absent"
                elif title == "reasons":
                    cells[title] = f"0x{int(statistics.median(vals)):x}"
                else:
                    cells[title] = f"{statistics.median(vals):.3g}"
            rows.append((label, cells, active_reasons(texts[-1])))
        final = scrape(port)
    finally:
        exporter.terminate()
        exporter.wait(timeout=15)

    info = re.search(r"^stepscope_gpu_info\{.*$", final, re.M)
    header = "| phase | " + " | ".join(t for t, _ in SERIES) + " | clock events active |"
    sep = "| --- " * (len(SERIES) + 2) + "|"
    table = [header, sep]
    for label, cells, reasons in rows:
        table.append(f"| {label} | " + " | ".join(cells[t] for t, _ in SERIES)
                     + f" | {reasons} |")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pstate,power.limit",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    report = [
        "# stepscope on a real GPU",
        "",
        f"GPU: `{smi}`; torch {torch.__version__}; exporter uid line: `{uid_line}`"
        f" (ran {'as uid 65534 (nobody), dropped from root' if as_root else 'as the caller'}).",
        "",
        f"Info series: `{info.group(0) if info else 'missing'}`",
        "",
        "Median of three scrapes near the end of each phase (GPU 0):",
        "",
        *table,
        "",
        "Workloads:",
        "",
        *[f"- {w}" for w in workload_log],
        "",
        "Exporter log:",
        "",
        "```",
        log_path.read_text().strip(),
        "```",
    ]
    (out / "validation.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
