"""Map the training part of a Snapshot to metric families: pure functions.

Per rank: the rank label set of the pass's label schema (the rank joined with its GPU
by the UUID it reported), with the step time as a summary (``_sum``, ``_count``). Per
job on the node: the step-time histogram, on the job and node labels (every query that
reads buckets sums a job's ranks: 19 series a job instead of 19 a rank). Per GPU:
``stepscope_gpu_peak_flops`` at the precisions its ranks train in, for models in the
peak table, on the GPU's label set. Ingest health.
"""

from __future__ import annotations

from stepscope.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    SUMMARY,
    Family,
    join_labels,
    label_string,
)
from stepscope.core.labels import LabelSchema
from stepscope.ingest.aggregate import STEP_BUCKETS, TrainingView
from stepscope.ingest.mfu import rank_mfu
from stepscope.ingest.peak_flops import PeakTable
from stepscope.shared.datagram import NCCL_TRANSPORTS, PHASES, SPANS

# le values as prometheus_client writes them ("0.5", "1.0", "+Inf")
_LE = (*(label_string((("le", repr(float(b))),)) for b in STEP_BUCKETS), '{le="+Inf"}')
_PHASE = tuple(label_string((("phase", p),)) for p in PHASES)
_TRANSPORT = {t: label_string((("transport", t),)) for t in NCCL_TRANSPORTS}
_SPAN = tuple(label_string((("span", s),)) for s in SPANS)
_REPORTED = " Reported by the training ranks, aggregated by the exporter; warm-up steps excluded."


def peak_flops_families(view: TrainingView, labels: LabelSchema, peaks: PeakTable) -> list[Family]:
    """``stepscope_gpu_peak_flops{precision}`` for each GPU a rank reported, at the
    precisions its ranks train in, where the model is in the table.

    The datasheet figure of every precision of every GPU is a static fact that no query
    needs (5 series a GPU); the MFU denominator of the ranks that train is.
    """
    fam = Family(
        "stepscope_gpu_peak_flops",
        GAUGE,
        "Datasheet peak dense FLOP/s of this GPU model at the precision its training "
        "ranks report (the MFU denominator); absent for GPUs without a rank and models "
        "not in the table.",
    )
    wanted = sorted({(r.uuid, r.precision) for r in view.ranks if r.uuid is not None})
    for uuid, precision in wanted:
        g = labels.gpu_identity(uuid)
        value = peaks.lookup(g.model_name, precision) if g is not None else None
        if g is None or value is None:
            continue
        fam.add(join_labels(labels.gpu(uuid), label_string((("precision", precision),))), value)
    return [fam]


def job_families(view: TrainingView, labels: LabelSchema) -> list[Family]:
    """``stepscope_job_step_duration_seconds``: each job's step-time histogram on this node."""
    fam = Family(
        "stepscope_job_step_duration_seconds",
        HISTOGRAM,
        "Wall time of each optimizer step of the job's ranks on this node (the per-rank "
        "mean is stepscope_step_duration_seconds)." + _REPORTED,
    )
    for j in view.jobs:
        lbl = labels.subject(j.job, None, None, None)
        cumulative = 0
        for le, count in zip(_LE, j.bucket_counts, strict=True):
            cumulative += count
            fam.add(join_labels(lbl, le), float(cumulative), "_bucket")
        fam.add(lbl, j.step_seconds_sum, "_sum")
        fam.add(lbl, float(cumulative), "_count")
    return [fam]


def restart_families(view: TrainingView, labels: LabelSchema) -> list[Family]:
    """``stepscope_training_restarts_total``: ranks taken over by a restarted process."""
    restarts = Family(
        "stepscope_training_restarts_total",
        COUNTER,
        "Ranks of the job on this node taken over by a new process after their old one "
        "exited (a restart under the same job name), since the job was first seen here.",
    )
    for j in view.jobs:
        restarts.add(labels.subject(j.job, None, None, None), float(j.restarts))
    return [restarts]


def span_families(view: TrainingView, labels: LabelSchema) -> list[Family]:
    """``stepscope_job_span_seconds_total{span}``: the job's named time between steps.

    Per job, not per rank (a rank's spans feed its verdict in process): at most 4
    series a job, and none for a job whose ranks name no span."""
    fam = Family(
        "stepscope_job_span_seconds_total",
        COUNTER,
        "Seconds the job's ranks on this node spent in named spans between steps "
        "(StepReporter.phase: " + ", ".join(SPANS) + "), part of the step phase "
        "other; absent for spans never named." + _REPORTED,
    )
    for j in view.jobs:
        if j.span_seconds is None:
            continue
        lbl = labels.subject(j.job, None, None, None)
        for span, seconds in zip(_SPAN, j.span_seconds, strict=True):
            if seconds > 0.0:
                fam.add(join_labels(lbl, span), seconds)
    return [fam]


def rank_families(view: TrainingView, labels: LabelSchema) -> list[Family]:
    """Every per-rank family for the ranks in ``view``."""
    peaks = view.settings.peak_flops
    duration = Family(
        "stepscope_step_duration_seconds",
        SUMMARY,
        "Wall time of each optimizer step of the rank (sum and count; the distribution "
        "is stepscope_job_step_duration_seconds, per job)." + _REPORTED,
    )
    steps = Family(
        "stepscope_steps_total",
        COUNTER,
        "Optimizer steps reported by the rank, warm-up steps included.",
    )
    warmup = Family(
        "stepscope_warmup_steps_total",
        COUNTER,
        "Steps the rank reported as warm-up (kept out of step time, phases, tokens, "
        "FLOPs and MFU).",
    )
    phases = Family(
        "stepscope_step_phase_seconds_total",
        COUNTER,
        "Step time by phase: data_wait (waiting for the next batch), compute, comm "
        "(exposed communication), other (the rest of the step)." + _REPORTED,
    )
    tokens = Family("stepscope_tokens_total", COUNTER, "Tokens processed by the rank." + _REPORTED)
    flops = Family(
        "stepscope_model_flops_total",
        COUNTER,
        "Model FLOPs of the rank, as the training job counts them." + _REPORTED,
    )
    mfu = Family(
        "stepscope_mfu_ratio",
        GAUGE,
        "Model FLOPs utilization: the rank's achieved model FLOP/s over the MFU window "
        "divided by its GPU's peak dense FLOP/s at its precision. Not clamped: above 1 "
        "means the reported FLOPs or the peak is wrong (mfu_status on the info series).",
    )
    last = Family(
        "stepscope_last_step_timestamp_seconds",
        GAUGE,
        "Unix time the rank's last step ended (a hung job stops moving it).",
    )
    dropped = Family(
        "stepscope_sdk_dropped_datagrams_total",
        COUNTER,
        "Step reports the rank's SDK failed to send (exporter absent, socket full).",
    )
    transport = Family(
        "stepscope_nccl_transport_info",
        GAUGE,
        "The network NCCL chose for the rank (efa, ib, libfabric: another libfabric "
        "provider, socket: TCP), as the rank's SDK read it from NCCL's debug output "
        "(opt-in: nccl_transport=True); the value is always 1.",
    )
    info = Family(
        "stepscope_training_rank_info",
        GAUGE,
        "Facts about a rank; the value is always 1. mfu_status says whether MFU is "
        "exported and, if not, why.",
    )
    for r in view.ranks:
        gpu = labels.gpu_identity(r.uuid)
        lbl = labels.rank(r.identity)
        if r.native is not None:  # one native histogram a rank (protobuf scrapes only)
            duration.add_native(lbl, r.native)
        duration.add(lbl, r.step_seconds_sum, "_sum")
        duration.add(lbl, float(r.measured_steps), "_count")
        steps.add(lbl, float(r.steps))
        warmup.add(lbl, float(r.warmup_steps))
        for phase, seconds in zip(_PHASE, r.phase_seconds, strict=True):
            phases.add(join_labels(lbl, phase), seconds)
        tokens.add(lbl, float(r.tokens))
        flops.add(lbl, r.flops)
        result = rank_mfu(r, gpu, peaks)
        if result.value is not None:
            mfu.add(lbl, result.value)
        last.add(lbl, r.last_step_timestamp)
        dropped.add(lbl, float(r.sdk_dropped))
        if r.nccl_transport is not None:
            transport.add(join_labels(lbl, _TRANSPORT[r.nccl_transport]), 1.0)
        info.add(
            join_labels(
                lbl,
                label_string(
                    (
                        ("precision", r.precision),
                        ("world_size", str(r.world_size) if r.world_size else ""),
                        ("pid", str(r.pid) if r.pid is not None else ""),
                        ("mfu_status", result.status),
                    )
                ),
            ),
            1.0,
        )
    return [duration, steps, warmup, phases, tokens, flops, mfu, last, dropped, transport, info]


def ingest_families(view: TrainingView) -> list[Family]:
    """The ingest's health: bound or not, datagrams accepted, rejected and dropped by the
    kernel, ranks tracked."""
    up = Family.single(
        "stepscope_ingest_up",
        GAUGE,
        "Whether the training ingest socket is bound (1) or could not be set up (0).",
        1.0 if view.ingest_up else 0.0,
    )
    accepted = Family.single(
        "stepscope_ingest_datagrams_total",
        COUNTER,
        "Step datagrams accepted by the training ingest.",
        float(view.accepted),
    )
    rejected = Family(
        "stepscope_ingest_rejected_total",
        COUNTER,
        "Datagrams dropped by the training ingest, by reason (see docs/ingest.md).",
    )
    for reason, count in view.rejected.items():
        rejected.add(label_string((("reason", reason),)), float(count))
    clamped = Family(
        "stepscope_ingest_clamped_total",
        COUNTER,
        "Step datagrams accepted with their time judged down by the exporter's own clock, "
        "by reason: clock_ahead, clock_behind (the end set to the receive time), "
        "longer_than_seen (the duration cut to the time the rank was seen; see "
        "docs/ingest.md).",
    )
    for reason, count in view.clamped.items():
        clamped.add(label_string((("reason", reason),)), float(count))
    ranks = Family.single(
        "stepscope_training_ranks",
        GAUGE,
        "Training ranks tracked on this node (ranks silent for rank_expiry are dropped).",
        float(len(view.ranks)),
    )
    families = [up, accepted, rejected, clamped, ranks]
    if view.kernel_dropped is not None:  # absent where the kernel does not count them
        families.append(
            Family.single(
                "stepscope_ingest_kernel_dropped_total",
                COUNTER,
                "Datagrams the kernel dropped on the ingest socket because its receive "
                "buffer was full (UDP; a Unix socket makes the sender wait or fail instead, "
                "counted by the SDK).",
                float(view.kernel_dropped),
            )
        )
    return families


def training_families(view: TrainingView, labels: LabelSchema) -> list[Family]:
    """Every training-related family for ``view``."""
    return [
        *peak_flops_families(view, labels, view.settings.peak_flops),
        *rank_families(view, labels),
        *job_families(view, labels),
        *restart_families(view, labels),
        *span_families(view, labels),
        *ingest_families(view),
    ]
