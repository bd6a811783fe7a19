"""Fail-slow on the node: a rank busier than its group's other ranks here reads
``straggler``; a loaded GPU clocked under its peers with no clock event of its own reads
``clock_lag``. Through the real sampler (simulated GPUs, scripted ranks) for ranks; the
GPU comparison over GPU windows as the engine makes them."""

from __future__ import annotations

import dataclasses

import pytest

from stepscope.diagnose.engine import GpuWindow
from stepscope.diagnose.fail_slow import clock_laggards
from stepscope.diagnose.thresholds import Thresholds
from stepscope.gpu.model import GpuInfo
from tests.support import parse_samples
from tests.support.diagnosis import Node, by_gpu, by_rank

BUSY = {"gpus": 4, "workload": {"activity": "busy", "precision": "bf16"}}


def jitter(rank: int, n: int) -> float:
    """+-4% in a fixed pattern per rank and step (no randomness)."""
    return 0.04 * (((rank * 7 + n * 13) % 9) - 4) / 4


def run(busy: dict[int, float], groups: dict[int, str] | None = None,
        jittered: bool = False) -> dict[int | None, object]:  # fmt: skip
    """Four ranks, one a GPU, stepping once a second for 25 s: busy seconds of compute
    per step as given, plus 0.1 s of exposed communication (not busy time)."""
    node = Node(BUSY)

    def each_second() -> None:
        for rank, seconds in busy.items():
            n = node.steps.get(rank, -1) + 1
            compute = seconds * (1 + jitter(rank, n)) if jittered else seconds
            node.step(rank, compute + 0.1, comm=0.1, gpu=rank, world_size=4,
                      group=(groups or {}).get(rank))  # fmt: skip

    diag = node.run(25, each_second)
    return {"verdicts": by_rank(diag), "text": node.text(), "status": diag.status}  # type: ignore[dict-item]


def test_a_rank_8_percent_busier_than_its_peers_on_the_node_reads_straggler_naming_it() -> None:
    out = run({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.54})
    verdicts = out["verdicts"]
    assert isinstance(verdicts, dict)
    slow = verdicts[3]
    assert slow.kind == "compute" and slow.modifiers == ("straggler",)
    assert slow.bottleneck and out["status"] == "bottleneck"  # diagnose exits 1
    said = slow.evidence[-1]
    assert said.startswith("rank 3 is busy 0.540 s per step")
    assert "1.08x the median 0.500 s of the 3 other rank(s) of job j on this node" in said
    assert "every rank of its job waits for it" in slow.advice
    assert [v.modifiers for r, v in verdicts.items() if r != 3] == [(), (), ()]
    # served per rank, with the rank's labels (no group label: none reported)
    samples = parse_samples(str(out["text"]))
    mods = [(lbl["rank"], lbl["modifier"]) for lbl, _ in samples["stepscope_bottleneck_modifier"]]
    assert mods == [("3", "straggler")]
    assert all("group" not in lbl for lbl, _ in samples["stepscope_step_duration_seconds_count"])


def test_jitter_of_4_percent_step_to_step_is_no_straggler() -> None:
    out = run({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}, jittered=True)
    verdicts = out["verdicts"]
    assert isinstance(verdicts, dict)
    assert {r: v.modifiers for r, v in verdicts.items()} == dict.fromkeys(range(4), ())


def test_pipeline_stages_compare_within_their_group_only() -> None:
    # stage0 carries the embedding: 30% busier by design; stage1's rank 3 is 10% slower
    stages = {0: "stage0", 1: "stage0", 2: "stage1", 3: "stage1"}
    out = run({0: 0.65, 1: 0.65, 2: 0.5, 3: 0.55}, groups=stages)
    verdicts = out["verdicts"]
    assert isinstance(verdicts, dict)
    assert {r: v.modifiers for r, v in verdicts.items()} == {0: (), 1: (), 2: (), 3: ("straggler",)}
    assert (
        "of the 1 other rank(s) of group stage1 of job j on this node" in verdicts[3].evidence[-1]
    )
    # the group is a label of the rank's series and of its verdict
    samples = parse_samples(str(out["text"]))
    groups = {lbl["rank"]: lbl["group"] for lbl, _ in samples["stepscope_steps_total"]}
    assert groups == {"0": "stage0", "1": "stage0", "2": "stage1", "3": "stage1"}
    assert {lbl["rank"]: lbl["group"] for lbl, _ in samples["stepscope_bottleneck"]} == groups
    # without the groups, the first stage's ranks are the job's stragglers
    flat = run({0: 0.65, 1: 0.65, 2: 0.5, 3: 0.55})["verdicts"]
    assert isinstance(flat, dict)
    assert {r for r, v in flat.items() if "straggler" in v.modifiers} == {0, 1}


def _gpu(index: int, clock: float, *, util: float = 100.0, limit: float = 700.0,
         thermal: float = 0.0, power: float = 0.0,
         model: str = "NVIDIA H100 80GB HBM3") -> GpuWindow:  # fmt: skip
    info = GpuInfo(index=index, uuid=f"GPU-{index}", name=model,
                   pci_bus_id=f"00000000:{index:02x}:00.0")  # fmt: skip
    return GpuWindow(info, True, 0.9, util, 0.5, 0.6, 0.1, 0.3, thermal, power, {},
                     sm_clock=clock, power_limit=limit)  # fmt: skip


def test_a_loaded_gpu_8_percent_under_its_peers_clock_reads_clock_lag() -> None:
    th = Thresholds()
    peers = [_gpu(i, 1980.0) for i in range(3)]
    lagging = clock_laggards([*peers, _gpu(3, 1815.0)], th)
    assert set(lagging) == {"GPU-3"}
    lag = lagging["GPU-3"]
    assert lag.modifier == "clock_lag"
    assert lag.evidence.startswith(
        "GPU 3 runs its SMs at 1815 MHz under load, 92% of the "
        "median 1980 MHz of the node's 3 other loaded NVIDIA H100"
    )
    # a bin's dip, another power limit, another model, an idle GPU: no peers to lag
    assert clock_laggards([*peers, _gpu(3, 1965.0)], th) == {}
    assert clock_laggards([*peers, _gpu(3, 1600.0, limit=500.0)], th) == {}
    assert clock_laggards([*peers, _gpu(3, 1410.0, model="NVIDIA A100")], th) == {}
    assert clock_laggards([*peers, _gpu(3, 345.0, util=0.0)], th) == {}
    # its own thermal slowdown, or power capping beyond its peers', already says why
    assert clock_laggards([*peers, _gpu(3, 1815.0, thermal=0.5)], th) == {}
    assert clock_laggards([*peers, _gpu(3, 1815.0, power=0.5)], th) == {}
    # a node uniformly at its power cap: the one clocked lower with no more capping lags
    capped = [_gpu(i, 1755.0, power=1.0) for i in range(3)]
    assert set(clock_laggards([*capped, _gpu(3, 1605.0, power=1.0)], th)) == {"GPU-3"}


def test_a_simulated_gpu_held_at_92_percent_clock_without_an_event_reads_clock_lag() -> None:
    node = Node({**BUSY, "timeline": [{"gpus": [2], "sm_clock": 0.92}]})
    v = by_gpu(node.run(20))
    assert {g: x.modifiers for g, x in v.items()} == {0: (), 1: (), 2: ("clock_lag",), 3: ()}
    assert v[2].kind == "compute" and v[2].bottleneck
    assert v[2].signals["sm_clock_over_peers"] == pytest.approx(0.92, abs=0.01)
    assert v[2].signals["thermal_share"] == 0.0 and "nvidia-smi -rgc" in v[2].advice
    samples = parse_samples(node.text())
    lagging = [lbl["gpu"] for lbl, _ in samples["stepscope_bottleneck_modifier"]]
    assert lagging == ["2"]


def test_the_node_thresholds_default_to_the_fleets() -> None:
    from stepscope.diagnose.fleet_rules import FLEET

    th = Thresholds()
    assert (th.straggler_ratio, th.clock_lag_ratio, th.clock_load_gpu_util) == (
        FLEET.rank_straggler_ratio,
        FLEET.gpu_clock_lag_ratio,
        FLEET.clock_load_gpu_util,
    )
    assert dataclasses.replace(th, straggler_ratio=1.2).straggler_ratio == pytest.approx(1.2)
