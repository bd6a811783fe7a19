"""The verdicts on /metrics: each subject's active kind and modifiers only.

The families used to be one-hot (every kind and modifier of every subject, 0 or 1);
every query the shipped rules, dashboards and ``diagnose --prometheus`` run selected
``== 1``. These tests show the new encoding serves exactly the one-hot's ``== 1``
series, and that the one-hot's ``{kind="x"} == 0`` is ``{kind!="x"}`` now.
"""

from __future__ import annotations

import itertools

from stepscope.core.exposition import render
from stepscope.core.labels import GpuIdentity, LabelSchemaBuilder
from stepscope.diagnose.metrics import diagnosis_families
from stepscope.diagnose.model import KINDS, MODIFIERS, Diagnosis, Subject, Verdict
from tests.support import parse_samples

GPUS = [GpuIdentity(i, f"GPU-{i}", f"0000:{i:02x}:00.0", "NVIDIA H100 80GB HBM3")
        for i in range(len(KINDS))]  # fmt: skip
# every kind on one rank each; modifiers spread over them (none, one, several)
VERDICTS = (
    *(Verdict(Subject("llama", i, i, i, f"GPU-{i}"), kind, tuple(MODIFIERS[i:i + (i % 3)]))
      for i, kind in enumerate(KINDS)),
    Verdict(Subject(gpu=99, uuid="GPU-99"), "idle"),  # a GPU no rank reported
)


def served() -> dict[str, list[tuple[dict[str, str], float]]]:
    labels = LabelSchemaBuilder().build("node-a", GPUS)
    text = render(diagnosis_families(Diagnosis(30.0, 30, VERDICTS), labels)).decode()
    return parse_samples(text)


def one_hot() -> set[tuple[str, str, str]]:
    """The old encoding's (rank, kind, value) for every subject and kind."""
    return {(str(v.subject.rank), k, "1" if v.kind == k else "0")
            for v in VERDICTS[:-1] for k in KINDS}  # fmt: skip


def test_each_subject_serves_its_one_kind_at_1_and_nothing_else() -> None:
    kinds = served()["stepscope_bottleneck"]
    assert len(kinds) == len(VERDICTS)
    assert {v for _, v in kinds} == {1.0}
    by_rank = {lbl.get("rank"): lbl["kind"] for lbl, _ in kinds}
    want: dict[str | None, str] = {str(v.subject.rank): v.kind for v in VERDICTS[:-1]}
    assert by_rank == {**want, None: "idle"}
    # the GPU without a rank carries no empty rank labels
    alone = next(lbl for lbl, _ in kinds if "rank" not in lbl)
    assert "training_job" not in alone and "local_rank" not in alone


def test_the_old_one_hot_selections_are_the_same_series() -> None:
    served_kinds = {(lbl["rank"], lbl["kind"]) for lbl, _ in served()["stepscope_bottleneck"]
                    if "rank" in lbl}  # fmt: skip
    old = one_hot()
    # stepscope_bottleneck == 1 (alerts, dashboards, diagnose --prometheus): the same series
    assert served_kinds == {(r, k) for r, k, v in old if v == "1"}
    # stepscope_bottleneck{kind="x"} == 0 was "judged, and not x": now {kind!="x"}
    for x in KINDS:
        was = {r for r, k, v in old if k == x and v == "0"}
        now = {r for r, k in served_kinds if k != x}
        assert now == was, x


def test_modifiers_serve_the_ones_that_apply_in_their_documented_order() -> None:
    mods = served()["stepscope_bottleneck_modifier"]
    assert {v for _, v in mods} == {1.0}
    got = sorted((lbl["rank"], lbl["modifier"]) for lbl, _ in mods)
    assert got == sorted((str(v.subject.rank), m) for v in VERDICTS for m in v.modifiers)
    # sum by (modifier) (...) counts the subjects each applies to, as it did with zeros
    counts = {m: len(list(g)) for m, g in itertools.groupby(sorted(m for _, m in got))}
    assert counts == {m: sum(m in v.modifiers for v in VERDICTS) for m in MODIFIERS
                      if any(m in v.modifiers for v in VERDICTS)}  # fmt: skip
