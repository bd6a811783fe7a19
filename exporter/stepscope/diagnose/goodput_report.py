"""A training job's goodput and badput over a period, in GPU-hours: what
``stepscope diagnose --prometheus URL --job NAME --since 24h`` prints. Pure functions:
the PromQL, the report made from its results, the report as text; the command runs the
queries (:func:`stepscope.diagnose.cli.job_goodput`).

Each node's exporter counts, per training job, the GPU-seconds its ranks' GPUs spent in
productive steps and those lost by cause (``badput_type``). The report is their
``increase()`` over the period, summed over the job's nodes and clusters (one name in
two clusters is summed: the clusters are named beside it), per cause sorted by loss,
each with its share of the GPU time the job held (goodput plus all badput), and the
goodput ratio. docs/diagnosis.md ("Goodput: where the GPU-hours go") describes it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from stepscope.core.labels import HOST_LABEL, with_host_label

GOODPUT = "stepscope_job_goodput_gpu_seconds_total"
BADPUT = "stepscope_job_badput_gpu_seconds_total"
DEFAULT_SINCE = "24h"

# Prometheus' duration syntax: units largest first, each at most once (1h30m, 7d, 90s)
_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?"
                       r"(?:(\d+)ms)?")  # fmt: skip
_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def since_seconds(text: str) -> float:
    """Seconds in a Prometheus duration (``24h``, ``7d``, ``1h30m``); ValueError naming
    ``--since`` and the text for anything else, or for a zero duration."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"--since: expected a Prometheus duration such as 24h, 7d or 1h30m, "
                         f"got {text!r}")
    seconds = sum(int(n) * unit for n, unit in zip(match.groups(), _UNIT_SECONDS, strict=True)
                  if n is not None)  # fmt: skip
    if seconds <= 0:
        raise ValueError(f"--since: the period must be longer than zero, got {text!r}")
    return float(seconds)


def _quoted(value: str) -> str:
    # a PromQL string literal: Go's escapes, which JSON's are a subset of
    return json.dumps(value, ensure_ascii=False)


def goodput_queries(job: str, since: str, host_label: str = HOST_LABEL) -> dict[str, str]:
    """The PromQL of the report for training job ``job`` over ``since``, for the host
    label the fleet's exporters serve."""
    # the host label is put in by name, not by with_host_label: the job's name may hold
    # the word
    host = with_host_label("Hostname", host_label)
    sel = f"{{training_job={_quoted(job)}}}"
    return {
        "goodput": f"sum(increase({GOODPUT}{sel}[{since}]))",
        "badput": f"sum by (badput_type) (increase({BADPUT}{sel}[{since}]))",
        # the nodes that served either family in the period, per cluster
        "nodes": (f"count by (cluster) (group by (cluster, {host}) ("
                  f"last_over_time({GOODPUT}{sel}[{since}]) "
                  f"or last_over_time({BADPUT}{sel}[{since}])))"),
    }  # fmt: skip


def known_jobs_query(since: str) -> str:
    """The training jobs with goodput counted in the period (asked when ``--job`` names
    none, to say which exist)."""
    return f"count by (training_job) (last_over_time({GOODPUT}[{since}]))"


def _value(row: dict[str, Any]) -> float:
    v = float(row["value"][1])
    return v if math.isfinite(v) else 0.0


def analyse_goodput(job: str, since: str, results: dict[str, list[dict[str, Any]]]
                    ) -> dict[str, Any]:  # fmt: skip
    """The report from the results of :func:`goodput_queries` (Prometheus' instant-vector
    rows). GPU-hours are GPU-seconds / 3600; a share is of the GPU-hours held (goodput
    plus all badput), so goodput's and the causes' shares add up to 1. Causes that lost
    nothing in the period are left out. ``goodput_ratio`` is None when nothing was held."""
    goodput = sum(_value(r) for r in results.get("goodput", [])) / 3600
    causes = {}
    for r in results.get("badput", []):
        lost = _value(r) / 3600
        if lost > 0:
            causes[r["metric"].get("badput_type", "")] = lost
    badput = sum(causes.values())
    held = goodput + badput
    clusters = sorted(({"cluster": r["metric"].get("cluster"), "nodes": int(_value(r))}
                       for r in results.get("nodes", [])),
                      key=lambda c: str(c["cluster"] or ""))  # fmt: skip
    return {
        "job": job,
        "since": since,
        "clusters": clusters,
        "nodes": sum(c["nodes"] for c in clusters),
        "gpu_hours": {"held": held, "goodput": goodput, "badput": badput},
        "goodput_ratio": goodput / held if held > 0 else None,
        "badput": [{"badput_type": cause, "gpu_hours": lost, "share": lost / held}
                   for cause, lost in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))],
    }  # fmt: skip


def _where(report: dict[str, Any]) -> str:
    parts = [f"{c['cluster'] or '(no cluster label)'} ({c['nodes']})"
             for c in report["clusters"]]  # fmt: skip
    noun = "cluster" if len(parts) == 1 else "clusters"
    return f"{report['nodes']} node(s) in {noun} {', '.join(parts)}"


def render_goodput(report: dict[str, Any], base: str) -> str:
    """The report for a terminal: the job, where it ran, then goodput and each cause in
    GPU-hours with its share of the time held, most lost first, and the goodput ratio."""
    hours = report["gpu_hours"]
    held = hours["held"]

    def share(v: float) -> str:
        return f"{v / held:.1%}" if held > 0 else "-"

    rows = [("held", hours["held"], share(held)),
            ("goodput", hours["goodput"], share(hours["goodput"])),
            ("badput", hours["badput"], share(hours["badput"]))]  # fmt: skip
    rows += [(f"  {c['badput_type']}", c["gpu_hours"], share(c["gpu_hours"]))
             for c in report["badput"]]  # fmt: skip
    width = max(len(name) for name, _, _ in rows)
    out = [f"training job {report['job']}, last {report['since']} via {base}: "
           f"{_where(report)}", "",
           f"{'':<{width}}  {'GPU-HOURS':>10}  {'SHARE':>6}"]  # fmt: skip
    out += [f"{name:<{width}}  {value:>10.2f}  {pct:>6}" for name, value, pct in rows]
    out.append("")
    if hours["goodput"] == 0:
        out.append(f"goodput ratio 0.0%: no productive step counted in the last "
                   f"{report['since']}")
    else:
        out.append(f"goodput ratio {report['goodput_ratio']:.1%}")
    return "\n".join(out)
