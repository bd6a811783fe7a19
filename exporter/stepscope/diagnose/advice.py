"""One line of advice per verdict kind and modifier, following the diagnosis workflow
in docs/field-guide.md. A ``gpu_fault`` verdict's line comes from the fault itself
(:mod:`stepscope.diagnose.faults`: which XID, what NVIDIA says to do); the lines here
are its generic fallback."""

from __future__ import annotations

KIND_ADVICE: dict[str, str] = {
    "gpu_fault": "Hardware fault: drain this GPU's work and reset or replace the GPU before "
    "it runs jobs again (see the evidence for which fault).",
    "compute": "The GPU is the limit, which is where training should be; to go faster, "
    "raise the batch, use faster kernels or lower precision.",
    "host_bound": "The GPU idles between kernel launches while the training process keeps "
    "a CPU core busy: the host is the limit. Capture the step in CUDA graphs "
    "(torch.compile mode='reduce-overhead'), fuse with torch.compile, raise the batch, and "
    "drop host syncs in the step (.item(), .cpu(), printing a tensor) or do them every N "
    "steps.",
    "transfer_bound": "The step body waits for host-to-device copies while the SMs idle: "
    "load batches into pinned memory (DataLoader(pin_memory=True)), copy with "
    ".to(device, non_blocking=True), prefetch the next batch to the GPU on a side stream "
    "while this one computes, or keep data that every step reads resident on the GPU.",
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
    "between_steps": "Most of the wall time is spent between steps, where the GPU idles "
    "(checkpoints, evaluation, logging, or an untimed loader): checkpoint asynchronously "
    "(torch.distributed.checkpoint.async_save) or sharded, and less often; evaluate less "
    "often or off the training ranks; log every N steps; wrap the loader in "
    "reporter.timed() and name the rest with reporter.phase() to see which it is.",
    "idle": "Nothing runs here: no training steps and no GPU activity.",
    "finished": "The rank's training process has ended; its verdict drops out shortly.",
    "unknown": "Not enough data to tell; see the evidence.",
}

MODIFIER_ADVICE: dict[str, str] = {
    "fp32_no_tensor": "FP32 pipe busy, tensor cores idle: use mixed precision "
    "(torch.autocast with bf16/fp16) or TF32 to move the work to the tensor cores.",
    "low_occupancy": "SM occupancy is low, so busy is not full: a larger batch or fused "
    "kernels keep more warps resident.",
    "memory_bound": "Memory bandwidth is the limit, not the math: fuse element-wise and "
    "normalisation kernels (torch.compile, fused optimizers and LayerNorm/RMSNorm, "
    "FlashAttention), and materialise fewer intermediates (in-place ops, activation "
    "checkpointing of cheap ops); a larger batch or lower precision will not help much.",
    "thermal_throttle": "Clocks lowered for temperature: this GPU is slower than its peers "
    "and every all-reduce waits for it; check cooling or drain the node.",
    "power_cap": "Clocks held at the power limit: expected near full load on H100/H200; "
    "check the power limit if it persists at modest load.",
    "tcp_suspected": "The job spans nodes but RDMA counters are flat: NCCL has probably "
    "fallen back to TCP sockets; check its log with `stepscope nccl-check` (expect "
    "'NET/OFI Selected provider is efa').",
    "checkpoint": "Checkpoint saving blocks training: save asynchronously "
    "(torch.distributed.checkpoint.async_save, or Lightning's AsyncCheckpointIO), shard "
    "the save across ranks (torch.distributed.checkpoint) instead of gathering on one, "
    "and checkpoint less often.",
    "evaluation": "Evaluation stops training: evaluate less often or on fewer batches, "
    "or off the critical path (a separate job or process on a saved checkpoint).",
    "logging": "Logging stops training: log every N steps, and avoid host syncs "
    "(.item(), .cpu()) and blocking uploads in the logger.",
    "gpu_down": "The GPU stopped answering: drain the node, reset the GPU or reboot; "
    "replace it if it falls off again.",
    "xid_critical": "A critical XID: drain the GPU and reset it as NVIDIA's XID catalogue "
    "says for that code.",
    "row_remap_failed": "Row remapping failed: the GPU has no spare memory rows left; "
    "drain it and replace it (RMA).",
    "ecc_uncorrectable": "Uncorrectable ECC error: drain and reset the GPU; the job on it "
    "may have computed on corrupt memory.",
    "row_remap_pending": "A memory row remap waits for a GPU reset: drain and reset the GPU.",
    "pcie_replay_storm": "PCIe link replays above DCGM's limit: reseat or replace the "
    "riser/cable, check the slot; drain the node if it persists.",
}

# Modifiers whose advice replaces the kind's: the kind's generic line would mislead
# (a memory-bound GPU is not helped by "raise the batch, lower precision").
_OVERRIDING = ("memory_bound", "fp32_no_tensor", "thermal_throttle", "tcp_suspected")


def advice_for(kind: str, modifiers: tuple[str, ...]) -> str:
    """The verdict's one line: an overriding modifier's advice wins over the kind's."""
    for modifier in _OVERRIDING:
        if modifier in modifiers:
            return MODIFIER_ADVICE[modifier]
    if modifiers and kind != "gpu_fault":
        return KIND_ADVICE[kind] + " " + MODIFIER_ADVICE[modifiers[0]]
    return KIND_ADVICE[kind]
