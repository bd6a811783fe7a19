"""NvmlBackend on a real NVIDIA GPU (skipped where there is no driver).

Run on a GPU machine with ``pytest -m gpu tests/unit/gpu/test_nvml_real.py -s`` (``-s``
prints the readings, evidence for docs/validation/).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from stepscope.gpu import pynvml_compat
from stepscope.gpu.fields import FIELDS_BY_KEY, PROFILING_KEYS
from stepscope.gpu.getters import CALLS, GetterSpec
from stepscope.gpu.model import NoDriverError, Tier
from stepscope.gpu.nvml_backend import NvmlBackend

pytestmark = pytest.mark.gpu

FAST = frozenset({Tier.FAST})
SLOW = frozenset({Tier.SLOW})

# Keys every datacenter GPU (A100, H100, H200) answers.
FAST_KEYS = {"gpu_util", "mem_copy_util", "sm_clock", "mem_clock", "gpu_temp", "power_usage",
             "fb_used", "fb_free", "clocks_event_reasons", "ecc_dbe_vol_total"}
SLOW_EXPECTED = {"total_energy", "power_violation", "thermal_violation",
                 "sync_boost_violation", "board_limit_violation", "pcie_replay"}


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    try:
        nvml = NvmlBackend()
    except NoDriverError as exc:
        pytest.skip(str(exc))
    yield nvml
    nvml.close()


def test_every_gpu_is_listed_with_its_identity(backend: NvmlBackend) -> None:
    gpus = backend.devices()
    assert gpus
    for gpu in gpus:
        print(gpu)
        assert gpu.uuid.startswith("GPU-")
        assert gpu.name
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", gpu.pci_bus_id, re.I)
        assert gpu.driver_version
        assert gpu.memory_total_mib and gpu.memory_total_mib > 0
        assert gpu.mig_mode in {"enabled", "disabled", "unsupported"}


def test_every_per_read_call_goes_straight_to_the_driver(backend: NvmlBackend) -> None:
    # A symbol that does not resolve falls back to pynvml's wrapper: correct, but it
    # costs about as much again as the call (see benchmarks/nvml_call_cost.py).
    symbols = [spec.symbols if isinstance(spec, GetterSpec) else (spec.symbol,)
               for spec in CALLS[Tier.FAST] + CALLS[Tier.SLOW]]
    symbols.append(("nvmlDeviceGetFieldValues",))
    if any(gpu.profiling_supported for gpu in backend.devices()):
        symbols += [("nvmlGpmSampleGet",), ("nvmlGpmMetricsGet",)]
    nvml = pynvml_compat.pynvml
    assert [s for s in symbols if pynvml_compat.resolve(nvml, *s) is None] == []


def test_fast_and_slow_tiers_read_their_keys(backend: NvmlBackend) -> None:
    for gpu in backend.devices():
        fast = backend.read(gpu.index, FAST)
        slow = backend.read(gpu.index, SLOW)
        print(gpu.index, "FAST", dict(fast.values), "errors", fast.errors)
        print(gpu.index, "SLOW", dict(slow.values), "errors", slow.errors)
        assert fast.errors == 0 and slow.errors == 0
        assert fast.values.keys() >= FAST_KEYS
        assert slow.values.keys() >= SLOW_EXPECTED
        assert not slow.values.keys() & FAST_KEYS
        assert not fast.values.keys() & SLOW_EXPECTED
        assert 0 <= fast.values["gpu_util"] <= 100
        assert gpu.memory_total_mib is not None
        assert fast.values["fb_used"] + fast.values["fb_free"] <= gpu.memory_total_mib + 1
        assert 0 < fast.values["power_usage"] < 2000  # W, not mW
        assert slow.values["total_energy"] > 0


def test_profiling_ratios_from_two_reads_apart(backend: NvmlBackend) -> None:
    profiled = [gpu for gpu in backend.devices() if gpu.profiling_supported]
    if not profiled:
        pytest.skip("no GPU here supports GPM")
    for gpu in profiled:
        backend.read(gpu.index, FAST)
        time.sleep(0.2)  # GPM computes over the window between two samples
        values = backend.read(gpu.index, FAST).values
        print(gpu.index, {k: values[k] for k in sorted(PROFILING_KEYS & values.keys())})
        assert 0.0 <= values["sm_active"] <= 1.0
        for key in PROFILING_KEYS & values.keys():
            if FIELDS_BY_KEY[key].unit == "ratio":
                assert 0.0 <= values[key] <= 1.0, key
            else:
                assert values[key] >= 0.0, key


def test_xid_drain_returns_promptly(backend: NvmlBackend) -> None:
    started = time.monotonic()
    events = backend.events()
    assert time.monotonic() - started < 0.5
    assert all(0 <= e.index < len(backend.devices()) for e in events)


def test_memory_splits_out_the_reserved_part_and_utilisations_are_percentages(
    backend: NvmlBackend,
) -> None:
    for gpu in backend.devices():
        v = backend.read(gpu.index, FAST).values
        print(gpu.index, {k: v.get(k) for k in ("fb_used", "fb_free", "fb_reserved",
                                                "enc_util", "dec_util")})
        assert gpu.memory_total_mib is not None and v["fb_reserved"] > 0
        assert abs(v["fb_used"] + v["fb_free"] + v["fb_reserved"] - gpu.memory_total_mib) <= 1
        for key in ("enc_util", "dec_util"):
            assert key not in v or 0 <= v[key] <= 100, key
        slow = backend.read(gpu.index, SLOW).values
        assert slow.get("vgpu_license_status", 0) in (0, 1)
