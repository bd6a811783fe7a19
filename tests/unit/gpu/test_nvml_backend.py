"""NvmlBackend against a fake NVML (tests/support/fake_nvml.py): no driver, the devices,
and what a read gives, through the C functions and through pynvml's wrappers."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pynvml
import pytest

from stepscope.gpu.fields import CLOCK_EVENT_DURATION_KEYS, PROFILING_KEYS, SLOW_KEYS
from stepscope.gpu.model import GpuUnavailable, NoDriverError, Tier
from stepscope.gpu.nvml_backend import NvmlBackend
from tests.support.clocks import ManualClock
from tests.support.fake_nvml import (
    BOTH,
    FAST,
    FakeGpu,
    FakeNvml,
    backend_for,
    nvml_error,
)

pytestmark = pytest.mark.usefixtures("nvml_path")  # each test through both paths


# ---------------------------------------------------------------- no driver


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, r"libnvidia-ml\.so\.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_no_driver_raises_no_driver_error_naming_the_cause(code: int, cause: str) -> None:
    fake = FakeNvml([FakeGpu()], init_error=code)
    with pytest.raises(NoDriverError, match=cause) as info:
        NvmlBackend(fake)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_real_pynvml_without_a_driver_raises_no_driver_error() -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoDriverError, match=r"libnvidia-ml\.so\.1 not found"):
        NvmlBackend()


def test_pynvml_not_installed_raises_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # `stepscope serve` imports the backend where it handles NoDriverError: one line.
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    for module in ("stepscope.gpu.nvml_backend", "stepscope.gpu.pynvml_compat"):
        monkeypatch.delitem(sys.modules, module)  # restored after the test
    with pytest.raises(NoDriverError, match="nvidia-ml-py"):
        importlib.import_module("stepscope.gpu.nvml_backend")


# ---------------------------------------------------------------- devices


def test_devices_report_static_facts_in_dcgm_form() -> None:
    backend, _ = backend_for(FakeGpu(), FakeGpu(uuid="GPU-1", bus_id="00000000:2A:00.0", mig=0))
    gpu0, gpu1 = backend.devices()
    assert (gpu0.index, gpu0.uuid, gpu0.name) == (0, FakeGpu().uuid, "NVIDIA H200")
    assert gpu0.pci_bus_id == "00000000:18:00.0"
    assert gpu0.driver_version == "570.86.15"
    assert gpu0.serial == "1654923012345"
    assert gpu0.vbios_version == "96.00.99.00.01"
    assert gpu0.memory_total_mib == 143771
    assert gpu0.profiling_supported is True
    assert gpu0.mig_mode == "unsupported"
    assert gpu0.device == "nvidia0"
    assert (gpu1.index, gpu1.uuid, gpu1.pci_bus_id, gpu1.mig_mode) == (
        1, "GPU-1", "00000000:2A:00.0", "disabled")


def test_gpu_without_handle_at_start_is_listed_and_reads_down() -> None:
    broken = FakeGpu(fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_UNKNOWN})
    backend, _ = backend_for(broken, FakeGpu(uuid="GPU-1"))
    gpu0, gpu1 = backend.devices()
    assert (gpu0.index, gpu0.uuid) == (0, "")
    assert gpu1.uuid == "GPU-1"
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)
    assert backend.read(1, FAST).values["gpu_util"] == 97


def test_unsupported_static_fact_leaves_the_gpu_up() -> None:
    backend, _ = backend_for(FakeGpu(fail={"nvmlDeviceGetSerial": pynvml.NVML_ERROR_NOT_SUPPORTED}))
    (gpu,) = backend.devices()
    assert gpu.serial == ""
    assert backend.read(0, FAST).values["gpu_util"] == 97


# ---------------------------------------------------------------- reads


def test_fast_read_fills_every_fast_key_with_dcgm_units() -> None:
    backend, _ = backend_for(FakeGpu())
    reading = backend.read(0, FAST)
    v = reading.values
    assert reading.errors == 0
    assert (v["gpu_util"], v["mem_copy_util"]) == (97, 35)
    assert (v["sm_clock"], v["mem_clock"], v["gpu_temp"]) == (1980, 3201, 52)
    assert v["power_usage"] == pytest.approx(612.345)
    assert (v["fb_used"], v["fb_free"], v["fb_reserved"]) == (1024, 142196, 551)
    assert (v["enc_util"], v["dec_util"]) == (0, 0)
    assert v["clocks_event_reasons"] == 0x4
    assert v["memory_temp"] == 41
    assert v["ecc_sbe_agg_total"] == 2**40 + 7
    assert (v["ecc_sbe_vol_total"], v["ecc_dbe_vol_total"], v["ecc_dbe_agg_total"]) == (3, 0, 1)
    assert (v["correctable_remapped_rows"], v["uncorrectable_remapped_rows"]) == (2, 0)
    assert (v["row_remap_pending"], v["row_remap_failure"]) == (0, 0)
    assert not SLOW_KEYS & v.keys()


def test_reads_call_the_c_functions_resolved_once_not_the_wrappers(nvml_path: str) -> None:
    if nvml_path != "c_functions":
        pytest.skip("the wrapper path is what the other run exercises")
    clock = ManualClock()
    backend, fake = backend_for(FakeGpu(), clock=clock)
    lookups = {name: n for name, n in fake.calls.items() if name.startswith("lookup:")}

    def no_wrapper(*args: Any) -> Any:
        raise AssertionError("a read went through a pynvml wrapper")

    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo",
                 "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetTotalEnergyConsumption", "nvmlGpmSampleGet",
                 "nvmlGpmMetricsGet", "nvmlDeviceGetEncoderUtilization",
                 "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetGridLicensableFeatures_v4"):
        setattr(fake, name, no_wrapper)
    for _ in range(3):
        clock.t += 1
        reading = backend.read(0, BOTH)
        assert reading.errors == 0
        assert reading.values["fb_used"] == 1024 and reading.values["sm_active"] == 0
    assert {n: c for n, c in fake.calls.items() if n.startswith("lookup:")} == lookups
    assert fake.calls["nvmlDeviceGetClockInfo"] == 6 and fake.calls["nvmlGpmMetricsGet"] == 3


def test_driver_without_the_clocks_event_symbol_uses_the_throttle_reasons_one(
    nvml_path: str,
) -> None:
    # Drivers before 535 export the same function only under its old name.
    fake = FakeNvml([FakeGpu()])
    lookup = fake._nvmlGetFunctionPointer

    def old_driver(name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksThrottleReasons":
            name = "nvmlDeviceGetCurrentClocksEventReasons"
        elif name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return lookup(name)

    fake._nvmlGetFunctionPointer = old_driver  # type: ignore[method-assign]
    reading = NvmlBackend(fake, clock=ManualClock()).read(0, FAST)  # type: ignore[arg-type]
    assert reading.values["clocks_event_reasons"] == 0x4 and reading.errors == 0


def test_non_nvml_exception_in_a_getter_counts_as_an_error() -> None:
    fake = FakeNvml([FakeGpu()])

    def broken(*args: Any) -> Any:
        raise RuntimeError("broken binding")

    fake._c_power = broken  # type: ignore[method-assign]
    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    backend = NvmlBackend(fake, clock=ManualClock())  # type: ignore[arg-type]
    for _ in range(2):  # not "unsupported": asked again
        reading = backend.read(0, FAST)
        assert "power_usage" not in reading.values and reading.errors == 1
        assert reading.values["gpu_util"] == 97


def test_slow_keys_only_when_the_slow_tier_is_asked_for() -> None:
    backend, fake = backend_for(FakeGpu())
    backend.read(0, FAST)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0
    v = backend.read(0, BOTH).values
    assert v["total_energy"] == 123_456_789
    assert v["power_violation"] == 5_000_000_000
    assert v["thermal_violation"] == 1_250  # sw + hw thermal slowdown
    assert v["sync_boost_violation"] == 0
    assert v["board_limit_violation"] == 77
    assert v["pcie_replay"] == 12
    assert {k for k, _ in CLOCK_EVENT_DURATION_KEYS} <= v.keys()
    assert v["clock_event_ns.hw_thermal_slowdown"] == 250
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 0
    # GPM and the NVLink bandwidth rate have no window yet here
    assert v.keys() >= SLOW_KEYS - PROFILING_KEYS - {"nvlink_bandwidth_total"}
    slow_only = backend.read(0, frozenset({Tier.SLOW})).values
    assert "gpu_util" not in slow_only and slow_only["total_energy"] == 123_456_789


def test_power_limits_are_read_in_watts_on_the_slow_tier() -> None:
    # an operator lowered GPU 1's limit to 500 W; both boards' default is 700 W
    backend, fake = backend_for(FakeGpu(), FakeGpu(uuid="GPU-1", enforced_limit_mw=500_000))
    assert "enforced_power_limit" not in backend.read(0, FAST).values
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 0
    v0, v1 = backend.read(0, BOTH).values, backend.read(1, BOTH).values
    assert (v0["enforced_power_limit"], v0["power_mgmt_limit_def"]) == (700.0, 700.0)
    assert (v1["enforced_power_limit"], v1["power_mgmt_limit_def"]) == (500.0, 700.0)


def test_gpu_that_falls_off_the_bus_reads_down_while_the_other_reports() -> None:
    lost = FakeGpu(fail={"nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_GPU_IS_LOST})
    backend, _ = backend_for(lost, FakeGpu(uuid="GPU-1"))
    with pytest.raises(GpuUnavailable, match="GPU is lost"):
        backend.read(0, FAST)
    reading = backend.read(1, BOTH)
    assert reading.values["gpu_util"] == 97 and reading.errors == 0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_UNINITIALIZED])
def test_gone_device_codes_read_down(code: int) -> None:
    backend, _ = backend_for(FakeGpu(fail={"nvmlDeviceGetTemperature": code}))
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)




def test_unsupported_getter_is_absent_and_not_called_again() -> None:
    backend, fake = backend_for(FakeGpu(fail={
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }))
    for _ in range(3):
        reading = backend.read(0, FAST)
        assert "power_usage" not in reading.values
        assert "clocks_event_reasons" not in reading.values
        assert reading.errors == 0
        assert reading.values["gpu_util"] == 97
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3


def test_other_getter_error_counts_and_is_retried() -> None:
    timeout = pynvml.NVML_ERROR_TIMEOUT
    backend, fake = backend_for(FakeGpu(fail={"nvmlDeviceGetTemperature": timeout}))
    for _ in range(2):
        reading = backend.read(0, FAST)
        assert "gpu_temp" not in reading.values
        assert reading.errors == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 2


def test_one_unknown_error_is_a_collect_error_but_all_unknown_is_down() -> None:
    one = FakeGpu(fail={"nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_UNKNOWN})
    backend, _ = backend_for(one)
    reading = backend.read(0, FAST)
    assert reading.errors == 2  # SM and memory clock
    assert "sm_clock" not in reading.values and reading.values["gpu_util"] == 97

    unknown = pynvml.NVML_ERROR_UNKNOWN
    every = {name: unknown for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues",
        "nvmlGpmSampleGet")}
    gpu = FakeGpu()
    backend, _ = backend_for(gpu, clock=(clock := ManualClock()))
    gpu.fail.update(every)  # after start: the GPU stops answering
    clock.t += 1
    with pytest.raises(GpuUnavailable, match="Unknown"):
        backend.read(0, FAST)



def test_close_frees_gpm_samples_and_event_set_once() -> None:
    backend, fake = backend_for(FakeGpu(), FakeGpu())
    assert len(fake.samples_live) == 4
    backend.close()
    backend.close()
    assert fake.samples_live == set()
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.calls["nvmlShutdown"] == 1
    assert backend.events() == []
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)

