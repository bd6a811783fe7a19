"""The per-GPU field table: every row says how NVML fills it, in names pynvml has; the
NVML backend reads every key at its row's tier and nothing else; the docs show it."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from stepscope.gpu.bindings import (
    Binding,
    EngineUtilization,
    FieldId,
    FieldRate,
    Getter,
    Gpm,
    LicenseStatus,
    Violation,
)
from stepscope.gpu.field_reads import FAST_FIELD_IDS, RATES, SLOW_FIELD_IDS, VIOLATIONS
from stepscope.gpu.fields import (
    CLOCK_EVENT_DURATIONS,
    FIELDS,
    FIELDS_BY_KEY,
    SLOW_KEYS,
    markdown_table,
)
from stepscope.gpu.getters import CALLS, GETTER_CALLS, GetterSpec
from stepscope.gpu.gpm import GPM_METRICS
from stepscope.gpu.model import Tier
from tests.support import REPO

KINDS = (Getter, EngineUtilization, LicenseStatus, FieldId, Violation, FieldRate, Gpm)
# Every row that says how a key is read: the table's, and the clock-event durations'.
ROWS: list[tuple[str, Binding]] = [(f.key, f.binding) for f in FIELDS] + [
    (d.key, d.binding) for d in CLOCK_EVENT_DURATIONS]
_PYNVML_SOURCE = inspect.getsource(pynvml)


def unknown_names(binding: Binding) -> list[str]:
    """The NVML names ``binding`` gives that pynvml does not have: a constant it does not
    define, a function it neither wraps nor looks up as a C symbol."""
    return [name for name in binding.nvml_names() if not hasattr(pynvml, name)
            and f'_nvmlGetFunctionPointer("{name}")' not in _PYNVML_SOURCE]


@pytest.mark.parametrize(("key", "binding"), ROWS, ids=[key for key, _ in ROWS])
def test_every_row_is_bound_to_nvml_names_pynvml_has(key: str, binding: Binding) -> None:
    assert isinstance(binding, KINDS), f"{key}: no binding"
    assert unknown_names(binding) == [], key
    getter: Getter | None = binding if isinstance(binding, Getter) else None
    while getter is not None:  # the backend knows how to call it, and its fallback
        assert getter.function in GETTER_CALLS, key
        getter = getter.fallback


def test_a_name_pynvml_does_not_have_is_caught() -> None:
    assert unknown_names(FieldId("NVML_FI_DEV_NO_SUCH_FIELD")) == ["NVML_FI_DEV_NO_SUCH_FIELD"]
    assert unknown_names(Getter("nvmlDeviceGetNoSuchThing", argument="NVML_CLOCK_SM")) == [
        "nvmlDeviceGetNoSuchThing"]
    assert unknown_names(Violation(("NVML_FI_DEV_PERF_POLICY_POWER",), "NVML_PERF_POLICY_X")) == [
        "NVML_PERF_POLICY_X"]
    # a C symbol pynvml only looks up has no wrapper of its name, and is known all the same
    assert not hasattr(pynvml, "nvmlDeviceGetMemoryInfo_v2")
    assert unknown_names(Getter("nvmlDeviceGetMemoryInfo_v2", "used")) == []


def test_the_nvml_backend_reads_every_key_at_its_rows_tier_and_nothing_else() -> None:
    read: set[tuple[str, Tier]] = set()
    for tier, calls in CALLS.items():
        for spec in calls:
            keys = [key for key, _, _ in spec.keys] if isinstance(spec, GetterSpec) else [spec.key]
            read |= {(key, tier) for key in keys}
    read |= {(key, Tier.FAST) for _, key in FAST_FIELD_IDS}
    read |= {(key, Tier.SLOW) for _, key in SLOW_FIELD_IDS}
    read |= {(key, Tier.SLOW) for key, _, _ in VIOLATIONS}
    read |= {(rate.key, Tier.SLOW) for rate in RATES}
    read |= {(key, FIELDS_BY_KEY[key].tier) for _, key, _ in GPM_METRICS}
    assert read == {(f.key, f.tier) for f in FIELDS} | {
        (d.key, Tier.SLOW) for d in CLOCK_EVENT_DURATIONS}
    assert {d.key for d in CLOCK_EVENT_DURATIONS} <= SLOW_KEYS


def test_rows_sharing_a_getter_share_one_call() -> None:
    (utilization,) = [s for s in CALLS[Tier.FAST] if isinstance(s, GetterSpec)
                      and s.symbols[0] == "nvmlDeviceGetUtilizationRates"]
    assert [key for key, _, _ in utilization.keys] == ["gpu_util", "mem_copy_util"]
    (memory,) = [s for s in CALLS[Tier.FAST] if isinstance(s, GetterSpec)
                 and s.symbols[0] == "nvmlDeviceGetMemoryInfo_v2"]
    assert [key for key, _, _ in memory.keys] == ["fb_used", "fb_free", "fb_reserved"]
    assert memory.fallback is not None
    assert [key for key, _, _ in memory.fallback.keys] == ["fb_used", "fb_free"]
    assert memory.fallback.symbols == ("nvmlDeviceGetMemoryInfo",)


def test_the_docs_say_where_each_value_comes_from_in_nvmls_names() -> None:
    source = {f.key: f.source for f in FIELDS}
    assert source["sm_clock"] == "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"
    assert source["power_usage"] == "nvmlDeviceGetPowerUsage() / 1000"
    assert source["gpu_util"] == "nvmlDeviceGetUtilizationRates().gpu"
    assert source["memory_temp"] == "field NVML_FI_DEV_MEMORY_TEMP"
    assert source["sm_active"] == "GPM NVML_GPM_METRIC_SM_UTIL / 100"
    assert source["pcie_tx_bytes"] == "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC * 2^20"
    assert source["power_violation"] == (
        "field NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP; "
        "fallback nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER)")
    assert source["fb_reserved"] == (
        "nvmlDeviceGetMemoryInfo_v2().reserved / 2^20 (absent before driver 510)")


def test_docs_field_table_is_generated_from_the_code() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    block = doc.split("<!-- BEGIN FIELD TABLE", 1)[1].split("-->", 1)[1]
    block = block.split("<!-- END FIELD TABLE -->", 1)[0].strip("\n") + "\n"
    assert block == markdown_table()
