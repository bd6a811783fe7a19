"""Lightning's StepscopeCallback serves what the plain-loop SDK serves for the same
workload: 2 DDP ranks (gloo) → callback → a real exporter → /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

from integration_runs import assert_same_series, exporter, run_ranks, served


def test_lightning_ddp_serves_the_plain_loops_series(tmp_path: Path) -> None:
    exp, ingest, uuids = exporter(tmp_path)
    try:
        plain = run_ranks("plain-ddp", "plain", ingest, uuids, tmp_path)
        framework = run_ranks("lightning-ddp", "lightning", ingest, uuids, tmp_path)
        assert all(r["comm_watched"] for r in plain + framework)
        assert_same_series(served(exp, "plain"), served(exp, "lightning"))
    finally:
        assert exp.stop() == 0
