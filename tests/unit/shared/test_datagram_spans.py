"""The ``spans`` field (named time between steps): compatible both ways within v1."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stepscope.shared.datagram import (
    SPANS,
    Limits,
    Rejection,
    StepEncoder,
    StepRecord,
    parse_datagram,
)
from tests.support import REPO

# the last commit whose datagram.py predates "spans" (the exporter of 0.1.x on main)
BEFORE_SPANS = "feb903f"


def _sdk_datagram(spans: tuple[tuple[str, float], ...]) -> bytes:
    enc = StepEncoder("llama", 0, 0, 1, "bf16")
    return enc.encode((7, False, 1.7e9, 1.25, 0.0, 0.25, 0.0, 0, 0.0, spans), 0)


def _old_datagram_module(tmp_path: Path) -> ModuleType:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git checkout: the older exporter's parser cannot be read")
    text = subprocess.run(
        ["git", "show", f"{BEFORE_SPANS}:exporter/stepscope/shared/datagram.py"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if text.returncode != 0:
        pytest.skip(f"commit {BEFORE_SPANS} not in this checkout")
    path = tmp_path / "old_datagram.py"
    path.write_text(text.stdout)
    spec = importlib.util.spec_from_file_location("old_datagram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_datagram"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["old_datagram"]
    assert "spans" not in text.stdout
    return module


def test_an_exporter_older_than_spans_accepts_a_new_sdks_datagram(tmp_path: Path) -> None:
    old = _old_datagram_module(tmp_path)
    rec = old.parse_datagram(_sdk_datagram((("checkpoint", 1.0),)), old.Limits())
    assert not isinstance(rec, old.Rejection), rec
    assert rec.other == pytest.approx(1.0)  # the span's time is other, as before


def test_an_old_sdks_datagram_parses_with_no_spans() -> None:
    rec = parse_datagram(_sdk_datagram(()), Limits())
    assert isinstance(rec, StepRecord) and rec.spans is None
    assert b"spans" not in _sdk_datagram(())


def test_spans_are_seconds_by_name_with_unknown_names_as_other() -> None:
    raw = _sdk_datagram((("checkpoint", 0.5), ("evaluation", 0.25)))
    obj: dict[str, Any] = json.loads(raw)
    obj["spans"]["warmup-profiler"] = 0.125  # a name a newer SDK may send
    rec = parse_datagram(json.dumps(obj).encode(), Limits())
    assert isinstance(rec, StepRecord) and rec.spans is not None
    assert dict(zip(SPANS, rec.spans, strict=True)) == {
        "checkpoint": 0.5, "evaluation": 0.25, "logging": 0.0, "other": 0.125}  # fmt: skip


def test_spans_longer_than_the_steps_other_time_are_scaled_to_fit() -> None:
    # host-timed spans vs a step measured with CUDA events: never more than other
    rec = parse_datagram(_sdk_datagram((("checkpoint", 1.5), ("logging", 0.5))), Limits())
    assert isinstance(rec, StepRecord) and rec.spans is not None
    assert sum(rec.spans) == pytest.approx(rec.other) and rec.other == pytest.approx(1.0)
    assert rec.spans[0] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ([1.0], "wrong_type"),
        ({"checkpoint": "1"}, "wrong_type"),
        ({"checkpoint": -1.0}, "out_of_range"),
        ({f"s{i}": 0.1 for i in range(17)}, "out_of_range"),
        (None, "wrong_type"),
    ],
)
def test_a_malformed_spans_field_is_rejected_under_its_reason(spans: Any, expected: str) -> None:
    obj = json.loads(_sdk_datagram(()))
    obj["spans"] = spans
    result = parse_datagram(json.dumps(obj).encode(), Limits())
    assert isinstance(result, Rejection) and result.reason == expected


def test_empty_spans_mean_none() -> None:
    obj = json.loads(_sdk_datagram(()))
    obj["spans"] = {"checkpoint": 0.0}
    rec = parse_datagram(json.dumps(obj).encode(), Limits())
    assert isinstance(rec, StepRecord) and rec.spans is None


def test_a_tail_carries_the_spans_after_the_last_step_and_is_no_step(tmp_path: Path) -> None:
    enc = StepEncoder("llama", 3, 1, 4, "bf16", "GPU-a")
    data = enc.encode_tail((41, 1.7e9, 4.5, (("checkpoint", 4.0), ("logging", 0.25))), 2)
    rec = parse_datagram(data, Limits())
    assert isinstance(rec, StepRecord) and rec.tail
    assert (rec.job, rec.rank, rec.local_rank, rec.world_size, rec.uuid) == (
        "llama", 3, 1, 4, "GPU-a")
    assert (rec.step, rec.dur, rec.other, rec.dropped) == (41, 4.5, 4.5, 2)
    assert rec.spans == (4.0, 0.0, 0.25, 0.0)
    assert not parse_datagram(_sdk_datagram((("checkpoint", 1.0),)), Limits()).tail  # type: ignore[union-attr]
    # an exporter older than tails refuses it by its type, and nothing else
    old = _old_datagram_module(tmp_path)
    refused = old.parse_datagram(data, old.Limits())
    assert refused.reason == "type"
