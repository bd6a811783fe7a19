"""Prometheus text exposition (format 0.0.4) for metric families.

Why not ``prometheus_client.generate_latest``: it renames every counter family
to ``<name>_total`` in its HELP/TYPE lines, while dcgm-exporter serves counters
such as ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` under their plain names, and
those names are a contract with existing dashboards. This writer keeps the name
it is given; prometheus_client still supplies the number formatting and the
process collector's families (see :func:`from_client_metric`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Family types as the text format names them.
GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"
SUMMARY = "summary"
UNTYPED = "untyped"


def format_value(value: float) -> str:
    """A sample value as Prometheus reads it: integers without a fraction."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape_label_value(value: str) -> str:
    """Escape a label value: backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def label_string(labels: Iterable[tuple[str, str]]) -> str:
    """``{a="1",b="2"}`` for the given pairs, ``""`` for none.

    A pair with an empty value is left out: Prometheus stores an empty label as absent,
    and a series that claims ``gpu=""`` only confuses a reader (and ``honor_labels``).
    """
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels if v)
    return f"{{{inner}}}" if inner else ""


def join_labels(prefix: str, extra: str) -> str:
    """Merge two rendered label strings (either may be empty)."""
    if not prefix:
        return extra
    if not extra:
        return prefix
    return prefix[:-1] + "," + extra[1:]


class NativeHistogram(NamedTuple):
    """The exponential buckets of one histogram series (a Prometheus native histogram).

    Bucket ``i`` holds the observations in ``(2**((i-1) / 2**schema), 2**(i / 2**schema)]``;
    ``counts[k]`` is bucket ``offset + k`` (not cumulative; zeros allowed, trailing ones
    too). Observations at most ``zero_threshold`` are ``zero_count``. Count and sum are the
    family's ``_count`` and ``_sum`` samples. Only the protobuf exposition writes it
    (:mod:`stepscope.core.exposition_proto`); the text format has no native histograms.
    """

    schema: int
    zero_threshold: float
    zero_count: int
    offset: int
    counts: tuple[int, ...]


@dataclass
class Family:
    """A metric family ready to write: each sample is (name suffix, labels, value).

    ``labels`` is an already rendered label string (see :func:`label_string`), so
    a label set that repeats across families (a GPU's) is escaped once; the protobuf
    writer reads the pairs back from it (cached by string).

    ``native``: for a histogram (or a summary whose distribution is kept), each series'
    exponential buckets by its label string (that of its ``_sum`` and ``_count``). The
    protobuf exposition writes such a series as one native histogram; the text format
    ignores it.
    """

    name: str
    type: str
    help: str
    samples: list[tuple[str, str, float]] = field(default_factory=list)
    native: dict[str, NativeHistogram] | None = None

    def add(self, labels: str, value: float, suffix: str = "") -> None:
        self.samples.append((suffix, labels, value))

    def add_native(self, labels: str, histogram: NativeHistogram) -> None:
        """Attach the exponential buckets of the series whose labels are ``labels``."""
        if self.native is None:
            self.native = {}
        self.native[labels] = histogram

    @classmethod
    def single(cls, name: str, type: str, help: str, value: float, labels: str = "") -> Family:
        """A family of one sample (a node-wide gauge or counter)."""
        return cls(name, type, help, [("", labels, value)])


def render(families: Iterable[Family]) -> bytes:
    """Write families in the text format; families without samples are skipped."""
    out: list[str] = []
    append = out.append
    for fam in families:
        if not fam.samples:
            continue
        append(f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.type}\n")
        name = fam.name
        for suffix, labels, value in fam.samples:
            append(f"{name}{suffix}{labels} {format_value(value)}\n")
    return "".join(out).encode("utf-8")


def from_client_metric(metric: Metric) -> Family:
    """Convert a prometheus_client family (e.g. from ProcessCollector) to ours."""
    name = metric.name
    typ = metric.type
    if typ == "counter":
        # prometheus_client strips _total from counter family names; the text
        # format wants the TYPE line to carry the sample name.
        name = f"{metric.name}_total"
    elif typ in ("unknown", "info", "stateset"):
        typ = "gauge" if typ != "unknown" else "untyped"
    fam = Family(name, typ, metric.documentation)
    for s in metric.samples:
        if s.name.endswith("_created"):
            continue
        suffix = s.name[len(name) :] if s.name.startswith(name) else ""
        fam.add(label_string(sorted(s.labels.items())), s.value, suffix)
    return fam
