"""Configuration: one typed, frozen object, validated once.

Every setting can come from the YAML file (``--config``), from the environment
(``STEPSCOPE_<NAME>``) or from a flag (``--name``); later sources win:
defaults < file < environment < flags. A bad value raises :class:`ConfigError`
naming the key, the value and where it came from.
"""

from __future__ import annotations

import difflib
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from stepscope.core.errors import ConfigError
from stepscope.core.labels import HOST_LABEL, HOST_LABELS
from stepscope.core.yamltext import mapping_text, strict_load
from stepscope.diagnose.thresholds import Thresholds, parse_thresholds
from stepscope.ingest.aggregate import TrainingSettings
from stepscope.ingest.listener import IngestAccess
from stepscope.shared.datagram import (
    DEFAULT_INGEST,
    MAX_LABEL_LENGTH,
    IngestURLError,
    Limits,
    parse_ingest_url,
)
from stepscope.shared.datagram import PRECISIONS as _PRECISIONS


@dataclass(frozen=True)
class Listen:
    """Where the HTTP server binds. An empty host means all interfaces."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Config:
    """The exporter's settings. See docs/configuration in README for each key."""

    listen: Listen = Listen("", 9400)
    interval: float = 1.0
    slow_interval: float = 10.0
    simulate: int | None = None
    scenario: Path | None = None
    hostname: str = ""
    host_label: str = HOST_LABEL
    ingest: str = DEFAULT_INGEST
    # who may report, and the socket's group and mode (docs/ingest.md#the-socket)
    ingest_allow_uids: frozenset[int] = TrainingSettings.allow_uids
    ingest_allow_gids: frozenset[int] = TrainingSettings.allow_gids
    ingest_group: int | None = IngestAccess.group
    ingest_mode: int = IngestAccess.mode
    web_config: Path | None = None
    max_connections: int = 512
    http_request_timeout: float = 10.0
    hpc_job_dir: Path | None = None
    kubernetes_pod_resources: Path | None = None
    log_level: str = "info"
    log_format: str = "text"
    wait_for_driver: float = 0.0
    # the ingest's defaults are defined where they are enforced
    rank_expiry: float = TrainingSettings.rank_expiry
    mfu_window: float = TrainingSettings.mfu_window
    max_jobs: int = Limits.max_jobs
    max_ranks_per_job: int = Limits.max_ranks_per_job
    max_label_length: int = Limits.max_label_length
    peak_flops: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    diagnosis: Thresholds = field(default_factory=Thresholds)
    config_file: Path | None = None
    # the settings a source (file, environment, flag) set to other than their default:
    # an optional feature configured so that cannot start stops the start (exit 2); at
    # its default it may degrade with a warning (README, "Optional features")
    explicit: frozenset[str] = frozenset()

    @property
    def simulated(self) -> bool:
        """Whether simulated GPUs are asked for (``--simulate`` or ``--scenario``)."""
        return self.simulate is not None or self.scenario is not None


def _parse_listen(value: Any) -> Listen:
    text = str(value).strip()
    host, sep, port_s = text.rpartition(":")
    if not sep:
        raise ValueError("expected HOST:PORT or :PORT")
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError("the port is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError("the port must be 0-65535")
    return Listen(host, port)


def _seconds(lo: float, hi: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("expected a number of seconds")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError("expected a number of seconds") from None
        if not lo <= v <= hi:  # also rejects NaN
            raise ValueError(f"must be between {lo:g} and {hi:g} seconds")
        return v

    return parse


def _parse_simulate(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("expected a number of GPUs")
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError("expected a number of GPUs") from None
    if not 1 <= n <= 64:
        raise ValueError("must be between 1 and 64 GPUs")
    return n


def _parse_path(value: Any) -> Path | None:
    if value is None or str(value).strip() == "":
        return None
    return Path(str(value)).expanduser()


def _parse_hostname(value: Any) -> str:
    text = str(value).strip()
    if not text or len(text) > 253 or any(c.isspace() or ord(c) < 32 for c in text):
        raise ValueError("expected a non-empty host name without spaces")
    return text


def _parse_ingest(value: Any) -> str:
    """The SDK's grammar (one module), and UDP only on loopback: it carries no sender."""
    try:
        address = parse_ingest_url(str(value))
    except IngestURLError as exc:
        raise ValueError(str(exc)) from None
    if not address.is_loopback:
        raise ValueError(
            "udp:// ingest is unauthenticated (any host that reaches it could report "
            "steps), so it binds loopback only: 127.0.0.1, [::1] or localhost"
        )
    return address.url


def _parse_ids(kind: str) -> Callable[[Any], frozenset[int]]:
    """A list of uids (``kind="user"``) or gids: numbers or names, a YAML list or
    ``"1000,alice"`` (environment, flag)."""

    def parse(value: Any) -> frozenset[int]:
        items = value if isinstance(value, list) else str(value).replace(",", " ").split()
        ids = {_id(kind, item) for item in items}
        return frozenset(ids)

    return parse


def _id(kind: str, item: Any) -> int:
    if isinstance(item, bool):
        raise ValueError(f"expected {kind} names or numbers, got {item!r}")
    text = str(item).strip()
    if text.isascii() and text.isdigit():
        n = int(text)
        if n >= 1 << 32:
            raise ValueError(f"{kind} id {n} is out of range")
        return n
    import grp
    import pwd

    try:
        return pwd.getpwnam(text).pw_uid if kind == "user" else grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError(f"no {kind} named {text!r} on this host (give the number)") from None


def _parse_group(value: Any) -> int | None:
    if value is None or str(value).strip() == "":
        return None
    return _id("group", value)


def _parse_mode(value: Any) -> int:
    """A file mode: an octal string (``"0660"``), or the number YAML 1.1 reads ``0660`` as."""
    if isinstance(value, bool):
        raise ValueError("expected an octal mode such as 0660")
    if isinstance(value, int):
        mode = value
        if mode & ~0o666 or not mode & 0o200:
            raise ValueError(
                f"YAML reads {value} as a decimal number; write the mode as a quoted "
                "octal string: '0660'"
            )
    else:
        try:
            mode = int(str(value).strip(), 8)
        except ValueError:
            raise ValueError("expected an octal mode such as 0660") from None
    if mode & 0o111 and not mode & ~0o777:
        raise ValueError(
            f"execute bits mean nothing on a socket: use {mode & 0o666:04o} (read/write "
            "bits only; 0660 admits the owner and the group, 0666 every local user)"
        )
    if mode & ~0o666 or not mode & 0o200:
        raise ValueError(
            "expected read/write bits from 0200 to 0666 (0660 admits the owner and the "
            "group, 0666 every local user)"
        )
    return mode


def _count(lo: int, hi: int, what: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"expected a number of {what}")
        try:
            n = int(str(value).strip())
        except ValueError:
            raise ValueError(f"expected a number of {what}") from None
        if not lo <= n <= hi:
            raise ValueError(f"must be between {lo} and {hi} {what}")
        return n

    return parse



def _parse_peak_flops(value: Any) -> Mapping[str, Mapping[str, float]]:
    """``{"NVIDIA Foo": {"bf16": 1.2e15}}``; a string (environment) is read as YAML."""
    value = mapping_text(value)
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, dict):
        raise ValueError('expected a mapping {"NVML model name": {precision: FLOP/s}}')
    table: dict[str, Mapping[str, float]] = {}
    for model, figures in value.items():
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model {model!r}: expected the exact NVML model name")
        if not isinstance(figures, dict) or not figures:
            raise ValueError(f"{model!r}: expected a mapping of precision to FLOP/s")
        row: dict[str, float] = {}
        for precision, flops in figures.items():
            if precision not in _PRECISIONS:
                raise ValueError(
                    f"{model!r}: unknown precision {precision!r} "
                    f"(expected {', '.join(_PRECISIONS)})"
                )
            try:
                # YAML 1.1 reads 1.2e15 (no dot before e, no sign) as a string
                v = float(flops) if not isinstance(flops, bool) else math.nan
            except (TypeError, ValueError):
                v = math.nan
            if not 1e9 <= v <= 1e18:  # also rejects NaN
                raise ValueError(
                    f"{model!r} {precision}: expected dense FLOP/s per GPU between 1e9 and "
                    f"1e18, got {flops!r}"
                )
            row[precision] = v
        table[model] = MappingProxyType(row)
    return MappingProxyType(table)


def _parse_host_label(value: Any) -> str:
    text = str(value).strip()
    if text not in HOST_LABELS:
        raise ValueError(
            "expected Hostname (dcgm-exporter before its rename) or hostname (after it)"
        )
    return text


def _parse_log_level(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ("debug", "info", "warning", "error"):
        raise ValueError("expected debug, info, warning or error")
    return text


def _parse_log_format(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ("text", "json"):
        raise ValueError("expected text or json")
    return text


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "listen": _parse_listen,
    "interval": _seconds(0.1, 3600),
    "slow_interval": _seconds(0.1, 86400),
    "simulate": _parse_simulate,
    "scenario": _parse_path,
    "hostname": _parse_hostname,
    "host_label": _parse_host_label,
    "ingest": _parse_ingest,
    "ingest_allow_uids": _parse_ids("user"),
    "ingest_allow_gids": _parse_ids("group"),
    "ingest_group": _parse_group,
    "ingest_mode": _parse_mode,
    "web_config": _parse_path,
    "max_connections": _count(1, 65536, "connections"),
    "http_request_timeout": _seconds(0.5, 600),
    "hpc_job_dir": _parse_path,
    # the kubelet's pod-resources socket; unset: no Kubernetes attribution
    "kubernetes_pod_resources": _parse_path,
    "log_level": _parse_log_level,
    "log_format": _parse_log_format,
    # 0: no driver is an error at once; N: a service started before the driver waits N s
    "wait_for_driver": _seconds(0, 86400),
    "rank_expiry": _seconds(1, 86400),
    "mfu_window": _seconds(1, 600),
    "max_jobs": _count(1, 1024, "jobs"),
    "max_ranks_per_job": _count(1, 65536, "ranks"),
    "max_label_length": _count(1, MAX_LABEL_LENGTH, "characters"),
    "peak_flops": _parse_peak_flops,
    "diagnosis": parse_thresholds,
}

SETTINGS: tuple[str, ...] = tuple(_PARSERS)


def env_name(key: str) -> str:
    """The environment variable for a setting: ``STEPSCOPE_SLOW_INTERVAL``."""
    return "STEPSCOPE_" + key.upper()


# STEPSCOPE_* variables that are not settings and are read elsewhere: the config file's
# path (read by load) and the training SDK's own (stepscope.train)
_OTHER_VARIABLES = frozenset({"STEPSCOPE_CONFIG", "STEPSCOPE_NCCL_TRANSPORT"})


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One warning per ``STEPSCOPE_*`` variable that is no setting but looks like a
    misspelt one (``STEPSCOPE_INTERVL``), naming the setting: it is ignored, and a typo
    must not pass for a setting silently. Names that resemble none are left alone (other
    tools' variables share the prefix)."""
    known = {env_name(key) for key in _PARSERS} | _OTHER_VARIABLES
    out = []
    for name in sorted(env):
        if not name.startswith("STEPSCOPE_") or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        if close:
            out.append(f"{name} is not a setting and is ignored; did you mean {close[0]}?")
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    try:
        data = strict_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path}: {problem}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
    unknown = sorted(str(k) for k in data if str(k).replace("-", "_") not in _PARSERS)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS)})"
        )
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def default_hostname(env: Mapping[str, str]) -> str:
    """``$NODE_NAME`` (Kubernetes downward API) if set, else this host's name."""
    return env.get("NODE_NAME") or socket.gethostname()


def load(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Config:
    """Build the Config from flags (None = not given), the environment and the file."""
    env = os.environ if env is None else env
    raw: dict[str, tuple[Any, str]] = {}

    config_file = flags.get("config") or env.get("STEPSCOPE_CONFIG") or None
    path = Path(config_file).expanduser() if config_file else None
    if path is not None:
        for key, value in _read_file(path).items():
            raw[key] = (value, f"config file {path}")
    for key in _PARSERS:
        if env_name(key) in env:
            raw[key] = (env[env_name(key)], f"${env_name(key)}")
    for key in _PARSERS:
        if flags.get(key) is not None:
            raw[key] = (flags[key], f"--{key.replace('_', '-')}")

    values: dict[str, Any] = {}
    for key, (value, origin) in raw.items():
        try:
            values[key] = _PARSERS[key](value)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}, got {value!r} (from {origin})") from None
    values.setdefault("hostname", default_hostname(env))
    defaults = Config()
    explicit = frozenset(k for k in raw if values[k] != getattr(defaults, k, None))
    cfg = Config(config_file=path, explicit=explicit, **values)
    if (cfg.ingest_allow_uids or cfg.ingest_allow_gids) and not parse_ingest_url(
        cfg.ingest
    ).is_unix:
        raise ConfigError(
            "ingest_allow_uids/ingest_allow_gids: need a unix:// ingest; a udp:// datagram "
            f"carries no sender to check (ingest is {cfg.ingest})"
        )
    if cfg.slow_interval < cfg.interval:
        raise ConfigError(
            f"slow_interval: must be at least interval ({cfg.interval:g} s), "
            f"got {cfg.slow_interval:g}"
        )
    return cfg
