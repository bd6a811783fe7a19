"""The verdicts' plain data. Pure, no imports from the rest of the exporter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from stepscope.diagnose.thresholds import Thresholds

# Verdict kinds (``stepscope_bottleneck{kind}`` serves a subject's one kind, at 1).
# ``gpu_fault`` outranks every performance verdict: a GPU that is down or must be
# drained reads ``gpu_fault`` whatever its steps look like.
KINDS: tuple[str, ...] = (
    "gpu_fault",
    "compute",
    "host_bound",
    "transfer_bound",
    "input_cpu",
    "input_io",
    "input",
    "communication",
    "waiting_on_peer",
    "between_steps",
    "idle",
    "finished",
    "unknown",
)
# The hardware faults a ``gpu_fault`` verdict names (one modifier each), most urgent first.
FAULT_MODIFIERS: tuple[str, ...] = (
    "gpu_down",
    "xid_critical",
    "row_remap_failed",
    "ecc_uncorrectable",
    "row_remap_pending",
    "pcie_replay_storm",
)
# The named spans between steps a ``between_steps`` verdict names (one modifier each):
# the SDK's span names (stepscope.shared.datagram.SPANS) but its catch-all "other".
SPAN_MODIFIERS: tuple[str, ...] = ("checkpoint", "evaluation", "logging")
# Qualifiers of a verdict (``stepscope_bottleneck_modifier{modifier}``).
MODIFIERS: tuple[str, ...] = (
    "fp32_no_tensor",
    "low_occupancy",
    "memory_bound",
    "thermal_throttle",
    "power_cap",
    "tcp_suspected",
    *SPAN_MODIFIERS,
    *FAULT_MODIFIERS,
)
# Kinds that mean "time is leaking" (or the hardware is broken): `stepscope diagnose`
# exits 1 on one of these, or on a thermally throttled GPU (the classic straggler).
BOTTLENECK_KINDS: frozenset[str] = frozenset(
    {"gpu_fault", "host_bound", "transfer_bound", "input_cpu", "input_io", "input",
     "communication", "waiting_on_peer", "between_steps"}
)  # fmt: skip
ALERT_MODIFIERS: frozenset[str] = frozenset({"thermal_throttle", "tcp_suspected"})


@dataclass(frozen=True)
class Subject:
    """Who a verdict is about: a training rank (with its GPU, if any) or a GPU alone."""

    job: str = ""
    rank: int | None = None
    local_rank: int | None = None
    gpu: int | None = None
    uuid: str = ""
    model: str = ""

    @property
    def name(self) -> str:
        """``job/rank 3 (gpu 3)`` or ``gpu 3``: for reports."""
        gpu = f"gpu {self.gpu}" if self.gpu is not None else ""
        if self.rank is None:
            return gpu or "?"
        return f"{self.job}/rank {self.rank}" + (f" ({gpu})" if gpu else "")


@dataclass(frozen=True)
class Verdict:
    """One subject's verdict over the window.

    ``evidence``: the observations it rests on, one sentence each. ``signals``: the
    numbers (None where unknown): GPU activity, step time and phase shares, MFU, host
    figures. ``history``: per-sample series for charts (``step_seconds``, phase
    shares, ``sm_active``, ``gpu_util``), oldest first, bounded by the window.
    """

    subject: Subject
    kind: str
    modifiers: tuple[str, ...] = ()
    advice: str = ""
    evidence: tuple[str, ...] = ()
    signals: Mapping[str, float | None] = field(default_factory=dict)
    history: Mapping[str, Sequence[float | None]] = field(default_factory=dict)

    @property
    def bottleneck(self) -> bool:
        """Whether this verdict says time is leaking (exit status 1 of ``diagnose``)."""
        return self.kind in BOTTLENECK_KINDS or bool(ALERT_MODIFIERS & set(self.modifiers))

    @property
    def fault(self) -> bool:
        """Whether this verdict is a hardware fault (drain, reset or replace the GPU)."""
        return self.kind == "gpu_fault"


class JobGoodput(NamedTuple):
    """One job's books on this node, in GPU-seconds since it was first seen here.

    ``badput``: (cause, seconds) for every cause of
    :data:`~stepscope.diagnose.goodput.BADPUT_TYPES`, in that order (0: none yet).
    ``pending``: held by its live ranks, not yet explained (the time since each one's
    last reported step). ``ranks``: its live ranks."""

    job: str
    goodput: float
    badput: tuple[tuple[str, float], ...]
    pending: float
    ranks: int

    @property
    def booked(self) -> float:
        """Goodput and badput together."""
        return self.goodput + sum(v for _, v in self.badput)

    @property
    def held(self) -> float:
        """GPU-seconds held: booked and pending."""
        return self.booked + self.pending


@dataclass(frozen=True)
class Diagnosis:
    """Every verdict of one pass. ``window_seconds``: the time the window spans;
    ``timestamp``: the wall-clock time of the pass the verdicts are for (at many ranks,
    an earlier pass than the snapshot served beside it: ``DiagnosisAnalysis``);
    ``goodput``: each training job's books on this node
    (:class:`~stepscope.diagnose.goodput.GoodputLedger`)."""

    window_seconds: float
    samples: int
    verdicts: tuple[Verdict, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    timestamp: float = 0.0
    goodput: tuple[JobGoodput, ...] = ()

    @property
    def status(self) -> str:
        """``bottleneck``, ``healthy`` or ``unknown`` (nothing to tell from).

        A hardware fault is a ``bottleneck`` too (exit status 1); :attr:`faults` says
        which verdicts are faults."""
        if any(v.bottleneck for v in self.verdicts):
            return "bottleneck"
        if not self.verdicts or all(v.kind == "unknown" for v in self.verdicts):
            return "unknown"
        return "healthy"

    @property
    def faults(self) -> tuple[Verdict, ...]:
        """The verdicts that name a hardware fault."""
        return tuple(v for v in self.verdicts if v.fault)
