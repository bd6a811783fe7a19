"""The CUDA-event path's bookkeeping, with fake events on a GPU clock the test drives:
the training thread only records (pool events); steps are read, in order, once their events have
completed; a spent pool or a full queue drops steps (counted) and never blocks or
raises; every event returns to the pool exactly once."""

from __future__ import annotations

import pytest

from stepscope.train._timeline import CudaTimeline


class Gpu:
    """A GPU clock: an event records the clock's value when recorded and has completed
    once ``done_until`` reaches it."""

    def __init__(self) -> None:
        self.now = 0.0  # ms
        self.done_until = -1.0
        self.made = 0

    def event(self) -> Event:
        self.made += 1
        return Event(self)


class Event:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.t: float | None = None

    def record(self) -> None:
        self.t = self.gpu.now

    def query(self) -> bool:
        return self.t is not None and self.t <= self.gpu.done_until

    def elapsed_time(self, end: Event) -> float:
        assert self.query() and end.query(), "read before completion"
        assert self.t is not None and end.t is not None
        return end.t - self.t


def mark(tl: CudaTimeline) -> Event | None:
    """A pool event recorded now, as the training thread takes one (None: spent)."""
    ev = tl.event()
    if ev is not None:
        ev.record()
    return ev  # type: ignore[no-any-return]


def step(tl: CudaTimeline, gpu: Gpu, n: int, start_ms: float, end_ms: float,
         data: float = 0.0) -> bool:  # fmt: skip
    """What the reporter's two threads do for one step; whether it was queued."""
    gpu.now = start_ms
    start = mark(tl)
    gpu.now = end_ms
    return tl.queue(n, False, 10, 1e9, data, 0.002, start, mark(tl), [])


def test_steps_are_read_in_order_once_completed_and_equal_what_the_events_measure() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    step(tl, gpu, 0, 0.0, 40.0)
    step(tl, gpu, 1, 50.0, 90.0, data=0.030)  # the GPU idled 10 ms before it
    assert tl.resolve(False) == []  # nothing completed: nothing read, nothing waited for
    gpu.done_until = 45.0
    (s0,) = tl.resolve(False)  # step 1 not done yet: it waits, in order
    assert s0 is not None
    number, warm, _t, dur, data, compute, comm, tokens, flops, spans = s0
    assert spans == ()  # no phase() between the steps
    assert (number, warm, data, comm, tokens, flops) == (0, False, 0.0, 0.0, 10, 1e9)
    assert dur == pytest.approx(0.042)  # the 2 ms host gap before the first step, + 40
    assert compute == pytest.approx(0.040)
    gpu.done_until = 90.0
    (s1,) = tl.resolve(False)
    assert s1 is not None
    assert s1[3] == pytest.approx(0.050)  # dur: end of step 0 to end of step 1, GPU clock
    assert s1[4] == pytest.approx(0.010)  # data: what the GPU waited, not the host's 30 ms
    assert s1[5] == pytest.approx(0.040)


def test_a_later_step_completing_first_does_not_jump_the_queue() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    step(tl, gpu, 0, 0.0, 10.0)
    step(tl, gpu, 1, 10.0, 20.0)
    # step 1's end reads as done while step 0's does not (events on different streams)
    first_end = tl.pending[0][8]
    first_end.t = 99.0
    gpu.done_until = 20.0
    assert tl.resolve(False) == []
    gpu.done_until = 99.0
    got = tl.resolve(False)
    assert [r[0] for r in got if r is not None] == [0, 1]


def test_events_are_pooled_and_each_returns_once() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    tl.prewarm(4)
    assert gpu.made == 4 and len(tl.free) == 4
    for n in range(200):
        step(tl, gpu, n, n * 10.0, n * 10.0 + 5.0)
        gpu.done_until = n * 10.0 + 5.0
        tl.resolve(False)
    # two events per step, the last end held for the next step: a handful in all
    assert gpu.made <= 6
    assert len({id(e) for e in tl.free}) == len(tl.free)  # never the same event twice


def test_a_spent_pool_gives_none_and_a_full_queue_refuses_without_blocking() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event, max_pending=2, max_events=6)
    for n in range(2):
        assert step(tl, gpu, n, n, n + 0.5)
    assert not step(tl, gpu, 2, 2.0, 2.5)  # two steps wait: refused, its events recycled
    assert gpu.made == 6 and len(tl.pending) == 2 and len(tl.free) == 2
    assert tl.event() is not None and tl.event() is not None and mark(tl) is None  # the cap
    assert not tl.queue(3, False, 0, 0.0, 0.0, 0.0, None, None, [])  # no events: refused
    gpu.done_until = 10.0
    assert len(tl.resolve(False)) == 2 and tl.event() is not None  # recycled


def test_a_dropped_steps_time_goes_to_the_next_queued_step() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event, max_pending=1)
    assert step(tl, gpu, 0, 0.0, 10.0)
    assert not step(tl, gpu, 1, 12.0, 20.0)  # the queue is full: dropped, counted by the caller
    gpu.done_until = 10.0
    (s0,) = tl.resolve(False)
    assert step(tl, gpu, 2, 25.0, 30.0)
    gpu.done_until = 30.0
    (s2,) = tl.resolve(False)
    assert s0 is not None and s2 is not None
    assert s2[0] == 2 and s2[3] == pytest.approx(0.020)  # from step 0's end, 10 -> 30 ms
    assert s2[5] == pytest.approx(0.005)  # its own compute


def test_at_close_steps_still_running_are_dropped_not_waited_for() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    step(tl, gpu, 0, 0.0, 10.0)
    step(tl, gpu, 1, 10.0, 20.0)
    gpu.done_until = 10.0
    got = tl.resolve(True)
    assert got[0] is not None and got[0][0] == 0 and got[1] is None and not tl.pending


def test_an_event_that_fails_to_read_drops_its_step_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    step(tl, gpu, 0, 0.0, 10.0)

    def broken() -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    tl.pending[0][8].query = broken
    step(tl, gpu, 1, 10.0, 20.0)
    assert tl.resolve(False) == [None, None]  # a broken context: nothing left readable
    assert caplog.text.count("reading CUDA events failed") == 1


def test_an_integrations_own_events_never_join_the_pool() -> None:
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    tl.prewarm(1)

    class TheirEvent(Event):
        pass

    theirs = TheirEvent(gpu)
    tl.recycle(theirs)
    assert theirs not in tl.free


def test_a_steps_named_spans_ride_with_it_until_its_events_are_read() -> None:
    # a checkpoint of 1 s between steps 0 and 1: the GPU idles 1000 ms, the step's gap
    gpu = Gpu()
    tl = CudaTimeline(gpu.event)
    step(tl, gpu, 0, 0.0, 40.0)
    gpu.now = 1040.0
    start = mark(tl)
    gpu.now = 1080.0
    assert tl.queue(1, False, 10, 1e9, 0.0, 1.0, start, mark(tl), [], (("checkpoint", 0.998),))
    gpu.done_until = 1080.0
    s0, s1 = tl.resolve(False)
    assert s0 is not None and s1 is not None
    assert s0[9] == () and s1[9] == (("checkpoint", 0.998),)
    assert s1[3] == pytest.approx(1.040)  # dur: the 1 s gap on the GPU clock, + 40 ms
