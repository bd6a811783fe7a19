"""Fuzz target: both exposition writers, text and protobuf, over any label values,
values and native histograms.

Label values come from senders (a job name, a pod name); values can be NaN or infinite.
Whatever they hold, the text format must parse back (prometheus_client's parser) with the
same label values and sample count, and the protobuf format must decode (the real
protobuf runtime, client_model's schema) with the same families, label values and
native histogram spans.
"""

from __future__ import annotations

import math

import atheris

with atheris.instrument_imports(include=["stepscope"]):
    from stepscope.core.exposition import (
        Family,
        NativeHistogram,
        join_labels,
        label_string,
        render,
    )
    from stepscope.core.exposition_proto import render_protobuf

from prometheus_client.parser import text_string_to_metric_families

from tests.security.fuzz._harness import fuzz
from tests.support.metrics_proto import decode_delimited, labels_of

TYPES = ("gauge", "counter", "histogram")


def families_from(fdp: atheris.FuzzedDataProvider) -> tuple[list[Family], list[set[str]]]:
    """Up to 3 families of up to 3 series each; and each family's job_name values."""
    families, names = [], []
    for f in range(fdp.ConsumeIntInRange(1, 3)):
        kind = TYPES[fdp.ConsumeIntInRange(0, len(TYPES) - 1)]
        name = f"fuzz_family_{f}" + ("_total" if kind == "counter" else "")
        fam = Family(name, kind, fdp.ConsumeUnicodeNoSurrogates(40))
        wanted: set[str] = set()
        for s in range(fdp.ConsumeIntInRange(1, 3)):
            job = fdp.ConsumeUnicodeNoSurrogates(30)
            wanted.add(job)
            labels = label_string([("job_name", job), ("series", str(s))])
            if kind == "histogram":
                count = float(fdp.ConsumeIntInRange(0, 1000))
                fam.add(join_labels(labels, '{le="+Inf"}'), count, "_bucket")
                fam.add(labels, fdp.ConsumeRegularFloat(), "_sum")
                fam.add(labels, count, "_count")
                if fdp.ConsumeBool():
                    counts = tuple(fdp.ConsumeIntInRange(0, 100) for _ in range(4))
                    fam.add_native(labels, NativeHistogram(
                        schema=fdp.ConsumeIntInRange(-4, 8),
                        zero_threshold=abs(fdp.ConsumeRegularFloat()),
                        zero_count=fdp.ConsumeIntInRange(0, 100),
                        offset=fdp.ConsumeIntInRange(-100, 100),
                        counts=counts,
                    ))  # fmt: skip
            else:
                fam.add(labels, fdp.ConsumeFloat())
        families.append(fam)
        names.append(wanted)
    return families, names


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def one_input(data: bytes) -> None:
    families, names = families_from(atheris.FuzzedDataProvider(data))
    text = render(families).decode("utf-8")
    parsed = list(text_string_to_metric_families(text))
    # the parser names a counter's family without its "_total" (OpenMetrics' way)
    assert [p.name for p in parsed] == [f.name.removesuffix("_total") for f in families], text
    for fam, wanted, back in zip(families, names, parsed, strict=True):
        assert len(back.samples) == len(fam.samples), text
        for (suffix, _, value), sample in zip(fam.samples, back.samples, strict=True):
            assert sample.name == fam.name + suffix, (sample, text)
            assert same(sample.value, value), (sample, value)
        # an empty label value is left out of the series (Prometheus reads it as absent)
        assert {s.labels.get("job_name", "") for s in back.samples} == wanted, text
    decoded = decode_delimited(render_protobuf(families))
    assert [mf.name for mf in decoded] == [f.name for f in families]
    for wanted, mf in zip(names, decoded, strict=True):
        assert {labels_of(m).get("job_name", "") for m in mf.metric} == wanted


if __name__ == "__main__":
    fuzz(one_input)
