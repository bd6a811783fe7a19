"""The diagnosis keeps its window indexed as snapshots arrive and expire; its verdicts are
the ones a computation from scratch over the same window gives.

A node with simulated GPUs (one falls off the bus and is reset, one logs a critical XID,
one idles for a while) and scripted ranks whose jobs start, finish and go silent long
enough to expire and come back with counters from 0, runs through the real sampler on a
fake clock. After every pass the published verdicts are compared, field by field, with
:func:`~stepscope.diagnose.engine.diagnose` over a window built from scratch out of the
same snapshots, and every rank's step figures and history with the rule written out
directly below (the one the diagnosis used before it kept an index).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from stepscope.core.labels import LabelSchema
from stepscope.core.snapshot import Snapshot
from stepscope.core.source import ReadContext, Source
from stepscope.diagnose.analysis import (
    DIAGNOSIS,
    EVERY_PASS_RANKS,
    REUSE_SECONDS,
    DiagnosisAnalysis,
)
from stepscope.diagnose.engine import diagnose
from stepscope.diagnose.faults import FaultTracker
from stepscope.diagnose.finished import FinishedTracker
from stepscope.diagnose.model import Diagnosis, Verdict
from stepscope.diagnose.page import render_status_page
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import SnapshotWindow
from stepscope.gpu.simulated import SimulatedBackend, parse_scenario
from stepscope.host.model import HOST_PART, HostReading, Pressure, ProcessReading
from stepscope.ingest.aggregate import (
    INGEST_PART,
    Aggregator,
    RankView,
    TrainingSettings,
    TrainingView,
)
from stepscope.ingest.source import IngestSource
from stepscope.shared.datagram import PHASES, Phases, StepRecord
from tests.support import make_sampler
from tests.support.clocks import ManualClock

GPUS = 4
SCENARIO: dict[str, Any] = {
    "gpus": GPUS,
    "timeline": [
        {"gpus": [0], "activity": "sawtooth", "period": 1.0, "duty": 0.3},
        {"at": "25s", "gpus": [1], "xid": 79},
        {"at": "40s", "gpus": [2], "fall_off_bus": True},
        {"at": "75s", "gpus": [2], "reset": True},
        {"at": "50s", "until": "95s", "gpus": [3], "activity": "idle"},
    ],
}
RANK_EXPIRY = 6.0  # seconds of silence before the ingest forgets a rank


@dataclass
class Rank:
    job: str
    rank: int
    gpu: int | None
    pid: int
    world_size: int
    step: int = -1
    mode: str = "compute"
    silent_until: float = 0.0


@dataclass
class Jobs:
    """Training jobs as a random script drives them."""

    rng: random.Random
    uuids: list[str]
    live: dict[str, list[Rank]] = field(default_factory=dict)
    started: int = 0
    next_pid: int = 5000

    def start(self) -> None:
        self.started += 1
        size = self.rng.randint(1, 4)
        world = size * self.rng.choice((1, 2))
        job = f"job-{self.started}"
        self.live[job] = [self._rank(job, r, world) for r in range(size)]

    def _rank(self, job: str, rank: int, world: int) -> Rank:
        self.next_pid += 1
        gpu = self.rng.choice((*range(GPUS), None))
        return Rank(job, rank, gpu, self.next_pid, world)

    def finish(self) -> None:
        del self.live[self.rng.choice(sorted(self.live))]

    def record(self, r: Rank, now: float) -> StepRecord:
        r.step += 1
        dur = self.rng.uniform(0.2, 1.5)
        weights = {
            "compute": (0.05, 0.8, 0.1, 0.05),
            "data": (0.6, 0.3, 0.05, 0.05),
            "comm": (0.05, 0.3, 0.6, 0.05),
            "other": (0.05, 0.2, 0.05, 0.7),
        }[r.mode]
        data, compute, comm, other = (dur * w for w in weights)
        return StepRecord(
            r.job, r.rank, r.rank, r.step, 1.7e9 + now, dur, data, compute, comm, other,
            r.step < 2, 1024, 1e13 * self.rng.random(), "bf16", r.world_size, r.pid,
            self.uuids[r.gpu] if r.gpu is not None else None, 0,
        )  # fmt: skip

    def second(self, now: float) -> list[StepRecord]:
        """What the ranks send this second, after the script's random events."""
        rng = self.rng
        if len(self.live) < 4 and rng.random() < 0.08:
            self.start()
        if self.live and rng.random() < 0.03:
            self.finish()
        out = []
        for r in itertools.chain.from_iterable(self.live.values()):
            if rng.random() < 0.05:
                r.mode = rng.choice(("compute", "data", "comm", "other"))
            if now < r.silent_until:
                continue
            # silent for a while: past the expiry it restarts, past the expiry and the
            # window nothing of it is left in the window; a rank silent after its first
            # step comes back with as many steps as before: not seen as restarted
            if rng.random() < (0.3 if r.step == 0 else 0.04):
                r.silent_until = now + rng.choice((rng.randint(2, 12), rng.randint(15, 45)))
                if r.silent_until - now > RANK_EXPIRY:
                    r.step = -1
                continue
            if rng.random() < 0.85:
                out.append(self.record(r, now))
        return out

    def processes(self) -> dict[int, ProcessReading]:
        """The live ranks' processes the host source can read (some it cannot)."""
        procs = {}
        for r in itertools.chain.from_iterable(self.live.values()):
            if self.rng.random() < 0.9:
                cpus = tuple(range(4 * (r.pid % 2), 4 * (r.pid % 2) + 4))
                procs[r.pid] = ProcessReading(
                    r.pid, self.rng.uniform(0, 1.2), self.rng.randint(0, 3),
                    self.rng.uniform(0, 2), cpus if r.pid % 3 else (),
                )  # fmt: skip
        return procs


class ScriptedHost(Source[HostReading]):
    key = HOST_PART

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    def read(self, ctx: ReadContext) -> HostReading:
        rng = self.jobs.rng
        return HostReading(
            8,
            tuple(rng.uniform(0, 1) for _ in range(8)),
            rng.uniform(0, 0.3),
            Pressure(rng.uniform(0, 0.5)) if rng.random() < 0.8 else None,
            Pressure(rng.uniform(0, 0.5)),
            self.jobs.processes(),
        )


@dataclass(frozen=True)
class Reference:
    """A rank over the window, computed directly from the snapshots (the old rule)."""

    steps: int
    dur: float
    shares: tuple[float, ...]
    history: dict[str, tuple[float | None, ...]]


def reference_rank(key: tuple[str, int], window: list[Snapshot]) -> Reference:
    views: list[RankView] = []
    for snap in window:
        training = snap.part(INGEST_PART)
        r = training.by_key.get(key) if training is not None else None
        if r is not None:
            if views and r.steps < views[-1].steps:  # restarted: counters from 0
                views.clear()
            views.append(r)
    first, last = views[0], views[-1]
    hist: dict[str, list[float | None]] = {"step_seconds": [], **{p: [] for p in PHASES}}
    for a, b in itertools.pairwise(views):
        n = b.measured_steps - a.measured_steps
        d = b.step_seconds_sum - a.step_seconds_sum
        hist["step_seconds"].append(d / n if n > 0 else None)
        for name, pa, pb in zip(PHASES, a.phase_seconds, b.phase_seconds, strict=True):
            hist[name].append((pb - pa) / d if n > 0 and d > 0 else None)
    dur = last.step_seconds_sum - first.step_seconds_sum
    phases = [b - a for a, b in zip(first.phase_seconds, last.phase_seconds, strict=True)]
    return Reference(
        steps=last.measured_steps - first.measured_steps,
        dur=dur,
        shares=tuple(p / dur if dur > 0 else 0.0 for p in phases),
        history={k: tuple(v) for k, v in hist.items()},
    )


def check_rank(v: Verdict, window: list[Snapshot]) -> None:
    assert v.subject.rank is not None
    ref = reference_rank((v.subject.job, v.subject.rank), window)
    assert v.signals["steps"] == float(ref.steps)
    if ref.steps:
        assert v.signals["step_seconds"] == ref.dur / ref.steps
        shares = tuple(v.signals[f"{p}_share"] for p in PHASES)
        assert shares == ref.shares
    else:
        assert v.signals["step_seconds"] is None
    for name, series in ref.history.items():
        assert tuple(v.history[name]) == series, name


@pytest.mark.parametrize(("seed", "window"), [(1, 20.0), (2, 10.0), (3, 30.0)])
def test_incremental_window_gives_the_verdicts_of_a_window_computed_from_scratch(
    seed: int, window: float
) -> None:
    clock = ManualClock()
    backend = SimulatedBackend(parse_scenario(SCENARIO), hostname="n", clock=clock)
    jobs = Jobs(random.Random(seed), [d.uuid for d in backend.devices()])
    agg = Aggregator(TrainingSettings(rank_expiry=RANK_EXPIRY), clock=clock)
    th = Thresholds(window=window, min_steps=3, finished_linger=8.0)
    sampler = make_sampler(
        backend, hostname="n", clock=clock, wall_clock=lambda: 1.7e9 + clock.t,
        sources=[IngestSource(agg), ScriptedHost(jobs)], analyses=[DiagnosisAnalysis(th)],
    )  # fmt: skip
    faults, finished = FaultTracker(), FinishedTracker()
    snapshots: list[Snapshot] = []
    seen: dict[str, int] = {"restart": 0, "expired": 0, "finished": 0, "gpu_down": 0}
    last_seen: dict[tuple[str, int], tuple[int, float]] = {}
    present: set[tuple[str, int]] = set()
    kinds: set[str] = set()
    for _ in range(130):
        clock.t += 1.0
        for rec in jobs.second(clock.t):
            agg.add(rec)
        published = sampler.sample_once()
        snap = published.snapshot
        snapshots.append(snap)
        # the window as the ring keeps it, from the full list of snapshots
        in_window = [s for s in snapshots if s.monotonic >= snap.monotonic - window - 1e-6]
        held = faults.update(snap, th.fault_hold)
        ended = finished.update(snap, th.window)
        expected = diagnose(SnapshotWindow.of(in_window, window), th, held, ended)
        got = published.result(DIAGNOSIS, Diagnosis)
        # the verdicts; the goodput books ride beside them (tests/unit/diagnose/test_goodput)
        assert replace(got, goodput=()) == expected, f"pass at t={clock.t:.0f}"
        for v in got.verdicts:
            kinds.add(v.kind)
            if v.subject.rank is not None and v.kind != "finished":
                check_rank(v, in_window)
            seen["finished"] += v.kind == "finished"
            seen["gpu_down"] += "gpu_down" in v.modifiers
        training = snap.part(INGEST_PART)
        assert training is not None
        now_steps = {k: r.steps for k, r in training.by_key.items()}
        seen["expired"] += sum(k not in now_steps for k in present)
        present = set(now_steps)
        for k, n in now_steps.items():  # back with counters from 0, older views in the window
            steps, when = last_seen.get(k, (0, 0.0))
            seen["restart"] += n < steps and clock.t - when < window
            last_seen[k] = (n, clock.t)
    # the random history did exercise what it is meant to
    assert all(n > 0 for n in seen.values()), seen
    assert {"compute", "gpu_fault", "finished"} <= kinds, kinds


def test_a_window_keeps_nothing_of_subjects_gone_from_it() -> None:
    """Memory stays bounded: ranks, GPUs and pids that left the window leave the index."""
    clock = ManualClock()
    backend = SimulatedBackend(parse_scenario(SCENARIO), hostname="n", clock=clock)
    jobs = Jobs(random.Random(7), [d.uuid for d in backend.devices()])
    agg = Aggregator(TrainingSettings(rank_expiry=RANK_EXPIRY), clock=clock)
    analysis = DiagnosisAnalysis(Thresholds(window=10.0))
    sampler = make_sampler(
        backend, hostname="n", clock=clock, wall_clock=lambda: 1.7e9 + clock.t,
        sources=[IngestSource(agg), ScriptedHost(jobs)], analyses=[analysis],
    )  # fmt: skip
    window = SnapshotWindow()
    for _ in range(40):
        clock.t += 1.0
        for rec in jobs.second(clock.t):
            agg.add(rec)
        window.push(sampler.sample_once().snapshot, 10.0)
    assert window.tracked()[0] > 0
    jobs.live.clear()  # every job ends; the ingest forgets the ranks after the expiry
    for _ in range(int(RANK_EXPIRY) + 12):
        clock.t += 1.0
        window.push(sampler.sample_once().snapshot, 10.0)
    assert window.tracked() == (0, GPUS, 0)
    assert window.samples == 11


def _snapshot(t: float, steps: int | None) -> Snapshot:
    """A snapshot at ``t`` with rank ("j", 0) at ``steps`` steps (None: absent)."""
    ranks = ()
    if steps is not None:
        s = float(steps)
        ranks = (RankView(
            "j", 0, 0, None, None, None, "bf16", steps, 0, s, (), Phases(0.1 * s, 0.7 * s,
            0.1 * s, 0.1 * s), 0, 0.0, False, t, 0, None,
        ),)  # fmt: skip
    parts = {INGEST_PART.name: TrainingView(True, 0, ranks=ranks)}
    return Snapshot(t, t, "n", 1.0, 10.0, LabelSchema("n", (), {}, (), {}), parts)


@pytest.mark.parametrize(
    "steps",
    [
        # seen once, gone for most of the window, back with as many steps: its first view
        # leaves the window while the rank has a single newer one
        [1, None, None, None, None, 1, 2, 3, 4, 5, 6, 7, 8],
        # restarted within the window, then the views before the restart leave it
        [5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        # gone longer than the window, back from 0
        [3, 4, None, None, None, None, None, None, None, 0, 1, 2, 3],
    ],
)
def test_a_rank_window_follows_gaps_and_restarts_as_a_scan_of_the_window_does(
    steps: list[int | None],
) -> None:
    window = SnapshotWindow()
    pushed: list[Snapshot] = []
    for t, n in enumerate(steps, start=1):
        pushed.append(_snapshot(float(t), n))
        kept = window.push(pushed[-1], 5.0)
        snapshots = pushed[-kept:]
        assert [s.monotonic for s in snapshots] == [
            s.monotonic for s in pushed if s.monotonic >= t - 5.0 - 1e-6
        ]
        rw = window.rank(("j", 0))
        assert (rw is None) == (n is None)
        if rw is None:
            continue
        assert rw == SnapshotWindow.of(snapshots, 5.0).rank(("j", 0))
        ref = reference_rank(("j", 0), snapshots)
        assert (rw.steps, rw.dur) == (ref.steps, ref.dur)
        assert {k: tuple(v) for k, v in rw.series.items()} == ref.history, f"t={t}"


# ------------------------------------------------------------------ made when read


class EveryPass(DiagnosisAnalysis):
    """The diagnosis made every pass, whatever the rank count (the reference)."""

    def reuse_for(self, snapshot: Snapshot) -> float:
        return 0.0


@pytest.mark.parametrize("ranks", [EVERY_PASS_RANKS, 2 * EVERY_PASS_RANKS])
def test_many_ranks_make_verdicts_when_read_and_at_least_every_few_seconds(ranks: int) -> None:
    """Above EVERY_PASS_RANKS ranks, a pass nobody is expected to read keeps the last
    verdicts (at most REUSE_SECONDS old, rendered with the pass they were made for)
    while the window still sees it, so a pass a scraper reads gets the verdicts a
    diagnosis made every pass gives; at or below it, every pass makes its own."""
    clock = ManualClock()
    agg = Aggregator(TrainingSettings(rank_expiry=600.0), clock=clock)
    backend = SimulatedBackend(parse_scenario({"gpus": GPUS}), hostname="n", clock=clock)
    uuids = [d.uuid for d in backend.devices()]
    lazy, reference = DiagnosisAnalysis(), EveryPass()
    samplers = [
        make_sampler(
            backend,
            clock=clock,
            sources=[IngestSource(agg)],
            analyses=[a],
            wall_clock=lambda: 1.7e9 + clock.t,
        )
        for a in (lazy, reference)
    ]
    made: list[float] = []  # the age of the verdicts each unread pass served
    for second in range(40):
        clock.t = float(second)
        for r in range(ranks):
            slow = 0.4 if (r == 3 and second >= 20) else 0.0  # a straggler appears
            agg.add(StepRecord(
                f"job-{r // 64}", r, r % GPUS, second, 1.7e9 + clock.t, 0.8 + slow, 0.1,
                0.5 + slow, 0.15, 0.05, second < 2, 4096, 1e14, "bf16", None, 100 + r,
                uuids[r % GPUS], 0,
            ))  # fmt: skip
        lazy_pass, ref_pass = (s.sample_once() for s in samplers)
        ours = lazy_pass.results[DIAGNOSIS]
        assert isinstance(ours, Diagnosis)
        made.append(lazy_pass.snapshot.timestamp - ours.timestamp)
        page = render_status_page(lazy_pass, "ok")
        assert (f"(made {made[-1]:.0f} s before this pass)" in page) == (made[-1] >= 0.5)
        if second % 10 == 9:  # a scraper reads every 10 s: the next read is expected
            assert lazy_pass.body and ref_pass.body
        if second >= 30:  # by now the reads' period is known: a read pass is fresh
            read_pass = second % 10 == 9
            if read_pass or ranks <= EVERY_PASS_RANKS:
                theirs = ref_pass.results[DIAGNOSIS]
                assert isinstance(theirs, Diagnosis)
                assert replace(ours, goodput=()) == replace(theirs, goodput=())
                # the books see the same counters, booked on fewer passes (float sums)
                for a, b in zip(ours.goodput, theirs.goodput, strict=True):
                    assert (a.job, dict(a.badput).keys()) == (b.job, dict(b.badput).keys())
                    assert (a.goodput, a.pending) == pytest.approx((b.goodput, b.pending))
                    assert dict(a.badput) == pytest.approx(dict(b.badput))
    assert max(made) <= REUSE_SECONDS
    if ranks <= EVERY_PASS_RANKS:
        assert made == [0.0] * 40
    else:
        assert made.count(0.0) < 20, "unread passes reuse the verdicts"
