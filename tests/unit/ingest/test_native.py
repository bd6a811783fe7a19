"""A rank's step times in exponential buckets: the right bucket for every value, a
bounded memory, and the view the protobuf exposition writes."""

from __future__ import annotations

import math
import random

import pytest

from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.native import MAX_BUCKETS, ZERO_THRESHOLD, NativeCounts, bucket_index
from stepscope.shared.datagram import StepRecord


@pytest.mark.parametrize("schema", range(-4, 4))
def test_every_value_lands_in_the_bucket_whose_bounds_hold_it(schema: int) -> None:
    rng = random.Random(schema)
    for _ in range(5000):
        v = math.exp(rng.uniform(-15.0, 15.0))
        i = bucket_index(v, schema)
        assert 2.0 ** ((i - 1) / 2**schema) < v <= 2.0 ** (i / 2**schema)


def test_bounds_are_upper_inclusive_powers_of_two() -> None:
    # 1 s is the upper bound of bucket 0; 2 s of bucket 8 at schema 3 (8 a power of two)
    assert [bucket_index(v) for v in (1.0, 1.0000001, 2.0, 0.5)] == [0, 1, 8, -8]
    assert bucket_index(2.0**16, -4) == 1 and bucket_index(2.0**16 + 1, -4) == 2


def test_a_bucket_is_about_nine_percent_wide_at_schema_3() -> None:
    i = bucket_index(0.9)
    width = 2.0 ** (i / 8) / 2.0 ** ((i - 1) / 8) - 1
    assert width == pytest.approx(0.0905, abs=1e-4)


def test_counts_are_kept_dense_between_the_lowest_and_highest_bucket() -> None:
    n = NativeCounts()
    for v in (1.0, 1.0, 1.05, 2.0, 0.25):
        n.observe(v)
    h = n.view()
    assert (h.schema, h.zero_threshold, h.zero_count) == (3, ZERO_THRESHOLD, 0)
    assert h.offset == -16 and len(h.counts) == 25 and sum(h.counts) == 5
    assert h.counts[0 - h.offset] == 2 and h.counts[1 - h.offset] == 1


def test_a_range_too_wide_for_the_budget_halves_the_resolution_keeping_every_count() -> None:
    n = NativeCounts()
    values = [0.001 * 1.5**k for k in range(60)]  # 1 ms to ~26 h: 2**37
    for v in values:
        n.observe(v)
    h = n.view()
    assert h.schema == 2 and len(h.counts) <= MAX_BUCKETS and sum(h.counts) == len(values)
    # each value is still in the bucket that holds it at the coarser schema
    for v in values:
        assert h.counts[bucket_index(v, h.schema) - h.offset] > 0


def test_each_rank_keeps_its_native_buckets_from_measured_steps_only() -> None:
    agg = Aggregator()
    for rank, durs in ((0, (0.5, 0.5, 0.6)), (1, (1.0,))):
        for i, dur in enumerate(durs):
            agg.add(
                StepRecord(
                    job="j", rank=rank, local_rank=rank, step=i, t=10.0 + i, dur=dur,
                    data_wait=0.0, compute=dur, comm=0.0, other=0.0, warmup=False, tokens=0,
                    flops=0.0, precision="bf16", world_size=2, pid=None, uuid=None, dropped=0,
                )
            )
    agg.add(
        StepRecord(
            job="j", rank=1, local_rank=1, step=9, t=20.0, dur=30.0, data_wait=0.0,
            compute=30.0, comm=0.0, other=0.0, warmup=True, tokens=0, flops=0.0,
            precision="bf16", world_size=2, pid=None, uuid=None, dropped=0,
        )
    )
    r0, r1 = agg.view().ranks
    assert r0.native is not None and r1.native is not None
    assert r0.native.offset == bucket_index(0.5) and r0.native.counts == (2, 0, 0, 1)
    assert (r1.native.offset, r1.native.counts) == (0, (1,)), "the warm-up step is not in it"
