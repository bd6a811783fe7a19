"""Verdicts as metric families: one-hot ``stepscope_bottleneck{kind}`` and modifiers.

Labels: the per-rank label set (``job``, ``rank``, ``local_rank``, ``gpu``, ``UUID``,
``modelName``, ``Hostname``); a GPU that no rank reported has empty ``job``, ``rank``
and ``local_rank``. Modifiers are a separate family so that the kind stays one-hot:
``stepscope_bottleneck{kind="input_cpu"} == 1`` selects exactly the starved ranks.
"""

from __future__ import annotations

from stepscope.diagnose.model import KINDS, MODIFIERS, Verdict
from stepscope.exposition import Family, join_labels, label_string
from stepscope.gpu.fields import GAUGE
from stepscope.snapshot import Snapshot

_KIND = tuple(label_string((("kind", k),)) for k in KINDS)
_MODIFIER = tuple(label_string((("modifier", m),)) for m in MODIFIERS)


def subject_labels(v: Verdict, hostname: str) -> str:
    """The rank label set of :func:`stepscope.training.metrics.rank_labels`, for any subject."""
    s = v.subject
    return label_string(
        (
            ("job", s.job),
            ("rank", str(s.rank) if s.rank is not None else ""),
            ("local_rank", str(s.local_rank) if s.local_rank is not None else ""),
            ("gpu", str(s.gpu) if s.gpu is not None else ""),
            ("UUID", s.uuid),
            ("modelName", s.model),
            ("Hostname", hostname),
        )
    )


def diagnosis_families(snapshot: Snapshot) -> list[Family]:
    """``stepscope_bottleneck``, ``stepscope_bottleneck_modifier`` and the window."""
    diag = snapshot.diagnosis
    if diag is None:
        return []
    kind = Family(
        "stepscope_bottleneck",
        GAUGE,
        "The bottleneck verdict per training rank (or per GPU without a rank) over the "
        "diagnosis window: 1 for the verdict's kind, 0 for the others (docs/diagnosis.md).",
    )
    modifier = Family(
        "stepscope_bottleneck_modifier",
        GAUGE,
        "Qualifiers of the verdict (fp32_no_tensor, low_occupancy, thermal_throttle, "
        "power_cap, tcp_suspected): 1 when it applies.",
    )
    for v in diag.verdicts:
        lbl = subject_labels(v, snapshot.hostname)
        for name, k in zip(KINDS, _KIND, strict=True):
            kind.add(join_labels(lbl, k), 1.0 if v.kind == name else 0.0)
        for name, m in zip(MODIFIERS, _MODIFIER, strict=True):
            modifier.add(join_labels(lbl, m), 1.0 if name in v.modifiers else 0.0)
    window = Family(
        "stepscope_diagnosis_window_seconds",
        GAUGE,
        "Time the snapshots behind the current verdicts span (up to the diagnosis window).",
    )
    window.add("", diag.window_seconds)
    return [kind, modifier, window]
