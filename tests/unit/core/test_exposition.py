"""The text writer: exact names (dcgm-exporter's counters), escaping, numbers."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from stepscope.core.exposition import Family, format_value, label_string, render
from stepscope.core.health import process_families


def test_counter_keeps_the_dcgm_name_without_total() -> None:
    fam = Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy (in mJ).")
    fam.add('{gpu="0"}', 12345678.0)
    text = render([fam]).decode()
    assert text == (
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Energy (in mJ).\n"
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 12345678\n'
    )


def test_label_values_and_help_are_escaped_and_parse_back() -> None:
    fam = Family("stepscope_x", "gauge", 'back\\slash and\nnewline')
    fam.add(label_string([("modelName", 'A "quoted"\\name\nx')]), 0.5)
    text = render([fam]).decode()
    parsed = list(text_string_to_metric_families(text))
    assert parsed[0].samples[0].labels["modelName"] == 'A "quoted"\\name\nx'
    assert parsed[0].documentation == 'back\\slash and\nnewline'


def test_numbers() -> None:
    assert format_value(3.0) == "3"
    assert format_value(7) == "7"
    assert format_value(0.25) == "0.25"
    assert format_value(float("inf")) == "+Inf"
    assert format_value(float("nan")) == "NaN"
    assert format_value(1e20) == "1e+20"


def test_empty_families_are_not_written() -> None:
    assert render([Family("stepscope_x", "gauge", "h")]) == b""


def test_process_families_are_standard() -> None:
    text = render(process_families()).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= names
    assert "# TYPE process_cpu_seconds_total counter" in text
