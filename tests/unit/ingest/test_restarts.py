"""A rank restarted under the same job name: the same user's new process takes the rank
over once the old one has exited (a process on the old one's reused pid is not it); while
it lives, the newcomer is refused and told why; the exporter's log says so on a budget per
reason that no sender can reset."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.core.logbudget import BURST
from stepscope.ingest.aggregate import Aggregator, Sender
from stepscope.ingest.refusals import (
    ANSWER_EVERY,
    ProcessStamp,
    Refusals,
    process_exited,
    process_stamp,
)
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
    return Aggregator(clock=ManualClock(5000.0), process_exited=lambda pid, _stamp: pid in exited)


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


def test_refusal_lines_are_on_one_budget_per_reason_that_varied_keys_cannot_reset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(100.0)
    refusals = Refusals(clock=clock, peer_check=lambda address, pid: False)
    with caplog.at_level(logging.WARNING, logger="stepscope.ingest"):
        # a flood with a new job, rank and pid in every datagram: one reason, one budget
        for i in range(10_000):
            rec = record(pid=i, job=f"j{i}", rank=i % 512)
            refusals.refused(None, None, "not_owner", rec, Sender(1000 + i, 1000, i))
        clock.t += 61.0
        refusals.log_budget.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == BURST + 1
    assert lines[0].startswith(
        "ingest: refused rank 0 of job 'j0' from uid 1000 pid 0: not_owner (this job "
        "or rank is held by another process"
    )
    assert lines[-1].startswith(f"{10_000 - BURST} more log lines for not_owner suppressed")


def own_sockets() -> tuple[socket.socket, socket.socket]:
    """The exporter's socket and a rank's, both of this process, abstract names."""
    exporter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rank = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    exporter.bind("")
    rank.bind("")
    rank.setblocking(False)
    return exporter, rank


def received(sock: socket.socket) -> list[Refusal | None]:
    answers = []
    while True:
        try:
            answers.append(parse_refusal(sock.recv(1024)))
        except BlockingIOError:
            return answers


def test_a_refused_sender_gets_an_answer_at_most_every_few_seconds() -> None:
    clock = ManualClock(100.0)
    refusals = Refusals(clock=clock)
    me = Sender(os.getuid(), os.getgid(), os.getpid())  # the process that holds the socket
    exporter, rank = own_sockets()
    with exporter, rank:
        address = rank.getsockname()
        for _ in range(3):
            refusals.refused(exporter, address, "identity_changed", record(pid=1), me)
        clock.t += ANSWER_EVERY
        refusals.refused(exporter, address, "identity_changed", record(pid=1), me)
        assert received(rank) == [Refusal("identity_changed", "llama", 3)] * 2
    assert refusals.outcomes["sent"] == 2
    assert refusals.outcomes["repeat"] == 2


def test_an_answer_goes_only_to_a_socket_the_sending_process_holds(tmp_path: Path) -> None:
    """A pathname (relative, absolute, a symlink) is never answered; an abstract name
    held by another process than the one the kernel names is not either."""
    refusals = Refusals(clock=ManualClock(100.0))
    me = Sender(os.getuid(), os.getgid(), os.getpid())
    exporter, rank = own_sockets()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        with exporter, rank, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as victim:
            victim.bind(str(tmp_path / "victim.sock"))
            victim.setblocking(False)
            os.symlink(tmp_path / "victim.sock", tmp_path / "link.sock")
            for address in (str(tmp_path / "victim.sock"), str(tmp_path / "link.sock"),
                            "victim.sock", ""):  # fmt: skip
                refusals.refused(exporter, address, "not_owner", record(pid=1), me)
            # our rank's name, but the kernel names the child as the sender
            other = Sender(os.getuid(), os.getgid(), child.pid)
            refusals.refused(exporter, rank.getsockname(), "cap_ranks", record(pid=1), other)
            assert received(victim) == []
            assert received(rank) == []
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert refusals.outcomes["not_abstract"] == 4
    assert refusals.outcomes["unverified"] == 1
    assert refusals.outcomes["sent"] == 0


def test_one_uid_cannot_spend_another_uids_answers() -> None:
    clock = ManualClock(100.0)
    checked: list[int] = []

    def check(address: object, pid: int) -> bool:
        checked.append(pid)
        return True

    refusals = Refusals(clock=clock, peer_check=check)
    exporter, rank = own_sockets()
    with exporter, rank:
        # uid 2000 floods with 5,000 aliases (a new abstract name each) in one second
        for i in range(5000):
            flood = Sender(2000, 2000, 77)
            refusals.refused(exporter, f"\0a{i:05x}".encode(), "not_owner", None, flood)
        assert refusals.outcomes["uid_budget"] >= 5000 - 16
        assert len(checked) <= 16  # the /proc checks a flood pays for are few
        me = Sender(os.getuid(), os.getgid(), os.getpid())
        refusals.refused(exporter, rank.getsockname(), "not_owner", record(pid=1), me)
        assert received(rank) == [Refusal("not_owner", "llama", 3)]


def test_an_answer_to_a_full_or_vanished_receiver_costs_nothing_and_raises_nothing() -> None:
    refusals = Refusals(clock=ManualClock(), peer_check=lambda address, pid: True)
    me = Sender(os.getuid(), os.getgid(), os.getpid())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as exporter:
        exporter.bind("")
        refusals.refused(exporter, b"\x00no-such-socket", "not_owner", record(pid=1), me)
    assert refusals.outcomes["send_failed"] == 1


def test_a_process_on_the_owners_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    stat = tmp_path / "42" / "stat"
    stat.write_bytes(b"42 (python) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5000 0\n")
    stamp = process_stamp(42, proc=tmp_path)
    assert stamp is not None and (stamp.pid, stamp.start, stamp.uid) == (42, 5000, os.getuid())
    assert process_exited(42, stamp, proc=tmp_path) is False
    # the owner exited and another process got pid 42: a later start time
    stat.write_bytes(b"42 (squatter) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9000 0\n")
    assert process_exited(42, stamp, proc=tmp_path) is True
    # same start time, another owner (a uid the stamp did not record)
    assert process_exited(42, ProcessStamp(42, 9000, os.getuid() + 1), proc=tmp_path) is True


def test_a_squatter_on_the_owners_pid_does_not_block_the_takeover() -> None:
    """The aggregator asks with the stamp recorded at the owner's first step."""
    stamps = {100: ProcessStamp(100, 5000, 1000)}
    now_on_pid = {100: ProcessStamp(100, 9000, 1001)}  # a squatter of another uid
    agg = Aggregator(
        clock=ManualClock(5000.0),
        process_stamp=stamps.get,
        process_exited=lambda pid, stamp: now_on_pid.get(pid) != stamp,
    )
    assert agg.add(record(pid=100, step=0), Sender(1000, 1000, 100)) is None
    assert agg.add(record(pid=200, step=1), Sender(1000, 1000, 200)) is None
    (job,) = agg.view().jobs
    assert job.restarts == 1


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
