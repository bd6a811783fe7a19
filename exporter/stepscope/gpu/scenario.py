"""The scenario language of the simulated GPU backend: parse and validate.

A scenario says what a simulated node looks like (how many GPUs, which model)
and scripts what each GPU does over simulated time: a baseline ``workload``
and a ``timeline`` of changes (windows such as thermal throttling, and point
events such as an XID). docs/scenarios.md is the user's reference.

Parsing is strict on purpose: a typo in a key must be an error, never a
silently ignored line that makes a demo show the wrong thing. Every error is a
:class:`ScenarioError` whose message names the source, the key path and the bad
value, e.g. ``faults.yaml: timeline[2].gpus: GPU index 9 out of range (node has
8 GPUs)``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn, cast, get_args

import yaml

Activity = Literal["busy", "idle", "sawtooth"]
Precision = Literal["bf16", "fp16", "tf32", "fp32", "fp64", "int8"]
Thermal = Literal["none", "sw", "hw", "both"]
Wait = Literal["data", "collective", "copy"]
Kernels = Literal["gemm", "elementwise"]

ACTIVITIES: tuple[str, ...] = get_args(Activity)
PRECISIONS: tuple[str, ...] = get_args(Precision)
THERMAL_KINDS: tuple[str, ...] = get_args(Thermal)
WAITS: tuple[str, ...] = get_args(Wait)
KERNELS: tuple[str, ...] = get_args(Kernels)

MAX_GPUS = 64
DEFAULT_GPUS = 8
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "580.159.03"
FORMAT_VERSION = 1


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names source, key path and value."""


@dataclass(frozen=True)
class GpuModel:
    """The physical facts of one GPU model that the simulation draws on.

    ``gpm``: the model supports NVML GPM (Hopper or newer), so profiling fields
    exist for it; on older models they are absent, as on real hardware.
    ``mig``: the model supports MIG (its mode then reads "disabled").
    """

    name: str
    memory_total_mib: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    mem_clock_mhz: int
    gpm: bool
    mig: bool


# Figures as nvidia-smi reports them on these boards (memory total in MiB as
# NVML returns it, default power limit, boost and idle clocks).
GPU_MODELS: Mapping[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 700.0, 75.0, 1980, 345, 2619, True, True),
        GpuModel("NVIDIA H200", 143771, 700.0, 75.0, 1980, 345, 3201, True, True),
        GpuModel("NVIDIA H100 NVL", 95830, 400.0, 60.0, 1785, 345, 2619, True, True),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 400.0, 60.0, 1410, 210, 1593, False, True),
        GpuModel("NVIDIA A10G", 23028, 300.0, 25.0, 1710, 210, 6251, False, False),
        GpuModel("Tesla T4", 15360, 70.0, 10.0, 1590, 300, 5000, False, False),
    )
}


@dataclass(frozen=True)
class Workload:
    """What a GPU runs: the baseline for every GPU from t=0.

    ``level``: SM active while a kernel runs (0-1). ``period``/``duty``: for
    ``sawtooth``, busy for ``duty * period`` seconds out of every ``period``.
    ``wait``: what fills a sawtooth's gaps: ``data`` (no kernel: the GPU waits
    for input), ``collective`` (an NCCL kernel spins on a few SMs waiting for
    peers, so GPU utilization still reads 100%) or ``copy`` (no kernel: the batch is
    copied from pageable host memory, PCIe receive busy). ``memory``: framebuffer share
    in use (0-1); None means "by activity" (most of it unless idle). ``kernels``:
    ``gemm`` (matrix multiplies: the precision's pipes) or ``elementwise``
    (element-wise and normalisation kernels: DRAM-bound, tensor pipes nearly idle).
    """

    activity: Activity = "busy"
    precision: Precision = "bf16"
    level: float = 0.95
    period: float = 1.0
    duty: float = 0.5
    wait: Wait = "data"
    memory: float | None = None
    kernels: Kernels = "gemm"


@dataclass(frozen=True)
class DeviceSpec:
    """Static facts of one simulated GPU: its model and whether GPM profiling works."""

    model: GpuModel
    profiling: bool


@dataclass(frozen=True)
class TimelineEntry:
    """One scripted change on ``gpus`` from ``at`` (until ``until`` when given).

    Window keys (workload keys, ``thermal``, ``power_cap``, ``sm_clock``) override the state
    within ``[at, until)``; later entries win where windows overlap. Counter
    keys (``ecc_sbe``, ``ecc_dbe``, ``pcie_replay``) add that many at ``at``,
    or spread them evenly over ``[at, until)``. Point keys (``xid``,
    ``fall_off_bus``, ``row_remap_failure``, ``reset``) happen at ``at``.
    """

    at: float
    gpus: tuple[int, ...]
    until: float | None = None
    activity: Activity | None = None
    precision: Precision | None = None
    level: float | None = None
    period: float | None = None
    duty: float | None = None
    wait: Wait | None = None
    memory: float | None = None
    kernels: Kernels | None = None
    thermal: Thermal | None = None
    power_cap: bool | None = None
    # the SM clock under load as a share of boost, with no clock event reason: a
    # fail-slow board, or clocks locked with nvidia-smi -lgc
    sm_clock: float | None = None
    xid: int | None = None
    fall_off_bus: bool = False
    row_remap_failure: bool = False
    reset: bool = False
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    pcie_replay: int = 0


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: one :class:`DeviceSpec` per GPU, a baseline, a timeline."""

    gpus: int
    devices: tuple[DeviceSpec, ...]
    workload: Workload = field(default_factory=Workload)
    timeline: tuple[TimelineEntry, ...] = ()
    driver_version: str = DEFAULT_DRIVER
    name: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.devices) != self.gpus:
            raise ScenarioError(
                f"scenario: {len(self.devices)} device specs for {self.gpus} GPUs"
            )


# --- key sets: one place that says which key belongs where ------------------

_TOP_KEYS = ("version", "name", "description", "gpus", "model", "driver_version", "workload",
             "devices", "timeline")
_WORKLOAD_KEYS = ("activity", "precision", "level", "period", "duty", "wait", "memory",
                  "kernels")
_DEVICE_KEYS = ("model", "profiling")
_WINDOW_KEYS = (*_WORKLOAD_KEYS, "thermal", "power_cap", "sm_clock")
_COUNTER_KEYS = ("ecc_sbe", "ecc_dbe", "pcie_replay")
_POINT_KEYS = ("xid", "fall_off_bus", "row_remap_failure", "reset")
_ENTRY_KEYS = ("at", "until", "gpus", *_WINDOW_KEYS, *_COUNTER_KEYS, *_POINT_KEYS)

SCHEMA_KEYS: Mapping[str, tuple[str, ...]] = {
    "top level": _TOP_KEYS, "workload": _WORKLOAD_KEYS, "devices": _DEVICE_KEYS,
    "timeline": _ENTRY_KEYS,
}
"""Every key the language accepts, by where it goes (docs/scenarios.md is checked against it)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _show(value: object) -> str:
    """A value as the user wrote it, with its YAML type when that is the problem."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return repr(value)


class _Checker:
    """Validation helpers that raise ScenarioError with ``source: path: message``."""

    def __init__(self, source: str, n_override: int | None) -> None:
        self.source = source
        self.n_override = n_override

    def fail(self, path: str, message: str) -> NoReturn:
        raise ScenarioError(f"{self.source}: {path}: {message}")

    def mapping(self, value: object, path: str, allowed: Iterable[str]) -> dict[str, object]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        allowed = tuple(allowed)
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                where = f"{path}.{key}" if path != "top level" else str(key)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                self.fail(where, f"unknown key{suggestion} (allowed: {', '.join(allowed)})")
        return cast(dict[str, object], value)

    def number(self, value: object, path: str, lo: float, hi: float,
               lo_open: bool = False, hi_open: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"expected a number, got {_show(value)}")
        v = float(value)
        too_low = v <= lo if lo_open else v < lo
        too_high = v >= hi if hi_open else v > hi
        if math.isnan(v) or too_low or too_high:
            lo_s = f"{'>' if lo_open else '>='} {lo:g}"
            hi_s = f"{'<' if hi_open else '<='} {hi:g}"
            self.fail(path, f"must be {lo_s} and {hi_s}, got {_show(value)}")
        return v

    def integer(self, value: object, path: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_show(value)}")
        if not lo <= value <= hi:
            self.fail(path, f"must be between {lo} and {hi}, got {value}")
        return value

    def seconds(self, value: object, path: str) -> float:
        """A time in seconds: a number, or a string like '90s', '500ms', '5m', '1h'."""
        if isinstance(value, str):
            m = _DURATION.match(value)
            if m is None:
                self.fail(path, f"expected seconds (a number, or a string like '90s', '5m'), "
                                f"got {_show(value)}")
            v = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"expected seconds (a number, or a string like '90s', '5m'), "
                            f"got {_show(value)}")
        else:
            v = float(value)
        if math.isnan(v) or math.isinf(v):
            self.fail(path, f"must be a finite time, got {_show(value)}")
        if v < 0:
            self.fail(path, f"must not be negative, got {_show(value)}")
        return v

    def choice(self, value: object, path: str, choices: tuple[str, ...], what: str) -> str:
        if not isinstance(value, str) or value not in choices:
            self.fail(path, f"unknown {what} {_show(value)} (one of: {', '.join(choices)})")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def text(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a string, got {_show(value)}")
        return value

    def model(self, value: object, path: str) -> GpuModel:
        name = self.text(value, path)
        if name not in GPU_MODELS:
            hint = difflib.get_close_matches(name, list(GPU_MODELS), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            self.fail(path, f"unknown GPU model {name!r}{suggestion} "
                            f"(one of: {', '.join(GPU_MODELS)})")
        return GPU_MODELS[name]

    def gpu_index(self, value: object, path: str, n: int) -> int:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # YAML mapping keys are often quoted
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a GPU index, got {_show(value)}")
        if not 0 <= value < n:
            by = ", set by --simulate" if self.n_override is not None else ""
            self.fail(path, f"GPU index {value} out of range (node has {n} GPUs{by})")
        return value

    def gpu_set(self, value: object, path: str, n: int) -> tuple[int, ...]:
        if value == "all":
            return tuple(range(n))
        if isinstance(value, bool) or not isinstance(value, (int, list)):
            self.fail(path, f"expected 'all', a GPU index or a list of them, got {_show(value)}")
        items: list[object] = value if isinstance(value, list) else [value]
        if not items:
            self.fail(path, "empty list; name GPU indices or write 'all'")
        out: list[int] = []
        for item in items:
            idx = self.gpu_index(item, path, n)
            if idx in out:
                self.fail(path, f"GPU index {idx} listed twice")
            out.append(idx)
        return tuple(sorted(out))


def _workload_fields(c: _Checker, m: Mapping[str, object], path: str) -> dict[str, object]:
    """The workload keys present in ``m``, validated (shared by baseline and timeline)."""
    out: dict[str, object] = {}
    if "activity" in m:
        out["activity"] = c.choice(m["activity"], f"{path}.activity", ACTIVITIES, "activity")
    if "precision" in m:
        out["precision"] = c.choice(m["precision"], f"{path}.precision", PRECISIONS,
                                    "precision")
    if "level" in m:
        out["level"] = c.number(m["level"], f"{path}.level", 0.0, 1.0, lo_open=True)
    if "period" in m:
        out["period"] = c.seconds(m["period"], f"{path}.period")
        if out["period"] == 0:
            c.fail(f"{path}.period", "must be > 0 seconds")
    if "duty" in m:
        # 0 and 1 are idle and busy: say so rather than simulate a degenerate sawtooth.
        out["duty"] = c.number(m["duty"], f"{path}.duty", 0.0, 1.0, lo_open=True, hi_open=True)
    if "wait" in m:
        out["wait"] = c.choice(m["wait"], f"{path}.wait", WAITS, "wait kind")
    if "memory" in m:
        out["memory"] = c.number(m["memory"], f"{path}.memory", 0.0, 1.0)
    if "kernels" in m:
        out["kernels"] = c.choice(m["kernels"], f"{path}.kernels", KERNELS, "kernel mix")
    return out


def _parse_entry(c: _Checker, raw: object, path: str, n: int) -> TimelineEntry:
    m = c.mapping(raw, path, _ENTRY_KEYS)
    at = c.seconds(m.get("at", 0), f"{path}.at")
    until = None
    if "until" in m:
        until = c.seconds(m["until"], f"{path}.until")
        if until <= at:
            c.fail(f"{path}.until", f"must be after at ({at:g} s), got {_show(m['until'])}")
    gpus = c.gpu_set(m.get("gpus", "all"), f"{path}.gpus", n)
    actions = [k for k in m if k not in ("at", "until", "gpus")]
    if not actions:
        c.fail(path, "entry does nothing; set at least one of: "
                     + ", ".join(k for k in _ENTRY_KEYS if k not in ("at", "until", "gpus")))
    if until is not None:
        for key in actions:
            if key in _POINT_KEYS:
                c.fail(f"{path}.until", f"{key} happens at one instant and takes no 'until' "
                                        "(put it in its own entry)")
    kw: dict[str, object] = _workload_fields(c, m, path)
    if "thermal" in m:
        kw["thermal"] = c.choice(m["thermal"], f"{path}.thermal", THERMAL_KINDS,
                                 "thermal slowdown kind")
    if "power_cap" in m:
        kw["power_cap"] = c.boolean(m["power_cap"], f"{path}.power_cap")
    if "sm_clock" in m:
        kw["sm_clock"] = c.number(m["sm_clock"], f"{path}.sm_clock", 0.0, 1.0, lo_open=True)
    for key in _COUNTER_KEYS:
        if key in m:
            kw[key] = c.integer(m[key], f"{path}.{key}", 1, 10**9)
    if "xid" in m:
        kw["xid"] = c.integer(m["xid"], f"{path}.xid", 1, 65535)
    for key in ("fall_off_bus", "row_remap_failure", "reset"):
        if key in m and c.boolean(m[key], f"{path}.{key}") is not True:
            c.fail(f"{path}.{key}", "only 'true' means something here; remove the key instead")
        elif key in m:
            kw[key] = True
    return TimelineEntry(at=at, gpus=gpus, until=until, **kw)  # type: ignore[arg-type]


def parse_scenario(data: str | Mapping[str, object], *, source: str = "scenario",
                   n_gpus: int | None = None) -> Scenario:
    """Validate a scenario given as YAML text or an already-loaded mapping.

    ``source`` names it in error messages (usually the file path). ``n_gpus``,
    when given (``--simulate N``), overrides the scenario's ``gpus`` count; GPU
    indices are then checked against it. Raises :class:`ScenarioError`.
    """
    c = _Checker(source, n_gpus)
    raw: object = _load_yaml(data, source) if isinstance(data, str) else data
    if raw is None:
        c.fail("top level", "empty document; expected a mapping (write {} for all defaults)")
    if not isinstance(raw, Mapping):
        c.fail("top level", f"expected a mapping of scenario keys, got {_show(raw)}")
    top = c.mapping(dict(raw), "top level", _TOP_KEYS)

    if "version" in top and c.integer(top["version"], "version", 0, 2**31) != FORMAT_VERSION:
        c.fail("version", f"unsupported scenario format version {top['version']} "
                          f"(this stepscope reads version {FORMAT_VERSION})")
    name = c.text(top["name"], "name") if "name" in top else ""
    description = c.text(top["description"], "description") if "description" in top else ""
    driver = c.text(top["driver_version"], "driver_version") if "driver_version" in top \
        else DEFAULT_DRIVER
    n = c.integer(top.get("gpus", DEFAULT_GPUS), "gpus", 1, MAX_GPUS)
    if n_gpus is not None:
        n = c.integer(n_gpus, "--simulate", 1, MAX_GPUS)
    model = c.model(top["model"], "model") if "model" in top else GPU_MODELS[DEFAULT_MODEL]

    wl = c.mapping(top.get("workload", {}), "workload", _WORKLOAD_KEYS)
    workload = Workload(**_workload_fields(c, wl, "workload"))  # type: ignore[arg-type]

    devices = [DeviceSpec(model, model.gpm) for _ in range(n)]
    dev_raw = top.get("devices", {})
    if not isinstance(dev_raw, dict):
        c.fail("devices", f"expected a mapping of GPU index to settings, got {_show(dev_raw)}")
    seen: set[int] = set()
    for key, spec in dev_raw.items():
        idx = c.gpu_index(key, f"devices[{key}]", n)
        path = f"devices[{idx}]"
        if idx in seen:  # 3 and "3" are the same GPU
            c.fail(path, f"GPU index {idx} given twice")
        seen.add(idx)
        d = c.mapping(spec, path, _DEVICE_KEYS)
        dev_model = c.model(d["model"], f"{path}.model") if "model" in d else model
        profiling = dev_model.gpm
        if "profiling" in d:
            profiling = c.boolean(d["profiling"], f"{path}.profiling")
            if profiling and not dev_model.gpm:
                c.fail(f"{path}.profiling", f"{dev_model.name} has no GPM (needs Hopper or "
                                            "newer), so profiling cannot be true")
        devices[idx] = DeviceSpec(dev_model, profiling)

    tl_raw = top.get("timeline", [])
    if not isinstance(tl_raw, list):
        c.fail("timeline", f"expected a list of entries, got {_show(tl_raw)}")
    timeline = tuple(_parse_entry(c, e, f"timeline[{i}]", n) for i, e in enumerate(tl_raw))

    return Scenario(gpus=n, devices=tuple(devices), workload=workload, timeline=timeline,
                    driver_version=driver, name=name, description=description)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[object, object]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: construct_mapping reports it with its mark
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise ScenarioError(f"{source}: {where}: invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: invalid YAML: {exc}") from None


def default_scenario(n_gpus: int) -> Scenario:
    """``--simulate N`` without a scenario: N H100s training bf16, healthy, steady."""
    if isinstance(n_gpus, bool) or not 1 <= n_gpus <= MAX_GPUS:
        raise ScenarioError(f"--simulate: must be between 1 and {MAX_GPUS} GPUs, got {n_gpus}")
    return parse_scenario({"gpus": n_gpus}, source="default scenario")


SCENARIOS_DIR = Path(__file__).parent / "scenarios"


def shipped_scenarios() -> dict[str, Path]:
    """The example scenarios shipped in the package, by name (file name without .yaml)."""
    return {p.stem: p for p in sorted(SCENARIOS_DIR.glob("*.yaml"))}


def load_scenario(path: str | os.PathLike[str], n_gpus: int | None = None) -> Scenario:
    """Load a scenario file; ``n_gpus`` (``--simulate N``) overrides its GPU count.

    ``path`` may also name a shipped example (``faults``, ``thermal-straggler``,
    ...) when no such file exists. Raises :class:`ScenarioError`, never OSError.
    """
    shipped = shipped_scenarios()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        if str(path) not in shipped:
            raise ScenarioError(f"{path}: no such file, and not a shipped example "
                                f"(one of: {', '.join(sorted(shipped))})") from None
        text = shipped[str(path)].read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    return parse_scenario(text, source=str(path), n_gpus=n_gpus)
