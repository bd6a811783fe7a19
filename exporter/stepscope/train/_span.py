"""What the framework integrations share: one optimizer step over micro-batches,
tokens counted from a batch, and which comm hook times a wrapped model (the rule
that a callback never raises is :mod:`._guard`).

Standard library only, like the rest of ``stepscope.train``: the integrations that
import Lightning, transformers or torch live in their own submodules.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from stepscope.train.reporter import StepReporter


def count_tokens(batch: Any) -> int:
    """Tokens in a batch, read from shapes only (never a device sync).

    A mapping's ``input_ids``; an integer tensor (token ids); the first element of a
    tuple or list. Anything else counts 0: pass the integration a ``tokens_fn``.
    """
    for _ in range(4):  # (inputs, labels) nests at most a few levels
        if isinstance(batch, Mapping):
            batch = batch.get("input_ids")
        elif isinstance(batch, (tuple, list)) and batch:
            batch = batch[0]
        else:
            break
    if batch is None or not hasattr(batch, "numel") or not hasattr(batch, "is_floating_point"):
        return 0
    if batch.is_floating_point() or batch.is_complex():
        return 0  # features, not token ids: the user says what a token is
    return int(batch.numel())


def precision_of(name: object) -> str:
    """Our precision (which peak MFU divides by) from a framework's setting:
    Lightning's ``"bf16-mixed"``/``"16-mixed"``/``"32-true"``, Accelerate's
    ``"bf16"``/``"fp16"``/``"fp8"``/``"no"``."""
    text = str(name).lower()
    if "bf16" in text:
        return "bf16"
    if "fp8" in text or "transformer-engine" in text:
        return "fp8"
    if text.startswith("16") or "fp16" in text:
        return "fp16"
    return "fp32"


class OptimizerStep:
    """One optimizer step, reported through ``reporter``, over one or more
    micro-batches (gradient accumulation).

    Frameworks call back per micro-batch: the step opens at the first micro-batch's
    ``begin`` and closes at the ``end`` of the micro-batch whose optimizer stepped,
    with the tokens and FLOPs of all its micro-batches. ``fail`` closes it as
    failed (the reporter counts it and its time goes to the next step's ``other``).
    """

    def __init__(self, reporter: StepReporter) -> None:
        self.reporter = reporter
        self.open = False
        self._tokens = 0
        self._flops: float | None = None

    def begin(self, tokens: int, flops: float | None) -> None:
        """A micro-batch starts; the first of a step opens it."""
        if not self.open:
            self._tokens, self._flops = 0, None
            self.reporter.step().__enter__()
            self.open = True
        self._tokens += tokens
        if flops is not None:
            self._flops = (self._flops or 0.0) + flops

    def end(self, stepped: bool) -> None:
        """A micro-batch ended; ``stepped``: the optimizer stepped, the step is over."""
        if self.open and stepped:
            self.open = False
            # step() only sets what the closing step reports: the tokens and FLOPs of
            # all its micro-batches, known now and not when it opened.
            self.reporter.step(tokens=self._tokens, flops=self._flops).__exit__(None, None, None)

    def fail(self, exc: BaseException) -> None:
        """The step's body raised: close it unreported."""
        if self.open:
            self.open = False
            self.reporter.step().__exit__(type(exc), exc, exc.__traceback__)


def watch_comm(reporter: StepReporter, model: Any) -> object:
    """Time ``model``'s gradient communication: DDP through ``watch_ddp``, FSDP
    through :func:`stepscope.train.fsdp.watch_fsdp`. None for anything else (one
    process, no wrapper); torch is only looked at when the script imported it."""
    if "torch" not in sys.modules:
        return None
    ddp = importlib.import_module("torch.nn.parallel").DistributedDataParallel
    if isinstance(model, ddp):
        return reporter.watch_ddp(model) or None
    fsdp = importlib.import_module("torch.distributed.fsdp")
    if isinstance(model, (fsdp.FullyShardedDataParallel, fsdp.FSDPModule)):
        from stepscope.train.fsdp import watch_fsdp  # imports torch: only for FSDP

        return watch_fsdp(reporter, model)
    return None


def in_phase(
    obj: Any, method: str, name: str, reporter: Callable[[], StepReporter | None]
) -> Callable[[], None] | None:
    """Run each call of ``obj.method`` (this instance only) inside
    ``reporter().phase(name)``: a framework's checkpoint save or evaluation, timed as a
    named span between steps. Returns the undo (None when there is no such method);
    while ``reporter()`` is None the method runs unwrapped."""
    original = getattr(obj, method, None)
    if not callable(original):
        return None
    shadowed = method in getattr(obj, "__dict__", {})

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        rep = reporter()
        if rep is None:
            return original(*args, **kwargs)
        with rep.phase(name):
            return original(*args, **kwargs)

    setattr(obj, method, timed)

    def undo() -> None:
        if getattr(obj, method, None) is not timed:
            return  # wrapped again by someone else since: leave theirs in place
        if shadowed:
            setattr(obj, method, original)
        else:
            delattr(obj, method)

    return undo
