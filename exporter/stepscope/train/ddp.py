"""Exposed gradient communication of a torch DDP model: the comm hook behind
``StepReporter.watch_ddp`` and the bookkeeping it feeds (FSDP's is :mod:`.fsdp`).

The hook does what DDP does without one (divide each bucket by the group size,
all-reduce, average) and records when backward's last bucket was ready and when each
all-reduce completed; exposed comm = max(0, done - ready) per backward pass.

Standard library only at import, like the rest of ``stepscope.train``: torch is looked
up when a model is watched, and only if the script imported it.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from stepscope.train._env import loaded_torch

WarnOnce = Callable[..., None]  # (key, message, *args): logs a key's first warning


class ExposedComm:
    """Exposed-communication bookkeeping fed by the DDP comm hook.

    Per backward pass: ``ready`` is when the last bucket's gradients were ready
    (backward's own compute is over), ``done`` the latest all-reduce completion.
    Exposed = max(0, done - ready). On CUDA both are events, resolved with the step.
    The hook and its callbacks run in autograd and process-group threads, hence
    the lock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launched = 0
        self.completed = 0
        self.ready: float | None = None
        self.done = 0.0
        self.ready_event: Any = None
        self.done_events: list[Any] = []
        self.host_seconds = 0.0  # folded backward passes of the open step
        self.event_pairs: list[tuple[Any, list[Any]]] = []

    def fold(self) -> None:
        """Close one backward pass (all its buckets done). Caller holds the lock."""
        if self.ready_event is not None:
            self.event_pairs.append((self.ready_event, self.done_events))
            self.ready_event, self.done_events = None, []
        elif self.ready is not None:
            self.host_seconds += max(0.0, self.done - self.ready)
        self.ready, self.done = None, 0.0
        self.launched = self.completed = 0

    def take(self) -> tuple[float, list[tuple[Any, list[Any]]]]:
        """The open step's exposed comm (host seconds, CUDA event pairs); resets."""
        with self.lock:
            if self.launched and self.launched == self.completed:
                self.fold()
            seconds, pairs = self.host_seconds, self.event_pairs
            self.host_seconds, self.event_pairs = 0.0, []
            return seconds, pairs


def register_timed_allreduce(
    model: Any, comm: ExposedComm, event: Callable[[], Any], warn_once: WarnOnce
) -> Any:
    """Register the timed all-reduce hook on ``model``; the torch module when it was
    registered, else None after one warning (torch not imported, a model that is not
    ``DistributedDataParallel``, or one that already has a comm hook). ``event`` makes
    a timing CUDA event (None when the pool is spent). Never raises."""
    try:
        torch = loaded_torch()
        if torch is None:
            warn_once("ddp", "stepscope: watch_ddp: torch is not imported; no comm")
            return None
        ddp_type = importlib.import_module("torch.nn.parallel").DistributedDataParallel
        if not isinstance(model, ddp_type):
            warn_once(
                "ddp",
                "stepscope: watch_ddp: %s is not DistributedDataParallel; no comm",
                type(model).__name__,
            )
            return None
        if getattr(model, "_comm_hooks", None):
            warn_once("ddp", "stepscope: watch_ddp: the model already has a comm hook; no comm")
            return None
        hook = _timed_allreduce(comm, event, warn_once)
        model.register_comm_hook(state=model.process_group, hook=hook)
        return torch
    except Exception as err:
        warn_once("ddp", "stepscope: watch_ddp failed, no comm timing: %r", err)
        return None


def _timed_allreduce(
    comm: ExposedComm, event: Callable[[], Any], warn_once: WarnOnce
) -> Callable[[Any, Any], Any]:
    def timed(process_group: Any, bucket: Any) -> Any:
        """DDP's default all-reduce (divide, all-reduce, average), timed."""
        dist: Any = importlib.import_module("torch.distributed")
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())
        cuda = tensor.is_cuda
        try:
            is_last = bucket.is_last()
            with comm.lock:
                if comm.launched and comm.launched == comm.completed and bucket.index() == 0:
                    comm.fold()  # a second backward in the same step
                comm.launched += 1
                if is_last:
                    if cuda:
                        ev = event()  # None: pool spent, this pass untimed
                        if ev is not None:
                            ev.record()  # on the stream backward computed on
                        comm.ready_event = ev
                    else:
                        comm.ready = time.perf_counter()
        except Exception as err:
            warn_once("hook", "stepscope: comm hook timing failed: %r", err)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def finished(f: Any) -> Any:
            try:
                if cuda:
                    # Runs on a stream made to wait for the all-reduce: this event
                    # completes when the all-reduce has, on the GPU.
                    ev = event()
                    if ev is not None:
                        ev.record()
                    now = 0.0
                else:
                    now = time.perf_counter()
                with comm.lock:
                    if cuda:
                        if ev is not None:
                            comm.done_events.append(ev)
                    elif now > comm.done:
                        comm.done = now
                    comm.completed += 1
                    if comm.completed == comm.launched and (
                        comm.ready is not None or comm.ready_event is not None
                    ):
                        comm.fold()
            except Exception as err:
                warn_once("hook", "stepscope: comm hook timing failed: %r", err)
            return f.value()[0]  # an all-reduce error is DDP's to raise

        return fut.then(finished)

    # torch checks a hook's annotations (``bucket`` must be unannotated or GradBucket):
    # an unannotated lambda passes whatever this module's annotations say.
    hook: Callable[[Any, Any], Any] = lambda state, bucket: timed(state, bucket)  # noqa: E731
    hook.__name__ = hook.__qualname__ = "stepscope_allreduce_hook"
    return hook
