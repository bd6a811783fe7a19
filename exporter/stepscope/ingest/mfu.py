"""MFU of one rank: achieved model FLOP/s ÷ its GPU's peak at its precision.

A pure function over the rank's view and its GPU (joined by UUID). When there is no
honest figure, there is no MFU, and the status says why; the statuses are the values
of ``mfu_status`` on ``stepscope_training_rank_info``:

==================== ============================================================
``ok``               MFU exported
``above_peak``       MFU exported, but it is > 1: the FLOPs the job reports or the
                     peak is wrong (a wrong ``flops_per_token``, a missing peak
                     override for a de-rated SKU). Not clamped: a clamp would hide it.
``warmup``           no measured (non-warm-up) step yet
``no_flops``         the rank reports no FLOPs > 0 (no ``flops_per_token``/``flops_per_step``)
``no_gpu``           the rank reported no GPU UUID (CPU training, or no CUDA)
``unknown_gpu``      the rank's UUID is not a GPU of this node
``unknown_model``    the GPU's model is not in the peak table (extend ``peak_flops``)
``unknown_precision`` the model has no peak for the rank's precision (bf16 on a T4)
==================== ============================================================
"""

from __future__ import annotations

from typing import NamedTuple

from stepscope.core.labels import GpuIdentity
from stepscope.ingest.aggregate import RankView
from stepscope.ingest.peak_flops import PeakTable

MFU_STATUSES: tuple[str, ...] = (
    "ok",
    "above_peak",
    "warmup",
    "no_flops",
    "no_gpu",
    "unknown_gpu",
    "unknown_model",
    "unknown_precision",
)


class Mfu(NamedTuple):
    """A rank's MFU (None when not computable) and its status from :data:`MFU_STATUSES`."""

    value: float | None
    status: str


def rank_mfu(rank: RankView, gpu: GpuIdentity | None, peaks: PeakTable) -> Mfu:
    """The rank's MFU over the aggregator's window, or why there is none."""
    if gpu is None:
        return Mfu(None, "unknown_gpu" if rank.uuid else "no_gpu")
    figures = peaks.figures(gpu.model_name)
    if figures is None:
        return Mfu(None, "unknown_model")
    peak = figures.get(rank.precision)
    if peak is None or peak <= 0:
        return Mfu(None, "unknown_precision")
    achieved = rank.achieved_flops_per_second
    if achieved is None:
        return Mfu(None, "warmup")
    if not rank.has_flops:
        return Mfu(None, "no_flops")
    value = achieved / peak
    return Mfu(value, "above_peak" if value > 1.0 else "ok")
