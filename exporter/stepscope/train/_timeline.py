"""CUDA-event step timing, split so the training thread only records events.

The training thread takes an event from a pool and calls ``record()`` (on the H200
``torch.Event.record()`` costs ~2.3 µs; ``torch.cuda.Event.record()`` ~9.5 µs, most of it
building a Python ``Stream`` for ``torch.cuda.current_stream()``), at a step's start and
end, and hands both to the sender thread (:mod:`._steps`), which queues the step here.
The sender thread, every tick, reads the steps whose events have completed (``query()``
never blocks), turns them into records and returns the events to the pool. So
``query()`` and ``elapsed_time()`` (~0.6 and ~1.6 µs each) never run on the training
thread, and after warm-up no event is created per step. All three
keep the GIL (measured on the H200), so a step never hands it to the sender thread.

Two events per step, because the GPU may idle between steps: the start event is what
tells the loop's own time and the data wait the GPU saw apart from compute; the previous
step's end cannot stand in for it (docs/benchmarks.md has the cost of each, measured).

Bounded and never blocking: at most :data:`MAX_PENDING` steps wait for their events and
at most :data:`MAX_EVENTS` events exist; beyond either the step is dropped and counted
(its time lands in the next step's ``other``, as a failed step's does). Standard
library only: torch is passed in by the reporter.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from stepscope.shared import datagram as schema
from stepscope.shared.datagram import PendingStep, Spans

log = logging.getLogger("stepscope.train")

# Steps waiting for their events. The sender thread reads them every 50 ms, so this
# allows steps of 50 us with room to spare; a GPU this far behind the CPU (or a hung
# one) makes further steps drop (counted) instead of growing memory.
MAX_PENDING = 1024
# Events in existence: two per pending step, the comm hook's, and the pool's slack.
MAX_EVENTS = 4 * MAX_PENDING
# Events created (and recorded once, so CUDA creates them) when timing starts.
PREWARM_EVENTS = 32

# A step's comm events: per backward pass, (ready event, all-reduce done events).
Pairs = Sequence[tuple[Any, Sequence[Any]]]
# One pending step: (number, warm, tokens, flops, host data wait, host gap, previous
# step's end event or None, start event, end event, comm event pairs, named spans)
Pending = tuple[int, bool, int, float, float, float, Any, Any, Any, Pairs, Spans]


def step_record(
    number: int,
    warm: bool,
    dur: float,
    data: float,
    body: float,
    comm: float,
    tokens: int,
    flops: float,
    spans: Spans = (),
    t: float | None = None,
) -> PendingStep | None:
    """The record to send for a step, or None if its duration cannot be sent (over
    :data:`~stepscope.shared.datagram.MAX_STEP_SECONDS`). Comm is clamped to the body;
    ``spans``: the named spans between the previous step and this one; ``t``: the Unix
    time the step ended (default: now)."""
    if not 0.0 < dur <= schema.MAX_STEP_SECONDS:
        if dur > 0.0 or dur != dur:
            return None
        dur = 1e-9  # clock granularity: an empty step
    comm = min(max(comm, 0.0), body)
    if not flops < math.inf:  # inf or NaN from an overflowing product
        flops = 0.0
    if t is None:
        t = time.time()
    return (number, warm, t, dur, data, body - comm, comm, tokens, flops, spans)


class CudaTimeline:
    """The event pool and the steps waiting for their events, for one reporter.

    ``new_event()`` makes one timing event on the rank's device. Threads: ``event`` and
    ``recycle`` are called from the training thread (and the DDP hook's; the training
    thread also pops ``free`` itself), ``queue`` and ``resolve`` from the sender thread
    (or from ``close``, with the sender's lock held). Every structure shared across
    threads is a ``deque``, whose appends and pops are atomic.
    """

    def __init__(self, new_event: Any, max_pending: int = MAX_PENDING,
                 max_events: int = MAX_EVENTS) -> None:  # fmt: skip
        self._new_event = new_event
        self.max_pending = max_pending
        self.max_events = max_events
        self.free: deque[Any] = deque()
        self.created = 0
        self.pending: deque[Pending] = deque()
        self._held: Any = None  # end event of the last resolved step (the next one's start)
        self._last_end: Any = None  # end event of the last queued step
        self._kind: type | None = None  # the pool's event type
        self._logged: set[str] = set()

    def prewarm(self, count: int = PREWARM_EVENTS) -> None:
        """Create ``count`` events now and record each once: CUDA creates an event at
        its first record, a cost the steps should not pay."""
        for _ in range(min(count, self.max_events - self.created)):
            ev = self._new_event()
            ev.record()
            self.created += 1
            self._kind = type(ev)
            self.free.append(ev)

    def event(self) -> Any:
        """A timing event from the pool, a new one while under the cap, else None."""
        try:
            return self.free.pop()
        except IndexError:
            if self.created >= self.max_events:
                return None
            self.created += 1
            ev = self._new_event()
            self._kind = type(ev)
            return ev

    def recycle(self, *events: Any) -> None:
        """Give events back to the pool (their readings are no longer needed). Events
        of another kind (an integration's own, passed to ``add_time``) are left alone."""
        free = self.free
        for ev in events:
            if ev is not None and type(ev) is self._kind and len(free) < self.max_events:
                free.append(ev)

    def recycle_pairs(self, pairs: Pairs) -> None:
        for ready, dones in pairs:
            self.recycle(ready, *dones)

    def queue(self, number: int, warm: bool, tokens: int, flops: float, data: float,
              gap: float, start: Any, end: Any, pairs: Pairs,
              spans: Spans = ()) -> bool:  # fmt: skip
        """Queue the step whose events ``start`` and ``end`` were recorded for
        ``resolve``. False when it is dropped (an event missing: the pool was spent; or
        :data:`MAX_PENDING` steps waiting): its events are recycled, and its time goes
        to the next step, measured from the last queued end, as a failed step's does."""
        pending = self.pending
        if start is not None and end is not None and len(pending) < self.max_pending:
            pending.append(
                (number, warm, tokens, flops, data, gap, self._last_end, start, end, pairs,
                 spans)
            )
            self._last_end = end
            return True
        self.recycle(start, end)
        self.recycle_pairs(pairs)
        return False

    def resolve(self, final: bool) -> list[PendingStep | None]:
        """The records of the leading steps whose events have completed, in order;
        None for a step dropped (``final``: not completed at close; or unreadable)."""
        out: list[PendingStep | None] = []
        pending = self.pending
        while pending:
            step = pending[0]
            try:
                ready = _completed(step)
            except Exception as err:
                self._log_once("query", "stepscope: reading CUDA events failed: %r", err)
                ready = False
                final = True  # a broken context: nothing pending will be readable
            if not ready and not final:
                break
            pending.popleft()
            record = None
            if ready:
                try:
                    record = self._read(step)
                except Exception as err:
                    self._log_once("read", "stepscope: reading CUDA events failed: %r", err)
            out.append(record)
            # Done with this step's start and comm events, and with the previous end
            # (this step's start of gap). Its end is the next step's start of gap.
            prev_end, start, end, pairs = step[6:10]
            held = self._held
            self.recycle(start, prev_end, held if held is not prev_end else None)
            self.recycle_pairs(pairs)
            self._held = end
        return out

    def _read(self, step: Pending) -> PendingStep | None:
        number, warm, tokens, flops, data, gap_host, prev_end, start, end, pairs, spans = step
        body = start.elapsed_time(end) / 1000.0
        gap = gap_host if prev_end is None else max(0.0, prev_end.elapsed_time(start) / 1000.0)
        comm = comm_seconds(pairs)
        return step_record(
            number, warm, gap + body, min(data, gap), body, comm, tokens, flops, spans
        )

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


def _completed(step: Pending) -> bool:
    if not step[8].query():
        return False
    return all(d.query() for _, dones in step[9] for d in dones)


def comm_seconds(pairs: Pairs) -> float:
    """Exposed comm of a step's backward passes: per pass, ready → latest done."""
    total = 0.0
    for ready, dones in pairs:
        latest = max((ready.elapsed_time(d) for d in dones), default=0.0)
        total += max(0.0, latest) / 1000.0
    return total
