"""The scenario language: what loads, and how a bad scenario is reported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepscope.gpu.scenario import (
    GPU_MODELS,
    SCHEMA_KEYS,
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
    shipped_scenarios,
)
from tests.support import REPO


def test_the_shipped_examples_are_there_and_all_load() -> None:
    shipped = shipped_scenarios()
    assert {"thermal-straggler", "faults", "data-starved"} <= set(shipped)
    for name, path in shipped.items():
        by_name = load_scenario(name)
        by_path = load_scenario(path)
        assert by_name == by_path
        assert by_name.name == name
        assert by_name.description


def test_thermal_straggler_example_says_what_its_comment_says() -> None:
    sc = load_scenario("thermal-straggler")
    assert sc.gpus == 8
    assert {d.model.name for d in sc.devices} == {"NVIDIA H200"}
    hot = [e for e in sc.timeline if e.thermal is not None]
    assert [(e.at, e.gpus, e.thermal) for e in hot] == [(30.0, (3,), "sw")]


def test_simulate_n_overrides_the_files_gpu_count() -> None:
    assert load_scenario("data-starved").gpus == 4
    sc = load_scenario("data-starved", n_gpus=16)
    assert sc.gpus == 16 and len(sc.devices) == 16


def test_default_scenario_is_n_healthy_h100s_training_bf16() -> None:
    sc = default_scenario(3)
    assert sc.gpus == 3
    assert all(d.model.name == "NVIDIA H100 80GB HBM3" and d.profiling for d in sc.devices)
    assert (sc.workload.activity, sc.workload.precision) == ("busy", "bf16")
    assert sc.timeline == ()


@pytest.mark.parametrize("n", [0, 65, -1])
def test_default_scenario_rejects_impossible_gpu_counts(n: int) -> None:
    with pytest.raises(ScenarioError, match=f"between 1 and 64 GPUs, got {n}"):
        default_scenario(n)


def test_a_dict_and_yaml_text_give_the_same_scenario() -> None:
    text = "gpus: 2\ntimeline:\n  - {at: 5, until: 10, gpus: [1], thermal: hw}\n"
    as_dict = {"gpus": 2, "timeline": [{"at": 5, "until": 10, "gpus": [1], "thermal": "hw"}]}
    assert parse_scenario(text) == parse_scenario(as_dict)


@pytest.mark.parametrize(
    ("written", "seconds"),
    [(30, 30.0), (2.5, 2.5), ("90s", 90.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0),
     ("45", 45.0)],
)
def test_times_take_seconds_or_a_unit(written: object, seconds: float) -> None:
    sc = parse_scenario({"timeline": [{"at": written, "xid": 13}]})
    assert sc.timeline[0].at == seconds


def test_an_entry_without_gpus_applies_to_all_and_without_at_starts_at_zero() -> None:
    sc = parse_scenario({"gpus": 4, "timeline": [{"precision": "fp32"}]})
    (entry,) = sc.timeline
    assert entry.gpus == (0, 1, 2, 3) and entry.at == 0.0 and entry.until is None


def test_devices_set_a_model_per_gpu_for_mixed_nodes() -> None:
    sc = parse_scenario({"gpus": 3, "devices": {1: {"model": "NVIDIA A100-SXM4-80GB"},
                                                "2": {"profiling": False}}})
    names = [d.model.name for d in sc.devices]
    assert names == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]
    # An A100 has no GPM: profiling follows the model unless switched off.
    assert [d.profiling for d in sc.devices] == [True, False, False]


def test_model_catalogue_has_the_memory_nvml_reports() -> None:
    assert GPU_MODELS["NVIDIA H100 80GB HBM3"].memory_total_mib == 81559
    assert GPU_MODELS["NVIDIA H200"].memory_total_mib == 143771


BAD: list[tuple[str, str]] = [
    # YAML itself
    ("gpus: 8\ntimeline: [ {at: 3, gpus: 1\n",
     "scenario.yaml: line 3, column 1: invalid YAML: expected ',' or '}'"),
    ("gpus: 8\nmodel: NVIDIA H200\ngpus: 4\n",
     "scenario.yaml: line 3, column 1: invalid YAML: duplicate key 'gpus'"),
    ("- gpus: 8\n", "scenario.yaml: top level: expected a mapping of scenario keys, got a list"),
    ("", "scenario.yaml: top level: empty document"),
    ("just words\n", "scenario.yaml: top level: expected a mapping of scenario keys, got 'just"),
    # unknown keys: typos must not be ignored
    ("gpus: 8\ntimelime: []\n", "scenario.yaml: timelime: unknown key; did you mean 'timeline'?"),
    ("workload: {activty: idle}\n",
     "scenario.yaml: workload.activty: unknown key; did you mean 'activity'?"),
    ("timeline:\n  - {at: 3, gpus: [1], thermall: sw}\n",
     "scenario.yaml: timeline[0].thermall: unknown key; did you mean 'thermal'?"),
    ("devices: {1: {modle: NVIDIA H200}}\n",
     "scenario.yaml: devices[1].modle: unknown key; did you mean 'model'?"),
    # GPU indices and counts
    ("gpus: 8\ntimeline:\n  - {at: 1, xid: 13}\n  - {at: 2, xid: 13}\n"
     "  - {at: 3, gpus: [2, 9], xid: 79}\n",
     "scenario.yaml: timeline[2].gpus: GPU index 9 out of range (node has 8 GPUs)"),
    ("gpus: 2\ntimeline: [{gpus: -1, xid: 13}]\n",
     "scenario.yaml: timeline[0].gpus: GPU index -1 out of range (node has 2 GPUs)"),
    ("timeline: [{gpus: [1, 1], xid: 13}]\n",
     "scenario.yaml: timeline[0].gpus: GPU index 1 listed twice"),
    ("timeline: [{gpus: [], xid: 13}]\n", "scenario.yaml: timeline[0].gpus: empty list"),
    ("timeline: [{gpus: some, xid: 13}]\n",
     "scenario.yaml: timeline[0].gpus: expected 'all', a GPU index or a list of them, got 'some'"),
    ("gpus: 2\ndevices: {5: {profiling: false}}\n",
     "scenario.yaml: devices[5]: GPU index 5 out of range (node has 2 GPUs)"),
    ("devices: {3: {profiling: false}, '3': {profiling: true}}\n",
     "scenario.yaml: devices[3]: GPU index 3 given twice"),
    ("devices: [1, 2]\n", "scenario.yaml: devices: expected a mapping of GPU index to settings"),
    ("gpus: 0\n", "scenario.yaml: gpus: must be between 1 and 64, got 0"),
    ("gpus: 65\n", "scenario.yaml: gpus: must be between 1 and 64, got 65"),
    ("gpus: eight\n", "scenario.yaml: gpus: expected an integer, got 'eight'"),
    ("gpus: true\n", "scenario.yaml: gpus: expected an integer, got true"),
    # names of things
    ("workload: {activity: bussy}\n",
     "scenario.yaml: workload.activity: unknown activity 'bussy' (one of: busy, idle, sawtooth)"),
    ("timeline: [{precision: fp8}]\n",
     "scenario.yaml: timeline[0].precision: unknown precision 'fp8' (one of: bf16, fp16, tf32,"),
    ("timeline: [{thermal: true}]\n",
     "scenario.yaml: timeline[0].thermal: unknown thermal slowdown kind true (one of: none, sw,"),
    ("timeline: [{activity: sawtooth, wait: nccl}]\n",
     "scenario.yaml: timeline[0].wait: unknown wait kind 'nccl' (one of: data, collective, copy)"),
    ("model: H100\n", "scenario.yaml: model: unknown GPU model 'H100'"),
    ("devices: {0: {model: NVIDIA H100}}\n",
     "scenario.yaml: devices[0].model: unknown GPU model 'NVIDIA H100'; did you mean"),
    ("devices: {0: {model: NVIDIA A100-SXM4-80GB, profiling: true}}\n",
     "scenario.yaml: devices[0].profiling: NVIDIA A100-SXM4-80GB has no GPM"),
    # numbers and times
    ("workload: {level: '0.9'}\n", "scenario.yaml: workload.level: expected a number, got '0.9'"),
    ("workload: {level: 0}\n", "scenario.yaml: workload.level: must be > 0 and <= 1, got 0"),
    ("workload: {level: 1.5}\n", "scenario.yaml: workload.level: must be > 0 and <= 1, got 1.5"),
    ("workload: {duty: 1}\n", "scenario.yaml: workload.duty: must be > 0 and < 1, got 1"),
    ("workload: {period: 0}\n", "scenario.yaml: workload.period: must be > 0 seconds"),
    ("workload: {memory: 2}\n", "scenario.yaml: workload.memory: must be >= 0 and <= 1, got 2"),
    ("timeline: [{at: -3, xid: 13}]\n",
     "scenario.yaml: timeline[0].at: must not be negative, got -3"),
    ("timeline: [{at: soon, xid: 13}]\n",
     "scenario.yaml: timeline[0].at: expected seconds (a number, or a string like '90s', '5m'), "
     "got 'soon'"),
    ("timeline: [{at: .inf, xid: 13}]\n", "scenario.yaml: timeline[0].at: must be a finite time"),
    ("timeline: [{at: 60, until: 30, thermal: sw}]\n",
     "scenario.yaml: timeline[0].until: must be after at (60 s), got 30"),
    ("timeline: [{at: 30, until: 30s, power_cap: true}]\n",
     "scenario.yaml: timeline[0].until: must be after at (30 s), got '30s'"),
    ("timeline: [{at: 10, until: 20, xid: 79}]\n",
     "scenario.yaml: timeline[0].until: xid happens at one instant and takes no 'until'"),
    ("timeline: [{at: 10, gpus: [1]}]\n", "scenario.yaml: timeline[0]: entry does nothing"),
    ("timeline: [{xid: 0}]\n", "scenario.yaml: timeline[0].xid: must be between 1 and 65535"),
    ("timeline: [{ecc_dbe: 1.5}]\n",
     "scenario.yaml: timeline[0].ecc_dbe: expected an integer, got 1.5"),
    ("timeline: [{power_cap: 700}]\n",
     "scenario.yaml: timeline[0].power_cap: expected true or false, got 700"),
    ("timeline: [{fall_off_bus: false}]\n",
     "scenario.yaml: timeline[0].fall_off_bus: only 'true' means something here"),
    ("timeline: {at: 3, xid: 79}\n",
     "scenario.yaml: timeline: expected a list of entries, got a mapping"),
    ("timeline: [3]\n", "scenario.yaml: timeline[0]: expected a mapping, got 3"),
    ("version: 2\n", "scenario.yaml: version: unsupported scenario format version 2 (this "
                     "stepscope reads version 1)"),
    ("version: 1\ngpus: 2\nnot_a_key: 3\n", "scenario.yaml: not_a_key: unknown key (allowed:"),
    ("name: [a]\n", "scenario.yaml: name: expected a string, got a list"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(": ")[1] for _, m in BAD])
def test_a_bad_scenario_is_one_error_naming_the_key_path_and_value(
    text: str, message: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, source="scenario.yaml")
    assert str(err.value).startswith(message), str(err.value)
    assert "Traceback" not in str(err.value)


def test_an_error_is_a_value_error_without_a_chained_yaml_traceback() -> None:
    with pytest.raises(ValueError) as err:
        parse_scenario("a: [\n", source="x.yaml")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_gpu_index_beyond_a_simulate_override_says_where_the_count_came_from() -> None:
    with pytest.raises(ScenarioError, match=r"^faults: devices\[7\]: GPU index 7 out of "
                                            r"range \(node has 2 GPUs, set by --simulate\)"):
        load_scenario("faults", n_gpus=2)
    with pytest.raises(ScenarioError,
                       match=r"thermal-straggler.yaml: timeline\[0\].gpus: GPU index 3 out"):
        load_scenario(Path(shipped_scenarios()["thermal-straggler"]), n_gpus=3)


def test_a_missing_file_names_the_path_and_the_shipped_examples(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as err:
        load_scenario(missing)
    assert str(err.value).startswith(f"{missing}: no such file, and not a shipped example")
    assert "thermal-straggler" in str(err.value)


def test_an_unreadable_path_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path)  # a directory


def test_a_file_error_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("gpus: 8\ntimeline:\n  - {at: 5, gpus: [8], xid: 79}\n")
    with pytest.raises(ScenarioError, match=f"^{f}: timeline\\[0\\].gpus: GPU index 8 out of"):
        load_scenario(f)


DOC = REPO / "docs" / "scenarios.md"


def test_the_docs_describe_every_key_and_model_and_their_examples_load() -> None:
    text = DOC.read_text()
    for where, keys in SCHEMA_KEYS.items():
        for key in keys:
            assert f"| `{key}` |" in text, (where, key)  # a row in one of the key tables
    for model in GPU_MODELS:
        assert f"| `{model}` |" in text, model
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        parse_scenario(block, source="docs/scenarios.md")
    for name in shipped_scenarios():
        assert f"### `{name}`" in text, name
