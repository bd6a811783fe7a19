"""``StepReporter.phase()``: named spans between steps, sent with the next step."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from stepscope.shared.datagram import Limits, StepRecord, parse_datagram
from stepscope.train import StepReporter
from tests.unit.train.test_reporter import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    path = tempfile.mkdtemp(prefix="ss-")  # short: a Unix socket path has 108 bytes
    rec = Receiver(os.path.join(path, "ingest.sock"))
    yield rec
    rec.sock.close()
    shutil.rmtree(path, ignore_errors=True)


def _step(rep: StepReporter) -> None:
    with rep.step():
        pass


def test_a_save_between_steps_is_sent_as_a_checkpoint_span_of_the_next_step(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", warmup_steps=0, cuda=False, ingest=receiver.url)
    _step(rep)
    with rep.phase("checkpoint"):
        time.sleep(0.2)
    with rep.phase("profiler-dump"):  # not one of ours: "other"
        time.sleep(0.05)
    _step(rep)
    _step(rep)
    first, second, third = receiver.take(3)
    rep.close()
    assert "spans" not in first and "spans" not in third
    spans = second["spans"]
    assert set(spans) == {"checkpoint", "other"}
    assert 0.2 <= spans["checkpoint"] < 0.3 and 0.05 <= spans["other"] < 0.1
    # the spans are inside the step's wall time: part of what the exporter calls other
    assert second["dur"] >= spans["checkpoint"] + spans["other"]
    raw = b'{"v":1,"type":"step","job":"j","rank":0,"local_rank":0,"step":1,"t":1.0,' + (
        f'"dur":{second["dur"]},"spans":{{"checkpoint":{spans["checkpoint"]}}}}}'.encode())
    rec = parse_datagram(raw, Limits())
    assert isinstance(rec, StepRecord) and rec.spans is not None
    assert rec.spans[0] == pytest.approx(spans["checkpoint"])


def test_spans_inside_a_step_or_nested_or_before_the_first_step_are_not_counted(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    rep = StepReporter("j", warmup_steps=0, cuda=False, ingest=receiver.url)
    with rep.phase("checkpoint"):  # loading a checkpoint before training: in no step
        time.sleep(0.02)
    _step(rep)
    with caplog.at_level(logging.WARNING, logger="stepscope.train"), rep.step(), rep.phase(
        "logging"
    ):
        time.sleep(0.02)
    with rep.phase("evaluation"), rep.phase("checkpoint"):
        time.sleep(0.05)
    _step(rep)
    first, second, third = receiver.take(3)
    rep.close()
    assert "spans" not in first and "spans" not in second
    assert set(third["spans"]) == {"evaluation"}  # the outer span only
    assert "phase() inside step()" in caplog.text


def test_an_exception_in_a_span_propagates_and_the_span_still_counts(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", warmup_steps=0, cuda=False, ingest=receiver.url)
    _step(rep)
    with pytest.raises(OSError, match="disk full"), rep.phase("checkpoint"):
        raise OSError("disk full")
    _step(rep)
    _, second = receiver.take(2)
    rep.close()
    assert set(second["spans"]) == {"checkpoint"}


def test_spans_after_the_last_step_are_sent_as_a_tail_when_the_reporter_closes(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", warmup_steps=0, cuda=False, ingest=receiver.url)
    _step(rep)
    _step(rep)
    time.sleep(0.05)  # the loop's own work after its last step
    with rep.phase("checkpoint"):  # the final save
        time.sleep(0.2)
    with rep.phase("evaluation"):  # open when the reporter closes: counted until then
        time.sleep(0.1)
        rep.close()
    first, second, tail = receiver.take(3)
    assert (first["type"], second["type"], tail["type"]) == ("step", "step", "tail")
    assert tail["step"] == second["step"] == 1
    assert set(tail["spans"]) == {"checkpoint", "evaluation"}
    assert 0.2 <= tail["spans"]["checkpoint"] < 0.3
    assert 0.1 <= tail["spans"]["evaluation"] < 0.2
    # from the last step's end: the loop's work before the save is in it, as other
    assert 0.35 <= tail["dur"] < 0.5
    assert tail["dur"] >= tail["spans"]["checkpoint"] + tail["spans"]["evaluation"] + 0.05
    assert receiver.pending() == 0  # sent once


def test_no_tail_without_spans_after_the_last_step_nor_before_any_step(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", warmup_steps=0, cuda=False, ingest=receiver.url)
    with rep.phase("checkpoint"):  # loading, before any step
        time.sleep(0.01)
    _step(rep)
    with rep.phase("checkpoint"):
        time.sleep(0.01)
    _step(rep)  # carries the span: nothing is left for a tail
    rep.close()
    _, second = receiver.take(2)
    assert "spans" in second and second["type"] == "step"
    assert receiver.pending() == 0  # close() sent what it had before returning
