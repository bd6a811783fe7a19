"""FSDP: ``watch_fsdp`` times FSDP's gradient reduce-scatter as ``comm``, reduces
bit-identically to FSDP's own, and a FSDP run serves what a DDP run of the same
workload serves: 2 ranks (gloo, CPU) → SDK → a real exporter → /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.integration_runs import assert_same_series, exporter, run_ranks, served


def test_fsdp_serves_the_ddp_loops_series_with_its_reduce_scatter_as_comm(
        tmp_path: Path) -> None:
    exp, ingest, uuids = exporter(tmp_path)
    try:
        ddp = run_ranks("plain-ddp", "ddp", ingest, uuids, tmp_path)
        fsdp = run_ranks("plain-fsdp", "fsdp", ingest, uuids, tmp_path)
        assert all(r["comm_watched"] for r in ddp + fsdp)
        assert all(r["grads_identical"] is True for r in fsdp)
        assert_same_series(served(exp, "ddp"), served(exp, "fsdp"))
    finally:
        assert exp.stop() == 0
