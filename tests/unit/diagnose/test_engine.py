"""The verdict rules, through the real sampler: simulated GPUs, scripted ranks and host.

Time is a fake clock shared by the simulated GPUs, the training aggregator and the
sampler, so a 30 s window takes no wall time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepscope.diagnose.api import diagnosis_document
from stepscope.diagnose.thresholds import parse_thresholds
from stepscope.host.model import HostReading, Pressure, ProcessReading
from stepscope.net.rdma import RdmaPort
from tests.support import parse_samples
from tests.support.diagnosis import PID, Node, by_gpu, by_rank


def test_simulated_gpus_read_compute_with_thermal_power_and_fp32_modifiers() -> None:
    node = Node({
        "gpus": 7,
        "workload": {"activity": "busy", "precision": "bf16"},
        "devices": {5: {"model": "NVIDIA A100-SXM4-80GB"}},
        "timeline": [
            {"gpus": [1], "thermal": "sw"},
            {"gpus": [2], "power_cap": True},
            {"gpus": [3], "precision": "fp32"},
            {"gpus": [4], "activity": "idle"},
            {"gpus": [6], "activity": "sawtooth", "period": 1.0, "duty": 0.3},
        ],
    })  # fmt: skip
    v = by_gpu(node.run(25))
    assert (v[0].kind, v[0].modifiers) == ("compute", ())
    assert (v[1].kind, v[1].modifiers) == ("compute", ("thermal_throttle",))
    assert v[1].bottleneck and "temperature" in v[1].advice
    assert (v[2].kind, v[2].modifiers) == ("compute", ("power_cap",))
    assert not v[2].bottleneck
    assert (v[3].kind, v[3].modifiers) == ("compute", ("fp32_no_tensor",))
    assert "mixed precision" in v[3].advice
    assert v[4].kind == "idle"
    assert v[5].kind == "unknown"  # A100: no GPM, utilization alone cannot tell
    assert "GPM" in " ".join(v[5].evidence)
    assert v[6].kind == "unknown"  # waits without a rank: data or comm, no guess
    # on /metrics: each subject's one kind at 1, the modifiers that apply at 1, nothing else
    samples = parse_samples(node.text())
    for gpu in map(str, range(7)):
        kinds = {lbl["kind"]: val for lbl, val in samples["stepscope_bottleneck"]
                 if lbl["gpu"] == gpu}  # fmt: skip
        assert kinds == {v[int(gpu)].kind: 1.0}
        mods = {lbl["modifier"]: val for lbl, val in samples["stepscope_bottleneck_modifier"]
                if lbl["gpu"] == gpu}  # fmt: skip
        assert mods == dict.fromkeys(v[int(gpu)].modifiers, 1.0)
    assert {lbl["modifier"] for lbl, _ in samples["stepscope_bottleneck_modifier"]
            if lbl["gpu"] == "1"} == {"thermal_throttle"}  # fmt: skip
    lbl = next(lbl for lbl, val in samples["stepscope_bottleneck"] if lbl["gpu"] == "1" and val)
    # a GPU without a rank: no rank labels at all (never an empty value)
    assert "training_job" not in lbl and "rank" not in lbl
    assert lbl["Hostname"] == "n" and lbl["kind"] == "compute"


def test_data_wait_with_the_loader_in_the_training_process_is_input() -> None:
    node = Node({"gpus": 1, "workload": {"activity": "sawtooth", "duty": 0.3}})
    node.host.reading = HostReading(
        8, (0.87,) * 8, processes={PID: ProcessReading(PID, 6.9, 0, 0.0)}
    )  # the trap: every CPU busy (intra-op threads), yet more workers is the fix
    diag = node.run(20, lambda: node.step(0, 1.0, data=0.7, gpu=0))
    v = by_rank(diag)[0]
    assert v.kind == "input" and v.bottleneck
    assert "num_workers" in v.advice and v.subject.gpu == 0
    assert node.host.pids == {PID}
    assert by_gpu(diag) == {}  # the rank's GPU has no verdict of its own
    assert v.signals["data_wait_share"] == pytest.approx(0.7)
    assert v.signals["dataloader_workers"] == 0


def test_an_idle_child_of_a_busy_training_process_is_not_a_blocked_loader() -> None:
    """H200 run: num_workers=0 with an unrelated idle child read input_io; it is input."""
    node = Node({"gpus": 1})
    node.host.reading = HostReading(
        4, (0.83,) * 4, processes={PID: ProcessReading(PID, 3.3, 1, 0.01)}
    )
    v = by_rank(node.run(20, lambda: node.step(0, 0.15, data=0.135, gpu=0)))[0]
    assert v.kind == "input" and "num_workers" in v.advice


@pytest.mark.parametrize(
    ("cpus", "busy", "workers", "per_worker", "io", "kind"),
    [
        (4, 0.95, 4, 0.95, 0.0, "input_cpu"),  # workers pegged and no free CPU
        (4, 0.89, 9, 0.35, 0.0, "input_cpu"),  # H200 light/8: 9 workers share 4 busy CPUs
        # workers starved of CPU by other work: the others hold the CPUs, not the job
        (16, 0.97, 4, 0.20, 0.0, "host_contended"),
        (16, 0.97, 4, 0.05, 0.45, "input_io"),  # idle workers under IO pressure: storage
        (16, 0.40, 4, 0.95, 0.0, "input"),  # workers pegged, CPUs free: add workers
        (16, 0.20, 4, 0.05, 0.0, "input_io"),  # workers idle while the rank waits: blocked reads
        (16, 0.50, 4, 0.50, 0.45, "input_io"),  # IO pressure
    ],
)
def test_data_wait_with_workers_tells_cpu_from_io_from_too_few_workers(
    cpus: int, busy: float, workers: int, per_worker: float, io: float, kind: str
) -> None:
    node = Node({"gpus": 1})
    node.host.reading = HostReading(
        cpus, (busy,) * cpus, io_pressure=Pressure(io),
        processes={PID: ProcessReading(PID, 0.5, workers, workers * per_worker)},
    )  # fmt: skip
    diag = node.run(20, lambda: node.step(0, 0.5, data=0.3, gpu=0))
    assert by_rank(diag)[0].kind == kind


def test_a_reading_that_spans_a_jiffy_does_not_weigh_like_a_second() -> None:
    """CI, 2 CPUs, heavy augmentation on both: a host read a few ms after the one before
    reads a tick or none, 0% busy, and counted like a full interval it pulled the
    window's busy share under the saturation line (input_cpu read input, "CPUs are free
    for more workers"). Each reading weighs by the time it spans."""
    node = Node({"gpus": 1})
    full = HostReading(2, (0.97,) * 2, processes={PID: ProcessReading(PID, 0.2, 2, 1.7)})
    blip = HostReading(
        2, (0.0,) * 2, seconds=0.01, processes={PID: ProcessReading(PID, 0.0, 2, 0.0, seconds=0.01)}
    )
    passes = 0

    def each_second() -> None:
        nonlocal passes
        passes += 1
        node.host.reading = blip if passes % 3 == 0 else full
        node.step(0, 0.5, data=0.4, gpu=0)

    v = by_rank(node.run(20, each_second))[0]
    assert v.kind == "input_cpu", v.evidence
    assert v.signals["cpu_busy"] == pytest.approx(0.97, abs=0.01)
    assert v.signals["dataloader_workers"] == 2


def test_comm_wait_behind_a_slower_peer_is_waiting_on_peer_and_the_peer_computes() -> None:
    node = Node({"gpus": 2})

    def both() -> None:
        node.step(0, 1.0, comm=0.4, gpu=0, world_size=2)  # waits 0.4 s per step
        node.step(1, 1.0, comm=0.02, gpu=1, world_size=2)  # computes 0.4 s longer

    v = by_rank(node.run(20, both))
    assert v[0].kind == "waiting_on_peer" and "rank 1" in " ".join(v[0].evidence)
    assert v[1].kind == "compute"


def test_comm_dominated_across_nodes_with_flat_rdma_suspects_tcp() -> None:
    node = Node({"gpus": 1})
    node.fake_rdma.ports = (RdmaPort("rdmap0", "1", {"tx_bytes": 1e6, "rx_bytes": 1e6}),)
    v = by_rank(node.run(20, lambda: node.step(0, 1.0, comm=0.5, gpu=0, world_size=16)))[0]
    assert (v.kind, v.modifiers) == ("communication", ("tcp_suspected",))
    assert "nccl-check" in v.advice and v.bottleneck
    # bytes flowing over RDMA: communication, but not TCP
    node = Node({"gpus": 1})
    node.fake_rdma.ports = (RdmaPort("rdmap0", "1", {"tx_bytes": 0.0, "rx_bytes": 0.0}),)

    def flowing() -> None:
        node.step(0, 1.0, comm=0.5, gpu=0, world_size=16)
        moved = node.clock.t * 5e9
        node.fake_rdma.ports = (RdmaPort("rdmap0", "1", {"tx_bytes": moved, "rx_bytes": moved}),)

    v = by_rank(node.run(20, flowing))[0]
    assert (v.kind, v.modifiers) == ("communication", ())
    # single node: no TCP question at all
    node = Node({"gpus": 1})
    v = by_rank(node.run(20, lambda: node.step(0, 1.0, comm=0.5, gpu=0, world_size=1)))[0]
    assert (v.kind, v.modifiers) == ("communication", ())


def test_a_rank_that_stops_reads_idle_and_warmup_only_reads_unknown() -> None:
    # the GPUs go idle at t=15 but keep their memory: the process is still there
    node = Node({"gpus": 2, "timeline": [{"at": 15, "activity": "idle", "memory": 0.5}]},
                window=10)  # fmt: skip
    node.run(12, lambda: node.step(0, 1.0, gpu=0))
    diag = node.run(25)  # no more steps
    assert by_rank(diag)[0].kind == "idle"
    assert by_gpu(diag)[1].kind == "idle"
    assert diag.status == "healthy"
    node = Node({"gpus": 1})
    diag = node.run(10, lambda: node.step(0, 1.0, gpu=0, warmup=True))
    assert by_rank(diag)[0].kind == "unknown"
    assert "measured step" in " ".join(by_rank(diag)[0].evidence)


def test_a_healthy_compute_bound_rank_and_the_api_document() -> None:
    node = Node({"gpus": 1}, window=30)
    seen: set[str] = set()

    def healthy() -> None:
        node.step(0, 0.5, data=0.01, comm=0.03, other=0.01, gpu=0, world_size=1)

    for _ in range(30):  # five minutes of simulated time: the verdict never flips
        diag = node.run(10, healthy)
        seen |= {v.kind for v in diag.verdicts}
    assert seen == {"compute"} and diag.status == "healthy"
    assert diag.window_seconds == pytest.approx(30.0)
    doc = json.loads(json.dumps(diagnosis_document(node.sampler.latest)))  # type: ignore[union-attr]
    assert doc["status"] == "healthy" and doc["hostname"] == "n"
    (verdict,) = doc["verdicts"]
    assert verdict["kind"] == "compute" and verdict["subject"]["rank"] == 0
    assert verdict["subject"]["gpu"] == 0 and verdict["advice"]
    assert verdict["signals"]["sm_active"] > 0.9
    assert verdict["signals"]["step_seconds"] == pytest.approx(0.5)
    assert len(verdict["history"]["step_seconds"]) >= 25
    assert doc["thresholds"]["window"] == 30


def test_thresholds_are_validated_with_the_key_named() -> None:
    assert parse_thresholds({"window": 5, "input_share": 0.4}).window == 5.0
    assert parse_thresholds("{min_steps: 2}").min_steps == 2
    with pytest.raises(ValueError, match="unknown threshold 'inputshare'"):
        parse_thresholds({"inputshare": 0.4})
    with pytest.raises(ValueError, match="input_share: must be between 0 and 1"):
        parse_thresholds({"input_share": 2})
    with pytest.raises(ValueError, match="window"):
        parse_thresholds({"window": "soon"})


def test_cpu_saturation_is_judged_over_the_cpus_the_rank_may_use() -> None:
    """A rank pinned to 4 of 16 CPUs with all 4 pegged has no headroom, however idle the rest."""
    node = Node({"gpus": 1})
    node.host.reading = HostReading(
        16, (0.98,) * 4 + (0.05,) * 12,
        processes={PID: ProcessReading(PID, 0.5, 3, 2.8, cpus=(0, 1, 2, 3))},
    )  # fmt: skip
    v = by_rank(node.run(20, lambda: node.step(0, 0.5, data=0.3, gpu=0)))[0]
    assert v.kind == "input_cpu"
    assert v.signals["cpu_busy"] == pytest.approx(0.98)


def test_a_gpu_whose_activity_drops_to_zero_every_step_is_not_called_compute() -> None:
    # 4 s steps, busy 75% of each: the window's mean SM activity (~0.7) looks busy, but
    # the GPU idles once per step: it waits for something, and without a rank we can't
    # tell what
    node = Node({"gpus": 2, "timeline": [
        {"gpus": [1], "activity": "sawtooth", "period": 4.0, "duty": 0.75},
    ]})  # fmt: skip
    v = by_gpu(node.run(25))
    assert v[0].kind == "compute"
    assert v[1].kind == "unknown"
    assert "sawtooth" in " ".join(v[1].evidence)


# A launch-bound loop on an H200 (issue 13): the step body is all of the step, SM active
# ~2%, one CPU core pegged by the training process. Tiny kernels leave gaps: util ~40%.
LAUNCH_BOUND_GPU = {"gpus": 1, "workload": {"activity": "sawtooth", "period": 0.01,
                                            "duty": 0.4, "level": 0.05}}  # fmt: skip


def _host(main_cores: float, busy: float = 0.2) -> HostReading:
    return HostReading(8, (busy,) * 8, processes={PID: ProcessReading(PID, main_cores, 0, 0.0)})


def test_a_gpu_idling_between_launches_while_the_process_pegs_a_core_is_host_bound() -> None:
    node = Node(LAUNCH_BOUND_GPU)
    node.host.reading = _host(1.0)
    v = by_rank(node.run(20, lambda: node.step(0, 0.05, gpu=0)))[0]
    assert (v.kind, v.modifiers) == ("host_bound", ()) and v.bottleneck
    assert "CUDA graphs" in v.advice and ".item()" in v.advice and "torch.compile" in v.advice
    assert v.signals["sm_active"] is not None and v.signals["sm_active"] < 0.05
    assert any("1.00 CPU cores" in e for e in v.evidence)


@pytest.mark.parametrize(
    ("scenario", "main_cores", "phases", "kind"),
    [
        # the same idle GPU, but the step waits for data: the loader, not the launches
        (LAUNCH_BOUND_GPU, 1.0, {"data": 0.03}, "input"),
        # ... or for peers in all-reduce
        (LAUNCH_BOUND_GPU, 1.0, {"comm": 0.03}, "communication"),
        # a genuinely busy GPU with a busy host thread (CUDA spins on syncs): compute
        ({"gpus": 1}, 1.0, {}, "compute"),
        # kernels back to back, each on few SMs: small grids, the GPU is the limit
        ({"gpus": 1, "workload": {"level": 0.1}}, 1.0, {}, "compute"),
        # idle GPU, idle process: the body waits on neither; no guess
        (LAUNCH_BOUND_GPU, 0.05, {}, "unknown"),
    ],
)
def test_host_bound_is_told_apart_from_waiting_and_from_a_busy_gpu(
    scenario: dict[str, Any], main_cores: float, phases: dict[str, float], kind: str
) -> None:
    node = Node(scenario)
    node.host.reading = _host(main_cores)
    v = by_rank(node.run(20, lambda: node.step(0, 0.05, gpu=0, **phases)))[0]
    assert v.kind == kind, v.evidence


def test_a_rank_whose_process_is_not_visible_reads_host_bound_from_the_idle_gpu() -> None:
    node = Node(LAUNCH_BOUND_GPU)  # FakeHost: no process reading for the pid
    v = by_rank(node.run(20, lambda: node.step(0, 0.05, gpu=0)))[0]
    assert v.kind == "host_bound" and "not visible" in " ".join(v.evidence)


def test_dram_near_its_limit_with_idle_tensor_pipes_is_memory_bound_not_fp32() -> None:
    # the H200 figures of issue 13: SM active 0.99, DRAM active 0.81, tensor 0.007
    node = Node({"gpus": 2, "workload": {"kernels": "elementwise", "level": 0.99}})
    diag = node.run(20, lambda: node.step(0, 0.5, gpu=0))
    v = by_rank(diag)[0]
    assert (v.kind, v.modifiers) == ("compute", ("memory_bound",)) and not v.bottleneck
    assert "fuse" in v.advice and "torch.compile" in v.advice and "batch" in v.advice
    assert v.signals["dram_active"] == pytest.approx(0.84, abs=0.02)
    assert v.signals["fp32_active"] is not None and v.signals["fp32_active"] >= 0.3
    assert by_gpu(diag)[1].modifiers == ("memory_bound",)  # a GPU without a rank too
    # a bf16 GEMM reads DRAM 0.38: not memory-bound
    node = Node({"gpus": 1})
    assert by_rank(node.run(20, lambda: node.step(0, 0.5, gpu=0)))[0].modifiers == ()


def test_a_rank_whose_process_exits_reads_finished_then_drops_out() -> None:
    node = Node({"gpus": 1}, window=10)
    node.host.reading = _host(0.5)
    node.run(15, lambda: node.step(0, 1.0, gpu=0))
    node.host.reading = HostReading(8, (0.2,) * 8)  # the pid is gone
    diag = node.run(2)
    v = by_rank(diag)[0]
    assert v.kind == "finished" and "exited" in v.evidence[0] and not v.bottleneck
    assert diag.status == "healthy" and by_gpu(diag) == {}
    diag = node.run(60)  # finished_linger: 60 s
    assert by_rank(diag) == {}  # dropped out, long before the ingest's 300 s expiry
    assert by_gpu(diag)[0].kind == "compute"  # the GPU is judged on its own again
    node.host.reading = _host(0.5)  # a new run of the same rank: live again
    v = by_rank(node.run(10, lambda: node.step(0, 1.0, gpu=0)))[0]
    assert v.kind == "compute"


def test_without_a_visible_pid_a_silent_rank_on_an_idle_released_gpu_is_finished() -> None:
    node = Node({"gpus": 1, "timeline": [{"at": 12, "activity": "idle"}]}, window=10)
    node.run(12, lambda: node.step(0, 1.0, gpu=0))
    assert by_rank(node.run(5))[0].kind != "finished"  # silent for less than a window
    v = by_rank(node.run(8))[0]
    assert v.kind == "finished" and "memory released" in v.evidence[0]
