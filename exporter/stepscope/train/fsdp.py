"""Exposed gradient communication of a torch FSDP model: ``watch_fsdp(reporter, model)``.

FSDP (``torch.distributed.fsdp.FullyShardedDataParallel``, what Lightning's
``strategy="fsdp"``, Accelerate's FSDP plugin and the Hugging Face Trainer's ``fsdp=``
build) reduces gradients unit by unit during backward: a reduce-scatter per FSDP
unit (an all-reduce with ``NO_SHARD``). Its one public extension point for that is a
communication hook, so like ``StepReporter.watch_ddp`` we register one that does
exactly what FSDP does without a hook (torch's own reference hooks,
``default_hooks.reduce_scatter_hook``/``allreduce_hook``: pre-divide, reduce,
post-divide; bit-identical gradients, tested) and time it:

- On the CPU (gloo) each reduce-scatter blocks the training thread until it is done,
  so all of it is exposed: comm = the sum of their durations.
- On CUDA the hook runs on FSDP's post-backward stream, overlapping the rest of
  backward; as for DDP, comm = from the moment the last unit's gradients were ready
  (an event on FSDP's compute stream) to the completion of the last reduction (an
  event after it on the post-backward stream), read with the step.

Not counted: FSDP's parameter all-gathers (forward, and backward's re-gather). FSDP
has no hook for them; the part of them compute could not hide shows as ``compute``.
FSDP2 (``fully_shard``) is not watched yet: ``watch_fsdp`` says so and returns None.

Imports torch: import this module only in a script that uses FSDP.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch.distributed.algorithms._comm_hooks import default_hooks

from stepscope.train._guard import guarded
from stepscope.train.reporter import StepReporter

log = logging.getLogger("stepscope.train")


class FsdpCommTimer:
    """The registered FSDP comm hook and its timing; ``errors`` counts our own
    failures (timing only: FSDP's reduction itself always runs)."""

    def __init__(self, reporter: StepReporter, model: Any) -> None:
        self.reporter = reporter
        self.errors = 0
        self._logged: set[str] = set()
        self._model = model
        self._last: tuple[Any, Any] | None = None  # CUDA: (ready, done) of this backward
        self._queued = False

    def hook(self, state: Any, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
        """FSDP's default reduction (``output`` is None for ``NO_SHARD``), timed."""
        start = self._start(grad.is_cuda)
        if output is None:
            default_hooks.allreduce_hook(state, grad)
        else:
            default_hooks.reduce_scatter_hook(state, grad, output)
        self._stop(start)

    @guarded
    def _start(self, cuda: bool) -> Any:
        if not cuda:
            return time.perf_counter()
        # The hook runs on FSDP's post-backward stream; "ready" belongs on the stream
        # backward computes on, which FSDP keeps as its default stream.
        stream = getattr(self._model, "_default_stream", None) or torch.cuda.current_stream()
        ready = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ready.record(stream)
        return ready

    @guarded
    def _stop(self, start: Any) -> None:
        if start is None:
            return
        if isinstance(start, float):
            self.reporter.add_time("comm", start, time.perf_counter())
            return
        done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        done.record()  # after the reduction, on the stream it ran on
        self._last = (start, done)
        if not self._queued:
            # Runs when this backward pass is over (after FSDP's own final callback),
            # when the last reduction is known.
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._queued = True

    @guarded
    def _backward_done(self) -> None:
        self._queued = False
        last, self._last = self._last, None
        if last is not None:
            self.reporter.add_time("comm", last[0], last[1])


def watch_fsdp(reporter: StepReporter, model: Any) -> FsdpCommTimer | None:
    """Time ``model``'s gradient reduction into ``reporter``'s ``comm`` phase.

    ``model``: the root ``FullyShardedDataParallel`` module, before its first
    forward. Returns the timer (truthy), or None with one warning when ``model`` is
    not FSDP, uses a hybrid strategy, already has a comm hook, or is FSDP2.
    """
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        if isinstance(model, FSDPModule):
            log.warning("stepscope: watch_fsdp: FSDP2 (fully_shard) is not timed; no comm")
            return None
        if not isinstance(model, FullyShardedDataParallel):
            log.warning("stepscope: watch_fsdp: %s is not FSDP; no comm", type(model).__name__)
            return None
        group = model.process_group
        if group is None:
            log.warning("stepscope: watch_fsdp: the model has no process group; no comm")
            return None
        timer = FsdpCommTimer(reporter, model)
        model.register_comm_hook(default_hooks.DefaultState(group), timer.hook)
        return timer
    except Exception as err:  # not root, hybrid sharding, a hook already there
        log.warning("stepscope: watch_fsdp failed, no comm timing: %r", err)
        return None
