"""The goodput ledger: every GPU-second a rank held booked once, to goodput or to one
cause of badput, from the real aggregator's views on a manual clock."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.core.procfs import ProcessStamp
from stepscope.diagnose.finished import FinishedRank
from stepscope.diagnose.goodput import BADPUT_TYPES, END_GRACE, GoodputLedger
from stepscope.diagnose.model import JobGoodput
from stepscope.ingest.aggregate import Aggregator, Sender
from stepscope.shared.datagram import SPANS, StepRecord
from tests.support.clocks import ManualClock

OWNER = Sender(1000, 1000, 100)


def record(step: int, t: float, **changes: Any) -> StepRecord:
    fields: dict[str, Any] = dict(
        job="llama",
        rank=0,
        local_rank=0,
        step=step,
        t=t,
        dur=1.0,
        data_wait=0.1,
        compute=0.7,
        comm=0.1,
        other=0.1,
        warmup=False,
        tokens=100,
        flops=1e12,
        precision="bf16",
        world_size=1,
        pid=100,
        uuid="GPU-a",
        dropped=0,
    )
    fields.update(changes)
    return StepRecord(**fields)


class Run:
    """One aggregator and one ledger on one clock: steps are received as they end."""

    def __init__(self, exited: set[int] | None = None) -> None:
        self.clock = ManualClock(5000.0)
        self.exited = exited if exited is not None else set()
        # pid -> when its process started (/proc); the owner's, as its first step starts
        self.started: dict[int, float] = {OWNER.pid: self.clock()}
        # one clock for receipt and wall time: steps are received as they end
        self.agg = Aggregator(
            clock=self.clock, process_exited=lambda pid, _stamp: pid in self.exited,
            wall_clock=self.clock, process_stamp=self.stamp,
        )
        self.ledger = GoodputLedger()
        self.kinds: dict[tuple[str, int], str] = {}
        self.finished: dict[tuple[str, int], FinishedRank] = {}
        self.books: tuple[JobGoodput, ...] = ()

    def stamp(self, pid: int) -> ProcessStamp | None:
        """The process as /proc shows it (the bill reads its start as Unix time)."""
        started = self.started.get(pid)
        return ProcessStamp(pid, 0, 0, started) if started is not None else None

    def step(self, step: int, sender: Sender = OWNER, **changes: Any) -> None:
        dur = changes.get("dur", 1.0)
        self.clock.t += dur
        assert self.agg.add(record(step, self.clock(), **changes), sender) is None

    def tick(self) -> JobGoodput:
        self.books = self.ledger.update(self.agg.view(), self.clock(), self.kinds,
                                        self.finished)  # fmt: skip
        (job,) = self.books
        return job


def causes(job: JobGoodput) -> dict[str, float]:
    """The causes that have accrued time (every cause is served, at 0 until then)."""
    assert [c for c, _ in job.badput] == list(BADPUT_TYPES)
    return {c: v for c, v in job.badput if v > 0.0}


def test_a_healthy_rank_books_its_phases_and_adds_up_to_the_time_held() -> None:
    run = Run()
    run.step(0)
    job = run.tick()  # first sight: the step reported was held before
    for i in range(1, 100):
        run.step(i)
        job = run.tick()
    assert job.goodput == pytest.approx(70.0)
    assert causes(job) == pytest.approx(
        {"data_loading_sync": 10.0, "exposed_communication": 10.0, "other": 10.0}
    )
    assert job.held == pytest.approx(100.0)  # 100 steps of 1 s, from the first one's start
    assert job.pending == pytest.approx(0.0, abs=1e-9)
    assert job.ranks == 1


def test_time_between_reports_is_pending_until_a_step_explains_it() -> None:
    run = Run()
    run.step(0)
    run.tick()
    run.clock.t += 0.5
    job = run.tick()
    assert job.pending == pytest.approx(0.5) and job.booked == pytest.approx(1.0)
    # the next step took 30 s, most of it a checkpoint save named by the SDK
    run.clock.t += 29.5  # 30 s after the last report in all
    assert run.agg.add(record(1, run.clock(), dur=30.0, data_wait=0.0, compute=1.0,
                              comm=0.0, other=29.0, spans=(25.0, 0.0, 0.0, 0.0)),
                       OWNER) is None  # fmt: skip
    job = run.tick()
    assert causes(job)["unproductive_checkpoint_save_time"] == pytest.approx(25.0)
    assert causes(job)["other"] == pytest.approx(0.1 + 4.0)
    assert job.held == pytest.approx(31.0) and job.pending == pytest.approx(0.0, abs=1e-9)
    assert "idle" not in causes(job)


@pytest.mark.parametrize(
    ("kind", "cause"), [("host_bound", "host_bound"), ("transfer_bound", "transfer_bound")]
)
def test_the_step_body_of_a_host_or_transfer_bound_rank_is_badput(kind: str, cause: str) -> None:
    run = Run()
    run.kinds[("llama", 0)] = kind
    for i in range(10):
        run.step(i)
        job = run.tick()
    assert job.goodput == 0.0
    assert causes(job)[cause] == pytest.approx(7.0)
    assert job.held == pytest.approx(10.0)


def test_warm_up_steps_are_program_startup() -> None:
    run = Run()
    run.step(0, warmup=True, dur=20.0)  # compilation in the first step
    run.step(1, warmup=True, dur=2.0)
    run.tick()
    for i in range(2, 12):
        run.step(i)
        job = run.tick()
    assert causes(job)["program_startup"] == pytest.approx(22.0)
    assert job.goodput == pytest.approx(7.0)
    assert job.held == pytest.approx(32.0)


def test_the_time_from_the_process_start_to_its_first_step_is_program_startup() -> None:
    """Imports, model and checkpoint loading before the loop: the GPU is held from the
    process's start (the host source reads it), not from the first step's."""
    run = Run()
    run.started[100] = run.clock() - 45.0  # 45 s before the first step began
    run.step(0, warmup=True, dur=5.0)
    run.tick()
    for i in range(1, 11):
        run.step(i)
        job = run.tick()
    assert causes(job)["program_startup"] == pytest.approx(45.0 + 5.0)
    assert job.held == pytest.approx(45.0 + 5.0 + 10.0)
    assert job.goodput == pytest.approx(7.0)


@pytest.mark.parametrize(
    ("started", "warmup", "held", "why"),
    [
        (-45.0, False, 11.0, "no warm-up seen: the node may have missed the first steps"),
        (-7 * 3600.0, True, 11.0, "a gap longer than MAX_STARTUP is not believed"),
    ],
)
def test_the_hold_starts_at_the_first_step_where_the_start_cannot_be_trusted(
    started: float, warmup: bool, held: float, why: str
) -> None:
    run = Run()
    run.started[100] = run.clock() + started
    run.step(0, warmup=warmup)
    run.tick()
    for i in range(1, 11):
        run.step(i)
        job = run.tick()
    assert job.held == pytest.approx(held), why  # from the first step's start
    assert causes(job).get("program_startup", 0.0) == pytest.approx(1.0 if warmup else 0.0)


@pytest.mark.parametrize(
    ("started", "why"),
    [
        (None, "the process is not seen (UDP, another PID namespace)"),
        (+3.0, "/proc says it started after its first step: not believed"),
    ],
)
def test_the_hold_of_a_process_not_seen_starts_at_its_first_receipt(
    started: float | None, why: str
) -> None:
    """The exporter's clock is the bill: a first step it cannot judge (no process start
    to hold it against) is not billed before the exporter received it. Its claimed second
    is a split of the time the exporter saw, not added to it."""
    run = Run()
    del run.started[100]
    if started is not None:
        run.started[100] = run.clock() + started
    run.step(0, warmup=True)
    run.tick()
    for i in range(1, 11):
        run.step(i)
        job = run.tick()
    assert job.held == pytest.approx(10.0), why  # from the first step's receipt
    # the second step's pass split its 1 s over the warm-up and the step claimed in it
    assert causes(job)["program_startup"] == pytest.approx(0.5)


def test_a_rank_in_another_pod_is_read_by_the_pid_the_kernel_names() -> None:
    """A rank in another pod reports its own namespace's pid (here 100; often 1). With the
    exporter in the host's PID namespace (hostPID) the kernel names its host pid, whose
    /proc entry is the rank's; without, the kernel names none, and /proc/100 here is
    another process (the exporter's own pod's), whose start says nothing of the rank's:
    the hold starts at the first receipt."""
    for kernel_pid, startup, held in ((54321, 45.0 + 1.0, 10.0 + 46.0), (0, 0.5, 10.0)):
        run = Run()
        run.started[100] = run.clock() - 3 * 3600.0  # another process, here
        run.started[54321] = run.clock() - 45.0
        sender = Sender(1000, 1000, kernel_pid)
        run.step(0, sender=sender, warmup=True)
        run.tick()
        for i in range(1, 11):
            run.step(i, sender=sender)
            job = run.tick()
        assert causes(job)["program_startup"] == pytest.approx(startup), kernel_pid
        assert job.held == pytest.approx(held)


def test_a_process_that_reports_a_second_job_books_no_startup_for_it() -> None:
    """One process, two jobs (a sweep; fine-tuning after pre-training): its start-up
    before the first job's first step is the first job's, once."""
    run = Run()
    run.started[100] = run.clock() - 20.0
    run.step(0, warmup=True)
    run.tick()
    run.step(1)
    first = run.tick()
    assert causes(first)["program_startup"] == pytest.approx(21.0)
    for i in range(2):
        run.step(i, job="finetune", warmup=i == 0)
        run.books = run.ledger.update(run.agg.view(), run.clock(), run.kinds, run.finished)
    (second,) = [j for j in run.books if j.job == "finetune"]
    assert causes(second).get("program_startup", 0.0) == pytest.approx(1.0)  # its warm-up


def test_a_restarted_process_books_its_own_startup() -> None:
    exited: set[int] = set()
    run = Run(exited)
    run.started[100] = run.clock() - 10.0
    run.step(0, warmup=True)
    run.tick()
    for i in range(1, 5):
        run.step(i)
        run.tick()
    exited.add(100)  # it crashed; a new process (pid 101) loads for 30 s and takes over
    run.clock.t += 30.0
    run.started[101] = run.clock() - 30.0
    new = Sender(1000, 1000, 101)
    run.step(5, sender=new, pid=101, warmup=True)
    run.tick()
    for i in range(6, 10):
        run.step(i, sender=new, pid=101)
        job = run.tick()
    startup = causes(job)["program_startup"]
    assert startup == pytest.approx(10.0 + 1.0 + 30.0 + 1.0)  # each start and warm-up step


def test_a_fault_books_everything_to_hardware_fault_and_its_unexplained_end_too() -> None:
    run = Run()
    for i in range(5):
        run.step(i)
        run.tick()
    run.kinds[("llama", 0)] = "gpu_fault"
    run.step(5)
    run.tick()
    run.clock.t += 40.0  # the rank hangs on its fallen GPU, then its process dies
    run.tick()
    run.finished[("llama", 0)] = FinishedRank(run.clock(), "exited", 6, run.clock() - 10.0)
    job = run.tick()
    assert "hardware_fault" in causes(job) and job.ranks == 1  # closed after a grace
    run.clock.t += END_GRACE
    job = run.tick()
    # step 5 (1 s) and the 30 s it was held silent before its process was last seen
    assert causes(job)["hardware_fault"] == pytest.approx(31.0)
    assert job.goodput == pytest.approx(3.5)
    assert job.held == pytest.approx(36.0) and job.pending == 0.0 and job.ranks == 0
    run.clock.t += 60.0
    assert run.tick() == job  # ended: nothing more is held


def test_a_rank_whose_process_ended_books_its_last_unexplained_time_as_idle() -> None:
    run = Run()
    for i in range(10):
        run.step(i)
        run.tick()
    run.clock.t += 3.0  # a final save (reported late), then the process exits
    run.tick()
    run.clock.t += 1.0
    run.finished[("llama", 0)] = FinishedRank(run.clock(), "exited", 10, run.clock() - 1.0)
    run.tick()
    # its last step, sent just before it exited, aggregated after the exit was seen
    run.clock.t += 0.5
    assert run.agg.add(record(10, run.clock() - 2.0, dur=2.0, data_wait=0.0, compute=0.0,
                              comm=0.0, other=2.0, spans=(2.0, 0.0, 0.0, 0.0)),
                       OWNER) is None  # fmt: skip
    run.tick()
    run.clock.t += END_GRACE
    job = run.tick()
    assert causes(job)["unproductive_checkpoint_save_time"] == pytest.approx(2.0)
    assert causes(job)["idle"] == pytest.approx(1.0)  # up to when it was last seen alive
    assert job.held == pytest.approx(13.0)


def tail(step: int, t: float, dur: float, spans: tuple[float, ...]) -> StepRecord:
    """The SDK's tail: named spans after the last step, no phases."""
    return record(step, t, dur=dur, data_wait=0.0, compute=0.0, comm=0.0, other=dur,
                  tokens=0, flops=0.0, spans=spans, tail=True)  # fmt: skip


@pytest.mark.parametrize("span, cause", [(0, "unproductive_checkpoint_save_time"),
                                         (1, "evaluation")])  # fmt: skip
def test_a_span_after_the_last_step_is_booked_by_its_name_not_as_idle(
    span: int, cause: str
) -> None:
    run = Run()
    for i in range(10):
        run.step(i)
        run.tick()
    for _ in range(4):  # a final save of 4 s: pending meanwhile
        run.clock.t += 1.0
        job = run.tick()
    assert job.pending == pytest.approx(4.0)
    spans = [0.0] * len(SPANS)
    spans[span] = 3.5  # and 0.5 s of the loop's own work before it
    assert run.agg.add(tail(9, run.clock(), 4.0, tuple(spans)), OWNER) is None
    job = run.tick()  # booked as soon as it is received, before the process is seen gone
    assert causes(job)[cause] == pytest.approx(3.5)
    assert causes(job)["other"] == pytest.approx(1.0 + 0.5)  # 0.1 s of each step's too
    assert job.pending == pytest.approx(0.0, abs=1e-9)
    view = run.agg.view()
    assert view.ranks[0].steps == 10  # a tail is no step
    assert view.ranks[0].phase_seconds.other == pytest.approx(1.0)
    assert view.jobs[0].span_seconds is None  # nor a step's span
    run.clock.t += 1.0
    run.finished[("llama", 0)] = FinishedRank(run.clock(), "exited", 10, run.clock() - 0.5)
    run.tick()
    run.clock.t += END_GRACE
    job = run.tick()
    assert causes(job)["idle"] == pytest.approx(0.5)  # up to when it was last seen alive
    assert job.held == pytest.approx(14.5)


def test_a_tail_received_after_the_exit_was_seen_is_booked_within_the_grace() -> None:
    run = Run()
    for i in range(10):
        run.step(i)
        run.tick()
    run.clock.t += 3.0
    run.finished[("llama", 0)] = FinishedRank(run.clock(), "exited", 10, run.clock())
    run.tick()
    run.clock.t += 0.5
    assert run.agg.add(tail(9, run.clock() - 0.5, 3.0, (3.0, 0.0, 0.0, 0.0)), OWNER) is None
    run.tick()
    run.clock.t += END_GRACE
    job = run.tick()
    assert causes(job)["unproductive_checkpoint_save_time"] == pytest.approx(3.0)
    assert "idle" not in causes(job)
    assert job.held == pytest.approx(13.0)


def test_a_tail_neither_makes_a_rank_nor_takes_one_over() -> None:
    exited: set[int] = set()
    run = Run(exited)
    assert run.agg.add(tail(9, run.clock(), 3.0, (3.0, 0.0, 0.0, 0.0)), OWNER) is None
    assert run.agg.view().ranks == ()
    run.step(0)
    exited.add(100)
    new = Sender(1000, 1000, 200)
    assert run.agg.add(tail(9, run.clock(), 3.0, (3.0, 0.0, 0.0, 0.0)), new) == "not_owner"
    assert run.agg.view().ranks[0].tail_seconds == 0.0


def test_a_restart_redoes_lost_steps_as_wasted_progress() -> None:
    exited: set[int] = set()
    run = Run(exited)
    for i in range(100):  # steps 0..99; the last checkpoint was at step 80
        run.step(i)
        run.tick()
    exited.add(100)  # it crashes; the new process resumes from step 81 (start_step=81)
    run.clock.t += 5.0
    run.tick()
    new = Sender(1000, 1000, 200)
    run.started[200] = run.clock()  # it starts now, and steps at once
    run.step(81, sender=new, pid=200, warmup=True, dur=10.0)
    job = run.tick()
    assert causes(job)["idle"] == pytest.approx(5.0)  # the old rank's end, unexplained
    for i in range(82, 130):
        run.step(i, sender=new, pid=200)
        job = run.tick()
    # steps 82..99 redo what was lost: 18 steps of 1 s, whatever their phases
    assert causes(job)["wasted_progress_from_disruption"] == pytest.approx(18.0)
    assert causes(job)["program_startup"] == pytest.approx(10.0)
    assert job.goodput == pytest.approx(0.7 * (100 + 30))
    assert job.held == pytest.approx(100 + 5 + 10 + 48)
    assert run.agg.view().jobs[0].restarts == 1


def test_steps_reporting_more_than_the_time_passed_never_book_more_than_wall_time() -> None:
    run = Run()
    for i in range(2):
        run.step(i)
        run.tick()
    for i in range(2, 22):  # each step claims 2 s but arrives 1 s after the last
        run.clock.t += 1.0
        assert run.agg.add(record(i, run.clock(), dur=2.0, data_wait=0.0, compute=2.0,
                                  comm=0.0, other=0.0), OWNER) is None  # fmt: skip
        job = run.tick()
    assert job.held == pytest.approx(22.0)  # from the first step's start
    assert job.goodput == pytest.approx(22.0 - 0.3 * 2)


def test_a_forgotten_job_lingers_then_goes() -> None:
    run = Run()
    for i in range(3):
        run.step(i)
        run.tick()
    run.clock.t += 301.0  # rank_expiry: the ingest forgets the rank
    job = run.tick()
    assert causes(job)["idle"] == pytest.approx(301.0)  # held, silent, then forgotten
    assert job.ranks == 0
    run.clock.t += 299.0
    assert run.ledger.update(run.agg.view(), run.clock(), {}, {}) != ()
    run.clock.t += 2.0
    assert run.ledger.update(run.agg.view(), run.clock(), {}, {}) == ()


def test_every_cause_is_named_once_and_every_span_has_one() -> None:
    from stepscope.diagnose.goodput import SPAN_CAUSES

    assert len(set(BADPUT_TYPES)) == len(BADPUT_TYPES)
    assert set(SPAN_CAUSES) == set(SPANS) and set(SPAN_CAUSES.values()) <= set(BADPUT_TYPES)
