"""Hugging Face Accelerate loops: ``AcceleratorReporter(accelerator, job, model=model)``.

A loop written with Accelerate is a plain loop, so this is ``StepReporter`` with what
Accelerate already knows filled in: rank, local rank and world size from the
``Accelerator``, precision from its ``mixed_precision``, and the prepared model's
gradient communication timed (DDP through ``watch_ddp``, FSDP through
:func:`stepscope.train.fsdp.watch_fsdp`). Under ``accelerator.accumulate(model)`` one
reported step is one optimizer step: ``step()`` wraps each micro-batch, the step
opens with the first and closes after the one where ``accelerator.sync_gradients``
is set, with all their tokens.

Nothing here imports accelerate (the ``Accelerator`` is read by attribute), and
nothing raises into the loop: our own failures are counted in ``errors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Literal, TypeVar

from stepscope.train._guard import guarded
from stepscope.train._span import OptimizerStep, precision_of, watch_comm
from stepscope.train.reporter import StepReporter

T = TypeVar("T")


class _MicroBatch:
    """What :meth:`AcceleratorReporter.step` returns; reused for every micro-batch."""

    __slots__ = ("_owner",)

    def __init__(self, owner: AcceleratorReporter) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        self._owner._begin()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self._owner._end(exc)
        return False  # the loop's exception propagates unchanged


class AcceleratorReporter:
    """Reports each optimizer step of an Accelerate loop to the node's exporter.

    ``accelerator``: the ``accelerate.Accelerator``. ``job`` and the keyword
    arguments are :class:`StepReporter`'s; ``rank``, ``local_rank``, ``world_size``
    and ``precision`` default to the accelerator's. ``model``: the model
    ``accelerator.prepare`` returned, to time its gradient communication.
    """

    def __init__(self, accelerator: Any, job: str, *, model: Any = None,
                 **reporter_kwargs: Any) -> None:
        options = {
            "rank": accelerator.process_index,
            "local_rank": accelerator.local_process_index,
            "world_size": accelerator.num_processes,
            "precision": precision_of(accelerator.mixed_precision),
            **reporter_kwargs,
        }
        self.reporter = StepReporter(job, **options)
        self.errors = 0
        self._logged: set[str] = set()
        self._accelerator = accelerator
        self._span = OptimizerStep(self.reporter)
        self._ctx = _MicroBatch(self)
        self._tokens = 0
        self._flops: float | None = None
        if model is not None:
            self._watch(model)

    def timed(self, iterable: Iterable[T]) -> Iterator[T]:
        """``StepReporter.timed``: the time blocked fetching the next batch is data wait."""
        return self.reporter.timed(iterable)

    def step(self, tokens: int = 0, flops: float | None = None) -> _MicroBatch:
        """Context manager around one micro-batch (inside ``accelerator.accumulate``)
        with its ``tokens`` and, optionally, its model ``flops``."""
        self._tokens, self._flops = tokens, flops
        return self._ctx

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued and stop (``StepReporter.close``)."""
        self.reporter.close(timeout)

    @guarded
    def _watch(self, model: Any) -> None:
        if self._accelerator.num_processes > 1:
            watch_comm(self.reporter, model)

    @guarded
    def _begin(self) -> None:
        self._span.begin(self._tokens, self._flops)

    @guarded
    def _end(self, exc: BaseException | None) -> None:
        if exc is not None:
            self._span.fail(exc)
        else:
            self._span.end(bool(getattr(self._accelerator, "sync_gradients", True)))
