"""Training settings: defaults, sources and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.app.config import load
from stepscope.app.serve import training_settings_of
from stepscope.core.errors import ConfigError


def test_training_defaults_are_the_documented_ones() -> None:
    cfg = load({}, env={"NODE_NAME": "n"})
    assert (cfg.rank_expiry, cfg.mfu_window) == (300.0, 30.0)
    assert (cfg.max_jobs, cfg.max_ranks_per_job, cfg.max_label_length) == (8, 64, 128)
    assert dict(cfg.peak_flops) == {}
    ts = training_settings_of(cfg)
    assert ts.limits.max_jobs == 8 and ts.rank_expiry == 300.0 and ts.mfu_window == 30.0


def test_training_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "rank_expiry: 120\nmax_jobs: 4\n"
        "peak_flops:\n  NVIDIA Foo:\n    bf16: 1.2e15\n    fp8: 2.4e+15\n"
    )
    env = {"STEPSCOPE_MFU_WINDOW": "10", "STEPSCOPE_MAX_JOBS": "8"}
    cfg = load({"config": str(f), "max_ranks_per_job": "64"}, env=env)
    assert cfg.rank_expiry == 120 and cfg.mfu_window == 10
    assert cfg.max_jobs == 8 and cfg.max_ranks_per_job == 64
    # YAML 1.1 reads 1.2e15 as a string; it is still a number of FLOP/s
    assert cfg.peak_flops["NVIDIA Foo"] == {"bf16": 1.2e15, "fp8": 2.4e15}
    table = training_settings_of(cfg).peak_flops
    assert table.lookup("NVIDIA Foo", "bf16") == 1.2e15
    assert table.lookup("NVIDIA H200", "bf16") == pytest.approx(989.4e12)


def test_peak_flops_from_the_environment_as_json() -> None:
    cfg = load({}, env={"STEPSCOPE_PEAK_FLOPS": '{"NVIDIA Foo": {"bf16": 1.2e15}}'})
    assert cfg.peak_flops["NVIDIA Foo"]["bf16"] == 1.2e15


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"rank_expiry": "0"}, {}, "rank_expiry: must be between 1 and 86400 seconds"),
        ({"mfu_window": "1000"}, {}, "mfu_window: must be between 1 and 600 seconds"),
        ({"max_jobs": "0"}, {}, "max_jobs: must be between 1 and 1024 jobs, got '0'"),
        ({"max_ranks_per_job": "many"}, {}, "max_ranks_per_job: expected a number of ranks"),
        ({"max_label_length": "129"}, {}, "max_label_length: must be between 1 and 128"),
        ({}, {"STEPSCOPE_PEAK_FLOPS": "[1, 2]"}, "peak_flops: expected a mapping"),
        ({}, {"STEPSCOPE_PEAK_FLOPS": '{"NVIDIA Foo": {"bf17": 1e15}}'},
         "peak_flops: 'NVIDIA Foo': unknown precision 'bf17'"),
        ({}, {"STEPSCOPE_PEAK_FLOPS": '{"NVIDIA Foo": {"bf16": "fast"}}'},
         "peak_flops: 'NVIDIA Foo' bf16: expected dense FLOP/s per GPU"),
        ({}, {"STEPSCOPE_PEAK_FLOPS": '{"NVIDIA Foo": {"bf16": 1e21}}'},
         "between 1e9 and 1e18"),
        ({}, {"STEPSCOPE_PEAK_FLOPS": '{"NVIDIA Foo": {}}'},
         "'NVIDIA Foo': expected a mapping of precision to FLOP/s"),
    ],
)
def test_bad_training_values_name_the_key(
    flags: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(flags, env=env)
    assert message in str(err.value)


def test_ingest_access_defaults_keep_the_socket_off_other_users() -> None:
    cfg = load({}, env={})
    assert (cfg.ingest_mode, cfg.ingest_group) == (0o660, None)
    assert cfg.ingest_allow_uids == frozenset() and cfg.ingest_allow_gids == frozenset()


def test_ingest_access_from_file_and_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    # YAML 1.1 reads 0660 as an octal number; lists of names and numbers
    f.write_text("ingest_mode: 0640\ningest_allow_uids: [root, 1000]\ningest_group: 0\n")
    cfg = load({"config": str(f)}, env={"STEPSCOPE_INGEST_ALLOW_GIDS": "nogroup, 1234"})
    assert cfg.ingest_mode == 0o640 and cfg.ingest_group == 0
    assert cfg.ingest_allow_uids == {0, 1000} and cfg.ingest_allow_gids == {65534, 1234}
    ts = training_settings_of(cfg)
    assert ts.allow_uids == {0, 1000} and ts.allow_gids == {65534, 1234}
    assert load({}, env={"STEPSCOPE_INGEST_MODE": "0666"}).ingest_mode == 0o666


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # issue 27: "write it as an octal string ... got '0777'" told a user who had
        ({"STEPSCOPE_INGEST_MODE": "0755"},
         "ingest_mode: execute bits mean nothing on a socket: use 0644"),
        ({"STEPSCOPE_INGEST_MODE": "0777"},
         "ingest_mode: execute bits mean nothing on a socket: use 0666 (read/write bits only; "
         "0660 admits the owner and the group, 0666 every local user), got '0777' "
         "(from $STEPSCOPE_INGEST_MODE)"),
        ({"STEPSCOPE_INGEST_MODE": "rw"}, "ingest_mode: expected an octal mode"),
        ({"STEPSCOPE_INGEST_MODE": "0060"}, "ingest_mode: expected read/write bits from 0200"),
        ({"STEPSCOPE_INGEST_GROUP": "no-such-group-x"},
         "ingest_group: no group named 'no-such-group-x' on this host (give the number)"),
        ({"STEPSCOPE_INGEST_ALLOW_UIDS": "root,4294967296"},
         "ingest_allow_uids: user id 4294967296 is out of range"),
        ({"STEPSCOPE_INGEST": "udp://127.0.0.1:9401", "STEPSCOPE_INGEST_ALLOW_UIDS": "0"},
         "ingest_allow_uids/ingest_allow_gids: need a unix:// ingest"),
    ],
)
def test_bad_ingest_access_values_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load({}, env=env)
    assert message in str(err.value)


def test_a_yaml_mode_written_in_decimal_is_refused_with_a_hint(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("ingest_mode: 660\n")  # YAML: the number 660, not 0o660
    with pytest.raises(ConfigError, match=r"YAML reads 660 as a decimal number; write the mode "
                       r"as a quoted octal string: '0660'"):
        load({"config": str(f)}, env={})
