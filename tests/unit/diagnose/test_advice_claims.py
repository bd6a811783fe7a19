"""Advice that cannot contradict its evidence (issue 34).

Every claim an advice line makes ("the GPU is the limit", "the job itself has the CPUs
pegged", "processes outside the job keep the CPUs busy") is a predicate over the verdict's
signals (``KIND_CLAIMS`` / ``MODIFIER_CLAIMS`` in stepscope.diagnose.advice). These tests
walk every verdict kind and modifier over the signal ranges that select it, through the
real sampler (simulated GPUs, scripted ranks and host), and fail on any line whose
signals deny what it says.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stepscope.diagnose.advice import (
    KIND_ADVICE,
    KIND_CLAIMS,
    MODIFIER_ADVICE,
    MODIFIER_CLAIMS,
    advice_for,
    denied_claims,
)
from stepscope.diagnose.model import KINDS, MODIFIERS, Verdict
from stepscope.diagnose.thresholds import Thresholds
from stepscope.host.model import HostReading, Pressure, ProcessReading
from tests.support.diagnosis import PID, Node
from tests.unit.diagnose.test_faults import faults

# GPU workloads of the simulated node, each selecting some verdicts
SAW = {"activity": "sawtooth", "period": 0.01, "duty": 0.4, "level": 0.05}
GPUS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp32": {"workload": {"precision": "fp32"}},
    "elementwise": {"workload": {"kernels": "elementwise", "level": 0.99}},
    "small grids": {"workload": {"level": 0.1}},
    "launch-bound": {"workload": SAW},
    "pageable copy": {"workload": {**SAW, "wait": "copy"}},
    "body only": {"workload": {"activity": "sawtooth", "period": 0.05, "duty": 0.3}},
    "thermal": {"timeline": [{"thermal": "sw"}]},
    "power cap": {"timeline": [{"power_cap": True}]},
    "idle": {"workload": {"activity": "idle"}},
    "no gpu": {},
}
# (data, comm, other) shares of a 0.5 s step: around each line and well past it
PHASES = [
    p for p in itertools.product((0.0, 0.1, 0.26, 0.5), (0.0, 0.26, 0.45),
                                 (0.0, 0.2, 0.31, 0.48, 0.7))
    if sum(p) <= 0.95
]  # fmt: skip
# the named spans of the time between steps, as shares of it: (checkpoint, evaluation,
# logging, other)
SPANS: list[tuple[float, float, float, float] | None] = [
    None,
    (1.0, 0.0, 0.0, 0.0),
    (0.0, 0.5, 0.0, 0.0),
    (0.0, 0.0, 0.3, 0.2),
]
# the host: (CPUs the rank may use, busy share, workers, cores per worker, main process
# cores, IO pressure), or None (the rank's process is not visible)
HOSTS: list[tuple[int, float, int, float, float, float] | None] = [
    None,
    *itertools.product((4, 16), (0.3, 0.9, 0.98), (0, 2, 4), (0.05, 0.4, 0.95), (0.05, 1.0),
                       (0.0, 0.45)),
]  # fmt: skip
TH = Thresholds()
# a variant whose occupancy line the simulated GPUs (occupancy 0.57 at SM 0.95) cross
LOW_OCCUPANCY = Thresholds(low_occupancy=0.6)


@dataclass(frozen=True)
class Case:
    gpu: str
    phases: tuple[float, float, float]
    spans: tuple[float, float, float, float] | None
    host: tuple[int, float, int, float, float, float] | None
    world_size: int
    th: Thresholds

    def __str__(self) -> str:
        occupancy = ", low_occupancy 0.6" if self.th is LOW_OCCUPANCY else ""
        return (f"{self.gpu}, phases {self.phases}, spans {self.spans}, host {self.host}, "
                f"world {self.world_size}{occupancy}")  # fmt: skip


def _host(h: tuple[int, float, int, float, float, float] | None, pid: int) -> HostReading:
    if h is None:  # another PID namespace: the host reads, the rank's pid does not
        return HostReading(8, (0.97,) * 8)
    cpus, busy, workers, per_worker, main, io = h
    return HostReading(
        cpus, (busy,) * cpus, io_pressure=Pressure(io),
        processes={pid: ProcessReading(pid, main, workers, workers * per_worker)},
    )  # fmt: skip


def _run(case: Case) -> tuple[Verdict, ...]:
    node = Node({"gpus": 2, **GPUS[case.gpu]}, thresholds=case.th)
    node.host.reading = _host(case.host, PID)
    data, comm, other = case.phases
    spans = None if case.spans is None else tuple(0.5 * other * s for s in case.spans)
    gpu = None if case.gpu == "no gpu" else 0

    def each_second() -> None:
        for _ in range(2):
            node.step(0, 0.5, data=0.5 * data, comm=0.5 * comm, other=0.5 * other, gpu=gpu,
                      world_size=case.world_size, spans=spans)  # fmt: skip

    return node.run(20, each_second).verdicts


def _cases(n: int, seed: int = 34) -> list[Case]:
    """``n`` cases drawn from the whole product (a fixed draw), with every GPU workload,
    phase mix and host at least once."""
    rng = random.Random(seed)
    gpus, hosts = list(GPUS), HOSTS
    out = [
        Case(gpus[i % len(gpus)], PHASES[i % len(PHASES)], SPANS[i % len(SPANS)],
             hosts[i % len(hosts)], (1, 16)[i % 2], (TH, LOW_OCCUPANCY)[i % 5 == 0])
        for i in range(max(len(gpus), len(PHASES), len(hosts)))
    ]  # fmt: skip
    while len(out) < n:
        out.append(Case(rng.choice(gpus), rng.choice(PHASES), rng.choice(SPANS),
                        rng.choice(hosts), rng.choice((1, 16)),
                        rng.choice((TH, TH, LOW_OCCUPANCY))))  # fmt: skip
    return out


def _special() -> Iterator[tuple[str, Thresholds, Callable[[], tuple[Verdict, ...]]]]:
    """Verdicts the phase grid cannot reach: two ranks, silence, an ended process,
    hardware faults, one long gap."""

    def peers() -> tuple[Verdict, ...]:
        node = Node({"gpus": 2})

        def both() -> None:
            node.step(0, 1.0, comm=0.4, gpu=0, world_size=2)
            node.step(1, 1.0, comm=0.02, gpu=1, world_size=2)

        return node.run(20, both).verdicts

    def silent() -> tuple[Verdict, ...]:
        node = Node({"gpus": 1, "timeline": [{"at": 15, "activity": "idle", "memory": 0.5}]},
                    window=10)  # fmt: skip
        node.run(12, lambda: node.step(0, 1.0, gpu=0))
        return node.run(25).verdicts

    def ended() -> tuple[Verdict, ...]:
        node = Node({"gpus": 1}, window=10)
        node.host.reading = _host((8, 0.2, 0, 0.0, 0.5, 0.0), PID)
        node.run(15, lambda: node.step(0, 1.0, gpu=0))
        node.host.reading = HostReading(8, (0.2,) * 8)
        return node.run(2).verdicts

    def broken() -> tuple[Verdict, ...]:
        return Node(faults(), window=20).run(65).verdicts

    def one_gap() -> tuple[Verdict, ...]:
        node = Node({"gpus": 1}, window=30)
        node.run(40, lambda: node.step(0, 0.5, gpu=0))
        node.run(20)
        node.step(0, 20.5, other=20.0, gpu=0)
        return node.run(2, lambda: node.step(0, 0.5, gpu=0)).verdicts

    def slow_clock() -> tuple[Verdict, ...]:
        # a loaded GPU clocked under its peers with no clock event (fail-slow)
        return Node({"gpus": 4, "timeline": [{"gpus": [3], "sm_clock": 0.9}]}).run(20).verdicts

    for run in (peers, silent, ended, broken, one_gap, slow_clock):
        yield run.__name__, TH, run


def _denied(v: Verdict, th: Thresholds) -> list[str]:
    return denied_claims(v.kind, v.modifiers, v.advice, v.signals, th)


def test_every_line_declares_its_claims_and_says_each_one() -> None:
    assert set(KIND_CLAIMS) == set(KIND_ADVICE) == set(KINDS)
    assert set(MODIFIER_CLAIMS) == set(MODIFIER_ADVICE) == set(MODIFIERS)
    for table, lines in ((KIND_CLAIMS, KIND_ADVICE), (MODIFIER_CLAIMS, MODIFIER_ADVICE)):
        for name, claims in table.items():
            for claim in claims:
                assert claim.phrase in lines[name], (name, claim.phrase)


def test_no_verdict_says_what_its_signals_deny() -> None:
    """The walk: 350 cases over every GPU workload, phase mix, named span, host and job
    shape, and the verdicts the grid cannot reach; every kind and every modifier whose
    line claims something must be met, and none may be denied by its own signals."""
    kinds: set[str] = set()
    mods: set[str] = set()
    denied: list[str] = []
    runs = [(str(c), c.th, lambda c=c: _run(c)) for c in _cases(350)]
    for name, th, run in [*runs, *_special()]:
        for v in run():
            kinds.add(v.kind)
            mods.update(v.modifiers)
            bad = _denied(v, th)
            if bad:
                denied.append(f"{name}: {v.subject.name} {v.kind}{list(v.modifiers)} says "
                              f"{bad} but {dict(v.signals)}")  # fmt: skip
    assert not denied, "\n".join(denied[:5]) + f"\n({len(denied)} in all)"
    assert kinds == set(KINDS)
    assert {m for m, claims in MODIFIER_CLAIMS.items() if claims} <= mods


@pytest.mark.parametrize(
    ("kind", "modifiers", "signals", "phrase"),
    [
        # issue 34: compute while 48% of the step is lost between steps, recurring
        ("compute", (), {"compute_share": 0.52, "other_share": 0.48,
                         "between_steps_intervals": 19.0}, "The GPU is the limit"),
        # issue 34: "the workers have the CPUs pegged" while others hold 87% of them
        ("input_cpu", (), {"data_wait_share": 0.6, "cpu_busy": 0.98, "job_cpu_share": 0.11,
                           "outside_cpu_share": 0.87}, "The job itself has the CPUs pegged"),
        ("host_contended", (), {"data_wait_share": 0.6, "cpu_busy": 0.5, "job_cpu_share": 0.1,
                                "outside_cpu_share": 0.4},
         "Processes outside the job keep the CPUs it may use busy"),
        ("between_steps", ("unnamed_gpu_work",), {"other_share": 0.5,
         "between_steps_intervals": 9.0, "between_steps_gpu_busy": 0.1},
         "The GPU works between steps"),
    ],
)  # fmt: skip
def test_a_line_its_signals_deny_is_caught(
    kind: str, modifiers: tuple[str, ...], signals: dict[str, float], phrase: str
) -> None:
    """The check can fail: the contradictions issue 34 found, as signals, are denied."""
    assert phrase in denied_claims(kind, modifiers, advice_for(kind, modifiers), signals, TH)
