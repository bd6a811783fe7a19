"""The diagnosis thresholds: one frozen object, defaults documented in docs/diagnosis.md.
Which lost share beats which is :mod:`stepscope.diagnose.losses` over these lines.

Set in the config file under ``diagnosis:`` (or ``STEPSCOPE_DIAGNOSIS`` as YAML/JSON):

    diagnosis: {window: 60, input_share: 0.3}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepscope.core.yamltext import mapping_text
from stepscope.diagnose.fleet_rules import FLEET


@dataclass(frozen=True)
class Thresholds:
    """Every number a verdict rule compares against. Shares and ratios are 0-1."""

    window: float = 30.0  # seconds of snapshots a verdict looks back over
    min_steps: int = 3  # measured steps in the window before a rank gets a verdict
    input_share: float = 0.25  # data_wait share of step time: input is the bottleneck
    comm_share: float = 0.25  # exposed comm share of step time: communication
    # a GPU without a rank at/above this SM active computes (the fleet's number: the node
    # straggler alert counts a median node above it as working)
    sm_active_busy: float = FLEET.sm_active_busy
    idle_gpu_util: float = 5.0  # percent: a GPU below this (and idle SMs) is idle
    idle_sm_active: float = 0.05
    cpu_saturated: float = 0.85  # all-CPU busy share: no headroom for more workers
    worker_busy: float = 0.6  # cores per DataLoader worker: the workers are CPU-bound
    worker_blocked: float = 0.25  # cores per worker below which they wait (on I/O)
    io_pressure: float = 0.2  # PSI io "some" avg10 share: storage stalls
    iowait: float = 0.2  # share of CPU time in iowait
    fp32_active: float = 0.3  # FP32 pipe at/above this ...
    tensor_idle: float = 0.05  # ... with tensor pipes below this: fp32_no_tensor
    low_occupancy: float = 0.3  # SM occupancy below this while the SMs are busy
    # share of the window under thermal / power clock events: what the fleet's thermal and
    # power-cap alerts call throttled, over their own windows
    throttle_share: float = FLEET.throttle_share
    peer_excess: float = 0.5  # a peer computes longer by this share of our comm: waiting
    rdma_flat_bytes_per_second: float = 1e6  # RDMA traffic below this counts as flat
    # host_bound: the step body dominates while the SMs idle (below this) ...
    host_bound_sm_active: float = 0.3
    # ... and the rank's main process keeps a core busy (cores: Python + launches) ...
    main_cpu_busy: float = 0.7
    # ... unless kernels run all the time (util %, at/above this): small grids instead
    busy_gpu_util: float = 90.0
    # transfer_bound: PCIe receive (bytes/s) at/above this while the step body's SMs idle
    # (a pageable copy read 6.9 GB/s on the H200; launches alone move a few MB/s)
    h2d_bytes_per_second: float = 1e9
    # between_steps: step time outside the timed loader and body at/above this share,
    # and above the body's ...
    between_steps_share: float = 0.3
    # ... in at least this many of the window's sampling intervals (one interval: a
    # single save or evaluation now and then, not a habit the window can judge) ...
    between_steps_stalls: int = 2
    # ... naming a span (checkpoint, evaluation, logging) at/above this share of step time
    span_share: float = 0.1
    # ... and the GPU works in the time between steps that no span names (evaluation or
    # other GPU work outside the step: unnamed_gpu_work) when kernels run at least this
    # share of it, a lower bound from the window's GPU util (the timed steps counted busy)
    between_steps_gpu_busy: float = 0.5
    dram_busy: float = 0.45  # DRAM active at/above this with tensor pipes idle: memory_bound
    # PCIe replays: a storm (DCGM's health limit; the fleet's StepscopeGpuPcieReplayStorm)
    pcie_replays_per_minute: float = FLEET.pcie_replays_per_minute
    # fail-slow on the node (the fleet's numbers): a rank busy per step at/above this
    # multiple of the median of its group's other ranks on the node is a straggler ...
    straggler_ratio: float = FLEET.rank_straggler_ratio
    # ... and a GPU above this utilisation (%) whose SM clock is under this share of the
    # median of the node's other such GPUs (same model and power limit) lags
    clock_load_gpu_util: float = FLEET.clock_load_gpu_util
    clock_lag_ratio: float = FLEET.gpu_clock_lag_ratio
    fault_hold: float = 600.0  # seconds a critical XID keeps the fault verdict (no reset seen)
    finished_linger: float = 60.0  # seconds a finished rank reads `finished` before it drops


_RANGES: dict[str, tuple[float, float]] = {
    "window": (2.0, 3600.0),
    "min_steps": (1, 100000),
    "between_steps_stalls": (1, 100000),
    "idle_gpu_util": (0.0, 100.0),
    "peer_excess": (0.0, 100.0),
    "rdma_flat_bytes_per_second": (0.0, 1e12),
    "h2d_bytes_per_second": (0.0, 1e12),
    "main_cpu_busy": (0.0, 1024.0),
    "busy_gpu_util": (0.0, 100.0),
    "pcie_replays_per_minute": (0.0, 1e9),
    "straggler_ratio": (1.0, 100.0),
    "clock_load_gpu_util": (0.0, 100.0),
    # at least 10 minutes: a reset is not always visible, and a critical XID must not
    # scroll out of view with the window
    "fault_hold": (600.0, 604800.0),
    "finished_linger": (0.0, 3600.0),
}


_INTEGERS = frozenset({"min_steps", "between_steps_stalls"})


def parse_thresholds(value: Any) -> Thresholds:
    """A mapping of threshold name to number -> Thresholds; ValueError names the bad key."""
    if value is None:
        return Thresholds()
    if isinstance(value, Thresholds):
        return value
    if isinstance(value, str):
        value = mapping_text(value)
        if value is None:
            return Thresholds()
    if not isinstance(value, Mapping):
        raise ValueError("expected a mapping of threshold name to number")
    fields = {f.name: f for f in dataclasses.fields(Thresholds)}
    out: dict[str, Any] = {}
    for key, raw in value.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise ValueError(f"unknown threshold {key!r} (known: {', '.join(fields)})")
        if isinstance(raw, bool):
            raise ValueError(f"{name}: expected a number, got {raw!r}")
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {raw!r}") from None
        lo, hi = _RANGES.get(name, (0.0, 1.0))
        if not (math.isfinite(number) and lo <= number <= hi):
            raise ValueError(f"{name}: must be between {lo:g} and {hi:g}, got {raw!r}")
        out[name] = int(number) if name in _INTEGERS else number
    return Thresholds(**out)
