"""The ``/api/v1/diagnosis`` document: the latest verdicts as plain JSON data. Pure."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from stepscope.core.snapshot import Published
from stepscope.diagnose.analysis import DIAGNOSIS
from stepscope.diagnose.model import Diagnosis, JobGoodput, Verdict
from stepscope.gpu.model import GPU_PART
from stepscope.net.rdma import RDMA_PART

API_VERSION = 1


def _number(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return round(v, 6)


def verdict_document(v: Verdict) -> dict[str, Any]:
    """One verdict as JSON-ready data."""
    s = v.subject
    return {
        "subject": {
            "name": s.name,
            "job": s.job or None,
            "rank": s.rank,
            "local_rank": s.local_rank,
            "gpu": s.gpu,
            "uuid": s.uuid or None,
            "model": s.model or None,
        },
        "kind": v.kind,
        "modifiers": list(v.modifiers),
        "bottleneck": v.bottleneck,
        "fault": v.fault,
        "advice": v.advice,
        "evidence": list(v.evidence),
        "signals": {k: _number(x) for k, x in v.signals.items()},
        "history": {k: [_number(x) for x in xs] for k, xs in v.history.items()},
    }


def goodput_document(j: JobGoodput) -> dict[str, Any]:
    """One training job's goodput books on this node as JSON-ready data (GPU-seconds)."""
    held = j.held
    return {
        "job": j.job,
        "live_ranks": j.ranks,
        "held_gpu_seconds": _number(held),
        "goodput_gpu_seconds": _number(j.goodput),
        "badput_gpu_seconds": {cause: _number(v) for cause, v in j.badput},
        "pending_gpu_seconds": _number(j.pending),
        "goodput_ratio": _number(j.goodput / j.booked) if j.booked > 0 else None,
    }


def diagnosis_document(published: Published | None) -> dict[str, Any]:
    """The whole document; ``status`` is ``unknown`` until a diagnosis exists.

    ``faults``: the subjects with a hardware fault (also among ``verdicts``), so a script
    finds them without reading every verdict. ``sources``: every source's health and
    the evidence lines it gives about the node. A GPU that is down has ``gpu_up`` 0 and
    no other GPU signal: its readings before it went down are not current. ``goodput``:
    each training job's books on this node (docs/metrics.md#goodput-and-badput).
    """
    diag = published.result(DIAGNOSIS, Diagnosis) if published is not None else None
    if published is None or diag is None:
        return {"version": API_VERSION, "status": "unknown", "faults": [], "verdicts": [],
                "goodput": []}  # fmt: skip
    snapshot = published.snapshot
    gpu = snapshot.part(GPU_PART)
    return {
        "version": API_VERSION,
        "hostname": snapshot.hostname,
        "backend": gpu.backend if gpu is not None else None,
        "timestamp": snapshot.timestamp,
        "diagnosis_timestamp": diag.timestamp,
        "interval": snapshot.interval,
        "window_seconds": round(diag.window_seconds, 3),
        "samples": diag.samples,
        "status": diag.status,
        "faults": [
            {"subject": v.subject.name, "gpu": v.subject.gpu, "uuid": v.subject.uuid or None,
             "modifiers": list(v.modifiers), "advice": v.advice}
            for v in diag.faults
        ],
        "rdma_ports": len(rdma) if (rdma := snapshot.part(RDMA_PART)) is not None else 0,
        "thresholds": dataclasses.asdict(diag.thresholds),
        "sources": {
            name: {
                "success": h.success,
                "duration_seconds": _number(h.duration_seconds),
                "errors_total": h.errors_total,
                "last_error": h.last_error or None,
                "evidence": list(snapshot.evidence.get(name, ())),
            }
            for name, h in snapshot.health.items()
        },
        "verdicts": [verdict_document(v) for v in diag.verdicts],
        "goodput": [goodput_document(j) for j in diag.goodput],
    }


def diagnosis_json(published: Published | None, readiness: str) -> bytes:
    """The document as JSON bytes (a :class:`~stepscope.web.app.Page` renderer)."""
    return json.dumps(diagnosis_document(published), separators=(",", ":")).encode()
