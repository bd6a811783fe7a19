"""Fail-slow ranks and GPUs on one node: the ``straggler`` and ``clock_lag`` modifiers.

A synchronous job runs at its slowest rank's pace, so a rank a few percent slower than
its peers costs every GPU of the job as much. On the node, a rank is compared with the
other ranks of its group here (the ranks of its job that report the same group: a
pipeline stage, a role; the job where none is reported): busy per step (its step less
exposed communication) at/above ``straggler_ratio`` of their median over the window,
it is the **straggler**. A GPU under load (utilisation at/above ``clock_load_gpu_util``)
whose SM clock over the window is under ``clock_lag_ratio`` of the median of the node's
other loaded GPUs of the same model and enforced power limit, with no clock event of its
own to explain it (thermal slowdown under ``throttle_share`` of the window, power capping
no more than its peers' by ``throttle_share``: those read ``thermal_throttle`` and
``power_cap``), **lags**. Both thresholds are the fleet's (``StepscopeRankStraggler``,
``StepscopeGpuClockLagging``); the node cannot see the job's ranks on other nodes, nor a
rank's past beyond its window: the fleet rules judge those (docs/diagnosis.md,
"Fail-slow ranks and GPUs").

The modifier is added to whatever verdict the rank or GPU already has (its kind says
what it waits on or computes; the modifier says it is slower than its peers), with the
evidence naming the rank or GPU, its figure and its peers'.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from stepscope.diagnose.advice import advice_for
from stepscope.diagnose.model import Verdict
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import RankWindow
from stepscope.gpu.model import GpuInfo


class GpuWindow(Protocol):
    """What the comparison reads of a GPU over the window (the engine's ``GpuWindow``,
    which imports this module)."""

    @property
    def info(self) -> GpuInfo: ...
    @property
    def up(self) -> bool: ...
    @property
    def gpu_util(self) -> float | None: ...
    @property
    def sm_clock(self) -> float | None: ...
    @property
    def power_limit(self) -> float | None: ...
    @property
    def thermal_share(self) -> float: ...
    @property
    def power_share(self) -> float: ...


# verdicts a modifier never joins: the hardware has failed, or the rank has ended
_UNJUDGED = frozenset({"gpu_fault", "finished"})


class Lag(NamedTuple):
    """A fail-slow finding: its modifier, the sentence of evidence, and the signal its
    advice's claim reads (``busy_over_group``, ``sm_clock_over_peers``: the ratio)."""

    modifier: str
    evidence: str
    signal: str
    ratio: float


def _busy(rw: RankWindow) -> float:
    """Seconds per step the rank is busy: its step less exposed communication."""
    p = rw.per_step()
    return p.data_wait + p.compute + p.other


def rank_stragglers(ranks: Iterable[RankWindow], th: Thresholds) -> dict[tuple[str, int], Lag]:
    """(job, rank) -> its ``straggler`` finding, for ranks busier per step than the median
    of their group's other ranks on this node by ``straggler_ratio``. Ranks with fewer
    than ``min_steps`` measured steps in the window neither judge nor are judged."""
    groups: dict[tuple[str, str | None], list[tuple[RankWindow, float]]] = {}
    for rw in ranks:
        if rw.steps >= th.min_steps:
            groups.setdefault((rw.view.job, rw.view.identity.group), []).append((rw, _busy(rw)))
    out: dict[tuple[str, int], Lag] = {}
    for (job, group), members in groups.items():
        if len(members) < 2:
            continue
        for rw, busy in members:
            # the median of the others: with one peer, that peer (a rank is not its own
            # reference, or a group of two could never show a straggler)
            others = [b for other, b in members if other is not rw]
            median = statistics.median(others)
            if median <= 0 or busy < th.straggler_ratio * median:
                continue
            where = f"group {group} of job {job}" if group else f"job {job}"
            out[(job, rw.view.rank)] = Lag("straggler", (
                f"rank {rw.view.rank} is busy {busy:.3f} s per step (its step less exposed "
                f"communication), {busy / median:.2f}x the median {median:.3f} s of the "
                f"{len(others)} other rank(s) of {where} on this node (threshold "
                f"{th.straggler_ratio:g}x): every rank of the job waits for it"),
                "busy_over_group", busy / median)  # fmt: skip
    return out


def clock_laggards(gpus: Iterable[GpuWindow], th: Thresholds) -> dict[str, Lag]:
    """UUID -> its ``clock_lag`` finding, for loaded GPUs whose mean SM clock over the
    window is under ``clock_lag_ratio`` of the median of the node's other loaded GPUs of
    the same model and enforced power limit."""
    peers: dict[tuple[str, float | None], list[tuple[GpuWindow, float]]] = {}
    for g in gpus:
        util, clock = g.gpu_util, g.sm_clock
        if g.up and util is not None and clock and util >= th.clock_load_gpu_util:
            peers.setdefault((g.info.name, g.power_limit), []).append((g, clock))
    out: dict[str, Lag] = {}
    for (model, limit), members in peers.items():
        if len(members) < 2:
            continue
        for g, clock in members:
            others = [other for other, _ in members if other is not g]
            median = statistics.median(c for other, c in members if other is not g)
            if clock >= th.clock_lag_ratio * median:
                continue
            capped = statistics.median(o.power_share for o in others)
            if g.thermal_share >= th.throttle_share or (
                g.power_share - capped >= th.throttle_share
            ):
                continue  # its own clock events say why (thermal_throttle, power_cap)
            at = f" at {limit:g} W" if limit else ""
            out[g.info.uuid] = Lag("clock_lag", (
                f"GPU {g.info.index} runs its SMs at {clock:.0f} MHz under load, "
                f"{clock / median:.0%} of the median {median:.0f} MHz of the node's "
                f"{len(members) - 1} other loaded {model}{at} (threshold "
                f"{th.clock_lag_ratio:.0%}), with no more thermal or power throttling "
                "than they have: a clock held down that no violation counter shows"),
                "sm_clock_over_peers", clock / median)  # fmt: skip
    return out


def mark_fail_slow(
    verdicts: Sequence[Verdict],
    ranks: Iterable[RankWindow],
    gpus: Iterable[GpuWindow],
    th: Thresholds,
) -> list[Verdict]:
    """``verdicts`` with the ``straggler`` modifier on each straggling rank's verdict and
    ``clock_lag`` on each verdict about a lagging GPU (its rank's, or its own)."""
    slow = rank_stragglers(ranks, th)
    lagging = clock_laggards(gpus, th)
    if not slow and not lagging:
        return list(verdicts)
    out = []
    for v in verdicts:
        s = v.subject
        found = [lag for lag in (
            slow.get((s.job, s.rank)) if s.rank is not None else None,
            lagging.get(s.uuid) if s.uuid else None,
        ) if lag is not None and lag.modifier not in v.modifiers]  # fmt: skip
        if not found or v.kind in _UNJUDGED:
            out.append(v)
            continue
        mods = (*v.modifiers, *(lag.modifier for lag in found))
        signals = {**v.signals, **{lag.signal: lag.ratio for lag in found}}
        out.append(replace(
            v, modifiers=mods, advice=advice_for(v.kind, mods), signals=signals,
            evidence=(*v.evidence, *(lag.evidence for lag in found))))  # fmt: skip
    return out
