"""Verdicts as metric families: one-hot ``stepscope_bottleneck{kind}`` and modifiers.

Labels: the rank label set of the pass's label schema; a GPU that no rank reported has
empty ``job``, ``rank`` and ``local_rank``. Modifiers are a separate family so that the
kind stays one-hot: ``stepscope_bottleneck{kind="input_cpu"} == 1`` selects exactly the
starved ranks.
"""

from __future__ import annotations

from stepscope.core.exposition import GAUGE, Family, join_labels, label_string
from stepscope.core.labels import LabelSchema
from stepscope.diagnose.model import KINDS, MODIFIERS, Diagnosis

_KIND = tuple(label_string((("kind", k),)) for k in KINDS)
_MODIFIER = tuple(label_string((("modifier", m),)) for m in MODIFIERS)


def diagnosis_families(diag: Diagnosis, labels: LabelSchema) -> list[Family]:
    """``stepscope_bottleneck``, ``stepscope_bottleneck_modifier`` and the window."""
    kind = Family(
        "stepscope_bottleneck",
        GAUGE,
        "The bottleneck verdict per training rank (or per GPU without a rank) over the "
        "diagnosis window: 1 for the verdict's kind, 0 for the others (docs/diagnosis.md).",
    )
    modifier = Family(
        "stepscope_bottleneck_modifier",
        GAUGE,
        "Qualifiers of the verdict (" + ", ".join(MODIFIERS) + "): 1 when it applies.",
    )
    for v in diag.verdicts:
        s = v.subject
        lbl = labels.subject(s.job, s.rank, s.local_rank, s.uuid)
        for name, k in zip(KINDS, _KIND, strict=True):
            kind.add(join_labels(lbl, k), 1.0 if v.kind == name else 0.0)
        for name, m in zip(MODIFIERS, _MODIFIER, strict=True):
            modifier.add(join_labels(lbl, m), 1.0 if name in v.modifiers else 0.0)
    window = Family.single(
        "stepscope_diagnosis_window_seconds",
        GAUGE,
        "Time the snapshots behind the current verdicts span (up to the diagnosis window).",
        diag.window_seconds,
    )
    return [kind, modifier, window]
