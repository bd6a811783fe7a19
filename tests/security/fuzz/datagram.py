"""Fuzz target: the ingest's datagram parser, and the SDK's refusal parser.

Any bytes a local process sends: ``parse_datagram`` returns a step or a named rejection
and never raises; a step it accepts has label-safe identity labels and finite, bounded
numbers; a refusal parses or is ignored, never raises (a process can send the SDK junk).
"""

from __future__ import annotations

import math

import atheris

with atheris.instrument_imports(include=["stepscope"]):
    from stepscope.shared.datagram import (
        LABEL_VALUE_RE,
        MAX_STEP_SECONDS,
        REJECT_REASONS,
        Limits,
        Rejection,
        parse_datagram,
        parse_refusal,
    )

from tests.security.fuzz._harness import fuzz

LIMITS = Limits()


def label_safe(value: str | None) -> bool:
    """Accepted by the label rule, and nothing that would break a line of exposition."""
    return value is None or (
        LABEL_VALUE_RE.fullmatch(value) is not None and value.isprintable() and "\n" not in value
    )


def one_input(data: bytes) -> None:
    parsed = parse_datagram(data, LIMITS)
    if isinstance(parsed, Rejection):
        assert parsed.reason in REJECT_REASONS, parsed
    else:
        for label in (parsed.job, parsed.uuid, parsed.precision, parsed.nccl_transport):
            assert label_safe(label), parsed
        for name in ("t", "dur", "data_wait", "compute", "comm", "other", "flops"):
            value = getattr(parsed, name)
            assert math.isfinite(value), (name, value)
        assert 0.0 <= parsed.dur <= MAX_STEP_SECONDS, parsed.dur
        assert parsed.rank >= 0 and parsed.tokens >= 0, parsed
    parse_refusal(data)


if __name__ == "__main__":
    fuzz(one_input)
