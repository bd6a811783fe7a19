"""A node as the diagnosis tests script it (GPUs, ranks, host and RDMA readings), and
its verdicts by GPU and by rank."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stepscope.core.source import ReadContext, Source
from stepscope.diagnose.analysis import DIAGNOSIS, DiagnosisAnalysis
from stepscope.diagnose.model import Diagnosis, Verdict
from stepscope.diagnose.thresholds import Thresholds
from stepscope.gpu.simulated import SimulatedBackend, parse_scenario
from stepscope.host.model import HOST_PART, HostReading
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.source import IngestSource
from stepscope.net.rdma import RDMA_PART, RdmaPort
from stepscope.shared.datagram import StepRecord
from tests.support import make_sampler
from tests.support.clocks import ManualClock

PID = 4242


class FakeHost(Source[HostReading]):
    """The host as a test scripts it: every read returns ``reading``."""

    key = HOST_PART

    def __init__(self) -> None:
        self.reading = HostReading(cpu_count=8, cpu_busy=(0.3,) * 8)
        self.pids: set[int] = set()

    def read(self, ctx: ReadContext) -> HostReading:
        self.pids = {r.pid for r in ctx.ranks if r.pid is not None}
        return self.reading


class FakeRdma(Source[tuple[RdmaPort, ...]]):
    """RDMA ports as a test scripts them."""

    key = RDMA_PART

    def __init__(self) -> None:
        self.ports: tuple[RdmaPort, ...] = ()

    def read(self, ctx: ReadContext) -> tuple[RdmaPort, ...]:
        return self.ports


class Node:
    """A simulated node: GPUs from a scenario, ranks stepping as the test says."""

    def __init__(
        self, scenario: dict[str, Any], window: float = 20.0, thresholds: Thresholds | None = None
    ) -> None:
        self.clock = ManualClock()
        self.backend = SimulatedBackend(parse_scenario(scenario), hostname="n", clock=self.clock)
        self.uuids = [d.uuid for d in self.backend.devices()]
        self.agg = Aggregator(clock=self.clock, wall_clock=lambda: 1.7e9 + self.clock.t)
        self.host = FakeHost()
        self.fake_rdma = FakeRdma()
        self.sampler = make_sampler(
            self.backend,
            hostname="n",
            clock=self.clock,
            wall_clock=lambda: 1.7e9 + self.clock.t,
            sources=[IngestSource(self.agg), self.host, self.fake_rdma],
            analyses=[
                DiagnosisAnalysis(
                    replace(thresholds, window=window) if thresholds else Thresholds(window=window)
                )
            ],
        )
        self.steps: dict[int, int] = {}

    def step(
        self, rank: int, dur: float, data: float = 0.0, comm: float = 0.0, other: float = 0.0,
        gpu: int | None = None, world_size: int = 1, job: str = "j", warmup: bool = False,
        spans: tuple[float, ...] | None = None, group: str | None = None,
    ) -> None:  # fmt: skip
        n = self.steps[rank] = self.steps.get(rank, -1) + 1
        self.agg.add(
            StepRecord(
                job, rank, rank, n, 1.7e9 + self.clock.t, dur, data, dur - data - comm - other,
                comm, other, warmup, 0, 0.0, "bf16", world_size, PID + rank,
                self.uuids[gpu] if gpu is not None else None, 0, None, spans, group=group,
            )
        )  # fmt: skip

    def run(self, seconds: int, each_second: Any = None) -> Diagnosis:
        for _ in range(seconds):
            self.clock.t += 1.0
            if each_second is not None:
                each_second()
            rendered = self.sampler.sample_once()
        diag = rendered.result(DIAGNOSIS, Diagnosis)
        assert diag is not None
        return diag

    def text(self) -> str:
        latest = self.sampler.latest
        assert latest is not None
        return latest.body.decode()


def by_gpu(diag: Diagnosis) -> dict[int | None, Verdict]:
    return {v.subject.gpu: v for v in diag.verdicts if v.subject.rank is None}


def by_rank(diag: Diagnosis) -> dict[int | None, Verdict]:
    return {v.subject.rank: v for v in diag.verdicts if v.subject.rank is not None}
