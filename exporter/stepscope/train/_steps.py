"""What a reporter's training thread hands its sender thread, and the bookkeeping the
sender thread does with it.

The training thread's whole share of a step is: record the CUDA events (on the CUDA
path), read the host clock, and put one plain tuple in a preallocated ring
(:class:`StepRing`, no allocation but the tuple, no lock, no call). Everything else a
step needs (its number and warm-up flag, the tokens and FLOPs checked, the data wait
and the gap before it, the named spans since the last step, the comm events, the CUDA
timeline, the record) is done by :class:`StepBook` on the sender thread, a slice of
entries at a time. Named spans and ``resume_from`` go through the same ring, in order
with the steps; spans no step follows become a tail when the reporter closes.

Threads: only the training thread writes ``StepRing.written``, ``lost`` and ``open``
and the slots ahead of ``written``; only the sender thread (or ``close``, under the
sender's lock) writes ``read`` and reads the slots behind ``written``. Under the GIL
an attribute store is atomic, and a slot is written before ``written`` moves past it.
Standard library only.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from stepscope.shared import datagram as schema
from stepscope.shared.datagram import PendingStep, PendingTail
from stepscope.train._timeline import CudaTimeline, comm_seconds, step_record

log = logging.getLogger("stepscope.train")

# Entries: a step is (tokens, flops, enter, end, data, start event, end event, comm),
# ``enter``/``end`` host clock readings, ``data`` the reporter's running total of data
# wait, ``comm`` the DDP hook's (host seconds, event pairs) or None. A control entry's
# first item is one of these markers (never a user's ``tokens``).
SPAN = object()  # (SPAN, name, seconds, end): a named span between steps ended
RESUME = object()  # (RESUME, number): the next step's number
# Steps that may wait in the ring: 4096 is 20 s of 5 ms steps between two sender ticks.
RING_SIZE = 4096
# Entries the sender thread turns into records per slice, holding the GIL: ~2-4 us each,
# so a slice is well under a millisecond (docs/sdk.md).
SLICE = 64

_clock = time.perf_counter


class StepRing:
    """A preallocated ring of the training thread's entries (``size`` a power of 2).

    ``first``: when timing began (the first ``timed()`` fetch or the first step's
    start), set once by the training thread. ``open``: the training thread is inside
    ``step()``, so the sender thread waits before taking the GIL for a slice."""

    __slots__ = ("first", "lost", "mask", "open", "read", "slots", "written")

    def __init__(self, size: int = RING_SIZE) -> None:
        if size & (size - 1):
            raise ValueError(f"ring size must be a power of 2, got {size}")
        self.slots: list[Any] = [None] * size
        self.mask = size - 1
        self.written = 0  # entries put (the training thread's)
        self.read = 0  # entries taken (the sender thread's)
        self.lost = 0  # steps dropped because the ring was full
        self.first: float | None = None
        self.open = False

    def put(self, entry: tuple[Any, ...]) -> bool:
        """Add an entry (training thread); False when the ring is full (not added)."""
        n = self.written
        if n - self.read > self.mask:
            return False
        self.slots[n & self.mask] = entry
        self.written = n + 1
        return True

    def pending(self) -> int:
        """Entries not yet taken."""
        return self.written - self.read


class StepBook:
    """The sender thread's side: turns ring entries into records, in order.

    ``number``: the first step's number; ``warmup_steps``, ``flops_per_token``,
    ``flops_per_step``: the reporter's. ``timeline``: set once CUDA events time the
    steps (their records then come out of it as their events complete)."""

    def __init__(self, ring: StepRing, number: int, warmup_steps: int,
                 flops_per_token: float | None, flops_per_step: float | None) -> None:  # fmt: skip
        self.ring = ring
        self.number = number
        self.warmup_steps = warmup_steps
        self.flops_per_token = flops_per_token
        self.flops_per_step = flops_per_step
        self.timeline: CudaTimeline | None = None
        self.invalid = 0  # bad per-step values, sent as 0
        self.seen = 0  # steps taken from the ring
        self._prev_end: float | None = None  # host end of the last step taken
        self._data = 0.0  # the reporter's data-wait total at the last step taken
        self._spans: dict[str, float] = {}  # named spans since the last step taken
        # for a tail: the host time its spans count from (the last step's end, or the
        # previous tail's), and the last span's end
        self._tail_from: float | None = None
        self._tail_to = 0.0
        self._logged: set[str] = set()

    def drain(self, final: bool, limit: int = SLICE) -> tuple[list[Any], bool]:
        """Up to ``limit`` entries' records (None for a step lost), then the CUDA steps
        whose events completed; ``final``: every entry, steps not completed dropped, and
        the spans after the last step as a tail. Returns (records, whether entries are
        left)."""
        ring = self.ring
        slots, mask = ring.slots, ring.mask
        r = ring.read
        stop = ring.written
        if not final:
            stop = min(stop, r + limit)
        out: list[PendingStep | PendingTail | None] = []
        while r < stop:
            entry = slots[r & mask]
            slots[r & mask] = None
            r += 1
            try:
                self._take(entry, out)
            except Exception as err:  # one bad entry never stops the others
                out.append(None)
                self._log_once("entry", "stepscope: a step could not be read: %r", err)
        ring.read = r
        timeline = self.timeline
        if timeline is not None:
            out += timeline.resolve(final)
        if final and self._spans:
            out.append(self._tail())
        return out, r < ring.written

    def _take(self, entry: tuple[Any, ...], out: list[Any]) -> None:
        kind = entry[0]
        if kind is SPAN:
            _, name, seconds, end = entry
            spans = self._spans
            spans[name] = spans.get(name, 0.0) + seconds
            self._tail_to = end
            return
        if kind is RESUME:
            self.number = entry[1]
            return
        tokens, flops, enter, end, data_total, start, end_event, comm = entry
        number = self.number
        self.number = number + 1
        warm = self.seen + self.ring.lost < self.warmup_steps
        self.seen += 1
        prev = self._prev_end
        if prev is None:
            prev = self.ring.first if self.ring.first is not None else enter
        gap = max(0.0, enter - prev)
        self._prev_end = self._tail_from = end
        data = data_total - self._data
        self._data = data_total
        data = min(data, gap) if data > 0.0 else 0.0
        if type(tokens) is not int or tokens < 0:
            tokens = self._tokens(tokens)
        if flops is None:
            flops = self.flops_per_step
            if flops is None:
                per_token = self.flops_per_token
                flops = 0.0 if per_token is None else per_token * tokens
        else:
            flops = self._flops(flops)
        spans = self._spans
        named = tuple(spans.items()) if spans else ()
        if named:
            spans.clear()
        comm_host, pairs = comm if comm is not None else (0.0, ())
        timeline = self.timeline
        if timeline is not None:  # read when its events complete (a spent pool: lost)
            if not timeline.queue(number, warm, tokens, flops, data, gap, start, end_event,
                                  pairs, named):  # fmt: skip
                out.append(None)
            return
        body = end - enter
        comm_total = comm_host + (comm_seconds(pairs) if pairs else 0.0)  # sync: completed
        out.append(step_record(number, warm, end - enter + gap, data, body, comm_total,
                               tokens, flops, named, time.time() - (_clock() - end)))  # fmt: skip

    def _tail(self) -> PendingTail | None:
        """The spans after the last step: from its end (or the previous tail's) to the
        last span's end. None (counted as lost) when there is nothing to count from."""
        spans = tuple(self._spans.items())
        self._spans.clear()
        since, until = self._tail_from, self._tail_to
        self._tail_from = until  # a later close (at exit) counts from here
        if since is None or self.seen == 0:
            return None
        dur = until - since
        if not 0.0 < dur <= schema.MAX_STEP_SECONDS:
            return None
        return (self.number - 1, time.time() - (_clock() - until), dur, spans)

    def _flops(self, flops: Any) -> float:
        """``step(flops=...)`` as a float; a bad value becomes 0 and is counted."""
        try:
            value = float(flops)
            if math.isfinite(value) and value >= 0.0:
                return value
        except (TypeError, ValueError):
            pass
        self.invalid += 1
        self._log_once("flops", "stepscope: step(flops=%r) is not a number >= 0; sent 0", flops)
        return 0.0

    def _tokens(self, tokens: Any) -> int:
        try:
            if isinstance(tokens, bool):
                value = -1
            elif isinstance(tokens, float) and tokens.is_integer():
                value = int(tokens)
            else:
                value = tokens.__index__()  # numpy / 0-d integer tensors
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        except Exception:
            pass
        self.invalid += 1
        self._log_once("tokens", "stepscope: step(tokens=%r) is not an int >= 0; sent 0",
                       tokens)  # fmt: skip
        return 0

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)

