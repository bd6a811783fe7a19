"""Field-value reads against a fake NVML: one batch per tier, unsupported field ids
dropped, the violation counters and their fallback."""

from __future__ import annotations

import pynvml
import pytest

from stepscope.gpu.field_reads import FAST_FIELD_IDS, SLOW_FIELD_IDS
from stepscope.gpu.model import GpuUnavailable, Tier
from tests.support.clocks import ManualClock
from tests.support.fake_nvml import (
    BOARD_LIMIT,
    BOTH,
    DOUBLE,
    FAST,
    HW_THERM,
    POWER_BRAKE,
    SW_POWER,
    SW_THERM,
    SYNC_BOOST,
    UINT,
    FakeGpu,
    backend_for,
    default_fields,
)

pytestmark = pytest.mark.usefixtures("nvml_path")  # each test through both paths


def test_lost_gpu_reported_inside_field_values_reads_down() -> None:
    gpu = FakeGpu(field_errors={pynvml.NVML_FI_DEV_MEMORY_TEMP: pynvml.NVML_ERROR_GPU_IS_LOST})
    backend, _ = backend_for(gpu)
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)



def test_unsupported_field_ids_are_dropped_from_the_batch() -> None:
    fields = default_fields()
    del fields[pynvml.NVML_FI_DEV_MEMORY_TEMP]
    gpu = FakeGpu(fields=fields,
                  field_errors={pynvml.NVML_FI_DEV_REMAPPED_COR: pynvml.NVML_ERROR_NO_DATA})
    backend, fake = backend_for(gpu)
    first = backend.read(0, FAST)
    second = backend.read(0, FAST)
    assert "memory_temp" not in second.values
    assert "correctable_remapped_rows" not in second.values
    assert first.errors == second.errors == 1  # the transient per-field error
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP in fake.field_requests[0]
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP not in fake.field_requests[1]
    assert pynvml.NVML_FI_DEV_REMAPPED_COR in fake.field_requests[1]  # retried


def test_violation_counters_fall_back_where_field_ids_are_unsupported() -> None:
    fields = default_fields()
    for fid in (SW_THERM, HW_THERM, POWER_BRAKE):  # an older driver: no clock-event fields
        del fields[fid]
    gpu = FakeGpu(fields=fields, violations={pynvml.NVML_PERF_POLICY_THERMAL: 9_000})
    backend, fake = backend_for(gpu)
    for _ in range(2):
        v = backend.read(0, BOTH).values
        assert v["thermal_violation"] == 9_000  # nvmlDeviceGetViolationStatus(THERMAL)
        assert v["power_violation"] == 5_000_000_000  # still from its field id
        assert "clock_event_ns.sw_thermal_slowdown" not in v
        assert v["clock_event_ns.sw_power_cap"] == 5_000_000_000
    assert fake.calls[f"nvmlDeviceGetViolationStatus:{pynvml.NVML_PERF_POLICY_THERMAL}"] == 2
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # only the thermal fallback
    assert SW_THERM not in fake.field_requests[-1]  # not asked again


def test_violation_fallback_that_is_unsupported_too_is_not_retried() -> None:
    backend, fake = backend_for(FakeGpu(fields={}))  # no field id works, no policy either
    for _ in range(3):
        reading = backend.read(0, frozenset({Tier.SLOW}))
        assert reading.errors == 0
        assert not {"thermal_violation", "power_violation"} & reading.values.keys()
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 4  # four policies, once each


def test_field_values_call_unsupported_falls_back_for_every_violation() -> None:
    policies = {pynvml.NVML_PERF_POLICY_POWER: 1, pynvml.NVML_PERF_POLICY_THERMAL: 2,
                pynvml.NVML_PERF_POLICY_SYNC_BOOST: 3, pynvml.NVML_PERF_POLICY_BOARD_LIMIT: 4}
    gpu = FakeGpu(fail={"nvmlDeviceGetFieldValues": pynvml.NVML_ERROR_NOT_SUPPORTED},
                  violations=policies)
    backend, fake = backend_for(gpu)
    backend.read(0, BOTH)
    v = backend.read(0, BOTH).values
    assert (v["power_violation"], v["thermal_violation"]) == (1, 2)
    assert (v["sync_boost_violation"], v["board_limit_violation"]) == (3, 4)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 3  # once per batch (FAST, SLOW, NVLink)



def test_an_unsupported_field_values_call_does_not_count_as_an_answer() -> None:
    # With its batch emptied, a GPU whose every call says "unknown" still reads down.
    gpu = FakeGpu(fail={"nvmlDeviceGetFieldValues": pynvml.NVML_ERROR_NOT_SUPPORTED})
    backend, fake = backend_for(gpu, clock=(clock := ManualClock()))
    assert backend.read(0, FAST).errors == 0
    unknown = pynvml.NVML_ERROR_UNKNOWN
    gpu.fail.update({name: unknown for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlGpmSampleGet")})
    clock.t += 1
    with pytest.raises(GpuUnavailable, match="Unknown"):
        backend.read(0, FAST)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # once, then never


def test_a_field_value_that_changes_is_read_anew() -> None:
    gpu = FakeGpu()
    backend, _ = backend_for(gpu)
    assert [backend.read(0, FAST).values["memory_temp"] for _ in range(2)] == [41, 41]
    gpu.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (UINT, 44)
    assert backend.read(0, FAST).values["memory_temp"] == 44
    gpu.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (DOUBLE, 45.5)  # another value type
    assert backend.read(0, FAST).values["memory_temp"] == 45.5
    assert backend.read(0, FAST).values["memory_temp"] == 45.5


def test_field_ids_read_are_pynvmls_named_field_ids() -> None:
    by_key = {key: fid for fid, key in FAST_FIELD_IDS + SLOW_FIELD_IDS}
    assert by_key == {
        "memory_temp": pynvml.NVML_FI_DEV_MEMORY_TEMP,
        "ecc_sbe_vol_total": pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        "ecc_dbe_vol_total": pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        "ecc_sbe_agg_total": pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        "ecc_dbe_agg_total": pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        "correctable_remapped_rows": pynvml.NVML_FI_DEV_REMAPPED_COR,
        "uncorrectable_remapped_rows": pynvml.NVML_FI_DEV_REMAPPED_UNC,
        "row_remap_pending": pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        "row_remap_failure": pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        "clock_event_ns.sw_power_cap": SW_POWER,
        "clock_event_ns.sync_boost": SYNC_BOOST,
        "clock_event_ns.sw_thermal_slowdown": SW_THERM,
        "clock_event_ns.hw_thermal_slowdown": HW_THERM,
        "clock_event_ns.hw_power_brake_slowdown": POWER_BRAKE,
        "board_limit_violation": BOARD_LIMIT,
        "pcie_replay": pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    }

