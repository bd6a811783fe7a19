"""The goodput books are the exporter's clock, whatever senders say (issue 33).

Hypothesis drives the real pipeline (the ingest's parser and aggregator, the sampler
with a simulated GPU, the diagnosis and its goodput ledger) on a manual clock, with any
sequence of step datagrams (any ``t``, ``dur``, phases, step numbers, warm-up, spans;
from Unix senders whose process /proc names, from a rank in another PID namespace, over
UDP), silences past the rank expiry, process exits and restarts that take a rank over.
After every pass:

- a job's books (goodput, badput and what is pending) never exceed the wall time its
  ranks were held on this node: for each rank, from the earliest of its first datagram's
  receipt and the start of a process of it that the kernel named (as /proc says: no
  older than the process), to now;
- counters never go down within the exporter's process (a rank's own series restart
  at 0 only when a new process takes it over or it comes back after expiry: a new
  process's counters, as documented);
- no NaN or infinity reaches the text or the protobuf exposition, and no source or
  analysis failed (a renderer's exception would cost its families, hiding a bad value).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stepscope.core.procfs import ProcessStamp
from stepscope.core.source import ReadContext, Source
from stepscope.diagnose.analysis import DIAGNOSIS, DiagnosisAnalysis
from stepscope.diagnose.model import Diagnosis
from stepscope.gpu.scenario import default_scenario
from stepscope.gpu.simulated import SimulatedBackend
from stepscope.host.model import HOST_PART, HostReading, ProcessReading
from stepscope.ingest.aggregate import INGEST_PART, Aggregator, Sender
from stepscope.ingest.source import IngestSource
from stepscope.shared.datagram import Rejection, parse_datagram
from tests.support import make_sampler, parse_samples
from tests.support.clocks import ManualClock
from tests.support.metrics_proto import decode_delimited

OFFSET = 1.7e9  # Unix time = monotonic time + OFFSET
UID = 1000
OLD_PID = 1  # an old process of the host (pid 1): what a UDP or namespaced rank reports


@dataclass
class Proc:
    """A sending process: its kernel pid (0: in another PID namespace; None: UDP) and
    its start (Unix time; None: /proc does not say)."""

    kpid: int | None
    start: float | None
    alive: bool = True


@dataclass
class World:
    """The host as the exporter sees it: processes, /proc, the clocks."""

    clock: ManualClock = field(default_factory=lambda: ManualClock(10_000.0))
    procs: list[Proc] = field(default_factory=list)
    next_pid: int = 1000

    def wall(self) -> float:
        return OFFSET + self.clock.t

    def by_kpid(self, pid: int) -> Proc | None:
        if pid == OLD_PID:
            return Proc(OLD_PID, OFFSET - 1e6)
        return next((p for p in self.procs if p.kpid == pid), None)

    def started(self, pid: int) -> float | None:
        p = self.by_kpid(pid)
        return p.start if p is not None and p.alive else None

    def stamp(self, pid: int) -> ProcessStamp | None:
        """The process as /proc shows it (the bill reads its start as Unix time)."""
        started = self.started(pid)
        return ProcessStamp(pid, 0, 0, started) if started is not None else None

    def exited(self, pid: int, stamp: object = None) -> bool:
        p = self.by_kpid(pid)
        return p is None or not p.alive

    def spawn(self, slot: int, age: float, hidden: bool) -> None:
        """A new process in ``slot`` (0-1: Unix, same PID namespace; 2: another PID
        namespace; 3: UDP), started ``age`` seconds ago."""
        kpid: int | None
        if slot <= 1:
            self.next_pid += 1
            kpid = self.next_pid
        else:
            kpid = 0 if slot == 2 else None
        start = None if hidden else self.wall() - age
        proc = Proc(kpid, start)
        if slot < len(self.procs):
            self.procs[slot] = proc
        else:
            self.procs.append(proc)


class HostOf(Source[HostReading]):
    """The host source: the ranks' processes that are alive, with their starts."""

    key = HOST_PART

    def __init__(self, world: World) -> None:
        self.world = world

    def read(self, ctx: ReadContext) -> HostReading:
        procs = {}
        for r in ctx.ranks:
            p = self.world.by_kpid(r.proc) if r.proc else None
            if p is not None and p.alive and r.proc is not None:
                procs[r.proc] = ProcessReading(r.proc, 0.5, 0, 0.0, started=p.start)
        return HostReading(cpu_count=8, cpu_busy=(0.3,) * 8, processes=procs)


# -- the datagrams: any values, mostly within the schema's ranges (a refused one tests
# nothing past the parser), some out of them
_T = st.one_of(
    st.floats(min_value=-5.0, max_value=5.0),  # relative to the receipt: honest-ish
    st.floats(min_value=-1e7, max_value=1e7),
    st.tuples(st.just("abs"), st.sampled_from([1.0, 1e9, 9.9e10, 2e11])),  # as sent
)
_STEP = st.fixed_dictionaries({
    "kind": st.just("step"),
    "slot": st.sampled_from([0, 0, 0, 1, 1, 2, 3]),
    "job": st.sampled_from(["a", "a", "b"]),
    "rank": st.integers(0, 1),
    "step": st.integers(0, 200),
    "t": _T,
    # one in ten out of the schema's range (the parser refuses it)
    "dur": st.integers(0, 9).flatmap(lambda n: (
        st.sampled_from([0.0, -1.0, 1e9, math.nan, math.inf]) if n == 9 else
        st.floats(min_value=1e-6, max_value=86400.0) if n >= 6 else
        st.floats(min_value=1e-6, max_value=10.0))),
    "split": st.tuples(*[st.floats(0.0, 1.0)] * 3),
    "warmup": st.booleans(),
    "checkpoint": st.integers(0, 9).flatmap(lambda n: (
        st.just(1e5) if n == 9 else st.floats(0.0, 50.0) if n >= 6 else st.none())),
    "flops": st.sampled_from([0.0, 1e12, 1e30]),
    "dropped": st.integers(0, 10),
})  # fmt: skip
# a wait is followed by a pass of the sampler (as the exporter's own interval does)
_EVENT = st.one_of(
    _STEP,
    _STEP,
    _STEP,
    st.fixed_dictionaries({"kind": st.just("wait"),
                           "seconds": st.sampled_from([0.0, 0.05, 0.5, 1.0, 3.0, 30.0, 301.0])}),
    st.fixed_dictionaries({"kind": st.just("exit"), "slot": st.integers(0, 3)}),
    st.fixed_dictionaries({"kind": st.just("spawn"), "slot": st.integers(0, 3),
                           "age": st.sampled_from([0.0, 1.0, 60.0, 5000.0, 1e6]),
                           "hidden": st.booleans()}),
)  # fmt: skip


def _datagram(ev: dict[str, Any], proc: Proc, wall: float) -> bytes:
    t = ev["t"][1] if isinstance(ev["t"], tuple) else wall + ev["t"]
    dur = ev["dur"]
    parts = [x / max(1.0, sum(ev["split"])) * dur for x in ev["split"]] if math.isfinite(
        dur) else [0.0, 0.0, 0.0]  # fmt: skip
    obj: dict[str, Any] = {
        "v": 1, "type": "step", "job": ev["job"], "rank": ev["rank"], "local_rank": ev["rank"],
        "world_size": 4, "step": ev["step"], "warmup": ev["warmup"], "t": t, "dur": dur,
        "data": parts[0], "compute": parts[1], "comm": parts[2], "flops": ev["flops"],
        "tokens": 1, "dropped": ev["dropped"],
        # the pid it reports: its own in our namespace, else its namespace's (often 1)
        "pid": proc.kpid if proc.kpid else OLD_PID,
    }  # fmt: skip
    if ev["checkpoint"] is not None:
        obj["spans"] = {"checkpoint": ev["checkpoint"]}
    return json.dumps(obj).encode()  # NaN and Infinity too: the parser must refuse them


Series = tuple[str, frozenset[tuple[str, str]]]


def _counters(text: str) -> dict[Series, float]:
    """Every counter-like sample (counters, and histograms' and summaries' buckets, count
    and sum), by (name, labels)."""
    kinds = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            kinds[name] = kind
    out = {}
    for name, samples in parse_samples(text).items():
        base = next((name[: -len(s)] for s in ("_bucket", "_count", "_sum")
                     if name.endswith(s) and name[: -len(s)] in kinds), name)  # fmt: skip
        if kinds.get(base) in ("counter", "histogram", "summary"):
            for labels, value in samples:
                out[(name, frozenset(labels.items()))] = value
    return out


def _finite_protobuf(body: bytes) -> None:
    for mf in decode_delimited(body):
        for m in mf.metric:
            for kind in ("gauge", "counter", "untyped"):
                if m.HasField(kind):
                    assert math.isfinite(getattr(m, kind).value), (mf.name, m)
            if m.HasField("summary"):
                assert math.isfinite(m.summary.sample_sum), (mf.name, m)
            if m.HasField("histogram"):
                h = m.histogram
                assert math.isfinite(h.sample_sum), (mf.name, m)
                assert all(math.isfinite(b.upper_bound) or b.upper_bound > 0 for b in h.bucket)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_EVENT, min_size=10, max_size=50))
def test_any_datagrams_takeovers_and_exits_keep_the_books_within_the_wall_time_held(
    events: list[dict[str, Any]],
) -> None:
    world = World()
    for slot in range(4):
        world.spawn(slot, age=10.0, hidden=False)
    agg = Aggregator(clock=world.clock, process_exited=world.exited, wall_clock=world.wall,
                     process_stamp=world.stamp)  # fmt: skip
    backend = SimulatedBackend(default_scenario(1), hostname="n", clock=world.clock)
    sampler = make_sampler(backend, hostname="n", clock=world.clock, wall_clock=world.wall,
                           sources=[IngestSource(agg), HostOf(world)],
                           analyses=[DiagnosisAnalysis()])  # fmt: skip
    earliest: dict[tuple[str, int], float] = {}  # the earliest a rank can have been held
    before: dict[Series, float] = {}
    created: dict[tuple[str, int], tuple[float, int | None]] = {}

    def check_pass() -> int:
        """One pass of the sampler, checked."""
        nonlocal before
        published = sampler.sample_once()
        snap = published.snapshot
        assert all(h.success for h in snap.health.values()), snap.health
        diag = published.result(DIAGNOSIS, Diagnosis)
        assert diag is not None
        now = world.clock.t
        for job in diag.goodput:
            held = sum(now - since for (j, _), since in earliest.items() if j == job.job)
            assert job.held <= held * (1 + 1e-9) + 1e-6, (job, held)
            assert all(math.isfinite(v) and v >= 0.0 for _, v in job.badput), job
        # counters: never down, but a rank's own series under a new process of it
        training = snap.part(INGEST_PART)
        assert training is not None
        renewed = set()  # the ranks a new process of them reports for now
        for r in training.ranks:
            key = (r.job, r.rank)
            # a new process's state (the clock may not have moved: its kernel pid has)
            incarnation = (r.created, r.proc_pid)
            if created.get(key, incarnation) != incarnation:
                renewed.add(frozenset({("training_job", r.job), ("rank", str(r.rank))}))
            created[key] = incarnation
        text = published.render().decode()
        now_counters = _counters(text)
        for series, value in now_counters.items():
            assert math.isfinite(value), series
            old = before.get(series)
            if old is not None and value < old:
                assert any(mark <= series[1] for mark in renewed), (series, old, value)
        before = now_counters
        for line in text.splitlines():  # every sample value, counters or not
            if line and not line.startswith("#"):
                assert math.isfinite(float(line.rsplit(" ", 1)[1])), line
        _finite_protobuf(published.render_protobuf())
        return 1

    passes = 0
    for ev in [*events, {"kind": "pass"}]:
        kind = ev["kind"]
        if kind == "wait":
            world.clock.t += ev["seconds"]
            kind = "pass"
        if kind == "pass":
            passes += check_pass()
        elif kind == "exit":
            world.procs[ev["slot"]].alive = False
        elif kind == "spawn":
            world.spawn(ev["slot"], ev["age"], ev["hidden"])
        elif kind == "step":
            proc = world.procs[ev["slot"]]
            if not proc.alive:
                continue
            rec = parse_datagram(_datagram(ev, proc, world.wall()), agg.limits)
            if isinstance(rec, Rejection):
                continue
            sender = None if proc.kpid is None else Sender(UID, UID, proc.kpid)
            reason = agg.add(rec, sender)
            event(f"add {reason}")
            if reason is None:
                key = (rec.job, rec.rank)
                first = world.clock.t  # its receipt, or its process's start where seen
                if proc.kpid and proc.start is not None and proc.start <= world.wall():
                    first = min(first, proc.start - OFFSET)
                earliest[key] = min(earliest.get(key, first), first)
    assert passes >= 1
