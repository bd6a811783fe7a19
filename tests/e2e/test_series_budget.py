"""The series budget: a busy node of 8 GPUs and 8 ranks of one job serves at most 700.

Series per node are what a fleet's Prometheus pays for (head series, memory, rule
evaluation: docs/scaling.md). Measured on this node shape before the budget: 1,051 series
with each rank on its GPU and 1,227 with ranks that name no GPU (one-hot verdicts over 16
subjects); after: ~640 (docs/metrics.md#what-each-family-costs-per-node). A family that
grows past the budget fails here with the table of the biggest families, so the count
cannot creep back unnoticed.
"""

from __future__ import annotations

import pytest

from tests.support.node_shape import GPUS, RANKS, busy_node, series_by_family, table

BUDGET = 700


@pytest.mark.parametrize("ranks_name_gpus", [True, False], ids=["ranks-on-gpus", "no-gpu-uuid"])
def test_a_busy_node_serves_at_most_700_series(ranks_name_gpus: bool) -> None:
    with busy_node(ranks_name_gpus=ranks_name_gpus) as exp:
        counts = series_by_family(exp.metrics())
    total = sum(counts.values())
    print(f"\n{GPUS} GPUs, {RANKS} ranks (ranks name their GPU: {ranks_name_gpus})\n"
          + table(counts))  # fmt: skip
    assert total <= BUDGET, (
        f"{total} series per node, over the budget of {BUDGET}; the biggest families:\n"
        + table(counts, top=10)
    )
    # what the budget must not cost: dcgm-exporter's families, one series per GPU each
    dcgm = {name: n for name, n in counts.items() if name.startswith("DCGM_FI_")}
    assert len(dcgm) > 30 and set(dcgm.values()) == {GPUS}, dcgm
    # every rank keeps its step time (sum and count), the job its distribution (16 + Inf)
    assert counts["stepscope_step_duration_seconds"] == 2 * RANKS
    assert counts["stepscope_job_step_duration_seconds"] == 17 + 2
    # one verdict per subject: the ranks (and the GPUs no rank names)
    assert counts["stepscope_bottleneck"] == RANKS + (0 if ranks_name_gpus else GPUS)
