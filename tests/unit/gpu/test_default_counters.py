"""dcgm-exporter's default counters, as a user replacing dcgm-exporter sees them.

Every counter of dcgm-exporter's ``etc/default-counters.csv`` is served under its name and
Prometheus type. The ones read by calls beyond the first release (encoder and decoder
utilisation, reserved framebuffer, NVLink bandwidth, vGPU license status, the driver
version label) are checked through the NVML backend against the fake NVML of
tests/support/fake_nvml.py (both the C-function and the pynvml-wrapper paths): a real
answer is served, "not supported" leaves the series out without an error while the other
series stay, any other error counts as a collect error and is asked again.
"""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from stepscope.core.exposition import COUNTER, GAUGE
from stepscope.gpu.fields import DEFAULT_COUNTERS, DRIVER_VERSION_LABEL, FIELDS, FIELDS_BY_KEY
from stepscope.gpu.model import GpuUnavailable, Tier
from stepscope.gpu.nvml_backend import NvmlBackend
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from tests.support import make_sampler, parse_samples
from tests.support.clocks import ManualClock
from tests.support.fake_nvml import BOTH, FAST, SLOW, FakeGpu, FakeNvml, backend_for

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
VGPU = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
ALL_LINKS = 0xFFFFFFFF

pytestmark = pytest.mark.usefixtures("nvml_path")  # each test through both paths



def types_of(text: str) -> dict[str, str]:
    """``# TYPE`` lines of an exposition: family name -> type."""
    return {parts[2]: parts[3] for line in text.splitlines()
            if line.startswith("# TYPE ") and len(parts := line.split()) == 4}


def nvml_exposition(*gpus: FakeGpu, passes: int = 1, step: float = 10.0) -> tuple[str, FakeNvml]:
    """The text a real sampler renders over NvmlBackend and the fake NVML, after
    ``passes`` passes ``step`` seconds apart (10 s: every pass reads the slow tier)."""
    clock = ManualClock(1000.0)
    fake = FakeNvml(list(gpus))
    backend = NvmlBackend(fake, clock=clock)  # type: ignore[arg-type]
    sampler = make_sampler(backend, hostname="node-1", clock=clock)
    text = ""
    for _ in range(passes):
        clock.t += step
        text = sampler.sample_once().body.decode()
    return text, fake


# ---------------------------------------------------------------- the whole list


def test_every_default_counter_is_served_with_dcgm_exporters_name_and_type() -> None:
    backend = SimulatedBackend(default_scenario(2), hostname="node-1", clock=ManualClock(1000.0))
    text = make_sampler(backend, hostname="node-1").sample_once().body.decode()
    served, samples = types_of(text), parse_samples(text)
    for name, kind in DEFAULT_COUNTERS:
        if kind == "label":  # on every DCGM_FI_* series, not a series of its own
            assert name not in served
            assert all(lbl.get(name) == "580.159.03"
                       for family, rows in samples.items() if family.startswith("DCGM_FI_")
                       for lbl, _ in rows), name
            continue
        assert served.get(name) == kind, name
        assert {lbl["gpu"] for lbl, _ in samples[name]} == {"0", "1"}, name


def test_the_field_table_types_the_new_counters_as_dcgm_exporter_does() -> None:
    table = {f.name: (f.type, f.unit, f.tier) for f in FIELDS}
    assert table["DCGM_FI_DEV_ENC_UTIL"] == (GAUGE, "percent", Tier.FAST)
    assert table["DCGM_FI_DEV_DEC_UTIL"] == (GAUGE, "percent", Tier.FAST)
    assert table["DCGM_FI_DEV_FB_RESERVED"] == (GAUGE, "MiB", Tier.FAST)
    # a rate in DCGM's unit, typed counter as in dcgm-exporter's CSV
    assert table["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == (COUNTER, "KiB/s / 1000", Tier.SLOW)
    assert table["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] == (GAUGE, "bool", Tier.SLOW)
    assert DRIVER_VERSION_LABEL == "DCGM_FI_DRIVER_VERSION"


# ---------------------------------------------------------------- supported: real answers


def test_an_h200_serves_its_answers_with_dcgms_units_and_types() -> None:
    text, _ = nvml_exposition(FakeGpu(encoder=12, decoder=47), passes=2)
    samples, types = parse_samples(text), types_of(text)

    def value(name: str) -> float:
        ((labels, v),) = samples[name]
        assert labels["gpu"] == "0" and labels["Hostname"] == "node-1"
        return v

    assert (value("DCGM_FI_DEV_ENC_UTIL"), value("DCGM_FI_DEV_DEC_UTIL")) == (12, 47)
    # nvmlDeviceGetMemoryInfo_v2: used without the 551 MiB reserved, as DCGM reads it
    assert value("DCGM_FI_DEV_FB_USED") == 1024
    assert value("DCGM_FI_DEV_FB_FREE") == 142196
    assert value("DCGM_FI_DEV_FB_RESERVED") == 551
    assert value("DCGM_FI_DEV_VGPU_LICENSE_STATUS") == 0  # bare metal: licensing unsupported
    # the NVLink counters did not move between the two passes: 0 MB/s
    assert value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 0
    assert types["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "counter"
    for name in ("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
                 "DCGM_FI_DEV_VGPU_LICENSE_STATUS"):
        assert types[name] == "gauge", name
    assert "Encoder utilization (in %)." in text
    assert "Framebuffer memory reserved by the driver and firmware (in MiB)." in text


def test_nvlink_bandwidth_is_dcgms_rate_of_the_all_links_data_counters() -> None:
    gpu = FakeGpu()
    clock = ManualClock()
    backend, fake = backend_for(gpu, clock=clock)
    first = backend.read(0, SLOW)
    assert "nvlink_bandwidth_total" not in first.values  # no window yet
    # both counters asked once, summed over every link by NVML (scopeId UINT_MAX)
    (ids, scopes), = [(r, s) for r, s in zip(fake.field_requests, fake.field_scopes,
                                             strict=True)
                      if pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX in r]
    assert sorted(ids) == [pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                           pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
    assert scopes == [ALL_LINKS, ALL_LINKS]
    # 18 links each move 40,000 KiB rx and 60,000 KiB tx over 10 s: 1.8e6 KiB,
    # 180,000 KiB/s, which DCGM divides by 1000
    gpu.nvlink_kib = [(rx + 40_000, tx + 60_000) for rx, tx in gpu.nvlink_kib]
    clock.t += 10.0
    second = backend.read(0, SLOW)
    assert second.values["nvlink_bandwidth_total"] == pytest.approx(180.0)
    assert second.errors == 0
    assert "nvlink_data_rx_kib" not in second.values  # the raw counters are not served
    clock.t += 10.0
    assert backend.read(0, SLOW).values["nvlink_bandwidth_total"] == 0


def test_nvlink_counters_that_go_back_give_no_reading_rather_than_a_negative_one() -> None:
    gpu = FakeGpu()
    clock = ManualClock()
    backend, _ = backend_for(gpu, clock=clock)
    backend.read(0, SLOW)
    gpu.nvlink_kib = [(0, 0)] * 18  # the driver reloaded: counters restart
    clock.t += 10.0
    assert "nvlink_bandwidth_total" not in backend.read(0, SLOW).values
    gpu.nvlink_kib = [(5_000, 5_000)] * 18
    clock.t += 10.0
    assert backend.read(0, SLOW).values["nvlink_bandwidth_total"] == pytest.approx(18.0)


@pytest.mark.parametrize(("licensing", "expected"), [
    ((0, []), 0.0),  # bare metal: NVML answers that vGPU licensing is not supported
    ((1, [(VGPU, 1)]), 1.0),  # a licensed vGPU
    ((1, [(VGPU, 0)]), 0.0),  # a vGPU without a license
    ((1, [(VGPU + 1, 1), (VGPU, 2)]), 1.0),  # the vGPU feature is found among others
    ((1, [(VGPU + 1, 1)]), None),  # no vGPU feature listed: DCGM gives no value
])
def test_vgpu_license_status_reads_the_licensable_features_as_dcgm_does(
    licensing: tuple[int, list[tuple[int, int]]], expected: float | None,
) -> None:
    backend, _ = backend_for(FakeGpu(licensing=licensing))
    reading = backend.read(0, SLOW)
    assert reading.values.get("vgpu_license_status") == expected
    assert reading.errors == 0


# ---------------------------------------------------------------- not supported: absent


def test_unsupported_new_calls_are_absent_without_errors_and_the_rest_still_served() -> None:
    gpu = FakeGpu(nvlink_kib=[], fail={
        "nvmlDeviceGetEncoderUtilization": NOT_SUPPORTED,
        "nvmlDeviceGetDecoderUtilization": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        "nvmlDeviceGetGridLicensableFeatures_v4": NOT_SUPPORTED,
    })
    clock = ManualClock()
    backend, fake = backend_for(gpu, clock=clock)
    for _ in range(3):
        clock.t += 10.0
        reading = backend.read(0, BOTH)
        assert reading.errors == 0
        assert not {"enc_util", "dec_util", "vgpu_license_status",
                    "nvlink_bandwidth_total"} & reading.values.keys()
        assert reading.values["gpu_util"] == 97 and reading.values["fb_reserved"] == 551
        assert reading.values["total_energy"] == 123_456_789
    # learnt on the first read, not asked again
    assert fake.calls["nvmlDeviceGetEncoderUtilization"] == 1
    assert fake.calls["nvmlDeviceGetDecoderUtilization"] == 1
    assert fake.calls["nvmlDeviceGetGridLicensableFeatures_v4"] == 1
    nvlink = [r for r in fake.field_requests if pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX in r]
    assert len(nvlink) == 1


def test_unsupported_series_are_left_out_of_the_exposition_for_that_gpu_only() -> None:
    without = FakeGpu(nvlink_kib=[], fail={"nvmlDeviceGetEncoderUtilization": NOT_SUPPORTED,
                                           "nvmlDeviceGetDecoderUtilization": NOT_SUPPORTED})
    text, _ = nvml_exposition(without, FakeGpu(uuid="GPU-1"), passes=2)
    samples = parse_samples(text)
    for name in ("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
                 "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert {lbl["gpu"] for lbl, _ in samples[name]} == {"1"}, name
    assert {lbl["gpu"] for lbl, _ in samples["DCGM_FI_DEV_GPU_UTIL"]} == {"0", "1"}
    assert {lbl["gpu"]: v for lbl, v in samples["stepscope_gpu_up"]} == {"0": 1, "1": 1}


def test_a_driver_without_memory_info_v2_serves_v1_used_and_no_reserved() -> None:
    # Drivers before 510 have no nvmlDeviceGetMemoryInfo_v2: used then includes the
    # reserved memory, and DCGM_FI_DEV_FB_RESERVED is absent, as with DCGM.
    fake = FakeNvml([FakeGpu()])
    lookup = fake._nvmlGetFunctionPointer

    def old_driver(name: str) -> Any:
        if name == "nvmlDeviceGetMemoryInfo_v2":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return lookup(name)

    fake._nvmlGetFunctionPointer = old_driver  # type: ignore[method-assign]
    fake._c_memory_v2 = lambda *args: pynvml.NVML_ERROR_FUNCTION_NOT_FOUND  # type: ignore
    backend = NvmlBackend(fake, clock=ManualClock())  # type: ignore[arg-type]
    for _ in range(2):
        reading = backend.read(0, FAST)
        assert (reading.values["fb_used"], reading.values["fb_free"]) == (1575, 142196)
        assert "fb_reserved" not in reading.values and reading.errors == 0
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2 + 1  # both reads, and the total at start


# ---------------------------------------------------------------- other errors


def test_a_transient_encoder_error_counts_and_is_asked_again() -> None:
    gpu = FakeGpu(encoder=30, fail={"nvmlDeviceGetEncoderUtilization": pynvml.NVML_ERROR_TIMEOUT})
    backend, fake = backend_for(gpu)
    for _ in range(2):
        reading = backend.read(0, FAST)
        assert "enc_util" not in reading.values and reading.errors == 1
        assert reading.values["dec_util"] == 0
    del gpu.fail["nvmlDeviceGetEncoderUtilization"]
    assert backend.read(0, FAST).values["enc_util"] == 30
    assert fake.calls["nvmlDeviceGetEncoderUtilization"] == 3


def test_a_license_query_that_says_the_gpu_is_lost_marks_it_down() -> None:
    lost = FakeGpu(fail={"nvmlDeviceGetGridLicensableFeatures_v4": pynvml.NVML_ERROR_GPU_IS_LOST})
    backend, _ = backend_for(lost, FakeGpu(uuid="GPU-1"))
    assert backend.read(0, FAST).values["gpu_util"] == 97  # the fast tier does not ask
    with pytest.raises(GpuUnavailable, match="vgpu_license"):
        backend.read(0, SLOW)
    assert backend.read(1, SLOW).values["vgpu_license_status"] == 0


def test_an_nvlink_counter_error_is_a_collect_error_and_no_reading() -> None:
    rx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    gpu = FakeGpu(field_errors={rx: pynvml.NVML_ERROR_NO_DATA})
    clock = ManualClock()
    backend, _ = backend_for(gpu, clock=clock)
    for _ in range(2):
        clock.t += 10.0
        reading = backend.read(0, SLOW)
        assert "nvlink_bandwidth_total" not in reading.values and reading.errors == 1
    del gpu.field_errors[rx]
    clock.t += 10.0
    assert "nvlink_bandwidth_total" not in backend.read(0, SLOW).values  # a new window
    clock.t += 10.0
    assert backend.read(0, SLOW).values["nvlink_bandwidth_total"] == 0


# ---------------------------------------------------------------- the driver version label


def test_dcgm_series_carry_the_driver_version_label_and_stepscope_series_do_not() -> None:
    text, _ = nvml_exposition(FakeGpu())
    for family, rows in parse_samples(text).items():
        for labels, _ in rows:
            if family.startswith("DCGM_FI_"):
                assert labels[DRIVER_VERSION_LABEL] == "570.86.15", family
            else:
                assert DRIVER_VERSION_LABEL not in labels, family
    info = parse_samples(text)["stepscope_gpu_info"][0][0]
    assert info["driver_version"] == "570.86.15"  # the static facts stay on _info


def test_an_unknown_driver_version_leaves_the_label_out_rather_than_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_version(self: FakeNvml) -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(FakeNvml, "nvmlSystemGetDriverVersion", no_version)
    text, _ = nvml_exposition(FakeGpu())
    assert f"{DRIVER_VERSION_LABEL}=" not in text
    assert parse_samples(text)["DCGM_FI_DEV_GPU_UTIL"][0][1] == 97


def test_the_simulated_twin_serves_plausible_values_for_the_new_counters() -> None:
    clock = ManualClock(1000.0)
    backend = SimulatedBackend(default_scenario(4), hostname="node-1", clock=clock)
    clock.t += 60.0
    v = backend.read(0, BOTH).values
    assert (v["enc_util"], v["dec_util"], v["vgpu_license_status"]) == (0, 0, 0)
    assert v["fb_used"] + v["fb_free"] + v["fb_reserved"] == 81559
    assert 300 < v["fb_reserved"] < 1000
    # training traffic: about what GPM's NVLink bytes/s say, in DCGM's KiB/s / 1000
    gpm = (v["nvlink_tx_bytes"] + v["nvlink_rx_bytes"]) / 1024 / 1000
    assert v["nvlink_bandwidth_total"] == pytest.approx(gpm)
    assert v["nvlink_bandwidth_total"] > 1000
    one = SimulatedBackend(default_scenario(1), hostname="node-1", clock=clock)
    assert one.read(0, BOTH).values["nvlink_bandwidth_total"] == 0  # no peer, no NVLink traffic
    assert FIELDS_BY_KEY["nvlink_bandwidth_total"].tier is Tier.SLOW
    assert "nvlink_bandwidth_total" not in backend.read(0, FAST).values
