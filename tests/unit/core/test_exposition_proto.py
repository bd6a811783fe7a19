"""The protobuf writer, read back by the real protobuf runtime (metrics.proto's
descriptor): every field type, native buckets, and the same series as the text format."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stepscope.core.exposition import Family, NativeHistogram, label_string, render
from stepscope.core.exposition_proto import parse_labels, render_protobuf
from stepscope.core.health import process_families
from stepscope.core.snapshot import BODY, GZIP, PROTOBUF_GZIP
from stepscope.gpu.scenario import default_scenario
from stepscope.gpu.simulated import SimulatedBackend
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.source import IngestSource
from stepscope.shared.datagram import StepRecord
from tests.support import make_sampler, parse_samples
from tests.support.clocks import ManualClock
from tests.support.metrics_proto import decode_delimited, family_type, labels_of


def one(fam: Family) -> Any:
    (mf,) = decode_delimited(render_protobuf([fam]))
    return mf


def test_a_dcgm_counter_keeps_its_name_and_labels_are_unescaped() -> None:
    fam = Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy (in mJ).")
    odd = 'A "quoted"\\name\nx ünï'
    fam.add(label_string([("gpu", "0"), ("modelName", odd)]), 12345678.0)
    mf = one(fam)
    assert (mf.name, mf.help, family_type(mf)) == (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy (in mJ).", "COUNTER"
    )
    (m,) = mf.metric
    assert labels_of(m) == {"gpu": "0", "modelName": odd}
    assert m.counter.value == 12345678.0


@pytest.mark.parametrize(
    ("typ", "field"), [("gauge", "gauge"), ("untyped", "untyped"), ("counter", "counter")]
)
def test_scalar_types_carry_every_double(typ: str, field: str) -> None:
    fam = Family("stepscope_x", typ, "h")
    values = [0.0, -1.5, 1e300, 5e-324, float("inf"), float("-inf"), float("nan")]
    for i, v in enumerate(values):
        fam.add(label_string([("i", str(i))]), v)
    fam.add("", 7.0)  # no labels at all
    mf = one(fam)
    assert family_type(mf) == typ.upper()
    got = [getattr(m, field).value for m in mf.metric]
    assert got[:-2] == values[:-1] and math.isnan(got[-2]) and got[-1] == 7.0
    assert [labels_of(m) for m in mf.metric][-1] == {}


def test_an_info_family_from_prometheus_client_is_named_as_the_text_names_it() -> None:
    fam = Family("python_info", "gauge", "Python platform information")
    fam.add(label_string([("version", "3.11")]), 1.0, "_info")
    assert one(fam).name == "python_info_info"


def test_empty_families_are_not_written() -> None:
    assert render_protobuf([Family("stepscope_x", "gauge", "h")]) == b""


def histogram(native: NativeHistogram | None = None, count: float = 5.0) -> Family:
    fam = Family("stepscope_step_duration_seconds", "histogram", "Step time.")
    lbl = label_string([("training_job", "llm"), ("rank", "3")])
    for le, c in (("0.5", 1.0), ("1.0", 4.0), ("+Inf", count)):
        fam.add(lbl[:-1] + f',le="{le}"}}', c, "_bucket")
    fam.add(lbl, 3.75, "_sum")
    fam.add(lbl, count, "_count")
    if native is not None:
        fam.add_native(lbl, native)
    return fam


def test_a_classic_histogram_is_one_metric_with_its_buckets_and_no_inf_bucket() -> None:
    mf = one(histogram(count=2.0**40))
    assert family_type(mf) == "HISTOGRAM"
    (m,) = mf.metric
    assert labels_of(m) == {"training_job": "llm", "rank": "3"}, "le is not a label"
    h = m.histogram
    assert (h.sample_count, h.sample_sum) == (2**40, 3.75)  # a count past 32 bits
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(0.5, 1), (1.0, 4)]
    assert not h.HasField("schema") and len(h.positive_span) == 0, "not native"


def test_native_buckets_become_spans_and_deltas() -> None:
    # buckets -12 (1), -9 (3), -8 (0), -7 (2), then a gap of 5, bucket -1 (2), 0 (1)
    counts = (1, 0, 0, 3, 0, 2, 0, 0, 0, 0, 0, 2, 1)
    native = NativeHistogram(3, 2.0**-128, 4, -12, counts)
    h = one(histogram(native)).metric[0].histogram
    assert (h.schema, h.zero_threshold, h.zero_count) == (3, 2.0**-128, 4)
    # a gap of two empty buckets stays in the span; one of five starts another
    assert [(s.offset, s.length) for s in h.positive_span] == [(-12, 6), (5, 2)]
    assert list(h.positive_delta) == [1, -1, 0, 3, -3, 2, 0, -1]
    assert [b.upper_bound for b in h.bucket] == [0.5, 1.0], "classic buckets kept beside"
    # the deltas add back up to the counts
    expanded, run = [], 0
    for d in h.positive_delta:
        run += d
        expanded.append(run)
    assert expanded == [1, 0, 0, 3, 0, 2, 2, 1]


def test_a_native_histogram_without_observations_is_still_native() -> None:
    h = one(histogram(NativeHistogram(3, 2.0**-128, 0, 0, ()), count=0.0)).metric[0].histogram
    assert h.HasField("schema") and h.zero_threshold > 0
    assert [(s.offset, s.length) for s in h.positive_span] == [(0, 0)]
    assert list(h.positive_delta) == []


def test_negative_schema_and_offsets_zig_zag() -> None:
    h = one(histogram(NativeHistogram(-4, 0.0, 0, -70000, (5,)))).metric[0].histogram
    assert (h.schema, h.positive_span[0].offset, list(h.positive_delta)) == (-4, -70000, [5])


def test_a_summary_keeps_its_quantiles_and_with_native_buckets_becomes_a_histogram() -> None:
    fam = Family("stepscope_s", "summary", "h")
    lbl = label_string([("rank", "0")])
    fam.add(lbl[:-1] + ',quantile="0.5"}', 0.25)
    fam.add(lbl[:-1] + ',quantile="0.9"}', 0.75)
    fam.add(lbl, 10.0, "_sum")
    fam.add(lbl, 20.0, "_count")
    mf = one(fam)
    assert family_type(mf) == "SUMMARY"
    s = mf.metric[0].summary
    assert (s.sample_count, s.sample_sum) == (20, 10.0)
    assert [(q.quantile, q.value) for q in s.quantile] == [(0.5, 0.25), (0.9, 0.75)]
    assert labels_of(mf.metric[0]) == {"rank": "0"}

    rank = Family("stepscope_step_duration_seconds", "summary", "h")
    rank.add(lbl, 10.0, "_sum")
    rank.add(lbl, 20.0, "_count")
    rank.add_native(lbl, NativeHistogram(3, 2.0**-128, 0, 0, (20,)))
    mf = one(rank)
    assert family_type(mf) == "HISTOGRAM"
    h = mf.metric[0].histogram
    assert (h.sample_count, h.sample_sum, list(h.positive_delta)) == (20, 10.0, [20])


def test_le_anywhere_in_the_labels_is_found() -> None:
    fam = Family("h", "histogram", "h")
    fam.add(label_string([("a", 'x,le="1"'), ("le", "0.1"), ("z", "1")]), 2.0, "_bucket")
    fam.add(label_string([("a", 'x,le="1"'), ("le", "+Inf"), ("z", "1")]), 3.0, "_bucket")
    base = label_string([("a", 'x,le="1"'), ("z", "1")])
    fam.add(base, 0.5, "_sum")
    fam.add(base, 3.0, "_count")
    (m,) = one(fam).metric
    assert labels_of(m) == {"a": 'x,le="1"', "z": "1"}
    assert [(b.upper_bound, b.cumulative_count) for b in m.histogram.bucket] == [(0.1, 2)]


def test_label_strings_parse_back_to_their_pairs() -> None:
    pairs = [("a", ""), ("b", '\\"\n,='), ("c", "}{"), ("d", "\\n")]
    assert parse_labels(label_string(pairs)) == [p for p in pairs if p[1]]


Series = set[tuple[str, tuple[tuple[str, str], ...], float]]


def series_from_text(text: str) -> Series:
    out = set()
    for name, samples in parse_samples(text).items():
        for labels, value in samples:
            if name.endswith("_bucket") and labels.get("le") == "+Inf":
                continue  # implied by _count in protobuf
            out.add((name, tuple(sorted(labels.items())), value))
    return out


def steady(series: Series) -> Series:
    """The process's own figures move between two renderings: their names and labels."""
    return {(n, lbl, math.nan if n.startswith("process_") else v) for n, lbl, v in series}


def series_from_protobuf(body: bytes) -> Series:
    out = set()
    for mf in decode_delimited(body):
        for m in mf.metric:
            lbl = labels_of(m)
            key = tuple(sorted(lbl.items()))
            kind = family_type(mf)
            if kind == "HISTOGRAM":
                h = m.histogram
                out.add((mf.name + "_count", key, float(h.sample_count)))
                out.add((mf.name + "_sum", key, h.sample_sum))
                for b in h.bucket:
                    le = tuple(sorted({**lbl, "le": repr(b.upper_bound)}.items()))
                    out.add((mf.name + "_bucket", le, float(b.cumulative_count)))
            elif kind == "SUMMARY":
                out.add((mf.name + "_count", key, float(m.summary.sample_count)))
                out.add((mf.name + "_sum", key, m.summary.sample_sum))
            else:
                out.add((mf.name, key, getattr(m, kind.lower()).value))
    return out


def test_a_node_serves_the_same_series_in_both_formats() -> None:
    """Two simulated GPUs with two ranks reporting: every name, label set and value of
    the text exposition is in the protobuf one, and nothing else; the rank's step
    duration carries its native buckets."""
    agg = Aggregator()
    backend = SimulatedBackend(default_scenario(2), hostname="node-1", clock=ManualClock(1000.0))
    uuids = [g.uuid for g in backend.devices()]
    for rank in range(2):
        for i, dur in enumerate((0.2, 0.21, 0.45, 1.3)):
            agg.add(
                StepRecord(
                    job="llm", rank=rank, local_rank=rank, step=i, t=100.0 + i, dur=dur,
                    data_wait=0.0, compute=dur / 2, comm=0.0, other=dur / 2, warmup=i == 0,
                    tokens=10, flops=1e12, precision="bf16", world_size=2, pid=None,
                    uuid=uuids[rank], dropped=0,
                )
            )
    sampler = make_sampler(backend, sources=[IngestSource(agg)])
    published = sampler.sample_once()
    text = published.body.decode()
    proto = published.render_protobuf()
    got, want = steady(series_from_protobuf(proto)), steady(series_from_text(text))
    assert {n for n, _, _ in want} >= {"DCGM_FI_DEV_POWER_VIOLATION", "stepscope_mfu_ratio"}
    assert got == want
    step = next(
        mf for mf in decode_delimited(proto) if mf.name == "stepscope_step_duration_seconds"
    )
    assert family_type(step) == "HISTOGRAM" and len(step.metric) == 2
    for m in step.metric:
        h = m.histogram
        assert h.schema == 3 and sum(_expand(h.positive_delta)) == 3 == h.sample_count
    assert published.render_protobuf(gzipped=True) is published.render_protobuf(gzipped=True)


def _expand(deltas: Any) -> list[int]:
    out, run = [], 0
    for d in deltas:
        run += d
        out.append(run)
    return out


def test_process_families_are_written() -> None:
    names = {mf.name for mf in decode_delimited(render_protobuf(process_families()))}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert render(process_families())  # the text writer reads the same families


def test_a_protobuf_scraper_finds_protobuf_rendered_ahead_and_no_text_is_made() -> None:
    """The sampler renders ahead the form its scraper last read: a Prometheus with
    native histograms reads protobuf, so the next passes make protobuf, not text."""
    clock = ManualClock(1000.0)
    backend = SimulatedBackend(default_scenario(1), hostname="node-1", clock=clock)
    sampler = make_sampler(backend, clock=clock, wall_clock=lambda: 1.7e9 + clock.t)
    first = sampler.sample_once()
    assert first.has(BODY), "nobody has read yet: the first pass is made ready in text"
    clock.t += 0.5
    assert decode_delimited(first.protobuf(gzipped=True) and first.render_protobuf())
    clock.t += 0.5
    second = sampler.sample_once()
    assert second.has(PROTOBUF_GZIP) and not second.has(BODY) and not second.has(GZIP)
    assert not second.requested, "made ahead, not asked for"
