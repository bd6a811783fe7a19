"""Time lost outside the GPU's work: between steps (checkpoints, evaluation, logging)
and host-to-device copies in the step body, told apart from the verdicts they resemble."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.host.model import HostReading, ProcessReading
from tests.support.diagnosis import PID, Node, by_rank

# spans per SPANS: (checkpoint, evaluation, logging, other)
CHECKPOINT = (1.0, 0.0, 0.0, 0.0)
# a step body that launches tiny kernels (or copies): the SMs ~idle
IDLE_BODY = {"activity": "sawtooth", "period": 0.01, "duty": 0.4, "level": 0.05}


def _host(main_cores: float) -> HostReading:
    return HostReading(8, (0.2,) * 8, processes={PID: ProcessReading(PID, main_cores, 0, 0.0)})


def _saving_every_fifth_step(node: Node, named: bool, gpu: int | None = 0) -> None:
    """Each second: 5 steps of 50 ms, one of them after a 1 s blocking save."""
    for i in range(5):
        other = 1.0 if i == 0 else 0.0
        node.step(0, 0.05 + other, other=other, gpu=gpu,
                  spans=CHECKPOINT if named and i == 0 else None)  # fmt: skip


def test_a_blocking_checkpoint_named_with_phase_reads_between_steps_checkpoint() -> None:
    node = Node({"gpus": 1})
    v = by_rank(node.run(20, lambda: _saving_every_fifth_step(node, named=True)))[0]
    assert (v.kind, v.modifiers) == ("between_steps", ("checkpoint",)) and v.bottleneck
    assert "async_save" in v.advice and "less often" in v.advice
    assert v.signals["between_steps_share"] == pytest.approx(0.8, abs=0.01)
    assert any(e.startswith("80% of the step time") for e in v.evidence), v.evidence
    assert any(e.startswith("checkpoint: 80%") for e in v.evidence), v.evidence
    assert not any("no named span" in e for e in v.evidence)


# the GPU runs kernels in the step bodies only (20% of the time): idle between steps
BODY_ONLY = {"activity": "sawtooth", "period": 0.05, "duty": 0.2}


def test_an_unnamed_stall_between_steps_reads_between_steps_not_unknown() -> None:
    # the case of issue 26: it read "unknown, not enough data to tell"
    node = Node({"gpus": 1, "workload": BODY_ONLY})
    v = by_rank(node.run(20, lambda: _saving_every_fifth_step(node, named=False)))[0]
    assert (v.kind, v.modifiers) == ("between_steps", ()) and v.bottleneck
    assert "async_save" in v.advice and "reporter.timed()" in v.advice
    assert any("80% of the step time is in no named span" in e for e in v.evidence)
    assert v.signals["between_steps_gpu_busy"] == pytest.approx(0.0, abs=0.02)
    assert any(e.startswith("no sign of GPU work between steps") for e in v.evidence)


def test_unnamed_gpu_work_between_steps_reads_between_steps_with_evaluation_advice() -> None:
    """Issue 34: an evaluation pass every few steps, not named, with the GPU busy: the
    books put the time in `other` and the verdict read `compute` ("the GPU is the
    limit"). It is time between steps where the GPU works: likely evaluation."""
    node = Node({"gpus": 1})  # kernels run all the time: in the steps and between them
    v = by_rank(node.run(20, lambda: node.step(0, 1.0, other=0.48, gpu=0)))[0]
    assert (v.kind, v.modifiers) == ("between_steps", ("unnamed_gpu_work",)), v.evidence
    assert 'reporter.phase("evaluation")' in v.advice and "fewer batches" in v.advice
    assert "critical path" in v.advice and "GPU is the limit" not in v.advice
    assert v.signals["between_steps_gpu_busy"] == pytest.approx(1.0, abs=0.02)
    assert any("most likely evaluation" in e for e in v.evidence), v.evidence
    # the same time named with phase("evaluation"): the span says it, no guess
    node = Node({"gpus": 1})
    named = (0.0, 0.48, 0.0, 0.0)
    v = by_rank(node.run(20, lambda: node.step(0, 1.0, other=0.48, gpu=0, spans=named)))[0]
    assert (v.kind, v.modifiers) == ("between_steps", ("evaluation",)), v.evidence
    assert v.signals["between_steps_gpu_busy"] is None


def test_evaluation_and_logging_spans_name_each_modifier_largest_first() -> None:
    node = Node({"gpus": 1})
    spans = (0.0, 0.6, 0.3, 0.1)
    v = by_rank(node.run(20, lambda: node.step(0, 1.1, other=1.0, gpu=0, spans=spans)))[0]
    assert (v.kind, v.modifiers) == ("between_steps", ("evaluation", "logging"))
    assert v.advice.startswith("Evaluation stops training")
    assert any(e.startswith("named 'other': 9%") for e in v.evidence), v.evidence


@pytest.mark.parametrize(
    ("phases", "kind"),
    [
        # a starved loader with less time between steps: input, the other loss noted
        ({"data": 0.5, "other": 0.4}, "input"),
        # exposed all-reduce the larger loss: communication, the other noted
        ({"comm": 0.5, "other": 0.35}, "communication"),
        # the issue-34 case: the body computes longer than the time between steps, yet
        # 40% of the wall time is lost there: between_steps, never "the GPU is the limit"
        ({"other": 0.4}, "between_steps"),
        # more time between steps than waiting for data: the larger loss is the verdict
        ({"data": 0.3, "other": 0.45}, "between_steps"),
        # a little time between steps is no verdict of its own
        ({"other": 0.2}, "compute"),
    ],
)
def test_the_largest_lost_share_is_the_verdict_and_the_others_are_noted(
    phases: dict[str, float], kind: str
) -> None:
    node = Node({"gpus": 1})
    node.host.reading = _host(0.5)
    v = by_rank(node.run(20, lambda: node.step(0, 1.0, gpu=0, **phases)))[0]
    assert v.kind == kind, v.evidence
    assert "The GPU is the limit" not in v.advice or phases["other"] < 0.3
    also = [e for e in v.evidence if e.startswith("also ")]
    if kind in ("input", "communication"):
        assert also == [f"also {round(100 * phases['other'])}% of the step between steps"]
    elif "data" in phases:
        assert also == ["also 30% of the step waiting for data"]
    else:
        assert also == []


@pytest.mark.parametrize(
    ("workload", "main_cores", "kind"),
    [
        # the body copies from pageable memory: PCIe receive ~4.4 GB/s, SMs idle, and the
        # main thread busy in the copy's memcpy: transfer_bound, not host_bound
        ({**IDLE_BODY, "wait": "copy"}, 1.0, "transfer_bound"),
        # a synchronous copy the process sleeps through: transfer_bound, not unknown
        ({**IDLE_BODY, "wait": "copy"}, 0.05, "transfer_bound"),
        # launches alone: PCIe receive ~0.3 GB/s: host_bound, CUDA graphs advice
        (IDLE_BODY, 1.0, "host_bound"),
    ],
)
def test_host_to_device_copies_are_told_apart_from_launch_bound_steps(
    workload: dict[str, Any], main_cores: float, kind: str
) -> None:
    node = Node({"gpus": 1, "workload": workload})
    node.host.reading = _host(main_cores)
    v = by_rank(node.run(20, lambda: node.step(0, 0.05, gpu=0)))[0]
    assert v.kind == kind and v.bottleneck, v.evidence
    rx = v.signals["pcie_rx_bytes_per_second"]
    assert rx is not None
    if kind == "transfer_bound":
        assert rx == pytest.approx(0.6 * 6.9e9 + 0.4 * 0.8e9, rel=0.05)  # gaps + kernels
        assert "pin_memory=True" in v.advice and "non_blocking=True" in v.advice
        assert "CUDA graphs" not in v.advice
        assert any(f"PCIe receive runs at {rx / 1e9:.1f} GB/s" in e for e in v.evidence)
    else:
        assert rx < 1e9 and "CUDA graphs" in v.advice


def test_a_copy_beside_a_busy_gpu_is_compute() -> None:
    # PCIe busy while the SMs compute: the copy overlaps, nothing is lost
    node = Node({"gpus": 1})
    node.host.reading = _host(1.0)
    v = by_rank(node.run(20, lambda: node.step(0, 0.5, gpu=0)))[0]
    assert v.kind == "compute"


def test_one_long_save_in_the_window_is_not_a_habit_and_reads_unknown() -> None:
    # a healthy rank (0.5 s steps) that saved for 20 s once: the window after it holds
    # one gap, which reads unknown (as before), not a between_steps bottleneck
    node = Node({"gpus": 1}, window=30)
    node.host.reading = _host(0.5)
    node.run(40, lambda: node.step(0, 0.5, gpu=0))
    node.run(20)  # the save: no step for 20 s
    node.step(0, 20.5, other=20.0, gpu=0, spans=(20.0, 0.0, 0.0, 0.0))
    v = by_rank(node.run(2, lambda: node.step(0, 0.5, gpu=0)))[0]
    assert v.kind == "unknown" and not v.bottleneck, v.evidence
    assert any("all in one gap of the window" in e for e in v.evidence)
    diag = node.run(30, lambda: node.step(0, 0.5, gpu=0))  # the gap leaves the window
    assert by_rank(diag)[0].kind == "compute"
