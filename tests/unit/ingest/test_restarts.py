"""A rank restarted under the same job name: the same user's new process takes the rank
over once the old one has exited; while it lives, the newcomer is refused and told why;
the exporter's log says so at most once a minute per rank and reason."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.ingest.aggregate import Aggregator, Sender
from stepscope.ingest.refusals import ANSWER_EVERY, LOG_EVERY, Refusals, process_exited
from stepscope.shared.datagram import Refusal, StepRecord, encode_refusal, parse_refusal
from tests.support import wait_for
from tests.support.clocks import ManualClock


def record(pid: int, step: int = 0, **changes: Any) -> StepRecord:
    fields: dict[str, Any] = dict(
        job="llama", rank=3, local_rank=3, step=step, t=1000.0 + step, dur=1.0, data_wait=0.2,
        compute=0.5, comm=0.2, other=0.1, warmup=False, tokens=100, flops=1e12,
        precision="bf16", world_size=8, pid=pid, uuid="GPU-a", dropped=0,
    )
    fields.update(changes)
    return StepRecord(**fields)


def aggregator(exited: set[int]) -> Aggregator:
    return Aggregator(clock=ManualClock(5000.0), process_exited=exited.__contains__)


def test_a_new_process_of_the_same_user_takes_over_a_rank_whose_process_exited() -> None:
    exited: set[int] = set()
    agg = aggregator(exited)
    for i in range(5):
        assert agg.add(record(pid=100, step=i), Sender(1000, 1000, 100)) is None
    exited.add(100)  # the old rank crashed
    assert agg.add(record(pid=200, step=4), Sender(1000, 1000, 200)) is None
    view = agg.view()
    (rank,) = view.ranks
    assert (rank.pid, rank.steps) == (200, 1)  # counters restart with the new process
    (job,) = view.jobs
    assert job.restarts == 1
    assert view.rejected["not_owner"] == 0
    # the new process is the owner now; the old pid can no longer report
    assert agg.add(record(pid=200, step=5), Sender(1000, 1000, 200)) is None
    assert agg.add(record(pid=100, step=6), Sender(1000, 1000, 100)) == "not_owner"


@pytest.mark.parametrize(
    ("newcomer", "exited_pids", "why"),
    [
        (Sender(1000, 1000, 200), set(), "the old process is alive"),
        (Sender(1001, 1001, 200), {100}, "another user"),
        (None, {100}, "UDP: no sender to trust"),
        (Sender(1000, 1000, 0), {100}, "a sender the kernel cannot name"),
    ],
)
def test_a_rank_is_not_taken_over(
    newcomer: Sender | None, exited_pids: set[int], why: str
) -> None:
    agg = aggregator(exited_pids)
    assert agg.add(record(pid=100), Sender(1000, 1000, 100)) is None
    assert agg.add(record(pid=200, step=1), newcomer) == "not_owner", why
    (job,) = agg.view().jobs
    assert job.restarts == 0


def test_process_exited_reads_proc_a_live_a_zombie_and_a_reaped_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert process_exited(child.pid) is False
        assert child.stdin is not None
        child.stdin.close()  # it exits; not reaped yet: a zombie until wait()
        stat = Path(f"/proc/{child.pid}/stat")
        wait_for(lambda: stat.read_bytes().rsplit(b") ", 1)[1][:1] == b"Z", timeout=10)
        assert process_exited(child.pid) is True
    finally:
        child.wait()
    assert process_exited(child.pid) is True  # reaped: gone from /proc


def test_a_comm_with_spaces_and_parentheses_is_parsed(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_bytes(b"42 (python (rank) 0) S 1 42 42 0 -1\n")
    assert process_exited(42, proc=tmp_path) is False
    (tmp_path / "42" / "stat").write_bytes(b"42 (python (rank) 0) Z 1 42 42 0 -1\n")
    assert process_exited(42, proc=tmp_path) is True
    assert process_exited(43, proc=tmp_path) is True


def test_refusals_are_logged_once_a_minute_per_rank_with_the_count_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(100.0)
    refusals = Refusals(clock=clock)
    sender = Sender(1000, 1000, 4242)
    with caplog.at_level(logging.WARNING, logger="stepscope.ingest"):
        for _ in range(30):
            refusals.refused(None, None, "not_owner", record(pid=4242), sender)
            clock.t += 1.0
        clock.t += LOG_EVERY
        refusals.refused(None, None, "not_owner", record(pid=4242), sender)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith(
        "ingest: refused rank 3 of job 'llama' from uid 1000 pid 4242: not_owner (this job "
        "or rank is held by another process"
    )
    assert lines[1].endswith("; 29 more since the last line")


def test_a_refused_sender_with_an_address_gets_an_answer_at_most_every_few_seconds() -> None:
    clock = ManualClock(100.0)
    refusals = Refusals(clock=clock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as exporter, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rank:  # fmt: skip
        exporter.bind("")
        rank.bind("")
        rank.setblocking(False)
        address = rank.getsockname()
        for _ in range(3):
            refusals.refused(exporter, address, "identity_changed", record(pid=1), None)
        clock.t += ANSWER_EVERY
        refusals.refused(exporter, address, "identity_changed", record(pid=1), None)
        answers = []
        while True:
            try:
                answers.append(parse_refusal(rank.recv(1024)))
            except BlockingIOError:
                break
    assert answers == [Refusal("identity_changed", "llama", 3)] * 2


def test_an_answer_to_a_full_or_vanished_receiver_costs_nothing_and_raises_nothing() -> None:
    refusals = Refusals(clock=ManualClock())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as exporter:
        exporter.bind("")
        refusals.refused(exporter, b"\x00no-such-socket", "not_owner", record(pid=1), None)


def test_the_refusal_schema_round_trips_and_refuses_junk() -> None:
    refusal = Refusal("cap_ranks", "llama", 3)
    assert parse_refusal(encode_refusal("cap_ranks", "llama", 3)) == refusal
    assert parse_refusal(encode_refusal("not_json", None, None)) == Refusal("not_json", None, None)
    for junk in (b"", b"{", b"[]", b'{"type":"refused","reason":"nope"}', b'{"type":"step"}'):
        assert parse_refusal(junk) is None
    # a label that is not label-safe is dropped, not echoed into a log
    bad = b'{"v":1,"type":"refused","reason":"not_owner","job":"a\\nb","rank":1}'
    assert parse_refusal(bad) == Refusal("not_owner", None, None)
    assert Refusal("cap_jobs", "llama", 3).describe() == (
        "the exporter refuses rank 3 of job 'llama': cap_jobs (the node already tracks its "
        "maximum number of jobs (max_jobs))"
    )
