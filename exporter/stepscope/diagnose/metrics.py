"""Verdicts as metric families: ``stepscope_bottleneck{kind}`` and its modifiers.

Both serve the active state only, as a state set whose inactive members are absent
(kube-state-metrics' one-hot families are the classic cardinality complaint: here 11
kinds and 12 modifiers per subject were ~95% zeros). A subject has exactly one
``stepscope_bottleneck`` series, the verdict's kind, at 1; ``stepscope_bottleneck_modifier``
has one series per modifier that applies, at 1, and none when none applies. So
``stepscope_bottleneck{kind="input_cpu"}`` (or ``== 1``, as before) selects exactly the
starved ranks, and what the one-hot wrote as ``{kind="x"} == 0`` is ``{kind!="x"}``.
When a verdict changes, the old kind's series leaves the exposition and Prometheus marks
it stale at the next scrape.

Labels: the rank label set of the pass's label schema; a GPU that no rank reported has
no ``training_job``, ``rank`` and ``local_rank``.
"""

from __future__ import annotations

from stepscope.core.exposition import COUNTER, GAUGE, Family, join_labels, label_string
from stepscope.core.labels import LabelSchema
from stepscope.diagnose.goodput import BADPUT_TYPES
from stepscope.diagnose.model import KINDS, MODIFIERS, Diagnosis

_KIND = {k: label_string((("kind", k),)) for k in KINDS}
_MODIFIER = {m: label_string((("modifier", m),)) for m in MODIFIERS}
_BADPUT = {b: label_string((("badput_type", b),)) for b in BADPUT_TYPES}


def diagnosis_families(diag: Diagnosis, labels: LabelSchema) -> list[Family]:
    """``stepscope_bottleneck``, ``stepscope_bottleneck_modifier`` and the window."""
    kind = Family(
        "stepscope_bottleneck",
        GAUGE,
        "The bottleneck verdict per training rank (or per GPU without a rank) over the "
        "diagnosis window: one series per subject, its verdict's kind, value 1; the other "
        "kinds are absent (docs/diagnosis.md).",
    )
    modifier = Family(
        "stepscope_bottleneck_modifier",
        GAUGE,
        "Qualifiers of the verdict (" + ", ".join(MODIFIERS) + "): a series at 1 for each "
        "that applies; absent otherwise.",
    )
    for v in diag.verdicts:
        s = v.subject
        lbl = labels.subject(s.job, s.rank, s.local_rank, s.uuid, s.group or None)
        kind.add(join_labels(lbl, _KIND[v.kind]), 1.0)
        # in MODIFIERS' order, whatever order the verdict lists them in
        for name in MODIFIERS:
            if name in v.modifiers:
                modifier.add(join_labels(lbl, _MODIFIER[name]), 1.0)
    window = Family.single(
        "stepscope_diagnosis_window_seconds",
        GAUGE,
        "Time the snapshots behind the current verdicts span (up to the diagnosis window).",
        diag.window_seconds,
    )
    return [kind, modifier, window]


def goodput_families(diag: Diagnosis, labels: LabelSchema) -> list[Family]:
    """``stepscope_job_goodput_gpu_seconds_total`` and ``..._badput_...{badput_type}``:
    each training job's GPU-seconds on this node, productive and lost by cause."""
    goodput = Family(
        "stepscope_job_goodput_gpu_seconds_total",
        COUNTER,
        "GPU-seconds of productive step time of the job's ranks on this node (the step "
        "body, unless host- or transfer-bound), since the job was first seen here; with "
        "stepscope_job_badput_gpu_seconds_total it adds up to the time the ranks held "
        "their GPUs (docs/metrics.md#goodput-and-badput).",
    )
    badput = Family(
        "stepscope_job_badput_gpu_seconds_total",
        COUNTER,
        "GPU-seconds the job's ranks on this node held their GPUs without productive "
        "step time, by cause (" + ", ".join(BADPUT_TYPES) + "); every cause from the "
        "job's first pass on the node, at 0 until it accrues (rate() needs the zero).",
    )
    for j in diag.goodput:
        lbl = labels.subject(j.job, None, None, None)
        goodput.add(lbl, j.goodput)
        for cause, seconds in j.badput:
            badput.add(join_labels(lbl, _BADPUT[cause]), seconds)
    return [goodput, badput]
