"""Two ways a step loses its GPU that no kernel shows: time between steps, and
host-to-device copies inside the step body. Pure functions over a rank's window.

- ``between_steps``: most of the step is outside the timed loader and the step body
  (checkpoint saves, evaluation, logging, an untimed loader). The SDK's
  ``StepReporter.phase(name)`` (and the Lightning and Hugging Face integrations) name
  those spans, so the verdict can say which one (a modifier each: ``checkpoint``,
  ``evaluation``, ``logging``) instead of guessing.
- ``transfer_bound``: the step body dominates and the SMs idle while the GPU's PCIe
  receive is busy: the body copies its batch to the GPU (from pageable memory, or
  synchronously), which launch-bound ``host_bound`` steps do not (their PCIe receive is
  kernel launches only). docs/diagnosis.md states both rules and their thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from stepscope.diagnose.advice import advice_for
from stepscope.diagnose.model import SPAN_MODIFIERS, Verdict
from stepscope.diagnose.thresholds import Thresholds
from stepscope.shared.datagram import SPANS


class MakeVerdict(Protocol):
    """The engine's verdict constructor for one subject."""

    def __call__(
        self, kind: str, mods: Sequence[str] = (), why: Sequence[str] = (), advice: str = ""
    ) -> Verdict: ...


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def stalls(other_shares: Sequence[float | None], th: Thresholds) -> int:
    """Sampling intervals of the window whose steps spent ``between_steps_share`` or more
    of their time between steps: one is a single long gap (a save now and then)."""
    return sum(1 for s in other_shares if s is not None and s >= th.between_steps_share)


def unnamed_share(other: float, spans: tuple[float, ...] | None, dur: float) -> float:
    """Share of the step time between steps (``other``) that no span names."""
    named = sum(spans) / dur if spans is not None and dur > 0.0 else 0.0
    return max(0.0, other - named)


def gpu_busy_between_steps(kernels: float | None, unnamed: float, th: Thresholds) -> float | None:
    """At least what share of the ``unnamed`` time between steps the GPU runs kernels, from
    ``kernels``, the share of the window it ran any (util): what the rest of the step
    (counted busy all the time, the most it can hold) leaves over. None without a GPU
    reading or with too little unnamed time to judge (under ``span_share``).

    The step body's kernels are timed inside the step, so a GPU that idles between steps
    reads no more than the step accounts for (a bound of 0); an evaluation pass outside
    any step raises util above that."""
    if kernels is None or unnamed < th.span_share:
        return None
    return max(0.0, min(1.0, (kernels - (1.0 - unnamed)) / unnamed))


def between_steps_verdict(
    dur: float, steps: int, other: float, spans: tuple[float, ...] | None,
    th: Thresholds, verdict: MakeVerdict, gpu_busy: float | None = None,
) -> Verdict:  # fmt: skip
    """``between_steps``: ``other`` (a share of the step time ``dur`` over ``steps``
    steps) is the largest loss; ``spans``: the seconds of each named span of SPANS, if
    any; ``gpu_busy``: :func:`gpu_busy_between_steps` of the time no span names."""
    per_step = other * dur / steps if steps else 0.0
    why = [
        f"{_pct(other)} of the step time ({per_step:.3f} s per step) is outside the timed "
        "loader and step body"
    ]
    named = dict(zip(SPANS, spans, strict=True)) if spans is not None else {}
    for name, seconds in sorted(named.items(), key=lambda kv: -kv[1]):
        if seconds > 0.0 and dur > 0.0:
            what = "named 'other'" if name == "other" else name
            why.append(f"{what}: {_pct(seconds / dur)} of the step time ({seconds:.1f} s "
                       "in the window)")  # fmt: skip
    mods = [
        m for m in sorted(SPAN_MODIFIERS, key=lambda m: -named.get(m, 0.0))
        if dur > 0.0 and named.get(m, 0.0) / dur >= th.span_share
    ]  # fmt: skip
    unnamed = unnamed_share(other, spans, dur)
    if unnamed >= th.span_share:
        why.append(
            f"{_pct(unnamed)} of the step time is in no named span: the loop's own work, "
            "an untimed loader (wrap it in reporter.timed()), or saving/evaluation not "
            'marked with reporter.phase("checkpoint") / phase("evaluation")'
        )
    if gpu_busy is not None and gpu_busy >= th.between_steps_gpu_busy:
        mods.append("unnamed_gpu_work")
        why.append(
            f"the GPU runs kernels at least {_pct(gpu_busy)} of the unnamed time between "
            "steps (its util over the window is more than the timed steps account for): "
            "GPU work outside the step, most likely evaluation"
        )
    elif gpu_busy == 0.0:
        why.append(
            "no sign of GPU work between steps: the GPU's util over the window is no more "
            "than the timed steps account for (CPU work: a blocking save, logging, an "
            "untimed loader)"
        )
    elif gpu_busy is not None:
        why.append(
            f"the GPU runs kernels at least {_pct(gpu_busy)} of the unnamed time between "
            "steps: some GPU work outside the step"
        )
    return verdict("between_steps", mods, why, advice_for("between_steps", tuple(mods)))


def transfer_bound_why(pcie_rx: float | None, head: str, th: Thresholds) -> list[str] | None:
    """The evidence of a ``transfer_bound`` step body (``head``: the body's share and SM
    activity), or None when the PCIe receive rate does not show copies."""
    if pcie_rx is None or pcie_rx < th.h2d_bytes_per_second:
        return None
    return [
        f"{head}; meanwhile PCIe receive runs at {pcie_rx / 1e9:.1f} GB/s: the step body "
        "waits for host-to-device copies, not for kernel launches",
    ]
