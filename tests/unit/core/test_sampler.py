"""The sampler: one GPU's failure is that GPU's; tiers; XIDs; rendering."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from stepscope.core.sampler import Sampler
from stepscope.core.snapshot import Snapshot
from stepscope.gpu.model import (
    GPU_PART,
    GpuInfo,
    GpuPart,
    GpuReading,
    GpuUnavailable,
    Tier,
    XidEvent,
)
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from tests.support import make_sampler, parse_samples, wait_for
from tests.support.clocks import ManualClock


class ScriptedBackend:
    """A backend whose GPUs answer from a script the test controls."""

    name = "scripted"

    def __init__(self, n: int) -> None:
        self.infos = [GpuInfo(i, f"GPU-{i:04d}", "NVIDIA H200", f"00000000:{i + 16:02x}:00.0",
                              profiling_supported=True) for i in range(n)]
        self.lost: set[int] = set()
        self.pending: list[XidEvent] = []
        self.reads: list[tuple[int, frozenset[Tier]]] = []
        self.sm_active = 0.5
        self.energy = 1000.0
        self.closed = False

    def devices(self) -> Sequence[GpuInfo]:
        return self.infos

    def read(self, index: int, tiers: frozenset[Tier]) -> GpuReading:
        self.reads.append((index, tiers))
        if index in self.lost:
            raise GpuUnavailable("GPU is lost")
        values = {"sm_active": self.sm_active, "gpu_util": 100.0,
                  "clocks_event_reasons": float(0x20 | 0x04)}
        if Tier.SLOW in tiers:
            values["total_energy"] = self.energy
            values["clock_event_ns.sw_thermal_slowdown"] = 2.5e9
            values["clock_event_ns.sw_power_cap"] = values["power_violation"] = 4e9
        return GpuReading(values)

    def events(self) -> Sequence[XidEvent]:
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        self.closed = True


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_samples(text)


def make(n: int = 4) -> tuple[ScriptedBackend, Sampler, ManualClock]:
    backend = ScriptedBackend(n)
    clock = ManualClock(1000.0)
    sampler = make_sampler(backend, clock=clock, wall_clock=lambda: 1.7e9)
    return backend, sampler, clock


def gpus(snap: Snapshot) -> GpuPart:
    part = snap.part(GPU_PART)
    assert part is not None
    return part


def collector(fams: dict[str, Any], name: str, collector: str) -> float:
    return {lbl["collector"]: v for lbl, v in fams[name]}[collector]


def test_gpu_that_falls_off_the_bus_reads_down_while_others_keep_reporting() -> None:
    backend, sampler, clock = make(4)
    sampler.sample_once()
    backend.lost.add(2)
    clock.t += 1
    text = sampler.sample_once().body.decode()
    fams = families(text)
    up = {lbl["gpu"]: v for lbl, v in fams["stepscope_gpu_up"]}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0, "3": 1.0}
    sm = {lbl["gpu"] for lbl, _ in fams["DCGM_FI_PROF_SM_ACTIVE"]}
    assert sm == {"0", "1", "3"}
    # one GPU down is a partial error of the gpu source, which still succeeds
    assert collector(fams, "stepscope_collector_errors_total", "gpu") == 1.0
    assert collector(fams, "stepscope_collector_success", "gpu") == 1.0


def test_down_gpu_is_retried_on_the_slow_cadence_and_comes_back() -> None:
    backend, sampler, clock = make(2)
    backend.lost.add(1)
    sampler.sample_once()
    backend.reads.clear()
    for _ in range(5):
        clock.t += 1
        sampler.sample_once()
    assert [i for i, _ in backend.reads].count(1) == 0  # not hammered every pass
    backend.lost.clear()
    clock.t += 10
    snap = sampler.sample_once().snapshot
    assert gpus(snap).gpus[1].up
    assert gpus(snap).gpus[1].values["total_energy"] == 1000.0


def test_slow_tier_is_read_on_its_own_cadence_and_kept_between_reads() -> None:
    backend, sampler, clock = make(1)
    sampler.sample_once()
    tiers = [t for _, t in backend.reads]
    assert tiers == [frozenset({Tier.FAST, Tier.SLOW})]
    backend.energy = 2000.0
    for _ in range(9):
        clock.t += 1
        snap = sampler.sample_once().snapshot
        assert gpus(snap).gpus[0].values["total_energy"] == 1000.0  # carried from the slow read
    clock.t += 1
    snap = sampler.sample_once().snapshot
    assert gpus(snap).gpus[0].values["total_energy"] == 2000.0
    slow_reads = [t for _, t in backend.reads if Tier.SLOW in t]
    assert len(slow_reads) == 2


def test_each_xid_code_counts_separately_and_last_xid_is_kept() -> None:
    backend, sampler, _clock = make(2)
    backend.pending = [XidEvent(1, 79, 0.0), XidEvent(1, 48, 0.0), XidEvent(1, 79, 0.0)]
    fams = families(sampler.sample_once().body.decode())
    xids = {(lbl["gpu"], lbl["xid"]): v for lbl, v in fams["stepscope_xid_errors_total"]}
    assert xids == {("1", "79"): 2.0, ("1", "48"): 1.0}
    last = {lbl["gpu"]: v for lbl, v in fams["DCGM_FI_DEV_XID_ERRORS"]}
    assert last == {"0": 0.0, "1": 79.0}


def test_clock_event_bitmask_is_decoded_to_the_active_reasons_and_durations_in_seconds() -> None:
    _, sampler, _ = make(1)
    fams = families(sampler.sample_once().body.decode())
    active = {lbl["reason"]: v for lbl, v in fams["stepscope_gpu_clock_event_active"]}
    assert active == {"sw_power_cap": 1.0, "sw_thermal_slowdown": 1.0}  # inactive: absent
    secs = {lbl["reason"]: v for lbl, v in fams["stepscope_gpu_clock_event_seconds_total"]}
    assert secs == {"sw_thermal_slowdown": 2.5}
    # the power cap's time is served once, under dcgm-exporter's name (ns)
    assert [v for _, v in fams["DCGM_FI_DEV_POWER_VIOLATION"]] == [4e9]


def test_every_gpu_series_carries_the_dcgm_label_set() -> None:
    _, sampler, _ = make(2)
    fams = families(sampler.sample_once().body.decode())
    for labels, _ in fams["DCGM_FI_PROF_SM_ACTIVE"]:
        assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
        assert labels["Hostname"] == "node-a"
        assert labels["device"] == f"nvidia{labels['gpu']}"
    info = fams["stepscope_gpu_info"][0][0]
    assert info["profiling"] == "supported"


def test_a_backend_bug_on_one_gpu_is_counted_not_fatal() -> None:
    backend, sampler, _clock = make(2)

    def broken(index: int, tiers: frozenset[Tier]) -> GpuReading:
        if index == 0:
            raise KeyError("bug")
        return GpuReading({"sm_active": 0.25})

    backend.read = broken  # type: ignore[method-assign]
    snap = sampler.sample_once().snapshot
    assert snap.health["gpu"].errors_total == 1 and snap.health["gpu"].success
    assert gpus(snap).gpus[1].values["sm_active"] == 0.25


def test_stop_closes_the_backend() -> None:
    backend, sampler, _ = make(1)
    sampler.start()
    sampler.stop()
    assert backend.closed
    assert sampler.passes >= 1


def test_a_serving_sampler_runs_the_full_collection_itself_and_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stepscope serve``'s sampler keeps CPython from starting full collections (at 512
    ranks each scanned ~130,000 objects for 70-110 ms with the GIL held) and runs them
    on its own schedule: a reference cycle already in the oldest generation is still
    collected, and stopping gives the collector's settings back."""
    import gc
    import weakref

    from stepscope.core import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "FULL_COLLECT_SECONDS", 0.2)
    before = gc.get_threshold()
    sampler = make_sampler(SimulatedBackend(default_scenario(1)), interval=0.05)
    sampler._manage_gc = True  # as serve builds it

    class Node:
        pass

    sampler.start()
    try:
        assert gc.get_threshold()[2] >= 1 << 30, "CPython starts no full collection"
        assert gc.get_freeze_count() > 0, "what existed at start is never scanned again"
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        gc.collect(1)
        gc.collect(1)  # now in the oldest generation: young collections never see it
        del a, b
        wait_for(lambda: gone() is None, timeout=10.0)
    finally:
        sampler.stop()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_full_collection_runs_just_after_a_pass_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampler's full collection (a pause of ~100 ms at 512 ranks) waits for the pass
    it follows to be read, the moment furthest from the next read, instead of running
    as the pass is published, when a scraper that reads soon after each pass comes."""
    import gc
    import threading
    import time
    from types import SimpleNamespace

    from stepscope.core import sampler as sampler_module

    seen: list[float | None] = []  # the pass's read time when each collection ran
    sampler = make_sampler(SimulatedBackend(default_scenario(1)), interval=0.3)
    fake_gc = SimpleNamespace(
        collect=lambda *_: seen.append(sampler.latest.read_at),
        freeze=gc.freeze, unfreeze=gc.unfreeze,
        get_threshold=gc.get_threshold, set_threshold=gc.set_threshold,
    )  # fmt: skip
    monkeypatch.setattr(sampler_module, "gc", fake_gc)
    monkeypatch.setattr(sampler_module, "FULL_COLLECT_SECONDS", 0.0)  # after every pass
    sampler._manage_gc = True
    done = threading.Event()

    def scraper() -> None:  # reads each pass 0.1 s after it is published
        last = None
        while not done.is_set():
            latest = sampler.latest
            if latest is not None and latest is not last:
                last = latest
                time.sleep(0.1)
                assert latest.body
            time.sleep(0.01)

    reader = threading.Thread(target=scraper)
    sampler.start()
    reader.start()
    try:
        wait_for(lambda: len(seen) >= 8, timeout=30.0)
    finally:
        done.set()
        reader.join()
        sampler.stop()
    read_first = sum(at is not None for at in seen[1:])
    assert read_first >= (len(seen) - 1) * 3 // 4, seen


def test_the_read_forecast_never_raises_whatever_the_reads() -> None:
    """Irregular reads (a test polling /metrics every 0.1 s beside the 0.2 s passes) once
    made ReadForecast.expected index past its reads: IndexError, every pass failed and
    the served snapshot went stale until the reads settled."""
    import random

    from stepscope.core.sampler import MAX_READERS, ReadForecast

    rng = random.Random(7)
    for _ in range(2000):
        forecast = ReadForecast()
        at = 0.0
        for _ in range(rng.randint(1, 2 * MAX_READERS + 4)):
            at += rng.choice([0.01, 0.1, 0.2, 0.5, 1.0, rng.random()])
            forecast.saw(at, False, at)
            forecast.due(at + 0.05, 0.2)  # raised IndexError before
            expected = forecast.expected(0.2)
            assert expected is None or all(e > 0 for e in expected)
