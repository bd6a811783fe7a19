"""The sampler: reads every registered source on its tier, off the event loop.

One pass, top to bottom: read each due source in registration order (each read timed,
its failure isolated, its health kept), build the label schema from the GPUs and ranks
the sources named plus the enrichment they attribute, freeze a Snapshot, run the
analyses over it, render every family once and swap the reference the web server
serves. A scrape never reads a source. Sources never call each other: a read sees only
the identities earlier sources named (its ReadContext).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stepscope.core import memory
from stepscope.core.exposition import Family
from stepscope.core.health import health_families, process_families
from stepscope.core.labels import (
    GPU_IDENTITY_LABELS,
    HOST_LABEL,
    LabelSchema,
    LabelSchemaBuilder,
    Pairs,
)
from stepscope.core.logbudget import flush_all as flush_log_budgets
from stepscope.core.registry import Analysis, Registry
from stepscope.core.snapshot import Published, Snapshot
from stepscope.core.source import ReadContext, Source, SourceHealth, Tier

# Passes after the last one read for which the sampler still renders ahead (a reader
# whose period is not known yet; one late past the time expected).
RENDER_AHEAD_PASSES = 2
# Readers on periods of their own the forecast can follow at once (an HA pair of
# Prometheus servers is two).
MAX_READERS = 4
# How often the sampler runs CPython's full (oldest-generation) collection itself when it
# manages the collector (``stepscope serve``): at 512 ranks the window held ~130,000
# objects, and CPython's own schedule scanned them every 5-10 s, 70-110 ms each with the
# GIL held, so every thread stalled (scrapes waited behind it). The exporter's data is
# freed by reference counting; only reference cycles need the collector, and the young
# generations still collect those automatically. Run just after a pass is read.
FULL_COLLECT_SECONDS = 60.0

log = logging.getLogger("stepscope.sampler")


def manage_collector() -> tuple[int, int, int]:
    """Take CPython's full collections over: what exists now (modules, configuration) is
    never scanned again, and the oldest generation is collected only when
    :func:`full_collection` is called. The thresholds to hand back to
    :func:`release_collector`."""
    saved = gc.get_threshold()
    gc.freeze()
    young, middle, _ = saved
    gc.set_threshold(young, middle, 1 << 30)  # never automatically
    return saved


def release_collector(saved: tuple[int, int, int]) -> None:
    """CPython's own schedule again, as before :func:`manage_collector`."""
    gc.set_threshold(*saved)
    gc.unfreeze()


def full_collection() -> None:
    """The full collection, and what it and the passes freed handed back to the OS."""
    gc.collect()
    memory.trim()


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    """What a reload may change without restarting the sampler."""

    hostname: str
    interval: float
    slow_interval: float
    host_label: str = HOST_LABEL


@dataclass(slots=True)
class _Entry:
    """A source's bookkeeping: latest part and health. Sampler thread only, except a
    background source's ``latest`` tuple, which its reader thread swaps whole."""

    source: Source[object]
    part: object | None = None
    health: SourceHealth | None = None
    errors: int = 0
    last_read: float = -math.inf
    last_error: str = ""
    latest: tuple[object | None, SourceHealth | None] = (None, None)
    started: float | None = None
    thread: threading.Thread | None = None

    def due(self, now: float, settings: SamplerSettings) -> bool:
        tier = self.source.tier
        if tier is Tier.FAST:
            return True
        every = settings.slow_interval if tier is Tier.SLOW else float(tier)
        return now - self.last_read >= every - 1e-3


@dataclass(slots=True)
class _Timed:
    """Bookkeeping for an analysis, like a source's; ``result`` is for ``snapshot``
    (an earlier pass's when the analysis reused it, :meth:`Analysis.reuse_for`)."""

    analysis: Analysis[object]
    errors: int = 0
    last_error: str = ""
    health: SourceHealth | None = None
    result: object | None = field(default=None)
    snapshot: Snapshot | None = None


class ReadForecast:
    """When the exposition will next be read, learnt from when it was.

    A scraper reads on a period (Prometheus on its ``scrape_interval``, to the
    millisecond), or several do, each on its own (an HA pair). The last reads are
    searched for the smallest number of readers ``m`` (1 to :data:`MAX_READERS`) whose
    reads repeat with one period, ``R[-1] - R[-1-m] ≈ R[-2] - R[-2-m]``; each reader's
    next read is then its last plus that period. A pass is rendered ahead when a read is
    expected before the next pass (or is late by up to :data:`RENDER_AHEAD_PASSES`
    passes); until a period shows, the few passes after each read are.
    """

    def __init__(self) -> None:
        self._reads: deque[float] = deque(maxlen=2 * MAX_READERS + 2)
        self._learnt = -math.inf  # when the pass that learnt of the latest read started
        self.gzip = False  # whether the latest read asked for the gzip form
        self.protobuf = False  # whether it asked for the protobuf form

    def saw(self, at: float, gzip: bool, now: float, protobuf: bool = False) -> None:
        """A published snapshot was first read at ``at`` (gzip: in its gzip form;
        protobuf: in the protobuf format); the pass starting ``now`` learns of it."""
        reads = self._reads
        if not reads or at > reads[-1]:
            reads.append(at)
        self._learnt = now
        self.gzip = gzip
        self.protobuf = protobuf

    def expected(self, interval: float) -> list[float] | None:
        """The next read of each reader, or None while no period shows."""
        r = self._reads
        # m readers need 2m reads for their next reads and m + 2 for the check: with
        # fewer than 2m (a burst of irregular reads), r[-j - m] raised IndexError and
        # every pass failed until the reads settled (the served snapshot went stale)
        for m in range(1, min(MAX_READERS, len(r) - 2, len(r) // 2) + 1):
            period = r[-1] - r[-1 - m]
            if period > 0 and abs(period - (r[-2] - r[-2 - m])) <= interval / 2:
                return [r[-j] + (r[-j] - r[-j - m]) for j in range(1, m + 1)]
        return None

    def due(self, now: float, interval: float) -> bool:
        """Whether the pass starting ``now`` is likely to be read."""
        if not self._reads:
            return False
        expected = self.expected(interval)
        if expected is None:  # this pass and the next few
            return now - self._learnt < (RENDER_AHEAD_PASSES + 0.5) * interval
        late = RENDER_AHEAD_PASSES * interval
        return any(at - 1.25 * interval < now <= at + late for at in expected)


class Sampler:
    """Owns the sources while running; the only thread that reads the foreground ones."""

    def __init__(
        self,
        registry: Registry,
        settings: SamplerSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        build_labels: Mapping[str, str] | None = None,
        manage_gc: bool = False,
    ) -> None:
        self._manage_gc = manage_gc
        self._gc_saved: tuple[int, int, int] | None = None
        self._entries = [_Entry(s) for s in registry.sources]
        self._analyses = [_Timed(a) for a in registry.analyses]
        self._settings = settings
        self._clock = clock
        self._wall = wall_clock
        self._build_labels = dict(build_labels or {})
        self._labels = LabelSchemaBuilder()
        self._latest: Published | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self._reads = ReadForecast()

    @property
    def latest(self) -> Published | None:
        """The newest published snapshot (None before the first pass)."""
        return self._latest

    @property
    def settings(self) -> SamplerSettings:
        return self._settings

    def update(self, settings: SamplerSettings) -> None:
        """Apply reloaded settings from the next pass on (reference swap, no lock)."""
        self._settings = settings

    # ------------------------------------------------------------ reading

    def _fail(self, entry: _Entry | _Timed, name: str, exc: Exception, duration: float) -> None:
        entry.errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if message != entry.last_error:  # a source failing every pass logs once
            log.error("source %s failed: %s", name, message, exc_info=exc)
        entry.last_error = message
        entry.health = SourceHealth(False, duration, entry.errors, message)

    def _read(self, entry: _Entry, ctx: ReadContext) -> tuple[object | None, SourceHealth]:
        """One timed, isolated read; returns (part, health) and updates the entry."""
        source = entry.source
        ctx.errors = 0
        t0 = self._clock()
        try:
            part = source.read(ctx)
        except Exception as exc:  # a source's bug or outage costs its own part only
            entry.errors += ctx.errors
            self._fail(entry, source.name, exc, self._clock() - t0)
            assert entry.health is not None
            return None, entry.health
        entry.errors += ctx.errors
        if entry.last_error:
            log.warning("source %s is reading again", source.name)
            entry.last_error = ""
        entry.health = SourceHealth(True, self._clock() - t0, entry.errors)
        return part, entry.health

    def _background(self, entry: _Entry) -> None:
        """A background source's own loop: read, publish (part, health), wait."""
        source = entry.source
        while not self._stop.is_set():
            latest = self._latest
            snap = latest.snapshot if latest else None
            settings = self._settings
            ctx = ReadContext(
                self._clock(),
                settings.interval,
                settings.slow_interval,
                snap.labels.gpus if snap else (),
                snap.labels.ranks if snap else (),
            )
            part, health = self._read(entry, ctx)
            entry.latest = (part, health)  # one reference swap
            tier = source.tier
            every = settings.slow_interval if tier in (Tier.FAST, Tier.SLOW) else float(tier)
            if math.isinf(every):
                if health.success:
                    return  # read once
                every = settings.slow_interval  # retry a failed one-off read
            self._stop.wait(every)

    def _take_background(self, entry: _Entry, now: float) -> None:
        if entry.thread is None:
            entry.started = now
            entry.thread = threading.Thread(
                target=self._background,
                args=(entry,),
                name=f"stepscope-{entry.source.name}",
                daemon=True,
            )
            entry.thread.start()
        part, health = entry.latest
        if health is None:  # the first read has not finished
            assert entry.started is not None
            health = SourceHealth(False, now - entry.started, entry.errors, pending=True)
        entry.part, entry.health = part, health

    # ------------------------------------------------------------ one pass

    def _enrich(self, entries: list[_Entry], ctx: ReadContext) -> dict[str, Pairs]:
        """The enrichment stage: every source's extra GPU labels, merged in one place.

        A label name already on the GPU (or given by an earlier source) is not repeated:
        a series never carries one name twice.
        """
        taken = GPU_IDENTITY_LABELS
        merged: dict[str, Pairs] = {}
        for entry in entries:
            try:
                extra = entry.source.gpu_labels(entry.part, ctx.gpus)
            except Exception as exc:
                self._fail(entry, entry.source.name, exc, 0.0)
                continue
            for uuid, pairs in extra.items():
                have = merged.get(uuid, ())
                names = taken | {k for k, _ in have}
                merged[uuid] = have + tuple((k, v) for k, v in pairs if k not in names and v)
        return merged

    def _families(
        self,
        entry: _Entry | _Timed,
        name: str,
        make: Callable[[Any, Any], Iterable[Family]],
        *args: Any,
    ) -> list[Family]:
        try:
            return list(make(*args))
        except Exception as exc:  # a renderer bug costs that source's series only
            self._fail(entry, name, exc, 0.0)
            return []

    def sample_once(self) -> Published:
        """Run one pass now, publish its snapshot and return it."""
        settings = self._settings
        start = self._clock()
        ctx = ReadContext(start, settings.interval, settings.slow_interval)
        parts: dict[str, object] = {}
        health: dict[str, SourceHealth] = {}
        live: list[_Entry] = []
        for entry in self._entries:
            source = entry.source
            if source.background:
                self._take_background(entry, start)
            elif entry.due(start, settings):
                entry.last_read = start
                entry.part, _ = self._read(entry, ctx)
            if entry.health is not None:
                health[source.name] = entry.health
            if entry.part is None:
                continue
            parts[source.name] = entry.part
            live.append(entry)
            try:
                ctx.gpus += tuple(source.gpus(entry.part))
                ctx.ranks += tuple(source.ranks(entry.part))
            except Exception as exc:
                self._fail(entry, source.name, exc, 0.0)
        if self._labels.host_label != settings.host_label:
            self._labels = LabelSchemaBuilder(settings.host_label)
        labels = self._labels.build(
            settings.hostname, ctx.gpus, ctx.ranks, self._enrich(live, ctx)
        )
        evidence: dict[str, tuple[str, ...]] = {}
        for entry in live:
            try:
                lines = tuple(entry.source.evidence(entry.part))
            except Exception as exc:
                self._fail(entry, entry.source.name, exc, 0.0)
                continue
            if lines:
                evidence[entry.source.name] = lines
        snapshot = Snapshot(
            timestamp=self._wall(),
            monotonic=self._clock(),
            hostname=settings.hostname,
            interval=settings.interval,
            slow_interval=settings.slow_interval,
            labels=labels,
            parts=parts,
            health=health,
            evidence=evidence,
        )
        previous = self._latest
        if previous is None:  # the first pass is made ready: a scraper may be waiting
            self._reads.saw(start, False, start)
        elif previous.read_at is not None:
            self._reads.saw(
                previous.read_at, previous.gzip_requested, start, previous.protobuf_requested
            )
        # A pass a scraper is expected to read is rendered ahead (its analyses run in
        # full); the others only when someone asks.
        due = self._reads.due(start, settings.interval)
        results = self._analyse(snapshot, health, due)
        snapshot = replace(snapshot, health=health, collect_duration_seconds=self._clock() - start)
        # what this pass rendered from, fixed now: entries and analyses move on next pass
        pieces = [(entry, entry.part) for entry in live]
        analysed = [(timed, timed.result, timed.snapshot) for timed in self._analyses]

        def families() -> list[Family]:
            return self._render(pieces, analysed, labels, snapshot)

        published = Published(snapshot, results, families, self._clock)
        if due:
            published.render_ahead(gzipped=self._reads.gzip, protobuf=self._reads.protobuf)
        self._latest = published
        self.passes += 1
        # the "N more suppressed" lines of floods that ended: no sender to trigger them
        flush_log_budgets()
        return published

    def _analyse(
        self, snapshot: Snapshot, health: dict[str, SourceHealth], due: bool
    ) -> dict[str, object]:
        """Run each analysis; on a pass nobody is expected to read, one whose result is
        costly may keep its last (``reuse_for``) and only observe the snapshot."""
        results: dict[str, object] = {}
        for timed in self._analyses:
            analysis = timed.analysis
            name = analysis.name
            t0 = self._clock()
            try:
                if (
                    not due
                    and timed.result is not None
                    and timed.snapshot is not None
                    and snapshot.monotonic - timed.snapshot.monotonic
                    < analysis.reuse_for(snapshot)
                ):
                    analysis.observe(snapshot)
                else:
                    timed.result = analysis.run(snapshot)
                    timed.snapshot = snapshot
            except Exception as exc:  # a rule bug must not cost the metrics
                timed.result = timed.snapshot = None
                self._fail(timed, name, exc, self._clock() - t0)
            else:
                timed.health = SourceHealth(True, self._clock() - t0, timed.errors)
                timed.last_error = ""
            if timed.health is not None:
                health[name] = timed.health
            if timed.result is not None:
                results[name] = timed.result
        return results

    def _render(
        self,
        pieces: list[tuple[_Entry, Any]],
        analysed: list[tuple[_Timed, Any, Snapshot | None]],
        labels: LabelSchema,
        snapshot: Snapshot,
    ) -> list[Family]:
        families: list[Family] = []
        for entry, part in pieces:
            source = entry.source
            families += self._families(entry, source.name, source.families, part, labels)
        for timed, result, of in analysed:
            analysis = timed.analysis
            if result is not None and of is not None:  # with the pass it was made from
                families += self._families(timed, analysis.name, analysis.families, result, of)
        families += health_families(snapshot, self._build_labels)
        families += process_families()
        return families

    # ------------------------------------------------------------ lifecycle

    def _run(self) -> None:
        next_at = self._clock()
        collected_at = next_at
        while not self._stop.is_set():
            published = None
            try:
                published = self.sample_once()
            except Exception:  # never let the sampling thread die silently
                log.exception("sampling pass failed")
            interval = self._settings.interval
            next_at += interval
            if self._manage_gc and self._clock() - collected_at >= FULL_COLLECT_SECONDS:
                # Right after this pass is read: the longest time before the next read
                # (a scraper reading soon after each pass would otherwise meet the pause
                # once a minute). Nobody reading by the next pass: collect then.
                if published is not None:
                    published.wait_read(max(0.0, next_at - self._clock()))
                collected_at = self._clock()
                full_collection()
            now = self._clock()
            if next_at < now:  # fell behind (suspend, slow NVML): skip, don't burst
                next_at = now + interval
            self._stop.wait(next_at - now)

    def start(self) -> None:
        """Start the sampling thread (the first pass runs immediately). Managing the
        collector: what exists now (modules, configuration) is never scanned again,
        and full collections run every :data:`FULL_COLLECT_SECONDS` from this thread
        instead of whenever CPython's schedule says."""
        if self._manage_gc and self._gc_saved is None:
            self._gc_saved = manage_collector()
        self._thread = threading.Thread(target=self._run, name="stepscope-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads and close every source."""
        self._stop.set()
        for t in [self._thread, *(e.thread for e in self._entries)]:
            if t is not None:
                t.join(timeout)
        for entry in self._entries:
            try:
                entry.source.close()
            except Exception:
                log.exception("closing source %s failed", entry.source.name)
        if self._gc_saved is not None:
            release_collector(self._gc_saved)
            self._gc_saved = None
