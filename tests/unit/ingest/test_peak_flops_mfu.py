"""Peak FLOPs table and MFU: the traps peer projects fell into, and the served families."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stepscope.core.exposition import render
from stepscope.core.labels import LabelSchema, LabelSchemaBuilder
from stepscope.gpu.model import GpuInfo
from stepscope.ingest.aggregate import JobView, RankView, TrainingSettings, TrainingView
from stepscope.ingest.metrics import training_families
from stepscope.ingest.mfu import MFU_STATUSES, rank_mfu
from stepscope.ingest.peak_flops import DATASHEET_PEAKS, PeakTable
from tests.support import parse_samples

peak_flops_for = DATASHEET_PEAKS.lookup

REQUIRED_MODELS = (
    "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe", "NVIDIA A10G", "NVIDIA L4", "NVIDIA L40S", "Tesla T4",
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
    "NVIDIA B200", "NVIDIA GB200",
)


def test_the_reference_figure_h100_sxm_and_h200_dense_bf16_is_989_4_tflops() -> None:
    assert peak_flops_for("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peak_flops_for("NVIDIA H200", "bf16") == pytest.approx(989.4e12)
    assert peak_flops_for("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(312e12)


@pytest.mark.parametrize("model", REQUIRED_MODELS)
def test_every_required_model_has_a_plausible_dense_figure(model: str) -> None:
    figures = DATASHEET_PEAKS.figures(model)
    assert figures is not None
    half = figures.get("bf16") or figures["fp16"]
    # dense tensor throughput sits between 50 TFLOP/s and 3 PFLOP/s per GPU today;
    # a sparsity figure or a two-GPU figure for GB200 would exceed it
    assert 50e12 <= half <= 3e15
    assert figures["fp32"] < half
    if "fp8" in figures:
        assert figures["fp8"] == pytest.approx(2 * half, rel=0.02)


def test_unknown_gpus_are_unknown_not_a100() -> None:
    for name in ("NVIDIA A800-SXM4-80GB", "NVIDIA A100", "NVIDIA H20", "NVIDIA GeForce RTX 4090",
                 "", "nvidia h100 80gb hbm3"):
        assert DATASHEET_PEAKS.figures(name) is None
        assert peak_flops_for(name, "bf16") is None


def test_l40s_is_not_matched_as_l4() -> None:
    l4 = peak_flops_for("NVIDIA L4", "bf16")
    l40s = peak_flops_for("NVIDIA L40S", "bf16")
    assert l4 == pytest.approx(121e12) and l40s == pytest.approx(362.05e12)
    assert peak_flops_for("NVIDIA L40", "bf16") is None  # no prefix or substring matching
    assert peak_flops_for("NVIDIA L4S", "bf16") is None


def test_nvl_and_superchip_figures_are_per_gpu_not_per_pair() -> None:
    nvl = peak_flops_for("NVIDIA H100 NVL", "bf16")
    sxm = peak_flops_for("NVIDIA H100 80GB HBM3", "bf16")
    assert nvl is not None and sxm is not None
    assert nvl == pytest.approx(835.5e12) and nvl < sxm  # the pair figure was 3,958 sparse
    gb200 = peak_flops_for("NVIDIA GB200", "bf16")
    assert gb200 == pytest.approx(2.5e15)  # 10 PF sparse per two-GPU superchip


def test_precisions_a_gpu_lacks_are_absent() -> None:
    assert peak_flops_for("Tesla T4", "bf16") is None
    assert peak_flops_for("Tesla T4", "fp16") == pytest.approx(65e12)
    assert peak_flops_for("NVIDIA A100-SXM4-80GB", "fp8") is None


def test_config_overrides_extend_and_correct_per_precision() -> None:
    table = DATASHEET_PEAKS.with_overrides(
        {"NVIDIA Foo": {"bf16": 1.2e15}, "NVIDIA H100 80GB HBM3": {"bf16": 900e12}})
    assert table.lookup("NVIDIA Foo", "bf16") == 1.2e15
    assert table.lookup("NVIDIA H100 80GB HBM3", "bf16") == 900e12
    assert table.lookup("NVIDIA H100 80GB HBM3", "fp8") == pytest.approx(1978.9e12)
    assert DATASHEET_PEAKS.figures("NVIDIA Foo") is None  # the datasheet table is unchanged
    assert table == DATASHEET_PEAKS.with_overrides({"NVIDIA Foo": {"bf16": 1.2e15},
                                                    "NVIDIA H100 80GB HBM3": {"bf16": 900e12}})


# --- MFU per rank ---

H100 = GpuInfo(0, "GPU-h100", "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
MYSTERY = GpuInfo(1, "GPU-mystery", "NVIDIA Mystery 9000", "00000000:2a:00.0")


def rank(**changes: object) -> RankView:
    base = RankView(
        job="llm", rank=0, local_rank=0, uuid="GPU-h100", pid=1, world_size=2,
        precision="bf16", steps=10, warmup_steps=3, step_seconds_sum=7.0,
        bucket_counts=(0,) * 8 + (7,) + (0,) * 8, phase_seconds=(1.0, 4.0, 1.5, 0.5),
        tokens=7000, flops=7 * 494.7e12, has_flops=True, last_step_timestamp=1e9,
        sdk_dropped=0, achieved_flops_per_second=494.7e12,
    )
    return base._replace(**changes)


def test_mfu_is_achieved_over_peak() -> None:
    result = rank_mfu(rank(), H100.identity, DATASHEET_PEAKS)
    assert result.status == "ok" and result.value == pytest.approx(0.5)
    fp8 = rank_mfu(rank(precision="fp8"), H100.identity, DATASHEET_PEAKS)
    assert fp8.value == pytest.approx(0.25, rel=1e-3)


def test_mfu_above_one_is_exported_unclamped_and_flagged() -> None:
    result = rank_mfu(
        rank(achieved_flops_per_second=1.5 * 989.4e12), H100.identity, DATASHEET_PEAKS
    )
    assert result.value == pytest.approx(1.5) and result.status == "above_peak"


@pytest.mark.parametrize(
    ("view", "gpu", "status"),
    [
        (rank(uuid=None), None, "no_gpu"),
        (rank(uuid="GPU-elsewhere"), None, "unknown_gpu"),
        (rank(uuid="GPU-mystery"), MYSTERY, "unknown_model"),
        (rank(precision="fp8"), replace(H100, name="NVIDIA A100-SXM4-80GB"),
         "unknown_precision"),
        (rank(achieved_flops_per_second=None), H100, "warmup"),
        (rank(has_flops=False, achieved_flops_per_second=0.0), H100, "no_flops"),
    ],
)
def test_no_mfu_without_an_honest_figure_and_the_status_says_why(
    view: RankView, gpu: GpuInfo | None, status: str
) -> None:
    result = rank_mfu(view, gpu.identity if gpu else None, DATASHEET_PEAKS)
    assert result.value is None and result.status == status and status in MFU_STATUSES


# --- the served families ---

Part = tuple[TrainingView, LabelSchema]


def snapshot(ranks: tuple[RankView, ...], peaks: PeakTable = DATASHEET_PEAKS) -> Part:
    jobs = tuple(JobView(r.job, r.step_seconds_sum, r.bucket_counts) for r in ranks)
    view = TrainingView(ingest_up=True, accepted=10, rejected={"not_json": 2}, ranks=ranks,
                        settings=TrainingSettings(peak_flops=peaks), jobs=jobs)
    labels = LabelSchemaBuilder().build(
        "node-1", (H100.identity, MYSTERY.identity), [r.identity for r in ranks]
    )
    return view, labels


def served(snap: Part) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_samples(render(training_families(*snap)).decode())


def test_ranks_carry_their_gpus_labels_joined_by_uuid() -> None:
    fams = served(snapshot((rank(), rank(rank=1, local_rank=1, uuid="GPU-mystery"),
                            rank(rank=2, local_rank=2, uuid=None))))
    by_rank = {lbl["rank"]: lbl for lbl, _ in fams["stepscope_steps_total"]}
    assert by_rank["0"] == {"training_job": "llm", "rank": "0", "local_rank": "0", "gpu": "0",
                            "UUID": "GPU-h100", "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": "node-1"}
    assert by_rank["1"]["gpu"] == "1" and by_rank["1"]["modelName"] == "NVIDIA Mystery 9000"
    assert "gpu" not in by_rank["2"] and "UUID" not in by_rank["2"]  # absent, never empty
    assert by_rank["2"]["Hostname"] == "node-1"
    # MFU only where the GPU model is known; the info series says why not
    assert [lbl["rank"] for lbl, _ in fams["stepscope_mfu_ratio"]] == ["0"]
    status = {lbl["rank"]: lbl["mfu_status"] for lbl, _ in fams["stepscope_training_rank_info"]}
    assert status == {"0": "ok", "1": "unknown_model", "2": "no_gpu"}


def test_peak_flops_are_served_at_the_ranks_precisions_for_known_models_only() -> None:
    ranks = (rank(), rank(rank=1, uuid="GPU-mystery"), rank(rank=2, uuid=None))
    fams = served(snapshot(ranks))
    peaks = {(lbl["UUID"], lbl["precision"]): v for lbl, v in fams["stepscope_gpu_peak_flops"]}
    # the MFU denominator of the rank on the H100, not the datasheet's every precision
    assert peaks == {("GPU-h100", "bf16"): pytest.approx(989.4e12)}
    fp8 = served(snapshot((*ranks, rank(rank=3, precision="fp8"))))
    assert sorted(lbl["precision"] for lbl, _ in fp8["stepscope_gpu_peak_flops"]) == [
        "bf16", "fp8"]
    extended = served(snapshot(ranks, DATASHEET_PEAKS.with_overrides(
        {"NVIDIA Mystery 9000": {"bf16": 2e15}})))
    assert ({lbl["UUID"] for lbl, _ in extended["stepscope_gpu_peak_flops"]}
            == {"GPU-h100", "GPU-mystery"})
    assert "stepscope_gpu_peak_flops" not in served(snapshot(()))  # no rank, no figure


def test_step_time_per_rank_is_sum_and_count_and_per_job_a_cumulative_histogram() -> None:
    fams = served(snapshot((rank(),)))
    assert fams["stepscope_step_duration_seconds_count"][0][1] == 7
    assert fams["stepscope_step_duration_seconds_sum"][0][1] == 7.0
    assert "stepscope_step_duration_seconds_bucket" not in fams
    job = fams["stepscope_job_step_duration_seconds_bucket"]
    assert {frozenset(lbl.items() - {("le", lbl["le"])}) for lbl, _ in job} == {
        frozenset({("training_job", "llm"), ("Hostname", "node-1")})}  # job and node only
    buckets = [(lbl["le"], v) for lbl, v in job]
    assert buckets[0] == ("0.01", 0) and buckets[-1] == ("+Inf", 7)
    values = [v for _, v in buckets]
    assert values == sorted(values)
    assert fams["stepscope_job_step_duration_seconds_count"] == [
        ({"training_job": "llm", "Hostname": "node-1"}, 7)]
    assert fams["stepscope_job_step_duration_seconds_sum"][0][1] == 7.0
    phases = {lbl["phase"]: v for lbl, v in fams["stepscope_step_phase_seconds_total"]}
    assert phases == {"data_wait": 1.0, "compute": 4.0, "comm": 1.5, "other": 0.5}


def test_ingest_health_families() -> None:
    fams = served(snapshot((rank(),)))
    assert fams["stepscope_ingest_up"][0][1] == 1
    assert fams["stepscope_ingest_datagrams_total"][0][1] == 10
    assert fams["stepscope_ingest_rejected_total"] == [({"reason": "not_json"}, 2)]
    assert fams["stepscope_training_ranks"][0][1] == 1
