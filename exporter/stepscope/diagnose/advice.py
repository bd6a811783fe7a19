"""One line of advice per verdict kind and modifier, following the diagnosis workflow
in docs/field-guide.md."""

from __future__ import annotations

KIND_ADVICE: dict[str, str] = {
    "compute": "The GPU is the limit, which is where training should be; to go faster, "
    "raise the batch, use faster kernels or lower precision.",
    "input_cpu": "The DataLoader workers have the CPUs pegged, so more workers will not "
    "help: lighten the augmentation or move decoding/augmentation to the GPU (e.g. DALI).",
    "input_io": "The loader waits on storage: use faster storage (FSx for Lustre for small "
    "random files, S3 for large sequential reads), pack small files (WebDataset), warm "
    "the cache.",
    "input": "The loader cannot keep up and the CPUs have headroom: raise num_workers "
    "(and prefetch_factor, pin_memory).",
    "communication": "Exposed all-reduce dominates the step: check NCCL uses the fast "
    "transport (EFA/IB, not TCP), raise the per-GPU batch, tune DDP bucket_cap_mb and "
    "gradient_as_bucket_view=True.",
    "waiting_on_peer": "This rank waits in all-reduce for a slower peer: look at that "
    "rank's GPU (thermal, clocks) and host, not at this one.",
    "idle": "Nothing runs here: no training steps and no GPU activity.",
    "unknown": "Not enough data to tell; see the evidence.",
}

MODIFIER_ADVICE: dict[str, str] = {
    "fp32_no_tensor": "FP32 pipe busy, tensor cores idle: use mixed precision "
    "(torch.autocast with bf16/fp16) or TF32 to move the work to the tensor cores.",
    "low_occupancy": "SM occupancy is low, so busy is not full: a larger batch or fused "
    "kernels keep more warps resident.",
    "thermal_throttle": "Clocks lowered for temperature: this GPU is slower than its peers "
    "and every all-reduce waits for it; check cooling or drain the node.",
    "power_cap": "Clocks held at the power limit: expected near full load on H100/H200; "
    "check the power limit if it persists at modest load.",
    "tcp_suspected": "The job spans nodes but RDMA counters are flat: NCCL has probably "
    "fallen back to TCP sockets; check its log with `stepscope nccl-check` (expect "
    "'NET/OFI Selected provider is efa').",
}


def advice_for(kind: str, modifiers: tuple[str, ...]) -> str:
    """The verdict's one line: the first modifier's advice wins over the kind's."""
    for modifier in modifiers:
        if modifier in ("fp32_no_tensor", "thermal_throttle", "tcp_suspected"):
            return MODIFIER_ADVICE[modifier]
    if modifiers:
        return KIND_ADVICE[kind] + " " + MODIFIER_ADVICE[modifiers[0]]
    return KIND_ADVICE[kind]
