"""client_model's ``io/prometheus/client/metrics.proto``, built at runtime for the real
``protobuf`` runtime to decode what the exporter's hand-written writer produces.

The descriptor is transcribed field by field from metrics.proto (prometheus/client_model,
proto2); no generated module and no protoc needed. :func:`decode_delimited` reads a
``/metrics`` body in the delimited protobuf format into ``MetricFamily`` messages.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_T = {
    "string": _F.TYPE_STRING,
    "double": _F.TYPE_DOUBLE,
    "uint64": _F.TYPE_UINT64,
    "uint32": _F.TYPE_UINT32,
    "int64": _F.TYPE_INT64,
    "sint32": _F.TYPE_SINT32,
    "sint64": _F.TYPE_SINT64,
}
_PKG = ".io.prometheus.client."
_TS = ".google.protobuf.Timestamp"

# message -> (field name, number, label, type or message/enum name)
_MESSAGES: dict[str, list[tuple[str, int, int, str]]] = {
    "LabelPair": [("name", 1, _OPT, "string"), ("value", 2, _OPT, "string")],
    "Gauge": [("value", 1, _OPT, "double")],
    "Counter": [
        ("value", 1, _OPT, "double"),
        ("exemplar", 2, _OPT, "Exemplar"),
        ("created_timestamp", 3, _OPT, _TS),
    ],
    "Quantile": [("quantile", 1, _OPT, "double"), ("value", 2, _OPT, "double")],
    "Summary": [
        ("sample_count", 1, _OPT, "uint64"),
        ("sample_sum", 2, _OPT, "double"),
        ("quantile", 3, _REP, "Quantile"),
        ("created_timestamp", 4, _OPT, _TS),
    ],
    "Untyped": [("value", 1, _OPT, "double")],
    "Histogram": [
        ("sample_count", 1, _OPT, "uint64"),
        ("sample_count_float", 4, _OPT, "double"),
        ("sample_sum", 2, _OPT, "double"),
        ("bucket", 3, _REP, "Bucket"),
        ("created_timestamp", 15, _OPT, _TS),
        ("schema", 5, _OPT, "sint32"),
        ("zero_threshold", 6, _OPT, "double"),
        ("zero_count", 7, _OPT, "uint64"),
        ("zero_count_float", 8, _OPT, "double"),
        ("negative_span", 9, _REP, "BucketSpan"),
        ("negative_delta", 10, _REP, "sint64"),
        ("negative_count", 11, _REP, "double"),
        ("positive_span", 12, _REP, "BucketSpan"),
        ("positive_delta", 13, _REP, "sint64"),
        ("positive_count", 14, _REP, "double"),
        ("exemplars", 16, _REP, "Exemplar"),
    ],
    "Bucket": [
        ("cumulative_count", 1, _OPT, "uint64"),
        ("cumulative_count_float", 4, _OPT, "double"),
        ("upper_bound", 2, _OPT, "double"),
        ("exemplar", 3, _OPT, "Exemplar"),
    ],
    "BucketSpan": [("offset", 1, _OPT, "sint32"), ("length", 2, _OPT, "uint32")],
    "Exemplar": [
        ("label", 1, _REP, "LabelPair"),
        ("value", 2, _OPT, "double"),
        ("timestamp", 3, _OPT, _TS),
    ],
    "Metric": [
        ("label", 1, _REP, "LabelPair"),
        ("gauge", 2, _OPT, "Gauge"),
        ("counter", 3, _OPT, "Counter"),
        ("summary", 4, _OPT, "Summary"),
        ("untyped", 5, _OPT, "Untyped"),
        ("histogram", 7, _OPT, "Histogram"),
        ("timestamp_ms", 6, _OPT, "int64"),
    ],
    "MetricFamily": [
        ("name", 1, _OPT, "string"),
        ("help", 2, _OPT, "string"),
        ("type", 3, _OPT, "MetricType"),
        ("metric", 4, _REP, "Metric"),
        ("unit", 5, _OPT, "string"),
    ],
}
METRIC_TYPES = ("COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM")


def _build() -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto(
        name="io/prometheus/client/metrics.proto",
        package="io.prometheus.client",
        syntax="proto2",
        dependency=["google/protobuf/timestamp.proto"],
    )
    enum = fd.enum_type.add(name="MetricType")
    for number, name in enumerate(METRIC_TYPES):
        enum.value.add(name=name, number=number)
    for msg_name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=msg_name)
        for name, number, label, typ in fields:
            f = msg.field.add(name=name, number=number, label=label)
            if typ in _T:
                f.type = _T[typ]
            elif typ == "MetricType":
                f.type, f.type_name = _F.TYPE_ENUM, _PKG + typ
            else:
                f.type = _F.TYPE_MESSAGE
                f.type_name = typ if typ.startswith(".") else _PKG + typ
    pool.Add(fd)
    found = pool.FindMessageTypeByName("io.prometheus.client.MetricFamily")
    return message_factory.GetMessageClass(found)


MetricFamily = _build()


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def decode_delimited(data: bytes) -> list[Any]:
    """Every MetricFamily in a delimited protobuf body, in order."""
    out = []
    pos = 0
    while pos < len(data):
        length, pos = _varint(data, pos)
        mf = MetricFamily()
        mf.ParseFromString(data[pos : pos + length])
        out.append(mf)
        pos += length
    return out


def family_type(mf: Any) -> str:
    """The family's MetricType by name (``"HISTOGRAM"``)."""
    return METRIC_TYPES[mf.type]


def labels_of(metric: Any) -> dict[str, str]:
    """A Metric's labels as a dict."""
    return {lp.name: lp.value for lp in metric.label}
