"""Check 6: ``stepscope nccl-check`` over the DDP phase's per-rank ``NCCL_DEBUG=INFO``
files (skipped with ``--cpu``: gloo writes no NCCL log)."""

from __future__ import annotations

import json
import subprocess
import sys

from validation.multi_gpu.run import JOB_DDP, Run


def check_nccl(run: Run) -> None:
    """Check 6: every rank's NCCL log read by ``stepscope nccl-check`` as ``ok``."""
    a = run.args
    if a.cpu:
        run.rep.check("nccl", None, "skipped with --cpu: gloo writes no NCCL_DEBUG log")
        run.rep.add(
            "## 5. NCCL transport",
            "",
            "Not run: with `--cpu` the ranks use gloo, which writes no `NCCL_DEBUG=INFO` log.",
            "",
        )
        return
    logs = [str(p) for p in sorted(run.raw.glob(f"nccl-{JOB_DDP}-rank*.log"))]
    if not logs:
        run.rep.check("nccl", False, "no NCCL_DEBUG_FILE written")
        return
    base = [sys.executable, "-m", "stepscope", "nccl-check"]
    js = subprocess.run(
        [*base, "--json", *logs], capture_output=True, text=True, env=run.env, timeout=60
    )
    tx = subprocess.run(
        [*base, *logs], capture_output=True, text=True, env=run.env, timeout=60
    )
    try:
        rows = json.loads(js.stdout)
    except ValueError:
        rows = []
    ranks = sorted(r["rank"] for r in rows if r.get("rank") is not None)
    ok = (
        js.returncode == 0
        and ranks == list(range(a.ranks))
        and all(r["verdict"] == "ok" for r in rows)
    )
    run.rep.check(
        "nccl",
        ok,
        f"nccl-check exit {js.returncode}, ranks {ranks}, verdicts "
        f"{sorted({r['verdict'] for r in rows})}",
    )
    run.rep.add(
        "## 5. NCCL transport: `stepscope nccl-check` over the DDP phase's logs",
        "",
        f"`NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE` per rank ({len(logs)} files, in "
        f"raw.tar.gz); exit {tx.returncode}:",
        "",
        "```",
        tx.stdout.rstrip(),
        "```",
        "",
    )
    (run.raw / "nccl-check.json").write_text(js.stdout)

