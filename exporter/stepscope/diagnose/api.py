"""The ``/api/v1/diagnosis`` document: the latest verdicts as plain JSON data. Pure."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from stepscope.diagnose.model import Verdict
from stepscope.snapshot import Snapshot

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
        "advice": v.advice,
        "evidence": list(v.evidence),
        "signals": {k: _number(x) for k, x in v.signals.items()},
        "history": {k: [_number(x) for x in xs] for k, xs in v.history.items()},
    }


def diagnosis_document(snapshot: Snapshot | None) -> dict[str, Any]:
    """The whole document; ``status`` is ``unknown`` until a diagnosis exists."""
    if snapshot is None or snapshot.diagnosis is None:
        return {"version": API_VERSION, "status": "unknown", "verdicts": []}
    diag = snapshot.diagnosis
    return {
        "version": API_VERSION,
        "hostname": snapshot.hostname,
        "backend": snapshot.backend,
        "timestamp": snapshot.timestamp,
        "interval": snapshot.interval,
        "window_seconds": round(diag.window_seconds, 3),
        "samples": diag.samples,
        "status": diag.status,
        "rdma_ports": len(snapshot.rdma),
        "thresholds": dataclasses.asdict(diag.thresholds),
        "verdicts": [verdict_document(v) for v in diag.verdicts],
    }
