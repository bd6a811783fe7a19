"""A real Sampler, built as ``stepscope serve`` builds one."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def make_sampler(
    backend: Any,
    *,
    hostname: str = "node-a",
    interval: float = 1.0,
    slow_interval: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sources: Sequence[Any] = (),
    analyses: Sequence[Any] = (),
) -> Any:
    """A real Sampler over ``backend``'s GPUs plus ``sources`` (registered after the GPU
    source, in order) and ``analyses``, as ``stepscope serve`` builds one."""
    from stepscope.core.registry import Registry
    from stepscope.core.sampler import Sampler, SamplerSettings
    from stepscope.gpu.source import GpuSource

    registry = Registry()
    registry.register(GpuSource(backend))
    for source in sources:
        registry.register(source)
    for analysis in analyses:
        registry.register_analysis(analysis)
    return Sampler(
        registry,
        SamplerSettings(hostname, interval, slow_interval),
        clock=clock,
        wall_clock=wall_clock,
        build_labels={"backend": backend.name},
    )
