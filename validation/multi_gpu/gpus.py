"""Checks 1 and 2: every GPU's series distinct, and NVLink or PCIe bytes rising on every
GPU in use during the DDP phase."""

from __future__ import annotations

from validation.multi_gpu.report import gpu_values, samples, table
from validation.multi_gpu.run import Run


def check_labels(run: Run, text: str) -> list[dict[str, str]]:
    """Check 1 on an idle scrape; the served ``stepscope_gpu_info`` label sets."""
    smp = samples(text)
    info = [lbl for n, lbl, _ in smp if n == "stepscope_gpu_info"]
    keys = ("gpu", "UUID", "device", "pci_bus_id")
    problems: list[str] = []
    for k in keys:
        vals = [g.get(k, "") for g in info]
        if "" in vals or len(set(vals)) != len(vals):
            problems.append(f"`{k}` not unique: {vals}")
    per_gpu: dict[str, set[tuple[str, ...]]] = {}
    families = set()
    for n, lbl, _ in smp:
        if n.startswith("DCGM_") and "gpu" in lbl:
            families.add(n)
            per_gpu.setdefault(lbl["gpu"], set()).add(tuple(lbl.get(k, "") for k in keys))
    for gpu, sets in per_gpu.items():
        if len(sets) != 1:
            problems.append(f"gpu {gpu} has {len(sets)} label sets across DCGM_* families")
    dup = [
        n
        for n in families
        if len([1 for m, lbl, _ in smp if m == n])
        != len({lbl.get("gpu") for m, lbl, _ in smp if m == n})
    ]
    if dup:
        problems.append(f"families with two series for one GPU: {sorted(dup)}")
    want = run.args.ranks
    if len(info) < want:
        problems.append(f"{len(info)} GPUs served, {want} needed")
    ok = not problems
    run.rep.check(
        "labels",
        ok,
        (
            f"{len(info)} GPUs, {len(families)} DCGM_* families: "
            "gpu, UUID, device, pci_bus_id unique; one label set "
            "per GPU"
        )
        if ok
        else "; ".join(problems),
    )
    run.rep.add(
        "## 1. Per-GPU series",
        "",
        f"`stepscope_gpu_info` at idle ({len(families)} `DCGM_*` families "
        "checked for one label set per GPU):",
        "",
    )
    run.rep.add(
        *table(
            ["gpu", "UUID", "device", "pci_bus_id", "modelName", "profiling"],
            [
                [
                    g.get("gpu"),
                    g.get("UUID"),
                    g.get("device"),
                    g.get("pci_bus_id"),
                    g.get("modelName"),
                    g.get("profiling"),
                ]
                for g in info
            ],
        ),
        "",
    )
    return info

def check_bytes(run: Run, idle: list[str], scrapes: list[tuple[int, str]],
                uuids: list[str]) -> None:  # fmt: skip
    """Check 2: the most NVLink/PCIe bytes/s seen idle against during the DDP phase."""
    names = (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    )

    def peak(texts: list[str]) -> dict[str, dict[str, float]]:
        best: dict[str, dict[str, float]] = {}
        for t in texts:
            smp = samples(t)
            for n in names:
                for u, v in gpu_values(smp, n).items():
                    d = best.setdefault(u, {})
                    d[n] = max(d.get(n, 0.0), v)
        return best

    if run.args.cpu:
        run.rep.check(
            "bytes",
            None,
            "skipped with --cpu: simulated GPUs serve made-up "
            "NVLink/PCIe rates, and gloo moves no GPU bytes",
        )
        return
    base, busy = peak(idle), peak([t for _, t in scrapes])
    rows, bad = [], []
    for u in uuids:
        b, d = base.get(u, {}), busy.get(u, {})
        nv_idle = b.get(names[0], 0) + b.get(names[1], 0)
        nv = d.get(names[0], 0) + d.get(names[1], 0)
        pc_idle = b.get(names[2], 0) + b.get(names[3], 0)
        pc = d.get(names[2], 0) + d.get(names[3], 0)
        moved = nv > nv_idle or pc > pc_idle
        if not d:
            bad.append(f"{u}: no NVLink/PCIe series served")
        elif not moved:
            bad.append(f"{u}: no rise over idle")
        rows.append(
            [
                u,
                f"{nv_idle / 1e9:.3f}",
                f"{nv / 1e9:.3f}",
                f"{pc_idle / 1e9:.3f}",
                f"{pc / 1e9:.3f}",
                "yes" if moved else "no",
            ]
        )
    run.rep.check(
        "bytes",
        not bad,
        "NVLink or PCIe bytes/s above idle on every GPU in use" if not bad else "; ".join(bad),
    )
    run.rep.add(
        "### NVLink / PCIe bytes (GB/s, TX+RX; max over idle scrapes vs. over "
        "the DDP phase's scrapes)",
        "",
    )
    run.rep.add(
        *table(["UUID", "NVLink idle", "NVLink DDP", "PCIe idle", "PCIe DDP", "rose"], rows), ""
    )

