"""Check 3: the DDP phase per rank: steps received, phases summing to step time, comm
measured, MFU served and near FLOPs / step time / peak, each rank joined with its GPU."""

from __future__ import annotations

from typing import Any

from validation.multi_gpu.report import add_verdicts, fmt, rank_values, samples, table
from validation.multi_gpu.run import JOB_DDP, PHASES, SIM_MODEL, SIM_PEAK, WARMUP, Run


def check_ddp(run: Run, ph: dict[str, Any], info: list[dict[str, str]]) -> list[str]:
    """Check 3 on the DDP phase's last scrape; the UUIDs of the GPUs the ranks ran on."""
    a, job = run.args, JOB_DDP
    res = ph["results"]
    smp = samples(ph["scrapes"][-1][1])
    run.rep.data["ddp_results"] = res
    problems: list[str] = []
    if any(r is None for r in res) or any(c != 0 for c in ph["codes"]):
        problems.append(f"rank exit codes {ph['codes']}")
    steps = rank_values(smp, "stepscope_steps_total", job)
    count = rank_values(smp, "stepscope_step_duration_seconds_count", job)
    total = rank_values(smp, "stepscope_step_duration_seconds_sum", job)
    phase = {
        p: rank_values(smp, "stepscope_step_phase_seconds_total", job, phase=p) for p in PHASES
    }
    mfu = rank_values(smp, "stepscope_mfu_ratio", job)
    flops = rank_values(smp, "stepscope_model_flops_total", job)
    peaks = {
        lbl["UUID"]: v
        for n, lbl, v in smp
        if n == "stepscope_gpu_peak_flops" and lbl.get("precision") == "bf16"
    }
    rinfo = {
        int(lbl["rank"]): lbl
        for n, lbl, _ in smp
        if n == "stepscope_training_rank_info" and lbl.get("training_job") == job
    }
    gpu_of = {g["UUID"]: g["gpu"] for g in info}
    rows = []
    used: list[str] = []
    for r in range(a.ranks):
        rr = res[r] or {}
        lbl = rinfo.get(r, {})
        uuid = rr.get("uuid") or ""
        used.append(uuid)
        n = count.get(r, 0.0)
        tot = total.get(r, 0.0)
        ph_s = {p: phase[p].get(r, 0.0) for p in PHASES}
        expect = (flops.get(r, 0.0) / tot / peaks[uuid]) if tot and uuid in peaks else None
        m = mfu.get(r)
        if steps.get(r) != rr.get("steps"):
            problems.append(
                f"rank {r}: served {steps.get(r)} steps, rank did {rr.get('steps')}"
            )
        if rr.get("dropped"):
            problems.append(f"rank {r}: {rr['dropped']} steps dropped")
        if not n or abs(sum(ph_s.values()) - tot) > 1e-3 * tot + 1e-6:
            problems.append(f"rank {r}: phases {ph_s} do not sum to {tot}")
        if not ph_s["comm"] > 0 or not rr.get("hooked"):
            problems.append(f"rank {r}: comm not measured (hooked={rr.get('hooked')})")
        if m is None or lbl.get("mfu_status") != "ok" or not 0 < m <= 1:
            problems.append(f"rank {r}: MFU {m}, status {lbl.get('mfu_status')}")
        elif expect is None or abs(m - expect) > 0.15 * expect:
            problems.append(f"rank {r}: MFU {m:.4f} vs FLOPs/step time/peak {expect}")
        if lbl.get("UUID") != uuid or lbl.get("gpu") != gpu_of.get(uuid):
            problems.append(
                f"rank {r}: joined with {lbl.get('UUID')} / gpu {lbl.get('gpu')}, ran on {uuid}"
            )
        rows.append(
            [
                r,
                lbl.get("gpu", "-"),
                uuid,
                rr.get("steps", "-"),
                int(n),
                fmt(tot / n if n else None),
                *(f"{100 * ph_s[p] / tot:.1f}%" if tot else "-" for p in PHASES),
                fmt(ph_s["comm"] / n * 1e3 if n else None, ".2f"),
                fmt(m),
                fmt(expect),
                lbl.get("mfu_status", "-"),
            ]
        )
    if len(set(used)) != len(used):
        problems.append(f"ranks share GPUs: {used}")
    ok = not problems
    run.rep.check(
        "ddp",
        ok,
        (
            f"{a.ranks} ranks: steps, phases (sum = step time), comm > 0,"
            " MFU ok and within 15% of FLOPs/step time/peak, each rank on "
            "its own GPU"
        )
        if ok
        else "; ".join(problems),
    )
    r0 = res[0] or {}
    grad_mb = r0.get("n_params", 0) * (4 if a.cpu else 2) / 1e6
    run.rep.add(
        f"## 2. DDP over {a.ranks} {'processes (gloo)' if a.cpu else 'GPUs (NCCL)'}",
        "",
        f"Model: {r0.get('n_params', 0) / 1e6:.1f} M parameters "
        f"({'fp32, CPU' if a.cpu else 'bf16'}; {grad_mb:.0f} MB of gradients all-reduced "
        f"per step), {r0.get('tokens_per_step')} rows per rank per step, "
        "FLOPs/step = 6 x params x rows = "
        f"{r0.get('flops_per_step', 0):.3e}; {WARMUP} warm-up steps, then "
        f"{a.seconds:.0f} s. MFU is served over `mfu_window: 600` (the whole run) against "
        + (
            f'the configured peak `STEPSCOPE_PEAK_FLOPS={{"{SIM_MODEL}": {{"bf16": '
            f"{SIM_PEAK:g}}}}}`"
            if a.cpu
            else "the GPU's datasheet bf16 peak"
        )
        + "; 'expected' = served `stepscope_model_flops_total` / "
        "`step_duration_seconds_sum` / `stepscope_gpu_peak_flops`.",
        "",
    )
    run.rep.add(
        *table(
            [
                "rank",
                "gpu",
                "UUID",
                "steps",
                "measured",
                "step s",
                "data_wait",
                "compute",
                "comm",
                "other",
                "comm ms/step",
                "MFU served",
                "MFU expected",
                "mfu_status",
            ],
            rows,
        ),
        "",
    )
    add_verdicts(run.rep,
        "Verdicts read from `/api/v1/diagnosis` during this phase", ph["diagnosis"], job
    )
    return used

