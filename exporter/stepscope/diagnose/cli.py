"""``stepscope diagnose`` and ``stepscope nccl-check``: the diagnosis on a terminal.

``diagnose`` reads the local exporter's ``/api/v1/diagnosis`` (one row per rank / GPU),
or with ``--prometheus`` looks across the fleet: stragglers (SM active well below the
median of their peers), thermal throttling by Hostname, ranks whose compute time
stands out, bottleneck verdicts, jobs that span availability zones.

Exit status: 0 healthy, 1 a bottleneck or straggler found, 2 cannot tell (exporter
or Prometheus unreachable, no data). Standard library only, besides our own modules.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from stepscope.diagnose.model import ALERT_MODIFIERS, BOTTLENECK_KINDS
from stepscope.diagnose.nccl import parse_nccl_log

EXIT_HEALTHY = 0
EXIT_BOTTLENECK = 1
EXIT_UNKNOWN = 2

# Fleet view: a GPU whose SM active is below this share of the median of its peers
# is a straggler; a rank whose compute time per step is above (1 + this) x its job's
# median stands out.
STRAGGLER_SHARE = 0.8
COMPUTE_OUTLIER = 0.2
THERMAL_NS_PER_S = 5e7  # thermal violation rising 5% of the time


def add_commands(sub: Any) -> None:
    """Register ``diagnose`` and ``nccl-check`` on the ``stepscope`` subparsers."""
    d = sub.add_parser(
        "diagnose",
        help="print the bottleneck verdicts (local exporter, or the fleet via Prometheus)",
        description="Print one row per training rank and GPU: activity, step time, phases, "
        "MFU, verdict and advice. Exit 0 healthy, 1 bottleneck or straggler, 2 cannot tell.",
    )
    d.add_argument("--exporter", metavar="URL", default="http://127.0.0.1:9400",
                   help="the exporter to read (default http://127.0.0.1:9400)")  # fmt: skip
    d.add_argument("--prometheus", metavar="URL", default=None,
                   help="look across the fleet through this Prometheus instead")  # fmt: skip
    d.add_argument("--window", metavar="DURATION", default="5m",
                   help="Prometheus range for the fleet view (default 5m)")  # fmt: skip
    d.add_argument("--json", action="store_true", help="print JSON for scripts")
    d.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="HTTP timeout (default 5)")  # fmt: skip
    n = sub.add_parser(
        "nccl-check",
        help="which network NCCL chose per rank, from NCCL_DEBUG=INFO logs",
        description="Read NCCL_DEBUG=INFO logs and report per rank the network NCCL chose "
        "(EFA through libfabric, InfiniBand, or TCP sockets) and why a socket fallback "
        "happened. Exit 0 all fast (or single node), 1 a multi-node rank on TCP, 2 no "
        "NCCL lines found.",
    )
    n.add_argument("logs", nargs="+", metavar="LOGFILE", help="log files ('-' for stdin)")
    n.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    """Run ``args.command``; returns the exit status."""
    if args.command == "nccl-check":
        return nccl_check(args.logs, args.json)
    if args.prometheus:
        return fleet(args.prometheus, args.window, args.json, args.timeout)
    return local(args.exporter, args.json, args.timeout)


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _error(message: str) -> None:
    print(f"stepscope: error: {message}", file=sys.stderr)


# ----------------------------------------------------------------- local exporter


def _fmt(v: Any, kind: str = "pct") -> str:
    if v is None:
        return "-"
    if kind == "pct":
        return f"{100 * v:.0f}%"
    if kind == "util":
        return f"{v:.0f}%"
    return f"{v:.3f}"


def _row(v: dict[str, Any]) -> list[str]:
    s = v["signals"]
    phases = "/".join(
        _fmt(s.get(f"{p}_share")) for p in ("data_wait", "compute", "comm", "other")
    ) if s.get("step_seconds") is not None else "-"  # fmt: skip
    kind = v["kind"] + "".join(f"+{m}" for m in v["modifiers"])
    return [
        v["subject"]["name"],
        "DOWN" if s.get("gpu_up") == 0 else _fmt(s.get("sm_active")),
        _fmt(s.get("gpu_util"), "util"),
        _fmt(s.get("sm_occupancy")),
        f"{_fmt(s.get('tensor_active'))}/{_fmt(s.get('fp32_active'))}",
        _fmt(s.get("step_seconds"), "s"),
        phases,
        _fmt(s.get("mfu")),
        kind,
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]  # fmt: skip
    return "\n".join(lines)


def render_local(doc: dict[str, Any]) -> str:
    """The report for one exporter's diagnosis document."""
    head = (
        f"{doc.get('hostname', '?')} ({doc.get('backend', '?')}): {doc['status']}, "
        f"window {doc.get('window_seconds', 0):.0f} s over {doc.get('samples', 0)} samples"
    )
    verdicts = doc.get("verdicts", [])
    if not verdicts:
        return head + "\nno GPUs and no training ranks to judge yet"
    header = ["SUBJECT", "SM", "UTIL", "OCC", "TENSOR/FP32", "STEP s",
              "DATA/COMP/COMM/OTHER", "MFU", "VERDICT"]  # fmt: skip
    out = [head, ""]
    faults = [v for v in verdicts if v.get("fault")]
    if faults:  # first, before any performance verdict: these GPUs need an SRE
        out.append(f"HARDWARE FAULT on {len(faults)} subject(s): drain before it runs jobs")
        out += [f"  {v['subject']['name']}: {', '.join(v['modifiers'])}: {v['advice']}"
                for v in faults]  # fmt: skip
        out.append("")
    out += [_table(header, [_row(v) for v in verdicts]), ""]
    for v in verdicts:
        out.append(f"{v['subject']['name']}: {v['kind']}: {v['advice']}")
        out += [f"    - {e}" for e in v["evidence"]]
    return "\n".join(out)


def local(url: str, as_json: bool, timeout: float) -> int:
    """Read one exporter's diagnosis and print it."""
    api = url.rstrip("/") + "/api/v1/diagnosis"
    try:
        doc = _get_json(api, timeout)
    except (OSError, ValueError) as exc:
        _error(f"cannot read {api}: {getattr(exc, 'reason', None) or exc}")
        return EXIT_UNKNOWN
    print(json.dumps(doc, indent=2) if as_json else render_local(doc))
    status = doc.get("status")
    if status == "bottleneck":
        return EXIT_BOTTLENECK
    return EXIT_HEALTHY if status == "healthy" else EXIT_UNKNOWN


# ----------------------------------------------------------------- fleet view


def _query(base: str, promql: str, timeout: float) -> list[dict[str, Any]]:
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = _get_json(url, timeout)
    if body.get("status") != "success":
        raise ValueError(f"query failed: {body.get('error', body)}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def fleet_queries(window: str) -> dict[str, str]:
    """The PromQL the fleet view runs (documented in docs/diagnosis.md)."""
    return {
        "sm_active": f"avg by (Hostname, gpu) (avg_over_time(DCGM_FI_PROF_SM_ACTIVE[{window}]))",
        "thermal": f"max by (Hostname, gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION[{window}]))",
        "compute_per_step": (
            f'sum by (job, rank, Hostname) (rate(stepscope_step_phase_seconds_total'
            f'{{phase="compute"}}[{window}])) / sum by (job, rank, Hostname) '
            f"(rate(stepscope_step_duration_seconds_count[{window}]))"
        ),
        "verdicts": "stepscope_bottleneck == 1",
        "modifiers": "stepscope_bottleneck_modifier == 1",
        "zones": (
            "count by (job) (count by (job, availability_zone) (stepscope_training_rank_info "
            "* on (Hostname) group_left (availability_zone) max by (Hostname, "
            "availability_zone) (stepscope_node_info)))"
        ),
    }


def analyse_fleet(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Findings from the fleet queries' results. Pure."""
    def val(r: dict[str, Any]) -> float:
        return float(r["value"][1])

    findings: list[dict[str, Any]] = []
    sm = [(r["metric"], val(r)) for r in results.get("sm_active", [])]
    if len(sm) >= 2:
        med = statistics.median(v for _, v in sm)
        for m, v in sm:
            if med >= 0.2 and v < STRAGGLER_SHARE * med:
                findings.append({
                    "kind": "straggler", "Hostname": m.get("Hostname"), "gpu": m.get("gpu"),
                    "detail": f"SM active {v:.2f} vs median {med:.2f} of its peers",
                })  # fmt: skip
    for r in results.get("thermal", []):
        if val(r) >= THERMAL_NS_PER_S:
            m = r["metric"]
            findings.append({
                "kind": "thermal_throttle", "Hostname": m.get("Hostname"), "gpu": m.get("gpu"),
                "detail": f"thermal violation {val(r) / 1e9:.0%} of the time",
            })  # fmt: skip
    jobs: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for r in results.get("compute_per_step", []):
        jobs.setdefault(r["metric"].get("job", ""), []).append((r["metric"], val(r)))
    for job, ranks in jobs.items():
        if len(ranks) < 2:
            continue
        med = statistics.median(v for _, v in ranks)
        for m, v in ranks:
            if med > 0 and v > (1 + COMPUTE_OUTLIER) * med:
                findings.append({
                    "kind": "slow_rank", "job": job, "rank": m.get("rank"),
                    "Hostname": m.get("Hostname"),
                    "detail": f"compute {v:.3f} s/step vs job median {med:.3f} s",
                })  # fmt: skip
    for r in results.get("verdicts", []):
        m = r["metric"]
        if m.get("kind") in BOTTLENECK_KINDS:
            findings.append({
                "kind": m["kind"], "job": m.get("job"), "rank": m.get("rank"),
                "Hostname": m.get("Hostname"), "gpu": m.get("gpu"),
                "detail": "verdict of the node's exporter",
            })  # fmt: skip
    for r in results.get("modifiers", []):
        m = r["metric"]
        if m.get("modifier") in ALERT_MODIFIERS - {"thermal_throttle"}:
            findings.append({
                "kind": m["modifier"], "job": m.get("job"), "rank": m.get("rank"),
                "Hostname": m.get("Hostname"), "gpu": m.get("gpu"),
                "detail": "modifier of the node's exporter verdict",
            })  # fmt: skip
    for r in results.get("zones", []):
        if val(r) > 1:
            findings.append({
                "kind": "cross_az", "job": r["metric"].get("job"),
                "detail": f"ranks in {val(r):.0f} availability zones",
            })  # fmt: skip
    return {"gpus": len(sm), "findings": findings}


def fleet(base: str, window: str, as_json: bool, timeout: float) -> int:
    """Query Prometheus, print the findings."""
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, promql in fleet_queries(window).items():
            results[name] = _query(base, promql, timeout)
    except (OSError, ValueError, KeyError) as exc:
        _error(f"cannot query {base}: {getattr(exc, 'reason', None) or exc}")
        return EXIT_UNKNOWN
    report = analyse_fleet(results)
    no_data = not results["sm_active"] and not results["compute_per_step"] and not (
        results["verdicts"]
    )
    status = "unknown" if no_data else ("bottleneck" if report["findings"] else "healthy")
    report["status"] = status
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"fleet via {base}: {status}, {report['gpus']} GPU(s) with SM activity")
        for f in report["findings"]:
            where = " ".join(
                f"{k}={f[k]}" for k in ("job", "rank", "Hostname", "gpu") if f.get(k) is not None
            )
            print(f"  {f['kind']:<16} {where}: {f['detail']}")
    return {"unknown": EXIT_UNKNOWN, "bottleneck": EXIT_BOTTLENECK}.get(status, EXIT_HEALTHY)


# ----------------------------------------------------------------- nccl-check


def nccl_check(paths: Sequence[str], as_json: bool) -> int:
    """Parse the logs, print one row per rank."""
    lines: list[str] = []
    for path in paths:
        try:
            if path == "-":
                lines += sys.stdin.read().splitlines()
            else:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines += f.read().splitlines()
        except OSError as exc:
            _error(f"cannot read {path}: {exc.strerror or exc}")
            return EXIT_UNKNOWN
    ranks = parse_nccl_log(lines)
    if as_json:
        print(json.dumps([
            {"host": r.host, "pid": r.pid, "rank": r.rank, "nranks": r.nranks,
             "nnodes": r.nnodes, "network": r.network, "provider": r.provider,
             "plugin": r.plugin, "transport": r.transport, "verdict": r.verdict,
             "why": r.explain(), "reasons": r.reasons, "env": r.env}
            for r in ranks
        ], indent=2))  # fmt: skip
    else:
        if not ranks:
            print("no NCCL log lines found (run with NCCL_DEBUG=INFO)")
        rows = [[str(r.rank) if r.rank is not None else "?", r.host, str(r.pid),
                 r.network or "-", r.provider or "-", r.transport, r.verdict, r.explain()]
                for r in ranks]  # fmt: skip
        if rows:
            print(_table(["RANK", "HOST", "PID", "NETWORK", "PROVIDER", "TRANSPORT", "VERDICT",
                          "WHY"], rows))  # fmt: skip
    if not ranks or all(r.verdict == "unknown" for r in ranks):
        return EXIT_UNKNOWN
    return EXIT_BOTTLENECK if any(r.verdict == "slow" for r in ranks) else EXIT_HEALTHY
