"""Datagram validation: what a training rank may send, and why anything else is dropped."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.shared.datagram import (
    MAX_DATAGRAM_BYTES,
    MAX_RANK,
    REJECT_REASONS,
    Limits,
    Rejection,
    StepRecord,
    parse_datagram,
)

LIMITS = Limits()


def good(**changes: Any) -> dict[str, Any]:
    """A valid step datagram as the SDK sends it, with ``changes`` applied."""
    obj: dict[str, Any] = {
        "v": 1, "type": "step", "job": "llama-8b", "rank": 3, "local_rank": 3,
        "world_size": 16, "pid": 4242, "uuid": "GPU-5b0f3a52-8f7e-4f3e-9c55-73746570736d",
        "step": 17, "warmup": False, "t": 1_750_000_000.25, "dur": 0.5, "data": 0.1,
        "compute": 0.3, "comm": 0.05, "tokens": 8192, "flops": 3.2e14,
        "precision": "bf16", "dropped": 2,
    }
    obj.update(changes)
    return {k: v for k, v in obj.items() if v is not _DROP}


_DROP = object()


def encode(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def reason(data: bytes) -> str:
    result = parse_datagram(data, LIMITS)
    assert isinstance(result, Rejection), result
    assert result.reason in REJECT_REASONS
    return result.reason


def test_a_full_datagram_becomes_a_record_with_the_rest_of_the_step_as_other() -> None:
    rec = parse_datagram(encode(good()), LIMITS)
    assert isinstance(rec, StepRecord)
    assert (rec.job, rec.rank, rec.local_rank, rec.world_size, rec.pid) == (
        "llama-8b", 3, 3, 16, 4242)
    assert rec.dur == 0.5 and rec.tokens == 8192 and rec.flops == 3.2e14
    assert rec.other == pytest.approx(0.05)
    assert rec.data_wait + rec.compute + rec.comm + rec.other == pytest.approx(rec.dur)
    assert rec.dropped == 2 and rec.precision == "bf16" and not rec.warmup


def test_only_required_fields_default_the_rest() -> None:
    minimal = {"v": 1, "type": "step", "job": "j", "rank": 0, "local_rank": 0, "step": 0,
               "t": 1.0, "dur": 0.25}
    rec = parse_datagram(encode(minimal), LIMITS)
    assert isinstance(rec, StepRecord)
    assert rec.other == 0.25 and rec.tokens == 0 and rec.flops == 0.0
    assert rec.precision == "bf16" and rec.uuid is None and rec.world_size is None


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    assert isinstance(parse_datagram(encode(good(future_field=[1, 2])), LIMITS), StepRecord)


def test_phases_may_exceed_dur_by_rounding_only() -> None:
    rounding = good(dur=1.0, data=0.5, compute=0.5, comm=0.0000005)
    rec = parse_datagram(encode(rounding), LIMITS)
    assert isinstance(rec, StepRecord) and rec.other == 0.0
    assert reason(encode(good(dur=1.0, data=0.5, compute=0.5, comm=0.01))) == "out_of_range"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"x" * (MAX_DATAGRAM_BYTES + 1), "oversize"),
        (b'{"v": 1, "job": "\xff"}', "not_utf8"),
        (b"\xed\xa0\x80", "not_utf8"),  # an encoded lone surrogate
        (b"", "not_json"),
        (b"{not json", "not_json"),
        (b"[" * 2000 + b"]" * 2000, "not_json"),  # nesting deep enough to recurse
        (b"[1, 2]", "not_object"),
        (b'"step"', "not_object"),
        (b"null", "not_object"),
        (encode(good(v=_DROP)), "version"),
        (encode(good(v=2)), "version"),
        (encode(good(v="1")), "version"),
        (encode(good(v=True)), "version"),
        (encode(good(type="hello")), "type"),
        (encode(good(type=_DROP)), "missing_field"),
        (encode(good(job=_DROP)), "missing_field"),
        (encode(good(rank=_DROP)), "missing_field"),
        (encode(good(local_rank=_DROP)), "missing_field"),
        (encode(good(step=_DROP)), "missing_field"),
        (encode(good(t=_DROP)), "missing_field"),
        (encode(good(dur=_DROP)), "missing_field"),
        (encode(good(rank="3")), "wrong_type"),
        (encode(good(rank=3.0)), "wrong_type"),
        (encode(good(rank=True)), "wrong_type"),
        (encode(good(rank=None)), "wrong_type"),
        (encode(good(dur="0.5")), "wrong_type"),
        (encode(good(tokens=1.5)), "wrong_type"),
        (encode(good(warmup=1)), "wrong_type"),
        (encode(good(job=7)), "wrong_type"),
        (encode(good(uuid=None)), "wrong_type"),
        (encode(good(precision=16)), "wrong_type"),
        (b'{"v":1,"type":"step","job":"j","rank":0,"local_rank":0,"step":0,"t":1,"dur":NaN}',
         "out_of_range"),
        (b'{"v":1,"type":"step","job":"j","rank":0,"local_rank":0,"step":0,"t":1,'
         b'"dur":Infinity}', "out_of_range"),
        (b'{"v":1,"type":"step","job":"j","rank":0,"local_rank":0,"step":0,"t":1,"dur":1e999}',
         "out_of_range"),
        (encode(good(flops=10**400)), "out_of_range"),
        (encode(good(dur=0)), "out_of_range"),
        (encode(good(dur=-1.0)), "out_of_range"),
        (encode(good(dur=86400.5)), "out_of_range"),
        (encode(good(data=-0.1)), "out_of_range"),
        (encode(good(t=0)), "out_of_range"),
        (encode(good(rank=-1)), "out_of_range"),
        (encode(good(rank=MAX_RANK)), "out_of_range"),
        (encode(good(local_rank=1024)), "out_of_range"),
        (encode(good(rank=16, world_size=16)), "out_of_range"),
        (encode(good(world_size=0)), "out_of_range"),
        (encode(good(step=-5)), "out_of_range"),
        (encode(good(tokens=-1)), "out_of_range"),
        (encode(good(flops=-1.0)), "out_of_range"),
        (encode(good(dropped=-1)), "out_of_range"),
        (encode(good(dur=0.5, data=0.3, compute=0.3)), "out_of_range"),
        (encode(good(job="")), "bad_label"),
        (encode(good(job='a"b')), "bad_label"),
        (encode(good(job="a b")), "bad_label"),
        (encode(good(job="job\n")), "bad_label"),  # "$" alone would accept this
        (encode(good(job="é")), "bad_label"),
        (encode(good(job="j" * 129)), "bad_label"),
        (encode(good(uuid="GPU 1")), "bad_label"),
        (encode(good(precision="bf17")), "bad_label"),
    ],
)
def test_every_bad_datagram_is_dropped_under_its_reason(data: bytes, expected: str) -> None:
    assert reason(data) == expected


def test_the_label_length_limit_is_configurable() -> None:
    short = Limits(max_label_length=8)
    assert isinstance(parse_datagram(encode(good(job="j" * 8)), short), StepRecord)
    rej = parse_datagram(encode(good(job="j" * 9)), short)
    assert isinstance(rej, Rejection) and rej.reason == "bad_label"


def test_a_datagram_of_exactly_the_maximum_size_is_accepted() -> None:
    obj = good(pad="")
    obj["pad"] = "x" * (MAX_DATAGRAM_BYTES - len(encode(obj)))
    data = encode(obj)
    assert len(data) == MAX_DATAGRAM_BYTES
    assert isinstance(parse_datagram(data, LIMITS), StepRecord)


# --- property-based: never an exception, every bad datagram counted under a reason ---

PROPERTY = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.binary(max_size=MAX_DATAGRAM_BYTES + 64))
def test_arbitrary_bytes_never_raise_and_are_rejected_under_a_known_reason(data: bytes) -> None:
    result = parse_datagram(data, LIMITS)
    if isinstance(result, Rejection):
        assert result.reason in REJECT_REASONS
    else:  # arbitrary bytes that happen to be a valid datagram (practically never)
        assert isinstance(result, StepRecord)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
FIELDS = list(good())


@PROPERTY
@given(st.sampled_from(FIELDS), json_values | st.just(_DROP))
def test_one_mutated_field_is_either_accepted_as_valid_or_rejected_with_a_reason(
    key: str, value: Any
) -> None:
    obj = good(**{key: value})
    data = json.dumps(obj).encode()
    result = parse_datagram(data, LIMITS)
    if isinstance(result, Rejection):
        assert result.reason in REJECT_REASONS
        return
    # accepted: then the mutated value really is valid for that field
    assert isinstance(result, StepRecord)
    for f in ("dur", "t", "data", "compute", "comm", "flops"):
        assert math.isfinite(float(obj.get(f, 0.0)))
    assert result.dur > 0 and result.other >= 0
    assert result.data_wait + result.compute + result.comm <= result.dur * 1.001 + 1e-6
    assert result.job == obj["job"] and result.rank == obj["rank"]


@PROPERTY
@given(
    st.fixed_dictionaries(
        {
            "rank": st.integers(0, 255), "local_rank": st.integers(0, 7),
            "step": st.integers(0, 10**9), "dur": st.floats(1e-6, 86400.0),
            "split": st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
            "tokens": st.integers(0, 10**9), "flops": st.floats(0, 1e20),
            "warmup": st.booleans(), "precision": st.sampled_from(["bf16", "fp8", "fp32"]),
            "job": st.from_regex(r"[A-Za-z0-9_.:/@+=-]{1,128}", fullmatch=True),
        }
    )
)
def test_every_well_formed_step_is_accepted(fields: dict[str, Any]) -> None:
    a, b, c = fields.pop("split")
    total = max(a + b + c, 1.0)
    dur = fields["dur"]
    obj = good(**fields, world_size=256, data=dur * a / total, compute=dur * b / total,
               comm=dur * c / total)
    result = parse_datagram(json.dumps(obj).encode(), LIMITS)
    assert isinstance(result, StepRecord), result
    assert result.data_wait + result.compute + result.comm + result.other == pytest.approx(
        dur, rel=1e-6)


def test_the_sdks_wire_format_is_accepted() -> None:
    # byte for byte what stepscope.train encodes: a fixed head, then numbers printed
    # with fixed precision (phases may then exceed dur by rounding only)
    data = (
        b'{"v":1,"type":"step","job":"llama-8b","rank":1,"local_rank":1,"world_size":2,'
        b'"pid":77,"precision":"bf16","uuid":"GPU-1","step":9,"warmup":false,'
        b'"t":1750000000.123456,"dur":0.100000000,"data":0.033333334,"compute":0.033333334,'
        b'"comm":0.033333334,"tokens":512,"flops":0.0,"dropped":0}'
    )
    rec = parse_datagram(data, LIMITS)
    assert isinstance(rec, StepRecord) and rec.other == 0.0 and rec.flops == 0.0
