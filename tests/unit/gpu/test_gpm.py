"""GPM against a fake NVML: samples, the profiling metrics between them, their tiers,
scales and clamps."""

from __future__ import annotations

import math

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.gpu.fields import FIELDS_BY_KEY, PROFILING_KEYS, SLOW_KEYS
from stepscope.gpu.gpm import GPM_METRICS
from stepscope.gpu.model import Tier
from tests.support.clocks import ManualClock
from tests.support.fake_nvml import (
    BOTH,
    FAST,
    FakeGpu,
    backend_for,
)

pytestmark = pytest.mark.usefixtures("nvml_path")  # each test through both paths



def gpm_gpu(**values: float) -> FakeGpu:
    return FakeGpu(gpm_values={getattr(pynvml, f"NVML_GPM_METRIC_{k}"): v
                               for k, v in values.items()})


def test_gpm_unsupported_gives_no_profiling_keys() -> None:
    clock = ManualClock()
    backend, fake = backend_for(FakeGpu(gpm=False), clock=clock)
    assert backend.devices()[0].profiling_supported is False
    for _ in range(3):
        clock.t += 1
        assert not PROFILING_KEYS & backend.read(0, FAST).values.keys()
    assert fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_metrics_are_scaled_to_dcgm_units_and_ratios_clamped() -> None:
    clock = ManualClock()
    gpu = gpm_gpu(SM_UTIL=42.0, ANY_TENSOR_UTIL=104.0, HMMA_TENSOR_UTIL=-0.5,
                  PCIE_TX_PER_SEC=2.0, NVLINK_TOTAL_RX_PER_SEC=1.5)
    gpu.gpm_errors = {pynvml.NVML_GPM_METRIC_FP16_UTIL: pynvml.NVML_ERROR_NOT_SUPPORTED}
    backend, fake = backend_for(gpu, clock=clock)
    clock.t += 1.0
    v = backend.read(0, FAST).values
    assert v["sm_active"] == pytest.approx(0.42)
    assert v["pipe_tensor_active"] == 1.0
    assert v["pipe_tensor_hmma_active"] == 0.0
    assert v["pcie_tx_bytes"] == 2 * 2**20
    assert v["nvlink_rx_bytes"] == 1.5 * 2**20
    assert "pipe_fp16_active" not in v
    assert PROFILING_KEYS - SLOW_KEYS - {"pipe_fp16_active"} <= v.keys()
    assert "gr_engine_active" not in v  # costly on real GPUs: slow tier only
    assert fake.metric_pairs == [(1, 2)]  # sample1 is the older sample
    clock.t += 1.0
    backend.read(0, FAST)
    assert fake.metric_pairs == [(1, 2), (2, 3)]  # buffers swapped: the newest is the base


def test_gpm_keeps_previous_values_when_samples_are_too_close() -> None:
    clock = ManualClock()
    gpu = gpm_gpu(SM_UTIL=60.0)
    backend, fake = backend_for(gpu, clock=clock)
    clock.t += 0.05  # first read right after start: nothing to compute from yet
    assert "sm_active" not in backend.read(0, FAST).values
    assert fake.calls["nvmlGpmSampleGet"] == 1  # only the baseline
    clock.t += 1.0
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.6)
    gpu.gpm_values[pynvml.NVML_GPM_METRIC_SM_UTIL] = 10.0
    clock.t += 0.05
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.6)
    assert fake.calls["nvmlGpmSampleGet"] == 2
    clock.t += 0.2
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.1)


def test_gpm_metric_on_the_slow_tier_is_computed_only_on_slow_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GRAPHICS_UTIL costs ~1.4 ms CPU per computation on an H200: if the field table
    # puts gr_engine_active on the SLOW tier, the backend must follow it.
    from stepscope.gpu import gpm

    graphics = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    key, scale, ratio, _ = gpm._GPM_KEYS[graphics]
    monkeypatch.setitem(gpm._GPM_KEYS, graphics, (key, scale, ratio, Tier.SLOW))
    clock = ManualClock()
    backend, fake = backend_for(gpm_gpu(GRAPHICS_UTIL=80.0, SM_UTIL=70.0), clock=clock)
    clock.t += 1
    fast = backend.read(0, FAST).values
    assert "gr_engine_active" not in fast and fast["sm_active"] == pytest.approx(0.7)
    assert graphics not in fake.metric_requests[-1]
    clock.t += 1
    both = backend.read(0, BOTH).values
    assert both["gr_engine_active"] == pytest.approx(0.8)
    assert both["sm_active"] == pytest.approx(0.7)
    clock.t += 1
    slow = backend.read(0, frozenset({Tier.SLOW})).values
    assert fake.metric_requests[-1] == [graphics]
    assert slow["gr_engine_active"] == pytest.approx(0.8) and "sm_active" not in slow


def test_slow_tier_profiling_keys_are_computed_only_on_slow_reads() -> None:
    clock = ManualClock()
    backend, _ = backend_for(gpm_gpu(SM_UTIL=70.0), clock=clock)
    clock.t += 1
    slow = backend.read(0, frozenset({Tier.SLOW})).values
    assert PROFILING_KEYS & slow.keys() == PROFILING_KEYS & SLOW_KEYS == {"gr_engine_active"}
    clock.t += 1
    fast = backend.read(0, FAST).values
    assert "gr_engine_active" not in fast and fast["sm_active"] == pytest.approx(0.7)


def test_gpm_skipped_on_mig_enabled_gpus() -> None:
    clock = ManualClock()
    backend, fake = backend_for(FakeGpu(mig=pynvml.NVML_DEVICE_MIG_ENABLE), clock=clock)
    gpu = backend.devices()[0]
    assert (gpu.mig_mode, gpu.profiling_supported) == ("enabled", False)
    clock.t += 1
    assert not PROFILING_KEYS & backend.read(0, FAST).values.keys()
    assert fake.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_not_permitted_at_start_means_no_profiling_and_nothing_leaked() -> None:
    gpu = FakeGpu(fail={"nvmlGpmSampleGet": pynvml.NVML_ERROR_NO_PERMISSION})
    backend, fake = backend_for(gpu)
    assert backend.devices()[0].profiling_supported is False
    assert fake.samples_live == set()
    assert backend.read(0, FAST).errors == 0



# GPM answers: finite, NaN and infinite, negative and above 100 %, as a driver can give.
_GPM_VALUES = st.one_of(
    st.floats(min_value=-10.0, max_value=200.0),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 100.0, 1e300]),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_GPM_VALUES, min_size=len(GPM_METRICS), max_size=len(GPM_METRICS)),
       failing=st.sets(st.sampled_from([m for m, _, _ in GPM_METRICS]), max_size=2))
def test_gpm_values_are_scaled_clamped_and_non_finite_ones_left_out(
    values: list[float], failing: set[int],
) -> None:
    # What a reader of docs/metrics.md expects, computed the plain way: a metric that
    # failed or is not finite is absent; the rest are scaled; ratios are clamped to 0-1.
    gpu = FakeGpu(gpm_values={m: v for (m, _, _), v in zip(GPM_METRICS, values, strict=True)},
                  gpm_errors=dict.fromkeys(failing, pynvml.NVML_ERROR_UNKNOWN))
    clock = ManualClock()
    backend, _ = backend_for(gpu, clock=clock)
    clock.t += 1
    got = backend.read(0, BOTH).values
    expected = {}
    for (metric_id, key, scale), value in zip(GPM_METRICS, values, strict=True):
        if metric_id in failing or not math.isfinite(value):
            continue
        value *= scale
        if FIELDS_BY_KEY[key].unit == "ratio":
            value = min(max(value, 0.0), 1.0)
        expected[key] = value
    assert {k: got[k] for k in PROFILING_KEYS & got.keys()} == expected
    for key in expected:  # the same float, not merely a close one (-0.0 stays -0.0)
        assert math.copysign(1.0, got[key]) == math.copysign(1.0, expected[key])


def test_gpm_metric_ids_of_the_field_table_are_pynvmls() -> None:
    # gpu/fields.py holds the ids as numbers (it must not import pynvml).
    names = {
        "gr_engine_active": "GRAPHICS_UTIL", "sm_active": "SM_UTIL",
        "sm_occupancy": "SM_OCCUPANCY", "pipe_tensor_active": "ANY_TENSOR_UTIL",
        "pipe_tensor_dfma_active": "DFMA_TENSOR_UTIL",
        "pipe_tensor_hmma_active": "HMMA_TENSOR_UTIL",
        "pipe_tensor_imma_active": "IMMA_TENSOR_UTIL", "dram_active": "DRAM_BW_UTIL",
        "pipe_fp64_active": "FP64_UTIL", "pipe_fp32_active": "FP32_UTIL",
        "pipe_fp16_active": "FP16_UTIL", "pcie_tx_bytes": "PCIE_TX_PER_SEC",
        "pcie_rx_bytes": "PCIE_RX_PER_SEC", "nvlink_rx_bytes": "NVLINK_TOTAL_RX_PER_SEC",
        "nvlink_tx_bytes": "NVLINK_TOTAL_TX_PER_SEC",
    }
    assert {key: metric_id for metric_id, key, _ in GPM_METRICS} == {
        key: getattr(pynvml, f"NVML_GPM_METRIC_{name}") for key, name in names.items()}


