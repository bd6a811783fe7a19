"""One line of advice per verdict kind and modifier, following the diagnosis workflow
in docs/field-guide.md. A ``gpu_fault`` verdict's line comes from the fault itself
(:mod:`stepscope.diagnose.faults`: which XID, what NVIDIA says to do); the lines here
are its generic fallback.

Every claim a line makes about its subject ("the CPUs are pegged by the job", "the GPU is
the limit") is a :class:`Claim`: a predicate over the verdict's signals
(:data:`KIND_CLAIMS`, :data:`MODIFIER_CLAIMS`), so a line never says what its evidence
denies (tests/unit/diagnose/test_advice_claims.py walks every verdict)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from stepscope.diagnose.losses import BETWEEN, COMM, DATA, explains, lost_shares
from stepscope.diagnose.thresholds import Thresholds

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
    "input_cpu": "The job itself has the CPUs pegged (its DataLoader workers and training "
    "processes), so more workers will not help: lighten the augmentation or move "
    "decoding/augmentation to the GPU (e.g. DALI).",
    "input_io": "The loader waits on storage: use faster storage (FSx for Lustre for small "
    "random files, S3 for large sequential reads), pack small files (WebDataset), warm "
    "the cache.",
    "input": "The loader cannot keep up: make the batches in DataLoader workers, and more "
    "of them while CPUs are free (raise num_workers, with prefetch_factor and pin_memory).",
    "host_contended": "Processes outside the job keep the CPUs it may use busy: isolate "
    "the job: give it CPUs of its own (Kubernetes' static CPU "
    "manager with Guaranteed pods, Slurm's --cpu-bind, taskset or a cpuset), cap the other "
    "processes with cgroup CPU limits (cpu.max), or move the noisy job off the node; more or "
    "lighter DataLoader workers will not help while others hold the CPUs.",
    "communication": "Exposed all-reduce is the largest loss in the step: check NCCL uses "
    "the fast "
    "transport (EFA/IB, not TCP), raise the per-GPU batch, tune DDP bucket_cap_mb and "
    "gradient_as_bucket_view=True.",
    "waiting_on_peer": "This rank waits in all-reduce for a slower peer: look at that "
    "rank's GPU (thermal, clocks) and host, not at this one.",
    "between_steps": "Time between steps is the largest loss of wall time (checkpoints, "
    "evaluation, logging, or an untimed loader): checkpoint asynchronously "
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
    "straggler": "This rank is busier per step than the other ranks of its group on this "
    "node, and every rank of its job waits for it at each all-reduce: compare its GPU "
    "(clocks, temperature, power) and its input pipeline with its peers'; drain its GPU if "
    "the hardware is the difference.",
    "clock_lag": "Under load this GPU's SM clock sits below its peers' (same model and "
    "power limit) with no thermal event to explain it: check locked or lowered clocks "
    "(nvidia-smi -q -d CLOCK; reset with nvidia-smi -rgc), then power delivery and "
    "cooling; drain the GPU if it stays slow, since every all-reduce waits for it.",
    "tcp_suspected": "The job spans nodes and NCCL has probably fallen back to TCP sockets "
    "(no RDMA device, RDMA counters flat, or NCCL's own report): check its log with "
    "`stepscope nccl-check` (expect 'NET/OFI Selected provider is efa').",
    "checkpoint": "Checkpoint saving blocks training: save asynchronously "
    "(torch.distributed.checkpoint.async_save, or Lightning's AsyncCheckpointIO), shard "
    "the save across ranks (torch.distributed.checkpoint) instead of gathering on one, "
    "and checkpoint less often.",
    "evaluation": "Evaluation stops training: evaluate less often or on fewer batches, "
    "or off the critical path (a separate job or process on a saved checkpoint).",
    "logging": "Logging stops training: log every N steps, and avoid host syncs "
    "(.item(), .cpu()) and blocking uploads in the logger.",
    "unnamed_gpu_work": "The GPU works between steps in time no span names, most likely "
    'evaluation: name it with reporter.phase("evaluation") to confirm, then evaluate less '
    "often or on fewer batches, or move it off the critical path (a separate job or process "
    "on a saved checkpoint).",
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
_OVERRIDING = ("memory_bound", "fp32_no_tensor", "thermal_throttle", "clock_lag",
               "tcp_suspected")


def advice_for(kind: str, modifiers: tuple[str, ...]) -> str:
    """The verdict's one line: an overriding modifier's advice wins over the kind's; time
    between steps whose parts are named gets each part's line, largest first."""
    for modifier in _OVERRIDING:
        if modifier in modifiers:
            return MODIFIER_ADVICE[modifier]
    if modifiers and kind == "between_steps":
        return " ".join(MODIFIER_ADVICE[m] for m in modifiers)
    if modifiers and kind != "gpu_fault":
        return KIND_ADVICE[kind] + " " + MODIFIER_ADVICE[modifiers[0]]
    return KIND_ADVICE[kind]


# ---------------------------------------------------------------- what the lines claim

Signals = Mapping[str, float | None]


@dataclass(frozen=True)
class Claim:
    """A statement an advice line makes about its subject (``phrase``, as the line says
    it) and the test over the verdict's signals that makes it true. A signal the verdict
    lacks (not measured) fails a claim unless ``holds`` says otherwise."""

    phrase: str
    holds: Callable[[Signals, Thresholds], bool]


def _at_least(s: Signals, key: str, line: float) -> bool:
    v = s.get(key)
    return v is not None and v >= line


def _below(s: Signals, key: str, line: float) -> bool:
    v = s.get(key)
    return v is not None and v < line


def _gpu_not_idle_in_body(s: Signals, th: Thresholds) -> bool:
    """No SM reading, the SMs busy enough, or kernels running all the time."""
    sm = s.get("sm_active")
    busy_sms = sm is None or sm >= th.host_bound_sm_active
    return busy_sms or _at_least(s, "gpu_util", th.busy_gpu_util)


def _gpu_idles_in_body(s: Signals, th: Thresholds) -> bool:
    """The SMs idle while kernels do not run all the time."""
    return _below(s, "sm_active", th.host_bound_sm_active) and not _at_least(
        s, "gpu_util", th.busy_gpu_util
    )


def _cpus_saturated(s: Signals, th: Thresholds) -> bool:
    return _at_least(s, "cpu_busy", th.cpu_saturated)


def _outsiders_hold_cpus(s: Signals, th: Thresholds) -> bool:
    """The CPUs are saturated, and more of them by processes outside the job than by it."""
    outside, job = s.get("outside_cpu_share"), s.get("job_cpu_share")
    return _cpus_saturated(s, th) and outside is not None and job is not None and outside > job


def _job_holds_cpus(s: Signals, th: Thresholds) -> bool:
    """The CPUs are saturated, and by the job at least as much as by anyone else."""
    outside, job = s.get("outside_cpu_share"), s.get("job_cpu_share")
    return _cpus_saturated(s, th) and outside is not None and job is not None and job >= outside


def _storage_stalls(s: Signals, th: Thresholds) -> bool:
    """IO pressure or iowait high, or workers that wait while using little CPU."""
    workers, cores = s.get("dataloader_workers"), s.get("dataloader_cpu_cores")
    blocked = (
        workers is not None
        and workers > 0
        and cores is not None
        and (cores / workers < th.worker_blocked)
    )
    return _at_least(s, "io_pressure", th.io_pressure) or _at_least(s, "iowait", th.iowait) \
        or blocked  # fmt: skip


def _no_loss_matters(s: Signals, th: Thresholds) -> bool:
    """No lost share at its line, not even one gap between steps."""
    return not lost_shares(s, th) and not _at_least(s, BETWEEN, th.between_steps_share)


def _explains(loss: str) -> Callable[[Signals, Thresholds], bool]:
    return lambda s, th: explains(loss, s, th)


def _share_at_least(key: str) -> Callable[[Signals, Thresholds], bool]:
    return lambda s, th: _at_least(s, key, th.span_share)


# Every claim each line makes, by kind and by modifier (a test checks each phrase is in
# its line, and walks every verdict over the signals that select it: a claim its signals
# deny fails it). The fault lines state the fault the fault tracker found (their evidence:
# an XID, a counter), not a share or a rate, so they claim nothing of the signals.
KIND_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "gpu_fault": (),
    "compute": (
        Claim(
            "The GPU is the limit",
            lambda s, th: _no_loss_matters(s, th) and _gpu_not_idle_in_body(s, th),
        ),
    ),
    "host_bound": (
        Claim("The GPU idles between kernel launches", _gpu_idles_in_body),
        # where the rank's process is not visible the line stands on the idle GPU alone
        # (the evidence says so)
        Claim(
            "the training process keeps a CPU core busy",
            lambda s, th: (
                s.get("main_cpu_cores") is None or _at_least(s, "main_cpu_cores", th.main_cpu_busy)
            ),
        ),
    ),
    "transfer_bound": (
        Claim(
            "The step body waits for host-to-device copies while the SMs idle",
            lambda s, th: (
                _below(s, "sm_active", th.host_bound_sm_active)
                and _at_least(s, "pcie_rx_bytes_per_second", th.h2d_bytes_per_second)
            ),
        ),
    ),
    "input_cpu": (
        Claim("The job itself has the CPUs pegged", _job_holds_cpus),
        Claim("more workers will not help", _job_holds_cpus),
    ),
    "input_io": (
        Claim(
            "The loader waits on storage",
            lambda s, th: explains(DATA, s, th) and _storage_stalls(s, th),
        ),
    ),
    "input": (Claim("The loader cannot keep up", _explains(DATA)),),
    "host_contended": (
        Claim("Processes outside the job keep the CPUs it may use busy", _outsiders_hold_cpus),
    ),
    "communication": (Claim("Exposed all-reduce is the largest loss", _explains(COMM)),),
    "waiting_on_peer": (Claim("This rank waits in all-reduce", _explains(COMM)),),
    "between_steps": (Claim("Time between steps is the largest loss", _explains(BETWEEN)),),
    "idle": (
        Claim("no training steps", lambda s, th: not s.get("steps")),
        Claim(
            "no GPU activity",
            lambda s, th: s.get("gpu_util") is None or _below(s, "gpu_util", th.idle_gpu_util),
        ),
    ),
    "finished": (),  # the process's end is the fact (its evidence), no signal
    "unknown": (),
}
MODIFIER_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "fp32_no_tensor": (
        Claim(
            "FP32 pipe busy, tensor cores idle",
            lambda s, th: (
                _at_least(s, "fp32_active", th.fp32_active)
                and _below(s, "tensor_active", th.tensor_idle)
            ),
        ),
    ),
    "low_occupancy": (
        Claim("SM occupancy is low", lambda s, th: _below(s, "sm_occupancy", th.low_occupancy)),
    ),
    "memory_bound": (
        Claim(
            "Memory bandwidth is the limit",
            lambda s, th: (
                _at_least(s, "dram_active", th.dram_busy)
                and _below(s, "tensor_active", th.tensor_idle)
            ),
        ),
    ),
    "thermal_throttle": (
        Claim(
            "Clocks lowered for temperature",
            lambda s, th: _at_least(s, "thermal_share", th.throttle_share),
        ),
    ),
    "power_cap": (
        Claim(
            "Clocks held at the power limit",
            lambda s, th: _at_least(s, "power_share", th.throttle_share),
        ),
    ),
    "straggler": (
        Claim(
            "This rank is busier per step than the other ranks of its group on this node",
            lambda s, th: _at_least(s, "busy_over_group", th.straggler_ratio),
        ),
    ),
    "clock_lag": (
        Claim(
            "Under load this GPU's SM clock sits below its peers'",
            lambda s, th: _below(s, "sm_clock_over_peers", th.clock_lag_ratio),
        ),
        Claim(
            "with no thermal event to explain it",
            lambda s, th: _below(s, "thermal_share", th.throttle_share),
        ),
    ),
    "tcp_suspected": (
        Claim(
            "The job spans nodes",
            lambda s, th: (s.get("world_size") or 0) > (s.get("job_ranks_on_node") or 0) > 0,
        ),
    ),
    "checkpoint": (
        Claim("Checkpoint saving blocks training", _share_at_least("checkpoint_share")),
    ),
    "evaluation": (Claim("Evaluation stops training", _share_at_least("evaluation_share")),),
    "logging": (Claim("Logging stops training", _share_at_least("logging_share")),),
    "unnamed_gpu_work": (
        Claim(
            "The GPU works between steps",
            lambda s, th: _at_least(s, "between_steps_gpu_busy", th.between_steps_gpu_busy),
        ),
    ),
    "gpu_down": (Claim("The GPU stopped answering", lambda s, th: s.get("gpu_up") == 0.0),),
    "xid_critical": (),
    "row_remap_failed": (),
    "ecc_uncorrectable": (),
    "row_remap_pending": (),
    "pcie_replay_storm": (),
}


def denied_claims(
    kind: str, modifiers: Sequence[str], advice: str, signals: Signals, th: Thresholds
) -> list[str]:
    """The phrases of ``advice`` (a verdict's line) that its ``signals`` deny: every claim
    of the kind's line and of each modifier's line, where that line is in ``advice``."""
    lines = [(KIND_ADVICE.get(kind, ""), KIND_CLAIMS.get(kind, ()))]
    lines += [(MODIFIER_ADVICE.get(m, ""), MODIFIER_CLAIMS.get(m, ())) for m in modifiers]
    return [
        c.phrase
        for line, claims in lines
        if line and line in advice
        for c in claims
        if not c.holds(signals, th)
    ]
