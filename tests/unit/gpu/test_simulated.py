"""Simulated GPUs behave like the real node a scenario describes, deterministically."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest

from stepscope.gpu.fields import (
    CLOCK_EVENT_DURATION_KEYS,
    COUNTER,
    FIELDS,
    PROFILING_KEYS,
    SLOW_KEYS,
)
from stepscope.gpu.model import GpuUnavailable, Tier
from stepscope.gpu.simulated import (
    SimulatedBackend,
    default_scenario,
    load_scenario,
    parse_scenario,
)
from tests.support import make_sampler
from tests.support.clocks import ManualClock

FAST = frozenset({Tier.FAST})
SLOW = frozenset({Tier.SLOW})
BOTH = frozenset({Tier.FAST, Tier.SLOW})
ALL_KEYS = {f.key for f in FIELDS} | {k for k, _ in CLOCK_EVENT_DURATION_KEYS}
# DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is typed counter by dcgm-exporter but is a rate
COUNTER_KEYS = {f.key for f in FIELDS if f.type == COUNTER} - {"nvlink_bandwidth_total"} | {
    k for k, _ in CLOCK_EVENT_DURATION_KEYS}


def sim(spec: Mapping[str, object] | str, hostname: str = "node-a"
        ) -> tuple[SimulatedBackend, ManualClock]:
    clock = ManualClock(5000.0)
    scenario = parse_scenario(spec) if not isinstance(spec, str) else load_scenario(spec)
    return SimulatedBackend(scenario, hostname=hostname, clock=clock), clock


def at(backend: SimulatedBackend, clock: ManualClock, t: float, index: int,
       tiers: frozenset[Tier] = BOTH) -> Mapping[str, float]:
    clock.t = 5000.0 + t
    return backend.read(index, tiers).values


# --- identity -------------------------------------------------------------------

def test_simulate_8_is_eight_distinct_h100s_with_stable_identities() -> None:
    backend = SimulatedBackend(default_scenario(8), hostname="node-a", clock=ManualClock(5000.0))
    infos = backend.devices()
    assert [i.index for i in infos] == list(range(8))
    assert len({i.uuid for i in infos}) == 8
    assert len({i.pci_bus_id for i in infos}) == 8
    assert len({i.serial for i in infos}) == 8
    assert infos[0].pci_bus_id == "00000000:18:00.0"
    for info in infos:
        assert info.uuid.startswith("GPU-") and len(info.uuid) == 40
        assert info.name == "NVIDIA H100 80GB HBM3"
        assert info.memory_total_mib == 81559
        assert info.driver_version == "580.159.03"
        assert info.mig_mode == "disabled"
        assert info.profiling_supported
        assert info.device == f"nvidia{info.index}"
    again = SimulatedBackend(default_scenario(8), hostname="node-a", clock=ManualClock(5000.0))
    assert again.devices() == infos  # deterministic
    other = SimulatedBackend(default_scenario(8), hostname="node-b", clock=ManualClock(5000.0))
    assert not {i.uuid for i in other.devices()} & {i.uuid for i in infos}


def test_sixty_four_gpus_keep_distinct_bus_ids() -> None:
    backend = SimulatedBackend(default_scenario(64), clock=ManualClock(5000.0))
    assert len({i.pci_bus_id for i in backend.devices()}) == 64
    assert backend.name == "simulated"


def test_a_mixed_node_reports_each_model_and_its_memory() -> None:
    backend, clock = sim({"gpus": 2, "model": "NVIDIA H200",
                          "devices": {1: {"model": "NVIDIA A100-SXM4-80GB"}}})
    h200, a100 = backend.devices()
    assert (h200.name, h200.memory_total_mib, h200.profiling_supported) == (
        "NVIDIA H200", 143771, True)
    assert (a100.name, a100.memory_total_mib, a100.profiling_supported) == (
        "NVIDIA A100-SXM4-80GB", 81920, False)
    v = at(backend, clock, 10, 0)
    assert v["fb_used"] + v["fb_free"] + v["fb_reserved"] == 143771
    assert not PROFILING_KEYS & at(backend, clock, 10, 1).keys()


# --- which keys ------------------------------------------------------------------

def test_every_field_is_filled_and_tiers_select_fast_or_slow_keys() -> None:
    backend, clock = sim({"gpus": 1})
    assert at(backend, clock, 10, 0, BOTH).keys() == ALL_KEYS
    assert at(backend, clock, 10, 0, FAST).keys() == ALL_KEYS - SLOW_KEYS
    assert at(backend, clock, 10, 0, SLOW).keys() == SLOW_KEYS
    assert at(backend, clock, 10, 0, frozenset()) == {}


def test_a_gpu_without_profiling_has_no_profiling_keys_at_all() -> None:
    backend, clock = sim({"gpus": 2, "devices": {1: {"profiling": False}}})
    assert not backend.devices()[1].profiling_supported
    assert at(backend, clock, 10, 1).keys() == ALL_KEYS - PROFILING_KEYS
    assert at(backend, clock, 10, 0).keys() >= PROFILING_KEYS


# --- what the work looks like ----------------------------------------------------

def test_bf16_uses_the_tensor_cores_and_fp32_does_not() -> None:
    backend, clock = sim({"gpus": 2, "timeline": [{"gpus": [1], "precision": "fp32"}]})
    for t in (5, 50, 500):
        bf16 = at(backend, clock, t, 0)
        assert bf16["sm_active"] == pytest.approx(0.95, abs=0.015)
        assert bf16["pipe_tensor_active"] == pytest.approx(0.9, abs=0.02)
        assert bf16["pipe_tensor_hmma_active"] == bf16["pipe_tensor_active"]
        assert bf16["pipe_tensor_imma_active"] == bf16["pipe_tensor_dfma_active"] == 0
        assert bf16["pipe_fp32_active"] < 0.1
        assert bf16["sm_occupancy"] < bf16["sm_active"] <= bf16["gr_engine_active"] <= 1
        assert 0.2 < bf16["dram_active"] < 0.6
        assert bf16["gpu_util"] == 100
        fp32 = at(backend, clock, t, 1)
        assert fp32["pipe_fp32_active"] == pytest.approx(0.75, abs=0.02)
        assert fp32["pipe_tensor_active"] == fp32["pipe_tensor_hmma_active"] == 0
        assert fp32["power_usage"] < bf16["power_usage"]


@pytest.mark.parametrize(
    ("precision", "pipe"),
    [("fp64", "pipe_tensor_dfma_active"), ("int8", "pipe_tensor_imma_active"),
     ("fp16", "pipe_tensor_hmma_active"), ("tf32", "pipe_tensor_hmma_active")],
)
def test_each_precision_lights_its_own_tensor_pipe(precision: str, pipe: str) -> None:
    backend, clock = sim({"gpus": 1, "workload": {"precision": precision}})
    v = at(backend, clock, 20, 0)
    assert v[pipe] > 0.7
    assert v["pipe_tensor_active"] == v[pipe]
    tensor_pipes = {"pipe_tensor_dfma_active", "pipe_tensor_imma_active",
                    "pipe_tensor_hmma_active"}
    assert all(v[p] == 0 for p in tensor_pipes - {pipe})
    if precision == "fp64":
        assert v["pipe_fp64_active"] > 0.1


def test_a_sawtooth_reads_its_duty_averaged_over_the_last_second() -> None:
    backend, clock = sim({"gpus": 1, "workload": {"activity": "sawtooth", "duty": 0.3,
                                                   "period": 0.5}})
    for t in (3.0, 10.25, 77.7):
        v = at(backend, clock, t, 0)
        assert v["gpu_util"] == 30
        assert v["sm_active"] == pytest.approx(0.3 * 0.95, abs=0.01)
        assert v["pipe_tensor_active"] == pytest.approx(0.3 * 0.9, abs=0.01)


def test_a_slow_sawtooth_swings_but_averages_to_its_duty() -> None:
    backend, clock = sim({"gpus": 1, "workload": {"activity": "sawtooth", "duty": 0.4,
                                                   "period": 4}})
    utils = [at(backend, clock, 100 + k * 0.25, 0)["gpu_util"] for k in range(160)]
    assert min(utils) == 0 and max(utils) == 100
    assert sum(utils) / len(utils) == pytest.approx(40, abs=1)


def test_gpu_util_lies_while_a_collective_spins_but_sm_active_does_not() -> None:
    backend, clock = sim({"gpus": 2, "workload": {"activity": "sawtooth", "duty": 0.5,
                                                   "period": 1.0, "wait": "collective"}})
    v = at(backend, clock, 30, 0)
    assert v["gpu_util"] == 100
    assert v["sm_active"] == pytest.approx(0.5 * 0.95 + 0.5 * 0.12, abs=0.01)
    assert v["pipe_tensor_active"] == pytest.approx(0.5 * 0.9, abs=0.01)
    assert v["gr_engine_active"] >= v["sm_active"]


def test_an_idle_gpu_sits_at_idle_clocks_power_and_temperature() -> None:
    backend, clock = sim({"gpus": 1, "workload": {"activity": "idle"}})
    v = at(backend, clock, 100, 0)
    assert v["sm_clock"] == 345
    assert v["power_usage"] == pytest.approx(75, abs=1)
    assert 28 <= v["gpu_temp"] <= 33
    assert int(v["clocks_event_reasons"]) == 0x1
    assert v["gpu_util"] == v["sm_active"] == v["nvlink_tx_bytes"] == 0
    assert v["fb_used"] < 100


def test_a_busy_gpu_runs_at_boost_clock_and_holds_most_of_its_memory() -> None:
    backend, clock = sim({"gpus": 1})
    v = at(backend, clock, 100, 0)
    assert 1950 <= v["sm_clock"] <= 1980
    assert 450 < v["power_usage"] < 700
    assert 50 < v["gpu_temp"] < 80
    assert v["clocks_event_reasons"] == 0
    assert v["fb_used"] / 81559 > 0.85
    assert v["fb_used"] + v["fb_free"] + v["fb_reserved"] == 81559


def test_a_gpu_that_stops_training_drops_to_idle() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [{"at": 60, "activity": "idle"}]})
    assert at(backend, clock, 59, 0)["gpu_util"] == 100
    assert at(backend, clock, 60.5, 0)["gpu_util"] == 50  # the last second was half busy
    v = at(backend, clock, 100, 0)
    assert v["gpu_util"] == 0 and v["sm_clock"] == 345


def test_overlapping_windows_nest_and_the_later_entry_wins() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [
        {"at": 10, "until": 100, "activity": "idle"},
        {"at": 20, "until": 30, "activity": "busy", "precision": "fp32"},
    ]})
    assert at(backend, clock, 15, 0)["gpu_util"] == 0
    busy = at(backend, clock, 25, 0)
    assert busy["gpu_util"] == 100 and busy["pipe_fp32_active"] > 0.7
    assert at(backend, clock, 50, 0)["gpu_util"] == 0
    back = at(backend, clock, 150, 0)
    assert back["gpu_util"] == 100 and back["pipe_tensor_active"] > 0.85  # baseline bf16


def test_the_thermal_straggler_example_shows_its_straggler() -> None:
    backend, clock = sim("thermal-straggler")
    before = [at(backend, clock, 20, i)["sm_active"] for i in range(8)]
    assert min(before) > 0.9
    after = {i: at(backend, clock, 60, i) for i in range(8)}
    assert all(v["gpu_util"] == 100 for v in after.values())  # util says all is well
    sm = {i: v["sm_active"] for i, v in after.items()}
    assert max(sm, key=lambda i: sm[i]) == 3  # the others wait for GPU 3
    assert all(sm[i] < 0.85 for i in sm if i != 3)
    rates = {i: at(backend, clock, 90, i, SLOW)["thermal_violation"]
             - at(backend, clock, 60, i, SLOW)["thermal_violation"] for i in range(8)}
    assert rates[3] == pytest.approx(30e9, rel=1e-9)
    assert all(rates[i] == 0 for i in rates if i != 3)


# --- throttling ------------------------------------------------------------------

def test_thermal_throttling_raises_temperature_lowers_clocks_and_counts_violation() -> None:
    backend, clock = sim({"gpus": 2, "timeline": [
        {"at": 30, "until": 90, "gpus": [1], "thermal": "sw"}]})
    before = at(backend, clock, 29, 1)
    assert before["thermal_violation"] == 0 and before["clocks_event_reasons"] == 0
    hot = at(backend, clock, 60, 1)
    healthy = at(backend, clock, 60, 0)
    assert hot["gpu_temp"] >= 85
    assert 1350 <= hot["sm_clock"] <= 1450 < healthy["sm_clock"]
    assert int(hot["clocks_event_reasons"]) & 0x20
    assert hot["thermal_violation"] == pytest.approx(30e9, rel=1e-9)
    assert hot["clock_event_ns.sw_thermal_slowdown"] == hot["thermal_violation"]
    assert hot["clock_event_ns.hw_thermal_slowdown"] == 0
    assert hot["sm_active"] < healthy["sm_active"]
    assert hot["power_violation"] == 0  # thermal, not power
    after = at(backend, clock, 120, 1)
    assert after["thermal_violation"] == pytest.approx(60e9, rel=1e-9)
    assert at(backend, clock, 500, 1)["thermal_violation"] == after["thermal_violation"]
    assert after["clocks_event_reasons"] == 0 and after["sm_clock"] > 1900
    assert at(backend, clock, 500, 0)["thermal_violation"] == 0


def test_hw_thermal_slowdown_sets_its_own_bit_and_counter() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [{"at": 10, "thermal": "hw"}]})
    v = at(backend, clock, 20, 0)
    assert int(v["clocks_event_reasons"]) & 0x60 == 0x40
    assert v["clock_event_ns.hw_thermal_slowdown"] == pytest.approx(10e9, rel=1e-9)
    assert v["thermal_violation"] == v["clock_event_ns.hw_thermal_slowdown"]


def test_power_capping_pins_power_at_the_limit_and_counts_power_violation() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [
        {"at": 60, "until": 120, "power_cap": True}]})
    free = at(backend, clock, 50, 0)
    capped = at(backend, clock, 90, 0)
    assert capped["power_usage"] == pytest.approx(700, rel=0.01)
    assert int(capped["clocks_event_reasons"]) & 0x04
    assert 1700 <= capped["sm_clock"] < free["sm_clock"]
    assert capped["power_violation"] == pytest.approx(30e9, rel=1e-9)
    assert capped["clock_event_ns.sw_power_cap"] == capped["power_violation"]
    assert capped["thermal_violation"] == 0
    assert at(backend, clock, 300, 0)["power_violation"] == pytest.approx(60e9, rel=1e-9)


def test_a_simulated_board_enforces_its_default_power_limit_even_at_the_cap() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [{"at": 0, "power_cap": True}]})
    v = at(backend, clock, 30, 0)
    assert v["enforced_power_limit"] == v["power_mgmt_limit_def"] == 700.0  # an H100's
    assert v["power_usage"] == pytest.approx(700, rel=0.01)  # capped, at its own limit


def test_energy_is_the_integral_of_power() -> None:
    backend, clock = sim({"gpus": 1})
    e1 = at(backend, clock, 100, 0)["total_energy"]
    watts = at(backend, clock, 150, 0)["power_usage"]
    e2 = at(backend, clock, 200, 0)["total_energy"]
    assert (e2 - e1) / 1000 / 100 == pytest.approx(watts, rel=0.01)


# --- counters --------------------------------------------------------------------

def test_a_reading_at_t_is_the_same_however_often_read_was_called_before() -> None:
    often, c1 = sim("faults")
    rarely, c2 = sim("faults")
    for k in range(1, 2000):
        for i in (0, 3, 4, 5, 6):
            at(often, c1, k * 0.1, i)
    for i in (0, 3, 4, 5, 6):
        assert at(often, c1, 200.0, i) == at(rarely, c2, 200.0, i)


def test_counters_never_decrease() -> None:
    backend, clock = sim("faults")
    last: dict[tuple[int, str], float] = {}
    for k in range(0, 3000):
        t = k * 0.07
        for i in (0, 3, 4, 5, 6, 7):
            v = at(backend, clock, t, i)
            for key in COUNTER_KEYS & v.keys():
                assert v[key] >= last.get((i, key), 0.0), (t, i, key)
                last[(i, key)] = v[key]


# --- faults ----------------------------------------------------------------------

def test_each_xid_is_reported_exactly_once_even_when_several_fall_between_calls() -> None:
    backend, clock = sim({"gpus": 4, "timeline": [
        {"at": 20, "gpus": [1], "xid": 79},
        {"at": 40, "gpus": [2], "xid": 48},
        {"at": 41, "gpus": [0, 3], "xid": 13},
    ]})
    clock.t = 5010.0
    assert backend.events() == []
    clock.t = 5025.0
    (first,) = backend.events()
    assert (first.index, first.xid) == (1, 79)
    assert backend.events() == []
    clock.t = 5100.0
    later = backend.events()
    assert [(e.index, e.xid) for e in later] == [(2, 48), (0, 13), (3, 13)]
    assert later[1].timestamp - first.timestamp == pytest.approx(21.0)
    assert backend.events() == []


def test_a_gpu_that_falls_off_the_bus_raises_unavailable_and_the_others_keep_reading() -> None:
    backend, clock = sim("faults")
    assert at(backend, clock, 39.9, 2)["gpu_util"] == 100
    for t in (40.0, 41.0, 1000.0):
        with pytest.raises(GpuUnavailable, match="GPU 2 fell off the bus"):
            at(backend, clock, t, 2)
        for i in (0, 1, 3, 4, 5, 6, 7):
            assert at(backend, clock, t, i)["fb_free"] > 0
    assert len(backend.devices()) == 8  # still listed, just down


def test_a_double_bit_ecc_error_counts_and_leaves_a_row_remap_pending() -> None:
    backend, clock = sim("faults")
    before = at(backend, clock, 49, 3)
    assert before["ecc_dbe_vol_total"] == before["row_remap_pending"] == 0
    v = at(backend, clock, 50, 3)
    assert v["ecc_dbe_vol_total"] == v["ecc_dbe_agg_total"] == 1
    assert v["uncorrectable_remapped_rows"] == 1 and v["row_remap_pending"] == 1
    assert v["ecc_sbe_vol_total"] == 0 and v["row_remap_failure"] == 0


def test_pcie_replays_spread_over_their_window() -> None:
    backend, clock = sim("faults")
    assert at(backend, clock, 10, 4, SLOW)["pcie_replay"] == 0
    assert at(backend, clock, 40, 4, SLOW)["pcie_replay"] == 60
    assert at(backend, clock, 70, 4, SLOW)["pcie_replay"] == 120
    assert at(backend, clock, 900, 4, SLOW)["pcie_replay"] == 120


def test_point_ecc_and_row_remap_failure_happen_at_their_time() -> None:
    backend, clock = sim({"gpus": 1, "timeline": [
        {"at": 5, "ecc_sbe": 3}, {"at": 7, "row_remap_failure": True}]})
    assert at(backend, clock, 4.9, 0)["ecc_sbe_agg_total"] == 0
    assert at(backend, clock, 5, 0)["ecc_sbe_agg_total"] == 3
    assert at(backend, clock, 6.9, 0)["row_remap_failure"] == 0
    assert at(backend, clock, 7, 0)["row_remap_failure"] == 1


def test_out_of_range_index_is_a_caller_bug() -> None:
    backend, _ = sim({"gpus": 1})
    with pytest.raises(IndexError):
        backend.read(1, BOTH)


# --- served end to end ----------------------------------------------------------

def test_the_sampler_serves_every_dcgm_family_from_a_simulated_node() -> None:
    clock = ManualClock(5000.0)
    backend = SimulatedBackend(load_scenario("faults"), hostname="node-a", clock=clock)
    sampler = make_sampler(backend, clock=clock, wall_clock=lambda: 1.7e9)
    for _ in range(45):
        sampler.sample_once()
        clock.t += 1.0
    text = sampler.sample_once().body.decode()
    # Read the exposition line by line: DCGM's counters have no _total suffix, which
    # prometheus_client's parser would rename.
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            gpu = re.search(r'gpu="(\d+)"', line)
            series.setdefault(name, set()).add(gpu.group(1) if gpu else "")
    for f in FIELDS:
        if not f.once_active:
            assert f.name in series, f.name
    gpus_with_profiling = series["DCGM_FI_PROF_SM_ACTIVE"]
    assert gpus_with_profiling == {"0", "1", "3", "4", "5", "6"}  # 2 is down, 7 has no GPM
    # a tensor pipe is served from the first pass it ran on the GPU: HMMA under this
    # scenario's bf16 work; IMMA (integer) and DFMA (fp64) never ran, so no series
    assert series["stepscope_gpu_pipe_tensor_hmma_active_ratio"] <= gpus_with_profiling
    assert series["stepscope_gpu_pipe_tensor_hmma_active_ratio"]
    assert "stepscope_gpu_pipe_tensor_imma_active_ratio" not in series
    assert "stepscope_gpu_pipe_tensor_dfma_active_ratio" not in series
    backend.close()


def test_a_tensor_pipe_is_served_from_its_first_active_pass_and_stays() -> None:
    clock = ManualClock(5000.0)
    scenario = parse_scenario({"gpus": 1, "workload": {"activity": "busy", "precision": "int8"},
                               "timeline": [{"at": "5s", "activity": "idle"}]})
    backend = SimulatedBackend(scenario, hostname="n", clock=clock)
    sampler = make_sampler(backend, clock=clock, wall_clock=lambda: 1.7e9)
    served = []
    for _ in range(10):
        text = sampler.sample_once().body.decode()
        served.append([line.rsplit(" ", 1)[1] for line in text.splitlines()
                       if line.startswith("stepscope_gpu_pipe_tensor_imma_active_ratio{")])
        clock.t += 1.0
    backend.close()
    assert all(len(s) == 1 for s in served), served  # from the first pass, every pass after
    assert float(served[1][0]) > 0 and float(served[-1][0]) == 0.0  # idle now, still served
