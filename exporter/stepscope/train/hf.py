"""Hugging Face Trainer: ``StepscopeCallback.attach(trainer, job="...")``.

One optimizer step (``gradient_accumulation_steps`` micro-batches) is one reported
step:

- **data wait**: the Trainer fetches all micro-batches of an optimizer step in
  ``Trainer.get_batch_samples`` before the step begins; ``attach`` wraps that method
  on this trainer so each ``next()`` on the epoch iterator goes through
  ``StepReporter.timed`` (exact: the time blocked in the loader). The wrapper also
  counts the batches' tokens, which a ``TrainerCallback`` never sees.
- **step**: ``on_step_begin`` to ``on_step_end``: forward and backward of every
  micro-batch, gradient clipping, the optimizer and scheduler. Logging, evaluation
  and checkpoints run after ``on_step_end`` and are ``other``.
- **named spans**: ``attach`` wraps this trainer's ``_save_checkpoint``, ``evaluate``
  and ``log`` so their time between steps is the ``checkpoint``, ``evaluation`` and
  ``logging`` span (``StepReporter.phase``; a callback's ``on_save``/``on_evaluate``
  only say when they ended), so a ``between_steps`` verdict names them.
- **comm**: the model the Trainer wrapped (``trainer.model_wrapped``): DDP through
  ``StepReporter.watch_ddp``, FSDP through :func:`stepscope.train.fsdp.watch_fsdp`.
- **tokens**: the ``input_ids`` size of each micro-batch (shapes only, padding
  included), or ``tokens_fn(batch)``.
- **FLOPs**: ``flops_per_token``/``flops_per_step`` if given; else, for a model with a
  transformer config (``num_hidden_layers``, ``num_attention_heads``,
  ``hidden_size``), ``transformer_flops_per_token`` with the model's non-embedding
  parameter count and each batch's sequence length.

Rank, local rank, world size and precision come from the ``TrainingArguments``. The
Trainer has no exception callback: a step whose body raised is closed as failed when
``train()`` is called again. Nothing here raises into training; our own failures are
counted in ``errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from transformers import TrainerCallback

from stepscope.train._guard import guarded
from stepscope.train._span import OptimizerStep, count_tokens, in_phase, watch_comm
from stepscope.train.flops import transformer_flops_per_token
from stepscope.train.reporter import StepReporter


def _precision(args: Any) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "tf32" if getattr(args, "tf32", False) else "fp32"


def transformer_shape(model: Any) -> tuple[int, int, int, int] | None:
    """``(N, L, H, Q)`` of a transformers model for ``transformer_flops_per_token``:
    non-embedding parameters, layers, heads, head dimension; None when its config
    does not describe a transformer. Read before FSDP shards the parameters."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    count = getattr(model, "num_parameters", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0
            and isinstance(hidden, int) and callable(count)):
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return int(count(exclude_embeddings=True)), layers, heads, int(head_dim)


# (Trainer method, span): what the Trainer does between steps, each a named span
_SPAN_METHODS = (("_save_checkpoint", "checkpoint"), ("evaluate", "evaluation"),
                 ("log", "logging"))  # fmt: skip


class StepscopeCallback(TrainerCallback):
    """Reports each optimizer step of a ``transformers.Trainer`` run to the node's
    stepscope exporter. Create it with :meth:`attach`."""

    def __init__(self, trainer: Any, job: str, *,
                 tokens_fn: Callable[[Any], int] | None = None,
                 **reporter_kwargs: Any) -> None:
        StepReporter(job, **reporter_kwargs)  # raises on bad arguments, sends nothing
        self.job = job
        self.tokens_fn = tokens_fn if tokens_fn is not None else count_tokens
        self.reporter: StepReporter | None = None
        self.errors = 0
        self._logged: set[str] = set()
        self._trainer = trainer
        self._kwargs = reporter_kwargs
        self._span: OptimizerStep | None = None
        self._tokens = 0
        self._flops: float | None = None
        # counted now, while the model is whole (FSDP shards it when training starts)
        self._shape: tuple[int, int, int, int] | None = None
        try:
            self._shape = transformer_shape(trainer.model)
        except Exception:  # a model we cannot read: no FLOPs, training goes on
            self._shape = None

    @classmethod
    def attach(cls, trainer: Any, job: str, *,
               tokens_fn: Callable[[Any], int] | None = None,
               **reporter_kwargs: Any) -> StepscopeCallback:
        """Add the callback to ``trainer`` and time its batch fetches.

        ``job`` and the keyword arguments are :class:`StepReporter`'s (validated here);
        ``rank``, ``local_rank``, ``world_size`` and ``precision`` default to the
        ``TrainingArguments``'. Call before ``trainer.train()``.
        """
        cb = cls(trainer, job, tokens_fn=tokens_fn, **reporter_kwargs)
        trainer.add_callback(cb)
        original = trainer.get_batch_samples

        def get_batch_samples(epoch_iterator: Iterator[Any], num_batches: int,
                              device: Any) -> Any:
            timed = cb._timed(epoch_iterator)
            batches, items = original(timed if timed is not None else epoch_iterator,
                                      num_batches, device)
            cb._count(batches)
            return batches, items

        trainer.get_batch_samples = get_batch_samples
        # the Trainer's own methods for what it does between steps (private
        # _save_checkpoint since transformers 4.x; absent ones are left alone)
        for method, span in _SPAN_METHODS:
            in_phase(trainer, method, span, lambda: cb.reporter)
        return cb

    # -- Trainer events -------------------------------------------------------------

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Creates this rank's reporter and times the wrapped model's communication."""
        if self._span is not None and self._span.open:  # the last train() raised
            self._span.fail(RuntimeError("training step did not finish"))
        options = {
            "rank": args.process_index,
            "local_rank": args.local_process_index,
            "world_size": args.world_size,
            "precision": _precision(args),
            # a resumed run's steps carry on from the checkpoint's (so the exporter can
            # tell the steps a restart does again)
            "start_step": int(getattr(state, "global_step", 0) or 0),
            **self._kwargs,
        }
        self.reporter = StepReporter(self.job, **options)
        self._span = OptimizerStep(self.reporter)
        if args.world_size > 1:
            watch_comm(self.reporter, self._trainer.model_wrapped)

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step starts, its micro-batches already fetched."""
        if self._span is not None:
            self._span.begin(self._tokens, self._flops)
        self._tokens, self._flops = 0, None

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer stepped: the step is over."""
        if self._span is not None:
            self._span.end(True)

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Sends what is queued."""
        if self.reporter is not None:
            self.reporter.close()

    # -- ours -----------------------------------------------------------------------

    @guarded
    def _timed(self, iterator: Iterator[Any]) -> Iterator[Any] | None:
        return None if self.reporter is None else self.reporter.timed(iterator)

    @guarded
    def _count(self, batches: list[Any]) -> None:
        reporter = self.reporter
        explicit = reporter is not None and (
            reporter.flops_per_token is not None or reporter.flops_per_step is not None)
        for batch in batches:
            tokens = int(self.tokens_fn(batch))
            self._tokens += tokens
            if explicit:
                continue
            fpt = self._flops_per_token(batch)
            if fpt is not None:
                self._flops = (self._flops or 0.0) + fpt * tokens

    def _flops_per_token(self, batch: Any) -> float | None:
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        shape = getattr(ids, "shape", None)
        if self._shape is None or not shape:
            return None
        return transformer_flops_per_token(*self._shape, int(shape[-1]))
