"""Prometheus protobuf exposition: delimited ``io.prometheus.client.MetricFamily`` messages.

What a Prometheus with native histograms on asks for first: each family one
length-prefixed ``MetricFamily`` message (client_model's ``metrics.proto``), with a
family's native histograms (:class:`~stepscope.core.exposition.NativeHistogram`) as
exponential buckets instead of one series per bucket. Names, labels and values are the
text format's (:func:`stepscope.core.exposition.render`): counters keep the name they are
given (dcgm-exporter's have no ``_total``).

Written by hand, not with the ``protobuf`` runtime: the exporter needs six wire-format
rules (varint, zig-zag, 64-bit double, length-delimited) for one fixed schema, and the
runtime would be a dependency of every install for one content type. The tests decode
what this writes with the real runtime.

Labels travel as rendered strings (one escaping per label set, shared by the text
writer); this writer reads the pairs back from the string it knows the grammar of
(:func:`~stepscope.core.exposition.label_string`) and keeps each label set's encoded
bytes, so a steady node's labels are parsed once, not once per scrape.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable

from stepscope.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    SUMMARY,
    UNTYPED,
    Family,
    NativeHistogram,
    label_string,
)

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
    "encoding=delimited"
)

# MetricType (metrics.proto)
_TYPE_COUNTER, _TYPE_GAUGE, _TYPE_SUMMARY, _TYPE_UNTYPED, _TYPE_HISTOGRAM = 0, 1, 2, 3, 4
_SCALAR_TYPES = {COUNTER: _TYPE_COUNTER, GAUGE: _TYPE_GAUGE, UNTYPED: _TYPE_UNTYPED}
# the Metric field holding each scalar type's value message
_SCALAR_FIELD = {_TYPE_GAUGE: 2, _TYPE_COUNTER: 3, _TYPE_UNTYPED: 5}

# wire types
_VARINT, _FIXED64, _LEN = 0, 1, 2

_DOUBLE = struct.Struct("<d").pack
_SMALL = [bytes((n,)) for n in range(128)]

# A gap of up to this many empty buckets stays inside a span as zero deltas (a delta is
# one byte, a new span four): client_golang's choice.
_MAX_GAP = 2

# Label sets whose encoded bytes are kept (a node with 512 ranks has ~4,000); past it
# the cache starts over rather than grow with churning label sets.
_CACHE_LIMIT = 32_768

_PAIR = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")
# an "le" pair that ends the label string, the way join_labels appends it
_LE_LAST = re.compile(r'[{,]le="([^"\\]*)"\}$')


def _varint(n: int) -> bytes:
    """An unsigned varint (uint32/uint64 and lengths)."""
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:  # most metrics' lengths: two bytes
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    """sint32/sint64's zig-zag mapping: 0, -1, 1, -2 → 0, 1, 2, 3."""
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _double_field(field: int, value: float) -> bytes:
    return _key(field, _FIXED64) + _DOUBLE(value)


def _uint_field(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + _varint(value)


def _sint_field(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + _varint(_zigzag(value))


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_labels(labels: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of a rendered label string, unescaped."""
    return [(name, _unescape(value)) for name, value in _PAIR.findall(labels)]


_encoded: dict[str, bytes] = {}


def _label_fields(labels: str) -> bytes:
    """A Metric's ``label`` fields (repeated LabelPair, field 1) for a label string."""
    try:
        return _encoded[labels]
    except KeyError:
        pass
    out = b"".join(
        _len_field(
            1, _len_field(1, name.encode("utf-8")) + _len_field(2, value.encode("utf-8"))
        )
        for name, value in parse_labels(labels)
    )
    if len(_encoded) >= _CACHE_LIMIT:
        _encoded.clear()
    _encoded[labels] = out
    return out


def _split_le(labels: str) -> tuple[str, float]:
    """A bucket sample's label string without its ``le`` pair, and the bound."""
    m = _LE_LAST.search(labels)
    if m is not None:
        base = labels[: m.start()] + "}" if labels[m.start()] == "," else ""
        return base, float(m.group(1))
    pairs = parse_labels(labels)
    bound = next((float(v) for k, v in pairs if k == "le"), float("inf"))
    return label_string([(k, v) for k, v in pairs if k != "le"]), bound


def native_fields(h: NativeHistogram) -> bytes:
    """The native part of a Histogram message: schema, zero bucket, positive spans and
    deltas. Runs of more than two empty buckets split a span; at least one span is
    written (a no-op one for no observations, as metrics.proto asks)."""
    out = [
        _sint_field(5, h.schema),
        _double_field(6, h.zero_threshold),
        _uint_field(7, h.zero_count),
    ]
    spans: list[tuple[int, int]] = []  # (gap before it, or first index; length)
    deltas: list[int] = []
    prev = 0  # the previous bucket's count (deltas run across spans)
    start: int | None = None  # the open span's first bucket index
    end = 0  # the index after its last non-empty bucket
    last_end: int | None = None  # the index after the previous span
    for k, count in enumerate(h.counts):
        if not count:
            continue
        i = h.offset + k
        if start is not None and i - end <= _MAX_GAP:
            for _ in range(end, i):  # the empty buckets inside the span
                deltas.append(-prev)
                prev = 0
        else:
            if start is not None:
                spans.append((start if last_end is None else start - last_end, end - start))
                last_end = end
            start = i
        deltas.append(count - prev)
        prev = count
        end = i + 1
    if start is not None:
        spans.append((start if last_end is None else start - last_end, end - start))
    else:
        spans.append((0, 0))
    for offset, length in spans:
        out.append(_len_field(12, _sint_field(1, offset) + _uint_field(2, length)))
    out.extend(_sint_field(13, d) for d in deltas)
    return b"".join(out)


def _histogram_metrics(fam: Family) -> list[bytes]:
    """One Metric per series of a histogram (or summary) family: count, sum, classic
    buckets (without +Inf, which the count implies) and the native buckets if any."""
    series: dict[str, list[object]] = {}  # base labels -> [count, sum, buckets]

    def entry(labels: str) -> list[object]:
        got = series.get(labels)
        if got is None:
            got = series[labels] = [0.0, 0.0, []]
        return got

    for suffix, labels, value in fam.samples:
        if suffix == "_bucket":
            base, bound = _split_le(labels)
            if bound != float("inf"):
                buckets = entry(base)[2]
                assert isinstance(buckets, list)
                buckets.append(_len_field(3, _uint_field(1, int(value)) + _double_field(2, bound)))
        elif suffix == "_count":
            entry(labels)[0] = value
        elif suffix == "_sum":
            entry(labels)[1] = value
    native = fam.native or {}
    metrics = []
    for labels, (count, total, buckets) in series.items():
        assert isinstance(count, float) and isinstance(total, float)
        assert isinstance(buckets, list)
        body = [_uint_field(1, int(count)), _double_field(2, total), *buckets]
        hist = native.get(labels)
        if hist is not None:
            body.append(native_fields(hist))
        metrics.append(_metric_field(_label_fields(labels) + _len_field(7, b"".join(body))))
    return metrics


def _summary_metrics(fam: Family) -> list[bytes]:
    """One Metric per series of a summary: count, sum and quantiles."""
    series: dict[str, list[object]] = {}
    for suffix, labels, value in fam.samples:
        if suffix in ("_count", "_sum"):
            got = series.setdefault(labels, [0.0, 0.0, []])
            got[0 if suffix == "_count" else 1] = value
        elif not suffix:
            pairs = parse_labels(labels)
            q = next((float(v) for k, v in pairs if k == "quantile"), None)
            if q is None:
                continue
            base = label_string([(k, v) for k, v in pairs if k != "quantile"])
            quantiles = series.setdefault(base, [0.0, 0.0, []])[2]
            assert isinstance(quantiles, list)
            quantiles.append(_len_field(3, _double_field(1, q) + _double_field(2, value)))
    out = []
    for labels, (count, total, quantiles) in series.items():
        assert isinstance(count, float) and isinstance(total, float)
        assert isinstance(quantiles, list)
        body = _uint_field(1, int(count)) + _double_field(2, total) + b"".join(quantiles)
        out.append(_metric_field(_label_fields(labels) + _len_field(4, body)))
    return out


_METRIC = _key(4, _LEN)  # MetricFamily.metric


def _family_message(name: str, help: str, typ: int, metrics: list[bytes]) -> bytes:
    """A delimited MetricFamily; ``metrics`` are Metric messages, each already framed as
    the ``metric`` field (:func:`_metric_field`)."""
    body = b"".join(
        [
            _len_field(1, name.encode("utf-8")),
            _len_field(2, help.encode("utf-8")),
            _uint_field(3, typ),
            *metrics,
        ]
    )
    return _varint(len(body)) + body


def _metric_field(metric: bytes) -> bytes:
    return _METRIC + _varint(len(metric)) + metric


def _scalar_messages(fam: Family) -> list[bytes]:
    """Counter, gauge and untyped families. Samples with a suffix (an ``_info`` gauge
    from prometheus_client) form a family of their own, named as the text names them."""
    typ = _SCALAR_TYPES.get(fam.type, _TYPE_UNTYPED)
    field = _SCALAR_FIELD[typ]
    by_suffix: dict[str, list[bytes]] = {}
    tag = _key(field, _LEN) + _SMALL[9] + _key(1, _FIXED64)  # value message: one double
    cached = _encoded
    metric, varint, double = _METRIC, _varint, _DOUBLE
    for suffix, labels, value in fam.samples:
        lbl = cached.get(labels)
        if lbl is None:
            lbl = _label_fields(labels)
        body = lbl + tag + double(value)
        by_suffix.setdefault(suffix, []).append(metric + varint(len(body)) + body)
    return [
        _family_message(fam.name + suffix, fam.help, typ, metrics)
        for suffix, metrics in by_suffix.items()
    ]


def render_protobuf(families: Iterable[Family]) -> bytes:
    """Write families as delimited MetricFamily messages; families without samples are
    skipped. A summary with native buckets is written as a (native) histogram."""
    out: list[bytes] = []
    for fam in families:
        if not fam.samples:
            continue
        if fam.type == HISTOGRAM or (fam.type == SUMMARY and fam.native):
            out.append(
                _family_message(fam.name, fam.help, _TYPE_HISTOGRAM, _histogram_metrics(fam))
            )
        elif fam.type == SUMMARY:
            out.append(_family_message(fam.name, fam.help, _TYPE_SUMMARY, _summary_metrics(fam)))
        else:
            out.extend(_scalar_messages(fam))
    return b"".join(out)
