"""Which share of a rank's wall time its verdict explains: the policy of docs/diagnosis.md
("Which share beats which"), as one pure function over a verdict's signals.

A step's time splits into four phases: ``data_wait``, ``compute``, ``comm`` and ``other``
(between steps). Three of them are lost time. A lost share *matters* once it reaches its
line in :class:`~stepscope.diagnose.thresholds.Thresholds` (time between steps only when
it recurs in ``between_steps_stalls`` of the window's intervals: one long gap is a save now
and then, not a habit the window can judge). The largest lost share that matters is the
verdict, whatever the step body's share: a rank that loses 40% of its wall time between
steps is not "the GPU is the limit" because its body computes the other 60%. Only when no
lost share matters is the step body judged (compute, host-bound, transfer-bound).

The engine decides with it, and the advice lines' claims are checked with it
(:mod:`stepscope.diagnose.advice`), so the verdict and what its advice says about the
step cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

from stepscope.diagnose.thresholds import Thresholds

# The lost shares (signal names), in the order that breaks a tie.
DATA = "data_wait_share"
COMM = "comm_share"
BETWEEN = "other_share"
LOSSES: tuple[str, ...] = (DATA, COMM, BETWEEN)
# What each one is, in evidence: "26% of the step waiting for data"
LOSS_WORDS: Mapping[str, str] = {
    DATA: "waiting for data",
    COMM: "in exposed communication",
    BETWEEN: "between steps",
}


def line_of(loss: str, th: Thresholds) -> float:
    """The share from which ``loss`` matters."""
    if loss == DATA:
        return th.input_share
    if loss == COMM:
        return th.comm_share
    return th.between_steps_share


def lost_shares(signals: Mapping[str, float | None], th: Thresholds) -> tuple[str, ...]:
    """The lost shares of ``signals`` that matter, largest first (ties: data, comm, time
    between steps). Time between steps needs ``between_steps_intervals`` (the window's
    intervals with that share or more) of at least ``between_steps_stalls``."""
    found: list[tuple[float, int, str]] = []
    for order, loss in enumerate(LOSSES):
        share = signals.get(loss)
        if share is None or share < line_of(loss, th):
            continue
        if loss == BETWEEN and (signals.get("between_steps_intervals") or 0) < (
            th.between_steps_stalls
        ):
            continue
        found.append((-share, order, loss))
    return tuple(loss for _, _, loss in sorted(found))


def explains(loss: str, signals: Mapping[str, float | None], th: Thresholds) -> bool:
    """Whether ``loss`` is the share a verdict over ``signals`` explains."""
    lost = lost_shares(signals, th)
    return bool(lost) and lost[0] == loss
