"""The verdicts' plain data. Pure. The vocabulary (kinds, modifiers, which are
bottlenecks) is defined in :mod:`stepscope.diagnose.kinds` and re-exported here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from stepscope.diagnose.kinds import ALERT_MODIFIERS
from stepscope.diagnose.kinds import BOTTLENECK_KINDS as BOTTLENECK_KINDS
from stepscope.diagnose.kinds import KINDS as KINDS
from stepscope.diagnose.kinds import MODIFIERS as MODIFIERS
from stepscope.diagnose.kinds import SPAN_MODIFIERS as SPAN_MODIFIERS
from stepscope.diagnose.thresholds import Thresholds


@dataclass(frozen=True)
class Subject:
    """Who a verdict is about: a training rank (with its GPU, if any) or a GPU alone."""

    job: str = ""
    rank: int | None = None
    local_rank: int | None = None
    gpu: int | None = None
    uuid: str = ""
    model: str = ""
    group: str = ""  # the rank's group of peers in its job, where it reports one

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
