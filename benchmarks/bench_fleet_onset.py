"""Onset to verdict, onset to alert: one node of a fleet turns slow; how long until we say so.

    python -m benchmarks.bench_fleet_onset [--nodes 8] [--scrape 15s] [--slow-at 150]
                                           [--for 5s] [--rules DIR] [--timeout 900]
                                           [--cause thermal|starved|clock]
                                           [--slowdown 0.08]

The fleet of tests/support/fleet.py on this machine: ``--nodes`` exporters (simulated
H100, 1 s sampling, the default 30 s diagnosis window), a real Prometheus scraping them
every ``--scrape`` with the shipped rules (``for:`` as shipped by default), the ranks
of one job through the SDK, one per node. At ``--slow-at`` seconds (after the rate
windows have filled with healthy steps) the last node's GPU starts throttling for
temperature and its rank computes 0.45 s per step instead of 0.30 s; every other rank
then waits for it in the all-reduce. From that onset it measures, polling every 2-5 s:

- the slow node's own verdict (its ``/api/v1/diagnosis``) reading ``thermal_throttle``;
- ``stepscope diagnose --prometheus`` naming the slow node, rank and the thermal cause
  (it reads the recorded series, so only with the shipped rules);
- each shipped alert about it firing: ``StepscopeRankStraggler``,
  ``StepscopeNodeStraggler``, ``StepscopeGpuThermalViolation``.

``--rules DIR`` loads another folder of rule files (e.g. an earlier release's, to compare).
``--cause starved``: the slow node's GPU instead idles 70% of each second waiting for data
(its SM activity falls far below its peers'): the onset ``StepscopeNodeStraggler`` is
for; the fleet view then has to name the rank, without a thermal cause.
``--cause clock --slowdown S``: fail-slow. The slow node's GPU holds its clock at
1/(1+S) of boost with no clock event, and its rank computes (1+S) x 0.30 s per step (8%:
0.324 s): what ``StepscopeRankStraggler`` at 1.06x is for; the table says when it fires
and when the fleet view names the rank.

Prints a markdown table (and writes it, with JSON, to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.fleet import CAUSES, RULES, fleet, fleet_report

ALERTS = ("StepscopeRankStraggler", "StepscopeNodeStraggler", "StepscopeGpuThermalViolation")
FLEET_VIEW = "fleet view (stepscope diagnose --prometheus)"


def right(report: dict[str, Any], slow: str, rank: str, thermal: bool) -> bool:
    """The fleet view names the slow node and rank (with the thermal cause if ``thermal``)."""
    found = [s for job in report.get("jobs", []) for s in job["slow_ranks"]]
    return [(s["Hostname"], s["rank"]) for s in found] == [(slow, rank)] and (
        not thermal or "thermal_throttle" in found[0]["cause"])


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--scrape", default="15s")
    ap.add_argument("--slow-at", type=float, default=150.0)
    ap.add_argument("--for", dest="for_", default=None,
                    help="set every alert's for: to this (default: as shipped)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rules", type=Path, default=RULES,
                    help="folder of rule files to load (default: the shipped rules)")
    ap.add_argument("--cause", choices=sorted(CAUSES), default="thermal",
                    help="what slows the node (default thermal)")
    ap.add_argument("--slowdown", type=float, default=None,
                    help="with --cause clock: how much slower the rank computes (0.08: 8%%)")
    args = ap.parse_args()
    rank = str(args.nodes - 1)
    slowdown = args.slowdown if args.slowdown is not None else 0.5  # 0.45 s for 0.30
    change = {"sm_clock": round(1 / (1 + slowdown), 3)} if args.cause == "clock" else None
    with tempfile.TemporaryDirectory(prefix="stepscope-onset-") as tmp, fleet(
        Path(tmp), nodes=args.nodes, slow_at=args.slow_at, window=30.0, scrape=args.scrape,
        for_=args.for_, rules=args.rules, cause=args.cause, change=change,
        slow_compute=0.30 * (1 + slowdown),
    ) as f:
        onset = f.onset(timeout=args.slow_at + 120)
        print(f"onset at {time.strftime('%H:%M:%S', time.localtime(onset))}; polling",
              file=sys.stderr)  # fmt: skip
        seen: dict[str, float] = {}
        thermal = args.cause == "thermal"
        alerts = ALERTS if thermal else ALERTS[:1] if args.cause == "clock" else ALERTS[:2]
        wanted = ["local verdict", FLEET_VIEW, *alerts] if thermal else [FLEET_VIEW, *alerts]
        deadline = onset + args.timeout
        while time.time() < deadline and len(seen) < len(wanted):
            now = time.time()
            if thermal and "local verdict" not in seen:
                doc = json.loads(f.exporters[-1].get("/api/v1/diagnosis")[2])
                if any("thermal_throttle" in v["modifiers"] for v in doc["verdicts"]):
                    seen["local verdict"] = now - onset
            if FLEET_VIEW not in seen and right(fleet_report(f.prom.url), f.slow, rank, thermal):
                seen[FLEET_VIEW] = now - onset
            for alert in alerts:
                if alert not in seen and any(a.get("Hostname") == f.slow
                                             for a in f.prom.firing(alert)):  # fmt: skip
                    seen[alert] = now - onset
                    print(f"{alert} after {seen[alert]:.0f} s", file=sys.stderr)
            time.sleep(max(0.0, 2.0 - (time.time() - now)))
    for_ = f"for: {args.for_}" if args.for_ else "for: as shipped"
    lines = [
        f"# Onset to verdict and alert: {args.nodes} nodes, scrape {args.scrape}, {for_}, "
        f"rules {args.rules}, cause {args.cause}, rank {slowdown:.0%} slower",
        "",
        "| signal | seconds after onset |",
        "|---|---|",
    ]
    lines += [f"| {name} | {seen[name]:.0f} |" if name in seen else
              f"| {name} | not within {args.timeout:.0f} s |" for name in wanted]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fleet_onset.md").write_text(text)
        (args.out / "fleet_onset.json").write_text(json.dumps(seen, indent=2))
    return 0 if len(seen) == len(wanted) else 1


if __name__ == "__main__":
    sys.exit(main())
