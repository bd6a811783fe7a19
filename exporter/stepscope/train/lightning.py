"""Lightning: ``Trainer(callbacks=[StepscopeCallback(job="...")])``.

One optimizer step is one reported step, whatever ``accumulate_grad_batches`` is:

- **data wait**: the time Lightning spends fetching each training batch. Lightning
  reports that fetch to its profiler (the ``train_dataloader_next`` action), so the
  callback puts a thin tap in front of the trainer's profiler for the run: it times
  that action and forwards every call, unchanged, to the profiler the user chose.
- **step**: from the first micro-batch's ``on_train_batch_start`` to the
  ``on_train_batch_end`` of the batch whose optimizer stepped
  (``on_before_optimizer_step`` ran), so forward, backward and the optimizer are in it.
  The time between steps (batch transfer, Lightning's own per-batch work, other
  callbacks, validation, checkpoints) is ``other``.
- **named spans**: checkpoint saves (``trainer.save_checkpoint``, which
  ``ModelCheckpoint`` calls, wrapped for the run) are ``checkpoint``; the validation loop
  (``on_validation_start`` to ``on_validation_end``) is ``evaluation``
  (``StepReporter.phase``), so a ``between_steps`` verdict names them.
- **comm**: DDP (``strategy="ddp"``) through ``StepReporter.watch_ddp``, FSDP
  (``strategy="fsdp"``) through :func:`stepscope.train.fsdp.watch_fsdp`.
- **tokens**: ``tokens_fn(batch)`` per micro-batch; by default the ``input_ids`` of a
  dict batch or an integer tensor's size (shapes only, never a device sync).
- **FLOPs**: ``flops_per_token``/``flops_per_step`` if given, else the module's
  ``flops_per_batch`` (Lightning's ``ThroughputMonitor`` convention) per micro-batch.

Rank, local rank and world size come from the trainer; precision from
``Trainer(precision=...)`` unless given. Nothing here raises into training: each hook
swallows its own errors and counts them in ``errors``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from stepscope.train._guard import guarded
from stepscope.train._span import (
    OptimizerStep,
    count_tokens,
    in_phase,
    precision_of,
    watch_comm,
)
from stepscope.train.reporter import StepReporter


def _lightning() -> Any:
    """``lightning.pytorch``, or the standalone ``pytorch_lightning`` package."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


Callback: Any = _lightning().Callback

# Lightning's name for the training batch fetch in its profiler
# (``[_TrainingEpochLoop].train_dataloader_next``).
_FETCH_ACTION = "train_dataloader_next"


class _ProfilerTap:
    """Stands in for the trainer's profiler: times the training batch fetch, forwards
    everything (calls and attributes) to the profiler underneath."""

    def __init__(self, inner: Any, owner: StepscopeCallback) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_fetch_start", None)

    def start(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            object.__setattr__(self, "_fetch_start", time.perf_counter())
        self._inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self._inner.stop(action_name)
        start = self._fetch_start
        if start is not None and action_name.endswith(_FETCH_ACTION):
            object.__setattr__(self, "_fetch_start", None)
            self._owner._data_wait(start, time.perf_counter())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class StepscopeCallback(Callback):  # type: ignore[misc]
    """Reports each optimizer step of a Lightning run to the node's stepscope exporter.

    ``job`` and the keyword arguments are :class:`StepReporter`'s (validated here, so
    a bad one raises at construction); ``rank``, ``local_rank``, ``world_size`` and
    ``precision`` default to the trainer's. ``tokens_fn(batch) -> int``: the tokens
    of one micro-batch on this rank.
    """

    def __init__(
        self,
        job: str,
        *,
        tokens_fn: Callable[[Any], int] | None = None,
        **reporter_kwargs: Any,
    ) -> None:
        super().__init__()
        StepReporter(job, **reporter_kwargs)  # raises on bad arguments, sends nothing
        self.job = job
        self.tokens_fn = tokens_fn if tokens_fn is not None else count_tokens
        self._kwargs = reporter_kwargs
        self.reporter: StepReporter | None = None
        self.errors = 0
        self._logged: set[str] = set()
        self._span: OptimizerStep | None = None
        self._stepped = False
        self._tap: _ProfilerTap | None = None
        self._comm: object = None
        self._unwrap_save: Callable[[], None] | None = None
        self._evaluating: Any = None  # the open evaluation span

    # -- Lightning hooks ------------------------------------------------------------

    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Creates the reporter for this rank and taps the profiler (fit only)."""
        if stage != "fit":
            return
        kwargs = {
            "rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "world_size": trainer.world_size,
            "precision": precision_of(trainer.precision),
            **self._kwargs,
        }
        self.reporter = StepReporter(self.job, **kwargs)
        self._span = OptimizerStep(self.reporter)
        self._tap = _ProfilerTap(trainer.profiler, self)
        trainer.profiler = self._tap
        self._unwrap_save = in_phase(trainer, "save_checkpoint", "checkpoint",
                                     lambda: self.reporter)  # fmt: skip

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Numbers the steps from the restored checkpoint's, and times the strategy's
        gradient communication (DDP or FSDP)."""
        if self.reporter is None:
            return
        if "start_step" not in self._kwargs and self.reporter.steps == 0:
            # restored after setup(): a resumed run carries on from the checkpoint's step
            self.reporter.resume_from(int(getattr(trainer, "global_step", 0) or 0))
        if trainer.world_size < 2:
            return
        self._comm = watch_comm(self.reporter, trainer.strategy.model)

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        """A micro-batch starts: the first of an optimizer step opens the step."""
        if self._span is None or self.reporter is None:
            return
        tokens = self._tokens(batch) or 0  # a failing count still reports the step
        flops = None
        if self.reporter.flops_per_token is None and self.reporter.flops_per_step is None:
            flops = getattr(pl_module, "flops_per_batch", None)
        self._stepped = False
        self._span.begin(tokens, None if flops is None else float(flops))

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """The optimizer steps in this batch: the step ends with it."""
        self._stepped = True

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """A micro-batch ended: the step closes if its optimizer stepped."""
        if self._span is not None:
            self._span.end(self._stepped)

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Validation between steps: an ``evaluation`` span (not the sanity check)."""
        if self.reporter is not None and not trainer.sanity_checking:
            self._evaluating = self.reporter.phase("evaluation")
            self._evaluating.__enter__()

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """The evaluation span ends (before ModelCheckpoint, always listed last, saves)."""
        span, self._evaluating = self._evaluating, None
        if span is not None:
            span.__exit__(None, None, None)

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """The open step failed: not reported, its time goes to the next step."""
        if self._span is not None:
            self._span.fail(exception)

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Gives the profiler back and sends what is queued."""
        if stage != "fit":
            return
        if self._tap is not None and trainer.profiler is self._tap:
            trainer.profiler = self._tap._inner
        self._tap = None
        if self._unwrap_save is not None:
            self._unwrap_save()
            self._unwrap_save = None
        if self.reporter is not None:
            self.reporter.close()

    # -- ours -----------------------------------------------------------------------

    @guarded
    def _tokens(self, batch: Any) -> int:
        return int(self.tokens_fn(batch))

    @guarded
    def _data_wait(self, start: float, end: float) -> None:
        if self.reporter is not None:
            self.reporter.add_time("data_wait", start, end)
