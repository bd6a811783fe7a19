"""Named time between steps in the aggregator: per rank (for its verdict) and per job
(served as stepscope_job_span_seconds_total), measured steps only."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.core.exposition import render
from stepscope.core.labels import LabelSchemaBuilder
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.metrics import span_families
from stepscope.shared.datagram import StepRecord
from tests.support import parse_samples
from tests.support.clocks import ManualClock


def record(**changes: Any) -> StepRecord:
    fields: dict[str, Any] = dict(
        job="job", rank=0, local_rank=0, step=0, t=1000.0, dur=1.5, data_wait=0.0,
        compute=0.5, comm=0.0, other=1.0, warmup=False, tokens=0, flops=0.0,
        precision="bf16", world_size=2, pid=7, uuid=None, dropped=0,
    )  # fmt: skip
    fields.update(changes)
    return StepRecord(**fields)


def test_spans_add_up_per_rank_and_per_job_and_warmup_steps_do_not_count() -> None:
    agg = Aggregator(clock=ManualClock())
    ckpt = (1.0, 0.0, 0.0, 0.0)
    agg.add(record(step=0, warmup=True, spans=ckpt))
    agg.add(record(step=1, spans=ckpt))
    agg.add(record(step=2, spans=(0.0, 0.25, 0.0, 0.5)))
    agg.add(record(step=3))  # no spans: nothing added
    agg.add(record(rank=1, local_rank=1, pid=8, spans=(0.5, 0.0, 0.0, 0.0)))
    agg.add(record(job="quiet", pid=9))  # a job that names no span
    view = agg.view()
    by_rank = {(r.job, r.rank): r.span_seconds for r in view.ranks}
    assert by_rank == {("job", 0): (1.0, 0.25, 0.0, 0.5), ("job", 1): (0.5, 0.0, 0.0, 0.0),
                       ("quiet", 0): None}  # fmt: skip
    jobs = {j.job: j.span_seconds for j in view.jobs}
    assert jobs == {"job": (1.5, 0.25, 0.0, 0.5), "quiet": None}

    labels = LabelSchemaBuilder().build("node-1", (), [r.identity for r in view.ranks])
    served = parse_samples(render(span_families(view, labels)).decode())
    got = {(lbl["training_job"], lbl["span"]): v
           for lbl, v in served["stepscope_job_span_seconds_total"]}  # fmt: skip
    # never-named spans and the quiet job have no series: at most 4 a job
    assert got == {("job", "checkpoint"): 1.5, ("job", "evaluation"): 0.25,
                   ("job", "other"): 0.5}  # fmt: skip
    assert pytest.approx(sum(got.values())) == 2.25
