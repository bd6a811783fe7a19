"""Peak dense FLOP/s per GPU, keyed by the exact NVML model name and precision.

MFU divides a rank's achieved model FLOP/s by this figure, so a wrong entry is a
wrong MFU on every dashboard. The rules, each one a trap peer projects fell into:

- **Exact NVML name** (``nvmlDeviceGetName``), no substring or prefix matching:
  ``"NVIDIA L40S"`` must never read as ``"NVIDIA L4"``.
- **Unknown means unknown**: a model not in the table has no peak and no MFU (the
  rank's info series says ``mfu_status="unknown_model"``), never an A100 default.
- **Dense**, never the 2:4-sparsity figure datasheets print in large type (half of it).
- **Per GPU**: the H100 NVL's first datasheet and GB200 figures are for two GPUs
  (a bridged NVL pair, one Grace-Blackwell superchip); they are divided by two here.
- ``fp32`` is the non-tensor FP32 rate; ``tf32``/``bf16``/``fp16``/``fp8`` are tensor
  core rates (FP32 accumulate for fp16 where the datasheet distinguishes).
  A precision the GPU lacks (bf16 on a T4, fp8 before Hopper/Ada) is absent.

Users extend or correct it with the ``peak_flops`` setting
(``{"NVIDIA Foo": {"bf16": 1.2e15}}``), merged per model and precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from stepscope.shared.datagram import PRECISIONS

T = 1e12

_DATASHEET: dict[str, dict[str, float]] = {
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4): FP32 19.5 TF,
    # TF32 156 TF, BF16/FP16 312 TF dense (312/624 with sparsity). The PCIe cards have the
    # same peak figures (lower sustained clocks under their 250-300 W limit). No FP8.
    "NVIDIA A100-SXM4-40GB": {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    "NVIDIA A100-SXM4-80GB": {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    "NVIDIA A100-PCIE-40GB": {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    "NVIDIA A100 80GB PCIe": {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    # NVIDIA A10G (AWS G5): not on an NVIDIA datasheet; AWS/NVIDIA figures as tabulated
    # in "NVIDIA A10 vs A10G" (baseten.co): FP32 35 TF, TF32 35 TF, BF16/FP16 70 TF
    # dense. Not the A10's 125 TF: the A10G's tensor cores run FP32 accumulate at
    # half rate. (The A10, "NVIDIA A10", is a different entry.)
    "NVIDIA A10G": {"fp32": 35 * T, "tf32": 35 * T, "bf16": 70 * T, "fp16": 70 * T},
    # NVIDIA A10 datasheet: FP32 31.2 TF, TF32 62.5 TF, BF16/FP16 125 TF dense.
    "NVIDIA A10": {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T},
    # NVIDIA L4 datasheet: FP32 30.3 TF; TF32 120, BF16/FP16 242, FP8 485 TF are with
    # sparsity: dense 60 / 121 / 242.5.
    "NVIDIA L4": {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T,
                  "fp8": 242.5 * T},
    # NVIDIA L40S datasheet: FP32 91.6 TF, TF32 183 TF, BF16/FP16 362.05 TF, FP8 733 TF
    # dense (366 / 733 / 1,466 with sparsity).
    "NVIDIA L40S": {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T,
                    "fp8": 733 * T},
    # NVIDIA T4 datasheet: FP32 8.1 TF, mixed precision FP16/FP32 65 TF. No BF16, TF32
    # or FP8 (Turing).
    "Tesla T4": {"fp32": 8.1 * T, "fp16": 65 * T},
    # NVIDIA H100 datasheet, SXM5 column: FP32 67 TF; TF32 989, BF16/FP16 1,979, FP8
    # 3,958 TF with sparsity: dense 494.7 / 989.4 / 1,978.9.
    "NVIDIA H100 80GB HBM3": {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T,
                              "fp16": 989.4 * T, "fp8": 1978.9 * T},
    # NVIDIA H100 datasheet, PCIe column: FP32 51 TF; TF32 756, BF16/FP16 1,513, FP8
    # 3,026 TF with sparsity: dense 378 / 756.5 / 1,513.
    "NVIDIA H100 PCIe": {"fp32": 51 * T, "tf32": 378 * T, "bf16": 756.5 * T, "fp16": 756.5 * T,
                         "fp8": 1513 * T},
    # NVIDIA H100 NVL (one 94 GB card): H100 datasheet, NVL column (2023 revision, per
    # GPU): FP32 60 TF; TF32 835, BF16/FP16 1,671, FP8 3,341 TF with sparsity: dense
    # 417.5 / 835.5 / 1,670.5. The launch datasheet printed 2x these (134 TF FP32,
    # 3,958 TF BF16) for a bridged *pair*; using that per GPU halves every MFU.
    "NVIDIA H100 NVL": {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T,
                        "fp16": 835.5 * T, "fp8": 1670.5 * T},
    # NVIDIA H200 datasheet, SXM column: same tensor rates as H100 SXM: FP32 67 TF; TF32
    # 989, BF16/FP16 1,979, FP8 3,958 TF with sparsity: dense 494.7 / 989.4 / 1,978.9.
    "NVIDIA H200": {"fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T,
                    "fp8": 1978.9 * T},
    # NVIDIA H200 datasheet, NVL column: FP32 60 TF; TF32 835, BF16/FP16 1,671, FP8 3,341 TF
    # with sparsity: dense 417.5 / 835.5 / 1,670.5.
    "NVIDIA H200 NVL": {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T,
                        "fp16": 835.5 * T, "fp8": 1670.5 * T},
    # NVIDIA HGX B200 datasheet (8 GPUs): FP32 600 TF; TF32 18, BF16/FP16 36, FP8 72 PF
    # with sparsity. Per GPU dense: FP32 75 TF, TF32 1.125, BF16/FP16 2.25, FP8 4.5 PF.
    "NVIDIA B200": {"fp32": 75 * T, "tf32": 1125 * T, "bf16": 2250 * T, "fp16": 2250 * T,
                    "fp8": 4500 * T},
    # NVIDIA GB200 NVL72 datasheet, per GB200 superchip (1 Grace + 2 Blackwell GPUs):
    # FP32 180 TF; TF32 5, BF16/FP16 10, FP8 20 PF with sparsity. Per GPU dense: FP32
    # 90 TF, TF32 1.25, BF16/FP16 2.5, FP8 5 PF.
    "NVIDIA GB200": {"fp32": 90 * T, "tf32": 1250 * T, "bf16": 2500 * T, "fp16": 2500 * T,
                     "fp8": 5000 * T},
}


class PeakTable:
    """An immutable map model name → precision → peak dense FLOP/s."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[str, Mapping[str, float]]) -> None:
        self._entries: Mapping[str, Mapping[str, float]] = MappingProxyType(
            {model: MappingProxyType(dict(figures)) for model, figures in entries.items()}
        )

    def lookup(self, model_name: str, precision: str) -> float | None:
        """The peak for this exact model and precision, or None if not known."""
        figures = self._entries.get(model_name)
        if figures is None:
            return None
        return figures.get(precision)

    def figures(self, model_name: str) -> Mapping[str, float] | None:
        """Every known precision's peak for this exact model, or None for an unknown model."""
        return self._entries.get(model_name)

    def with_overrides(self, extra: Mapping[str, Mapping[str, float]]) -> PeakTable:
        """A table with ``extra`` merged in, per model and precision (extra wins)."""
        merged = {model: dict(figures) for model, figures in self._entries.items()}
        for model, figures in extra.items():
            merged.setdefault(model, {}).update(figures)
        return PeakTable(merged)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PeakTable):
            return NotImplemented
        return {m: dict(f) for m, f in self._entries.items()} == {
            m: dict(f) for m, f in other._entries.items()
        }

    def __hash__(self) -> int:
        return hash(tuple(sorted((m, tuple(sorted(f.items()))) for m, f in self._entries.items())))

    def __repr__(self) -> str:
        return f"PeakTable({len(self._entries)} models)"


DATASHEET_PEAKS = PeakTable(_DATASHEET)
assert all(p in PRECISIONS for f in _DATASHEET.values() for p in f)
