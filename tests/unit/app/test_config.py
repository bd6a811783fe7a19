"""Configuration: one typed object from file, environment and flags."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from stepscope.app.config import SETTINGS, Config, Listen, load, unknown_variables
from stepscope.core.errors import ConfigError
from tests.support import REPO


def test_defaults_match_the_documented_contract() -> None:
    cfg = load({}, env={"NODE_NAME": "ip-10-0-0-1"})
    assert cfg.listen == Listen("", 9400)
    assert cfg.interval == 1.0
    assert cfg.slow_interval == 10.0
    assert cfg.ingest == "unix:///run/stepscope/ingest.sock"
    assert cfg.hostname == "ip-10-0-0-1"
    assert not cfg.simulated
    assert cfg.log_format == "text"
    assert cfg.wait_for_driver == 0, "by hand, no driver is an error at once"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("interval: 2\nslow_interval: 30\nhostname: from-file\nlisten: ':9500'\n")
    env = {"STEPSCOPE_INTERVAL": "3", "STEPSCOPE_HOSTNAME": "from-env"}
    cfg = load({"config": str(f), "interval": "5"}, env=env)
    assert cfg.interval == 5.0
    assert cfg.hostname == "from-env"
    assert cfg.slow_interval == 30.0
    assert cfg.listen == Listen("", 9500)
    assert cfg.config_file == f


def test_service_settings_from_file_environment_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("log_format: json\nwait_for_driver: 300\n")
    cfg = load({"config": str(f)}, env={})
    assert (cfg.log_format, cfg.wait_for_driver) == ("json", 300.0)
    cfg = load({"config": str(f), "wait_for_driver": "0"}, env={"STEPSCOPE_LOG_FORMAT": "Text"})
    assert (cfg.log_format, cfg.wait_for_driver) == ("text", 0.0)


def test_config_file_from_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("simulate: 8\n")
    cfg = load({}, env={"STEPSCOPE_CONFIG": str(f)})
    assert cfg.simulate == 8 and cfg.simulated


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"interval": "-1"}, {}, "interval: must be between 0.1 and 3600 seconds, got '-1' "
                                 "(from --interval)"),
        ({}, {"STEPSCOPE_INTERVAL": "fast"}, "interval: expected a number of seconds, got "
                                             "'fast' (from $STEPSCOPE_INTERVAL)"),
        ({"interval": "nan"}, {}, "interval: must be between"),
        ({"listen": "9400"}, {}, "listen: expected HOST:PORT or :PORT, got '9400'"),
        ({"listen": ":99999"}, {}, "listen: the port must be 0-65535"),
        ({"simulate": "0"}, {}, "simulate: must be between 1 and 64 GPUs, got '0'"),
        ({"simulate": "eight"}, {}, "simulate: expected a number of GPUs"),
        ({"ingest": "tcp://x:1"}, {}, "ingest: expected unix:///PATH or udp://HOST:PORT"),
        ({"ingest": "udp://127.0.0.1"}, {}, "ingest: expected udp://HOST:PORT"),
        ({"hostname": "a b"}, {}, "hostname: expected a non-empty host name"),
        ({"log_level": "loud"}, {}, "log_level: expected debug, info, warning or error"),
        ({}, {"STEPSCOPE_LOG_FORMAT": "logfmt"}, "log_format: expected text or json, got "
                                                 "'logfmt' (from $STEPSCOPE_LOG_FORMAT)"),
        ({"wait_for_driver": "-5"}, {}, "wait_for_driver: must be between 0 and 86400 "
                                        "seconds, got '-5' (from --wait-for-driver)"),
        ({"interval": "20"}, {}, "slow_interval: must be at least interval (20 s), got 10"),
    ],
)
def test_bad_values_name_the_key_value_and_origin(
    flags: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(flags, env=env)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("interval: [1, 2\n", "at line 2"),
        ("- a\n- b\n", "expected a mapping of settings at the top level"),
        ("intervall: 2\n", "unknown setting 'intervall'"),
        ("interval: true\n", "interval: expected a number of seconds, got True (from config file"),
    ],
)
def test_bad_config_files_are_named_precisely(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load({"config": str(f)}, env={})
    assert message in str(err.value)
    assert str(f) in str(err.value)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load({"config": str(tmp_path / "nope.yaml")}, env={})


def test_ipv6_and_explicit_hosts() -> None:
    assert load({"listen": "[::1]:9400"}, env={}).listen == Listen("::1", 9400)
    assert str(Listen("::1", 9400)) == "[::1]:9400"
    assert load({"listen": "127.0.0.1:0"}, env={}).listen == Listen("127.0.0.1", 0)


def test_config_is_immutable() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.interval = 2  # type: ignore[misc]


def test_a_key_given_twice_is_an_error_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("interval: 1\nslow_interval: 10\ninterval: 5\n")
    with pytest.raises(ConfigError, match="duplicate key 'interval'"):
        load({"config": str(f)}, env={})


def test_every_setting_is_a_flag_and_a_readme_row() -> None:
    """The README's promise: every setting is a flag, a file key and STEPSCOPE_<NAME>
    (the two map-valued ones, peak_flops and diagnosis, are file or JSON only)."""
    from stepscope.app.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {a.dest for a in sub.choices["serve"]._actions}
    maps = {"peak_flops", "diagnosis"}
    assert [s for s in SETTINGS if s not in flags and s not in maps] == []
    readme = (REPO / "README.md").read_text()
    rows = set(re.findall(r"(?m)^\| `[^`]*`(?: / `(\w+)`)?", readme))
    assert [s for s in SETTINGS if s not in rows and s not in maps] == []


def test_a_setting_is_explicit_only_when_set_to_other_than_its_default() -> None:
    """The rule for optional features (issue 36): one configured explicitly that cannot
    start stops the start; at its default (the chart repeats the default ingest socket)
    it may degrade with a warning."""
    assert "ingest" not in load({}, env={}).explicit
    default = "unix:///run/stepscope/ingest.sock"
    assert "ingest" not in load({}, env={"STEPSCOPE_INGEST": default}).explicit
    cfg = load({"ingest": "unix:///tmp/s/ingest.sock"}, env={})
    assert "ingest" in cfg.explicit
    assert "kubernetes_pod_resources" in load(
        {"kubernetes_pod_resources": "/k.sock"}, env={}).explicit


def test_a_misspelt_variable_is_named_with_the_setting_meant() -> None:
    assert unknown_variables({
        "STEPSCOPE_INTERVL": "2", "STEPSCOPE_INTERVAL": "1", "STEPSCOPE_CONFIG": "/c.yaml",
        "STEPSCOPE_NCCL_TRANSPORT": "efa", "STEPSCOPE_REQUIRE_PROMTOOL": "1", "PATH": "/bin",
    }) == [
        "STEPSCOPE_INTERVL is not a setting and is ignored; did you mean STEPSCOPE_INTERVAL?"
    ]
