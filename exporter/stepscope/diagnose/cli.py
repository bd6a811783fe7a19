"""``stepscope diagnose`` and ``stepscope nccl-check``: the diagnosis on a terminal.

``diagnose`` reads the local exporter's ``/api/v1/diagnosis`` (one row per rank / GPU),
or with ``--prometheus`` looks across the fleet: per training job, the rank every other
rank waits for and its node's own verdict as the likely cause; hardware faults; nodes
whose SM activity is far below their peers'; thermal throttling; the nodes' bottleneck
verdicts; jobs that span availability zones. The fleet view reads the series the shipped
recording rules record and judges them by the thresholds the shipped alerts use
(:mod:`stepscope.diagnose.fleet_rules`), so it names what Alertmanager names. With
``--job NAME`` it prints that job's goodput and badput in GPU-hours over ``--since``
instead (:mod:`stepscope.diagnose.goodput_report`).

Exit status: 0 healthy (or the goodput report printed), 1 a bottleneck or straggler found,
2 cannot tell (exporter or Prometheus unreachable, no data) or a bad argument (one line
naming it). Standard library only,
besides our own modules.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import statistics
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from stepscope.core.labels import HOST_LABEL, HOST_LABELS, with_host_label
from stepscope.diagnose.advice import KIND_ADVICE, advice_for
from stepscope.diagnose.fleet_rules import FLEET
from stepscope.diagnose.goodput_report import (
    DEFAULT_SINCE,
    analyse_goodput,
    goodput_queries,
    known_jobs_query,
    render_goodput,
    since_seconds,
)
from stepscope.diagnose.model import BOTTLENECK_KINDS, MODIFIERS
from stepscope.shared.nccl_log import parse_nccl_log

EXIT_HEALTHY = 0
EXIT_BOTTLENECK = 1
EXIT_UNKNOWN = 2
# --timeout's ceiling: an HTTP wait longer than an hour is a typo, not a setting
MAX_TIMEOUT_S = 3600.0

# The recorded series the fleet view reads (deploy/prometheus/rules/stepscope-recording.yml)
NODE_STRAGGLER = "Hostname_peer_group:DCGM_FI_PROF_SM_ACTIVE:ratio_median_node"
THERMAL = "Hostname_gpu:DCGM_FI_DEV_THERMAL_VIOLATION:ratio_rate2m"
STRAGGLER_SCORE = "training_job_rank:stepscope_straggler_score:ratio"
FAIL_SLOW_SCORE = "training_job_rank:stepscope_fail_slow_score:ratio"
# a rank's busy time now over its own past (StepscopeRankStraggler's second reference)
BUSY_OVER_PAST = (f"training_job_rank:stepscope_step_busy_seconds:mean{FLEET.straggler_window}"
                  f"_over_past{FLEET.fail_slow_baseline}")
BUSY = f"training_job_rank:stepscope_step_busy_seconds:mean{FLEET.straggler_window}"
PHASES = "training_job_rank:stepscope_step_phase_seconds:mean2m"
NO_RULES = (
    "Prometheus at {base} has stepscope's GPU series but none of its recording rules: "
    "load deploy/prometheus/rules/stepscope-recording.yml (the fleet view reads them)"
)


def add_commands(sub: Any) -> None:
    """Register ``diagnose`` and ``nccl-check`` on the ``stepscope`` subparsers."""
    d = sub.add_parser(
        "diagnose",
        help="print the bottleneck verdicts (local exporter, or the fleet via Prometheus)",
        description="Print one row per training rank and GPU: activity, step time, phases, "
        "MFU, verdict and advice; with --prometheus, the fleet view; with --prometheus and "
        "--job, that training job's goodput and GPU-hours lost by cause. Exit 0 healthy (or "
        "the goodput printed), 1 bottleneck or straggler, 2 cannot tell.",
    )
    d.add_argument("--exporter", metavar="URL", default="http://127.0.0.1:9400",
                   help="the exporter to read: a URL, or HOST:PORT for http "
                   "(default http://127.0.0.1:9400)")  # fmt: skip
    d.add_argument("--prometheus", metavar="URL", default=None,
                   help="look across the fleet through this Prometheus instead "
                   "(a URL, or HOST:PORT for http)")  # fmt: skip
    # The fleet view reads the recorded series, whose windows are the rules' own
    # (stepscope.diagnose.fleet_rules): the flag is accepted for scripts that pass it.
    d.add_argument("--window", metavar="DURATION", default=None, help=argparse.SUPPRESS)
    d.add_argument("--job", metavar="NAME", default=None,
                   help="with --prometheus: this training job's goodput and GPU-hours lost "
                   "by cause instead of the fleet view")  # fmt: skip
    d.add_argument("--since", metavar="DURATION", default=None,
                   help=f"with --job: the period, a Prometheus duration such as 24h, 7d or "
                   f"1h30m (default {DEFAULT_SINCE})")  # fmt: skip
    d.add_argument("--host-label", choices=HOST_LABELS, default=HOST_LABEL,
                   help="the host label the fleet's exporters serve (default Hostname)")
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
    try:
        if not 0 < args.timeout <= MAX_TIMEOUT_S:  # also NaN
            raise ValueError(f"--timeout: expected seconds above 0, at most "
                             f"{MAX_TIMEOUT_S:g}, got {args.timeout:g}")
        if args.job is not None or args.since is not None:
            since = _goodput_args(args)
            base = base_url(args.prometheus, "--prometheus")
            return job_goodput(base, args.job, since, args.json, args.timeout,
                               args.host_label)
        if args.prometheus:
            base = base_url(args.prometheus, "--prometheus")
            return fleet(base, args.json, args.timeout, args.host_label)
        exporter = base_url(args.exporter, "--exporter")
    except ValueError as exc:
        _error(str(exc))
        return EXIT_UNKNOWN
    return local(exporter, args.json, args.timeout)


def base_url(text: str, flag: str) -> str:
    """``http://host:port`` from a URL or a bare ``HOST:PORT`` (``:9400`` is this
    host); ValueError naming ``flag`` for a scheme that is not http(s)."""
    text = text.strip()
    if "://" not in text:
        text = "http://" + ("127.0.0.1" + text if text.startswith(":") else text)
    scheme = text.split("://", 1)[0].lower()
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
        good = scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        good = False
    # http.client refuses (with a traceback) what urlsplit lets through: spaces, controls
    if not good or any(c.isspace() or ord(c) < 32 for c in text):
        raise ValueError(
            f"{flag}: expected http://HOST:PORT, https://HOST:PORT or HOST:PORT, got {text!r}"
        )
    return text


def _get_json(url: str, timeout: float) -> Any:
    """The JSON document at ``url``; ValueError saying which path answered what (a 404
    from /api/v1/query means the address is not a Prometheus), OSError when unreachable."""
    path = urllib.parse.urlsplit(url).path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        exc.close()
        what = {"/api/v1/query": "is it a Prometheus server?",
                "/api/v1/diagnosis": "is it a stepscope exporter?"}.get(path, "")
        hint = f" ({what})" if exc.code == 404 and what else ""
        raise ValueError(f"{path} answered HTTP {exc.code} {exc.reason}{hint}") from None
    except http.client.HTTPException as exc:
        raise ValueError(f"{path}: not an HTTP answer ({type(exc).__name__})") from None


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
        reason = getattr(exc, "reason", None) or exc
        hint = (
            "; is stepscope serve running there? pass its address with --exporter HOST:PORT"
            if isinstance(reason, ConnectionRefusedError)
            else ""
        )
        _error(f"cannot read {api}: {reason}{hint}")
        return EXIT_UNKNOWN
    if not isinstance(doc, dict) or "status" not in doc:
        _error(f"cannot read {api}: not a stepscope diagnosis document")
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
    if not isinstance(body, dict):
        raise ValueError("/api/v1/query answered JSON that is not a Prometheus API response")
    if body.get("status") != "success":
        raise ValueError(f"query failed: {body.get('error', body)}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def fleet_queries(host_label: str = HOST_LABEL) -> dict[str, str]:
    """The PromQL the fleet view runs (documented in docs/diagnosis.md), for the host
    label the fleet's exporters serve (``Hostname`` or ``hostname``): the series the
    recording rules record, as they are now, and the nodes' own verdicts."""
    queries = {
        "gpus": "stepscope_gpu_up",
        "recorded": "Hostname:stepscope_gpu_info:count",
        "gpu_down": "stepscope_gpu_up == 0",
        # judged here against the thresholds the alerts use
        "node_straggler": NODE_STRAGGLER,
        "thermal": THERMAL,
        "score": STRAGGLER_SCORE,
        "fail_slow": FAIL_SLOW_SCORE,
        "over_past": BUSY_OVER_PAST,
        # shown beside the judgement: each rank's busy time and its phases per step
        "busy": BUSY,
        "phase_per_step": PHASES,
        "verdicts": "stepscope_bottleneck == 1",
        "modifiers": "stepscope_bottleneck_modifier == 1",
        "zones": (
            "count by (cluster, training_job) (count by (cluster, training_job, "
            "availability_zone) (stepscope_training_rank_info * on (cluster, Hostname) "
            "group_left (availability_zone) max by (cluster, Hostname, availability_zone) "
            "(stepscope_node_info)))"
        ),
    }
    return {name: with_host_label(q, host_label) for name, q in queries.items()}


def _val(r: dict[str, Any]) -> float:
    return float(r["value"][1])


def _finite(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # 0/0 (a rank with no step in the window) comes back as NaN
    return [r for r in rows if math.isfinite(_val(r))]


def _kind(kind: str, mods: Sequence[str]) -> str:
    return kind + "".join(f"+{m}" for m in mods)


def _slow_against(entry: dict[str, Any]) -> str | None:
    """What a rank is slow against, as StepscopeRankStraggler's ``compared_with`` says:
    ``group`` (its group's median rank), ``past`` (its own past, its job not), or None."""
    ratio = FLEET.rank_straggler_ratio
    if entry.get("score", 0.0) > ratio:
        return "group"
    if entry.get("fail_slow", 0.0) > ratio and entry.get("over_past", 0.0) > ratio:
        return "past"
    return None


def analyse_fleet(
    results: dict[str, list[dict[str, Any]]], host_label: str = HOST_LABEL
) -> dict[str, Any]:
    """Findings from the fleet queries' results. Pure.

    Every judgement is an alert's, on the series the alert reads, by the same threshold
    (:data:`~stepscope.diagnose.fleet_rules.FLEET`): per training job, the rank the others
    wait for is one whose straggler score (busy time per step, the step less exposed
    communication, over the median rank of its group: the job where no group is
    reported) is above ``rank_straggler_ratio``, or whose fail-slow score (its busy time
    over its own past, over its job's median change) and change both are
    (``StepscopeRankStraggler``); a node straggler's least active GPU is under
    ``node_straggler_share`` of its peer group's median node (``StepscopeNodeStraggler``);
    a GPU is thermally throttled above ``throttle_share`` of the time
    (``StepscopeGpuThermalViolation``). A slow rank's node's own verdict is its likely
    cause; the job's ranks on other nodes whose verdict is ``communication`` or
    ``waiting_on_peer`` are waiting for it, and are reported as such rather than as
    findings of their own.
    """
    host = host_label
    findings: list[dict[str, Any]] = []

    def where(m: dict[str, str]) -> dict[str, Any]:
        return {"cluster": m.get("cluster"), "Hostname": m.get(host), "gpu": m.get("gpu")}

    gpus = [r["metric"] for r in results.get("gpus", [])]
    for r in _finite(results.get("node_straggler", [])):
        m, v = r["metric"], _val(r)
        if v < FLEET.node_straggler_share:
            group = m.get("peer_group")
            findings.append({"kind": "straggler", **where(m), "job": group or None,
                             "detail": f"its least active GPU at {v:.0%} of the SM activity "
                             f"of the median node of {f'job {group}' if group else 'its peers'}"
                             f" (threshold {FLEET.node_straggler_share:.0%})"})  # fmt: skip
    for r in results.get("gpu_down", []):
        findings.append({"kind": "gpu_down", **where(r["metric"]),
                         "detail": "the GPU stopped answering NVML: drain the node"})
    thermal: dict[tuple[Any, Any, Any], float] = {}
    for r in _finite(results.get("thermal", [])):
        m = r["metric"]
        thermal[(m.get("cluster"), m.get(host), m.get("gpu"))] = _val(r)
        if _val(r) > FLEET.throttle_share:
            findings.append({"kind": "thermal_throttle", **where(m),
                             "detail": f"thermal violation {_val(r):.0%} of the time"})

    # the node's own verdict per rank (and per GPU without a rank), with its modifiers
    Key = tuple[Any, ...]

    def key(m: dict[str, str]) -> Key:
        if m.get("rank") is not None:
            return (m.get("cluster"), m.get("training_job"), m.get("rank"))
        return (m.get("cluster"), m.get(host), m.get("gpu"))

    verdict: dict[Key, tuple[str, dict[str, str]]] = {}
    for r in results.get("verdicts", []):
        verdict[key(r["metric"])] = (r["metric"].get("kind", ""), r["metric"])
    mods: dict[Key, list[str]] = {}
    for r in results.get("modifiers", []):
        mods.setdefault(key(r["metric"]), []).append(r["metric"].get("modifier", ""))
    for k in mods:
        mods[k].sort(key=lambda m: MODIFIERS.index(m) if m in MODIFIERS else len(MODIFIERS))

    # per job: each rank's busy time per step and straggler score (recorded), and phases
    ranks: dict[Key, dict[str, Any]] = {}

    def rank_entry(m: dict[str, str]) -> dict[str, Any]:
        return ranks.setdefault((m.get("cluster"), m.get("training_job"), m.get("rank")), {
            "cluster": m.get("cluster"), "job": m.get("training_job"), "rank": m.get("rank"),
            "Hostname": m.get(host), "gpu": m.get("gpu"), "group": m.get("group"),
            "phases": {}})  # fmt: skip

    for r in _finite(results.get("busy", [])):
        rank_entry(r["metric"])["busy"] = _val(r)
    for r in _finite(results.get("score", [])):
        rank_entry(r["metric"])["score"] = _val(r)
    for name in ("fail_slow", "over_past"):
        for r in _finite(results.get(name, [])):
            rank_entry(r["metric"])[name] = _val(r)
    for r in _finite(results.get("phase_per_step", [])):
        m = r["metric"]
        if (m.get("cluster"), m.get("training_job"), m.get("rank")) in ranks:
            ranks[(m.get("cluster"), m.get("training_job"), m.get("rank"))]["phases"][
                m.get("phase", "")] = _val(r)
    jobs: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for entry in ranks.values():
        if "busy" not in entry:
            continue
        entry["step"] = sum(entry["phases"].values()) or entry["busy"]
        jobs.setdefault((entry["cluster"], entry["job"]), []).append(entry)
    explained: set[Key] = set()
    job_reports = []
    for (cluster, job), members in sorted(jobs.items(), key=lambda kv: str(kv[0])):
        members.sort(key=lambda e: int(e["rank"]) if str(e["rank"]).isdigit() else 0)
        report: dict[str, Any] = {
            "cluster": cluster, "job": job, "ranks": len(members),
            "nodes": len({e["Hostname"] for e in members}),
            "step_seconds": statistics.median(e["step"] for e in members),
            "slow_ranks": [], "waiting_ranks": 0, "waiting_nodes": 0,
        }  # fmt: skip
        job_reports.append(report)
        if len(members) < 2:
            continue
        slow = [e for e in members if _slow_against(e) is not None]
        slow_hosts = {e["Hostname"] for e in slow}
        for e in slow:
            k = (cluster, job, e["rank"])
            kind, _ = verdict.get(k, ("", {}))
            its_mods = mods.get(k, [])
            explained.add(k)
            hot = thermal.get((cluster, e["Hostname"], e["gpu"]), 0.0)
            cause = _kind(kind, its_mods) if kind else "no verdict from its node"
            advice = advice_for(kind, tuple(its_mods)) if kind in KIND_ADVICE else ""
            ph = e["phases"]
            against = _slow_against(e)
            ratio = e["score"] if against == "group" else e["fail_slow"]
            busy = (f"busy {e['busy']:.3f} s/step (compute {ph.get('compute', 0.0):.3f}, "
                    f"data {ph.get('data_wait', 0.0):.3f})")
            if against == "group":
                peers = f"group {e['group']}'s" if e.get("group") else "the job's"
                detail = f"{busy} vs {peers} median {e['busy'] / e['score']:.3f} s"
            else:
                detail = (f"{busy}, {e['over_past']:.2f}x its own of before while its job's "
                          "ranks did not slow as much")
            detail += f": {ratio:.2f}x (threshold {FLEET.rank_straggler_ratio:g}x)"
            finding = {"kind": "slow_rank", "job": job, "rank": e["rank"], "cluster": cluster,
                       "Hostname": e["Hostname"], "gpu": e["gpu"], "detail": detail,
                       "ratio": ratio, "compared_with": against, "cause": cause,
                       "advice": advice}  # fmt: skip
            if hot > FLEET.throttle_share and "thermal_throttle" not in its_mods:
                finding["cause"] += f" (its GPU thermal-throttled {hot:.0%} of the time)"
            findings.append(finding)
            report["slow_ranks"].append(finding)
        if not slow:
            continue
        waiting_hosts = set()
        for e in members:
            k = (cluster, job, e["rank"])
            kind, _ = verdict.get(k, ("", {}))
            if e in slow or kind not in ("communication", "waiting_on_peer"):
                continue
            explained.add(k)  # it waits for the slow rank: that is the finding
            report["waiting_ranks"] += 1
            if e["Hostname"] not in slow_hosts:
                waiting_hosts.add(e["Hostname"])
        report["waiting_nodes"] = len(waiting_hosts)

    for k, (kind, m) in verdict.items():
        if kind in BOTTLENECK_KINDS and k not in explained:
            findings.append({
                "kind": kind, "job": m.get("training_job"), "rank": m.get("rank"),
                **where(m), "modifiers": mods.get(k, []),
                "detail": "verdict of the node's exporter: " + _kind(kind, mods.get(k, [])),
            })  # fmt: skip
    for k, its in mods.items():
        if "tcp_suspected" in its and k not in explained and k in verdict:
            m = verdict[k][1]
            if verdict[k][0] not in BOTTLENECK_KINDS:
                findings.append({"kind": "tcp_suspected", "job": m.get("training_job"),
                                 "rank": m.get("rank"), **where(m),
                                 "detail": "modifier of the node's exporter verdict"})
    for r in results.get("zones", []):
        if _val(r) > 1:
            findings.append({
                "kind": "cross_az", "job": r["metric"].get("training_job"),
                "cluster": r["metric"].get("cluster"),
                "detail": f"ranks in {_val(r):.0f} availability zones",
            })  # fmt: skip
    faulted = {(f.get("cluster"), f.get("Hostname"), f.get("gpu"))
               for f in findings if f["kind"] == "gpu_fault"}  # fmt: skip
    findings = [f for f in findings if f["kind"] != "gpu_down"
                or (f.get("cluster"), f.get("Hostname"), f.get("gpu")) not in faulted]
    nodes = {(m.get("cluster"), m.get(host)) for m in gpus}
    return {"gpus": len(gpus), "nodes": len(nodes), "jobs": job_reports, "findings": findings}


def render_fleet(report: dict[str, Any], base: str) -> str:
    """The fleet report for a terminal: one block per job, its slow rank first."""
    out = [f"fleet via {base}: {report['status']}; {report['gpus']} GPU(s) "
           f"on {report['nodes']} node(s), {len(report['jobs'])} training job(s)"]
    faults = [f for f in report["findings"] if f["kind"] in ("gpu_down", "gpu_fault")]
    if faults:
        out += ["", f"HARDWARE FAULT on {len(faults)} GPU(s): drain before they run jobs"]
        out += [f"  {f.get('Hostname')} gpu {f.get('gpu')}: {f['detail']}" for f in faults]
    for job in report["jobs"]:
        out += ["", f"JOB {job['job']}" + (f" (cluster {job['cluster']})" if job["cluster"]
                                            else "")
                + f": {job['ranks']} rank(s) on {job['nodes']} node(s), step "
                  f"{job['step_seconds']:.3f} s"]  # fmt: skip
        for f in job["slow_ranks"]:
            out.append(f"  SLOW: rank {f['rank']} on {f['Hostname']} (gpu {f['gpu']}): "
                       f"{f['detail']}")
            out.append(f"    likely cause, {f['Hostname']}'s own verdict: {f['cause']}")
            if f["advice"]:
                out.append(f"    {f['advice']}")
        if job["waiting_ranks"]:
            out.append(f"  {job['waiting_ranks']} other rank(s) on {job['waiting_nodes']} "
                       "other node(s) wait for it in all-reduce (their verdict: "
                       "communication): fix the slow rank first")
        if not job["slow_ranks"] and job["ranks"] > 1:
            out.append("  no rank stands out")
    rest = [f for f in report["findings"]
            if f["kind"] not in ("slow_rank", "gpu_down", "gpu_fault")]  # fmt: skip
    if rest:
        out += ["", "OTHER FINDINGS"]
        for f in rest:
            at = " ".join(f"{k}={f[k]}" for k in ("job", "rank", "Hostname", "gpu")
                          if f.get(k) is not None)  # fmt: skip
            out.append(f"  {f['kind']:<16} {at}: {f['detail']}")
    return "\n".join(out)


def fleet(base: str, as_json: bool, timeout: float, host_label: str = HOST_LABEL) -> int:
    """Query Prometheus, print the findings."""
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, promql in fleet_queries(host_label).items():
            results[name] = _query(base, promql, timeout)
    except (OSError, ValueError, KeyError) as exc:
        _error(f"cannot query {base}: {getattr(exc, 'reason', None) or exc}")
        return EXIT_UNKNOWN
    if results["gpus"] and not results["recorded"]:
        _error(NO_RULES.format(base=base))
        return EXIT_UNKNOWN
    report = analyse_fleet(results, host_label)
    for f in report["findings"]:  # a GPU fault verdict names the GPU and its faults
        if f["kind"] == "gpu_fault":
            f["detail"] = ", ".join(f.get("modifiers", [])) or f["detail"]
    no_data = not results["gpus"] and not results["busy"] and not results["verdicts"]
    status = "unknown" if no_data else ("bottleneck" if report["findings"] else "healthy")
    report["status"] = status
    print(json.dumps(report, indent=2) if as_json else render_fleet(report, base))
    return {"unknown": EXIT_UNKNOWN, "bottleneck": EXIT_BOTTLENECK}.get(status, EXIT_HEALTHY)


# ----------------------------------------------------------------- a job's goodput


def _goodput_args(args: argparse.Namespace) -> str:
    """``--since`` checked (default 24h) with ``--job`` and ``--prometheus``; ValueError
    naming what is wrong."""
    if args.job is None:
        raise ValueError("--since goes with --job NAME (a training job's goodput)")
    if not args.job.strip():
        raise ValueError(f"--job: expected a training job's name, got {args.job!r}")
    if not args.prometheus:
        raise ValueError("--job reads the goodput counters from Prometheus: "
                         "add --prometheus URL")
    since: str = args.since if args.since is not None else DEFAULT_SINCE
    since_seconds(since)
    return since


def job_goodput(base: str, job: str, since: str, as_json: bool, timeout: float,
                host_label: str = HOST_LABEL) -> int:  # fmt: skip
    """Query Prometheus for one training job's goodput and badput over ``since``, print
    them. Exit 0 when printed, 2 when the job has no series in the period (or none
    grew) or Prometheus cannot be read."""
    results: dict[str, list[dict[str, Any]]] = {}
    known: list[str] = []  # when the job has no series: the jobs that have
    try:
        for name, promql in goodput_queries(job, since, host_label).items():
            results[name] = _query(base, promql, timeout)
        if not results["nodes"]:
            known = sorted(r["metric"].get("training_job", "")
                           for r in _query(base, known_jobs_query(since), timeout))
    except (OSError, ValueError, KeyError) as exc:
        _error(f"cannot query {base}: {getattr(exc, 'reason', None) or exc}")
        return EXIT_UNKNOWN
    if not results["nodes"]:
        if known:
            listed = ", ".join(known[:10]) + (f" and {len(known) - 10} more"
                                              if len(known) > 10 else "")
            _error(f"no goodput or badput series for training job {job!r} in the last "
                   f"{since} at {base}; jobs with goodput there: {listed}")
        else:
            _error(f"no goodput series at {base} in the last {since}: its exporters do not "
                   "serve goodput accounting (stepscope_job_goodput_gpu_seconds_total) yet, "
                   "or no training job reported a step")
        return EXIT_UNKNOWN
    report = analyse_goodput(job, since, results)
    if report["goodput_ratio"] is None:
        _error(f"training job {job!r} held no GPU time in the last {since} at {base}: its "
               "counters are there but did not grow: it held no GPUs in the period")
        return EXIT_UNKNOWN
    print(json.dumps(report, indent=2) if as_json else render_goodput(report, base))
    return EXIT_HEALTHY


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
