"""stepscope's Grafana dashboards, generated from code into ``dashboards/json/`` and
``dashboards/json-hostname/`` (``python -m generate`` runs it with the other generators).

Plain Python builders, no dependency: a panel is a :class:`Panel` of :class:`Query`; a
dashboard is a list of panels laid out left to right, top to bottom. Every dashboard has
the variables ``datasource``, ``cluster``, ``training_job``, ``Hostname`` and ``gpu``;
queries use them as ``$cluster``, ``$training_job``, ``$Hostname``, ``$gpu`` (regex
matchers, so "All" is ``.*``, which also matches a series without the label). The queries
read the recording rules of deploy/prometheus/rules/ where one exists, so a fleet of
hundreds of nodes stays fast. docs/dashboards.md describes every panel.

The dashboards are written once, for the host label ``Hostname``; ``json-hostname/`` is
the same set for dcgm-exporter's newer ``hostname`` label, rewritten by
:func:`stepscope.core.labels.with_host_label` (the rules use the same function).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generate.constants import DASHBOARDS_DIR, REPO
from generate.files import sync
from stepscope.core.labels import with_host_label
from stepscope.diagnose.fleet_rules import FLEET

# The alerts' thresholds, drawn as the panels' threshold lines (one source:
# stepscope.diagnose.fleet_rules, which the rules are rendered from too)
THROTTLED = f"{FLEET.throttle_share:g}"
STRAGGLER = FLEET.rank_straggler_ratio
STRAGGLER_ALERTS = (f"Above {STRAGGLER:g} for {FLEET.rank_straggler_for} alerts "
                    "(StepscopeRankStraggler).")
# the goodput rules' recorded series (their window is the fleet module's)
GOODPUT_RATIO = f"training_job:stepscope_job_goodput_gpu_seconds:ratio_rate{FLEET.goodput_window}"
BADPUT_RATE = f"training_job:stepscope_job_badput_gpu_seconds:rate{FLEET.goodput_window}"

# host label -> the folder its dashboards are written to
OUT_DIRS = {"Hostname": DASHBOARDS_DIR / "json", "hostname": DASHBOARDS_DIR / "json-hostname"}
SCHEMA_VERSION = 39  # Grafana 10.4 / 11
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUNBOOKS = "https://github.com/stepscope/stepscope/blob/main/docs/runbooks.md"

# Selectors every query of a dashboard uses, so variables filter consistently.
HOST = 'cluster=~"$cluster", Hostname=~"$Hostname"'
GPU = f'{HOST}, gpu=~"$gpu"'
RANK = f'training_job=~"$training_job", {HOST}'
JOB = 'cluster=~"$cluster", training_job=~"$training_job"'

Json = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One PromQL target. ``instant`` for tables and stats that show the latest value."""

    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False


@dataclass(frozen=True)
class Panel:
    """A panel: its type, queries and unit. ``w``/``h`` in Grafana grid units (24 wide)."""

    title: str
    kind: str  # timeseries | table | heatmap | stat | state-timeline | row
    queries: tuple[Query, ...] = ()
    unit: str = "none"
    description: str = ""
    w: int = 12
    h: int = 8
    min: float | None = None
    max: float | None = None
    stack: bool = False
    # table: the label columns to show, (title, unit) of each query's value column by
    # refId, and the refId column to sort by
    labels: tuple[str, ...] = ("Hostname",)
    columns: dict[str, tuple[str, str]] = field(default_factory=dict)
    sort_by: str = ""
    sort_desc: bool = False
    thresholds: tuple[tuple[str, float | None], ...] = ()


def ref_id(i: int) -> str:
    return chr(ord("A") + i)


def _target(q: Query, i: int) -> Json:
    target: Json = {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": q.expr,
        "legendFormat": q.legend or "__auto",
        "range": not q.instant,
        "instant": q.instant,
        "refId": ref_id(i),
    }
    if q.instant:
        target["format"] = "table"
    elif q.heatmap:
        target["format"] = "heatmap"
    return target


def _thresholds(panel: Panel) -> Json:
    steps: list[Json] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for color, value in panel.thresholds]
    return {"mode": "absolute", "steps": steps}


def value_field(panel: Panel, ref: str) -> str:
    """Grafana's name for a table query's value column: "Value", or "Value #A" for several."""
    return "Value" if len(panel.queries) == 1 else f"Value #{ref}"


def _field_config(panel: Panel) -> Json:
    defaults: Json = {"unit": panel.unit, "thresholds": _thresholds(panel)}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 60 if panel.stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
    if panel.kind in ("stat", "table") or panel.thresholds:
        defaults["color"] = {"mode": "thresholds"}
    else:
        defaults["color"] = {"mode": "palette-classic"}
    overrides: list[Json] = [
        {
            "matcher": {"id": "byName", "options": value_field(panel, ref)},
            "properties": [
                {"id": "displayName", "value": title},
                {"id": "unit", "value": unit},
            ],
        }
        for ref, (title, unit) in panel.columns.items()
    ]
    return {"defaults": defaults, "overrides": overrides}


def _options(panel: Panel) -> Json:
    if panel.kind == "timeseries":
        return {
            "legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                       "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if panel.kind == "stat":
        return {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    if panel.kind == "table":
        return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    if panel.kind == "heatmap":
        return {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "RdYlGn", "steps": 64, "reverse": False},
            "yAxis": {"axisPlacement": "left"},
            "rowsFrame": {"layout": "auto"},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False},
            "showValue": "never",
        }
    if panel.kind == "state-timeline":
        return {"showValue": "never", "mergeValues": True, "rowHeight": 0.9,
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False}}
    return {}


def _transformations(panel: Panel) -> list[Json]:
    if panel.kind != "table":
        return []
    keep = [*panel.labels, *(value_field(panel, ref) for ref in panel.columns)]
    steps: list[Json] = [
        {"id": "merge", "options": {}},
        {"id": "filterFieldsByName", "options": {"include": {"names": keep}}},
    ]
    if panel.sort_by:
        steps.append({"id": "sortBy", "options": {
            "sort": [{"field": value_field(panel, panel.sort_by), "desc": panel.sort_desc}]}})
    return steps


def layout(panels: list[Panel]) -> list[Json]:
    """Grafana panel JSON, placed left to right and wrapped at 24 columns."""
    out: list[Json] = []
    x = y = row_h = 0
    for pid, panel in enumerate(panels, start=1):
        if panel.kind == "row" or x + panel.w > 24:
            x, y, row_h = 0, y + row_h, 0
        body: Json = {
            "id": pid,
            "type": panel.kind,
            "title": panel.title,
            "gridPos": {"x": x, "y": y, "w": 24 if panel.kind == "row" else panel.w,
                        "h": 1 if panel.kind == "row" else panel.h},
        }
        if panel.kind == "row":
            body.update({"collapsed": False, "panels": []})
            out.append(body)
            y += 1
            continue
        body.update({
            "datasource": DATASOURCE,
            "description": panel.description,
            "fieldConfig": _field_config(panel),
            "options": _options(panel),
            "targets": [_target(q, i) for i, q in enumerate(panel.queries)],
        })
        transformations = _transformations(panel)
        if transformations:
            body["transformations"] = transformations
        out.append(body)
        x += panel.w
        row_h = max(row_h, panel.h)
    return out


def _variable(name: str, label: str, query: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change: new nodes and jobs appear
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 3,  # natural order: node-2 before node-10, gpu 2 before 10
        "hide": 0,
        "options": [],
        "regex": "",
    }


def templating() -> Json:
    return {"list": [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "includeAll": False,
            "multi": False,
            "options": [],
            "refresh": 1,
            "regex": "",
        },
        _variable("cluster", "Cluster", "label_values(DCGM_FI_DEV_GPU_UTIL, cluster)"),
        _variable("training_job", "Training job",
                  'label_values(stepscope_steps_total{cluster=~"$cluster"}, training_job)'),
        _variable("Hostname", "Node",
                  'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, Hostname)'),
        _variable("gpu", "GPU", f"label_values(DCGM_FI_DEV_GPU_UTIL{{{HOST}}}, gpu)"),
    ]}


def dashboard(uid: str, title: str, description: str, panels: list[Panel]) -> Json:
    links = [
        {"title": "stepscope dashboards", "type": "dashboards", "tags": ["stepscope"],
         "asDropdown": True, "includeVars": True, "keepTime": True},
        {"title": "Runbooks", "type": "link", "url": RUNBOOKS, "targetBlank": True},
    ]
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["stepscope", "gpu", "training"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": links,
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "templating": templating(),
        "panels": layout(panels),
    }


# --- 1. Fleet / stragglers ----------------------------------------------------------------

def fleet() -> Json:
    zero_per_host = f"0 * Hostname:stepscope_gpu_down:sum{{{HOST}}}"
    panels = [
        Panel("Nodes", "stat", (Query(f"count(Hostname:DCGM_FI_DEV_GPU_UTIL:avg{{{HOST}}})",
                                      instant=True),), w=4, h=4,
              description="Nodes reporting GPU metrics."),
        Panel("GPUs down", "stat", (Query(f"sum(Hostname:stepscope_gpu_down:sum{{{HOST}}})",
                                          instant=True),), w=4, h=4,
              thresholds=(("red", 1),), description="GPUs that stopped answering NVML."),
        Panel("Nodes throttling (thermal)", "stat", (Query(
            f"count(Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}"
            f" > {THROTTLED}) or vector(0)", instant=True),), w=4, h=4, thresholds=(("orange", 1),),
              description="Nodes with a GPU held down for temperature over "
              f"{FLEET.throttle_share:.0%} of the time."),
        Panel("XIDs", "stat", (Query(
            f"sum(Hostname:stepscope_xid_errors_total:sum{{{HOST}}}) or vector(0)",
            instant=True),), w=4, h=4, thresholds=(("red", 1),),
              description="XID errors since the exporters started, all nodes."),
        Panel("Lowest SM active, fleet median", "stat", (Query(
            f"quantile(0.5, Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}})", instant=True),),
              unit="percentunit", w=4, h=4, min=0, max=1,
              description="Median over nodes of each node's least active GPU."),
        Panel("Firing stepscope alerts", "stat", (Query(
            'count(ALERTS{alertstate="firing", alertname=~"Stepscope.*"}) or vector(0)',
            instant=True),), w=4, h=4, thresholds=(("orange", 1),)),
        Panel("Stragglers: nodes by lowest SM active", "table", (
            Query(f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}", instant=True),
            Query(f"Hostname:DCGM_FI_PROF_SM_ACTIVE:avg{{{HOST}}}", instant=True),
            Query(f"Hostname:DCGM_FI_DEV_GPU_UTIL:avg{{{HOST}}}", instant=True),
            Query(f"Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}",
                  instant=True),
            Query(f"Hostname:DCGM_FI_DEV_POWER_VIOLATION:max_ratio_rate2m{{{HOST}}}",
                  instant=True),
            Query(f"Hostname:stepscope_xid_errors_total:sum{{{HOST}}} or {zero_per_host}",
                  instant=True),
            Query(f"Hostname:stepscope_gpu_down:sum{{{HOST}}}", instant=True),
        ), w=24, h=10, sort_by="A", columns={
            "A": ("SM active (lowest GPU)", "percentunit"),
            "B": ("SM active (avg)", "percentunit"),
            "C": ("GPU util (avg)", "percent"),
            "D": ("Thermal violation (worst GPU)", "percentunit"),
            "E": ("Power violation (worst GPU)", "percentunit"),
            "F": ("XIDs", "none"),
            "G": ("GPUs down", "none"),
        }, description=(
            "One row per node, the least active first: a node far below the others while "
            "they work is the straggler. Thermal/power violation is the share of time the "
            "worst GPU's clocks were held down. GPU util reads 100% even while a GPU spins in "
            "a collective; SM active does not.")),
        Panel("Lowest SM active per node over time", "heatmap", (Query(
            f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}", legend="{{Hostname}}"),),
              unit="percentunit", w=12, h=10, min=0, max=1,
              description="A row per node; the straggler is the row that stays red."),
        Panel("SM active per GPU", "heatmap", (Query(
            f"DCGM_FI_PROF_SM_ACTIVE{{{GPU}}}", legend="{{Hostname}} gpu {{gpu}}"),),
              unit="percentunit", w=12, h=10, min=0, max=1),
        Panel("Lowest SM active per node", "timeseries", (Query(
            f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}", legend="{{Hostname}}"),),
              unit="percentunit", w=12, min=0, max=1,
              description="min by (cluster, Hostname) (DCGM_FI_PROF_SM_ACTIVE), recorded."),
        Panel("Thermal violation (worst GPU per node)", "timeseries", (Query(
            f"Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}",
            legend="{{Hostname}}"),), unit="percentunit", w=12, min=0,
              thresholds=(("orange", FLEET.throttle_share),),
              description="Share of time clocks were held down for temperature; above the "
              f"line for {FLEET.thermal_for} alerts (StepscopeGpuThermalViolation)."),
        Panel("Power violation (worst GPU per node)", "timeseries", (Query(
            f"Hostname:DCGM_FI_DEV_POWER_VIOLATION:max_ratio_rate2m{{{HOST}}}",
            legend="{{Hostname}}"),), unit="percentunit", w=12, min=0),
        Panel("Training ranks by straggler score", "table", (
            Query(f"training_job_rank:stepscope_straggler_score:ratio{{{RANK}}}", instant=True),
        ), w=12, h=8, sort_by="A", sort_desc=True,
              labels=("cluster", "training_job", "rank", "Hostname", "gpu"),
              columns={"A": ("Busy time / job median", "none")},
              description="Needs the training SDK. " + STRAGGLER_ALERTS),
    ]
    return dashboard("stepscope-fleet", "stepscope / Fleet: stragglers",
                     "Which node or GPU holds the fleet back: SM activity per node, "
                     "throttling, XIDs, GPUs down.", panels)


# --- 2. Node / GPU ------------------------------------------------------------------------

def node() -> Json:
    def gpu_series(title: str, unit: str, *queries: Query, **kw: Any) -> Panel:
        return Panel(title, "timeseries", queries, unit=unit, **kw)

    legend = "{{Hostname}} gpu {{gpu}}"
    panels = [
        Panel("GPUs up", "stat", (Query(f"sum(stepscope_gpu_up{{{GPU}}})", instant=True),),
              w=4, h=4),
        Panel("GPUs down", "stat", (Query(f"count(stepscope_gpu_up{{{GPU}}} == 0) or vector(0)",
                                          instant=True),), w=4, h=4, thresholds=(("red", 1),)),
        Panel("Energy in range", "stat", (Query(
            f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__range])) / 3.6e9",
            instant=True),), unit="kwatth", w=4, h=4),
        Panel("GPUs", "table", (Query(f"stepscope_gpu_info{{{GPU}}}", instant=True),),
              w=12, h=4, labels=("Hostname", "gpu", "modelName", "UUID", "driver_version",
                                 "serial", "vbios_version", "profiling", "mig_mode"),
              description="Model, driver, serial, VBIOS, profiling support."),
        Panel("Activity", "row"),
        gpu_series("GPU util vs SM active vs SM occupancy", "percentunit",
                   Query(f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}} / 100", legend=f"util {legend}"),
                   Query(f"DCGM_FI_PROF_SM_ACTIVE{{{GPU}}}", legend=f"SM active {legend}"),
                   Query(f"DCGM_FI_PROF_SM_OCCUPANCY{{{GPU}}}", legend=f"occupancy {legend}"),
                   min=0, max=1, w=24, description=(
                       "GPU util only says a kernel ran; SM active says how busy the SMs were, "
                       "occupancy how full. Busy is not full.")),
        gpu_series("Tensor vs FP32 / FP16 / FP64 pipes", "percentunit",
                   Query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU}}}", legend=f"tensor {legend}"),
                   Query(f"DCGM_FI_PROF_PIPE_FP32_ACTIVE{{{GPU}}}", legend=f"fp32 {legend}"),
                   Query(f"DCGM_FI_PROF_PIPE_FP16_ACTIVE{{{GPU}}}", legend=f"fp16 {legend}"),
                   Query(f"DCGM_FI_PROF_PIPE_FP64_ACTIVE{{{GPU}}}", legend=f"fp64 {legend}"),
                   min=0, max=1, description=(
                       "FP32 busy with tensor near 0: an fp32 run not using tensor cores "
                       "(mixed precision would move the work to the tensor pipe).")),
        gpu_series("DRAM active", "percentunit",
                   Query(f"DCGM_FI_PROF_DRAM_ACTIVE{{{GPU}}}", legend=legend), min=0, max=1),
        Panel("Clocks and throttling", "row"),
        gpu_series("SM and memory clocks", "hertz",
                   Query(f"DCGM_FI_DEV_SM_CLOCK{{{GPU}}} * 1e6", legend=f"SM {legend}"),
                   Query(f"DCGM_FI_DEV_MEM_CLOCK{{{GPU}}} * 1e6", legend=f"mem {legend}")),
        gpu_series("GPUs per active clock-event reason", "none",
                   Query(f"sum by (reason) (stepscope_gpu_clock_event_active{{{GPU}}})",
                         legend="{{reason}}"), min=0, description=(
                       "How many of the selected GPUs have each clock-event reason active "
                       "(sw_thermal_slowdown, sw_power_cap, gpu_idle, ...).")),
        gpu_series("Violations (share of time clocks held down)", "percentunit",
                   Query(f"Hostname_gpu:DCGM_FI_DEV_THERMAL_VIOLATION:ratio_rate2m{{{GPU}}}",
                         legend=f"thermal {legend}"),
                   Query(f"Hostname_gpu:DCGM_FI_DEV_POWER_VIOLATION:ratio_rate2m{{{GPU}}}",
                         legend=f"power {legend}"),
                   Query(f"rate(DCGM_FI_DEV_SYNC_BOOST_VIOLATION{{{GPU}}}[$__rate_interval])"
                         " / 1e9", legend=f"sync boost {legend}"),
                   Query(f"rate(DCGM_FI_DEV_BOARD_LIMIT_VIOLATION{{{GPU}}}[$__rate_interval])"
                         " / 1e9", legend=f"board limit {legend}"), min=0),
        gpu_series("Clock-event time by reason", "percentunit",
                   Query(f"sum by (cluster, Hostname, gpu, reason) "
                         f"(rate(stepscope_gpu_clock_event_seconds_"
                         f"total{{{GPU}}}[$__rate_interval]))", legend=f"{{{{reason}}}} {legend}"),
                   min=0, description="Software vs hardware thermal slowdown, power cap."),
        Panel("Temperature and power", "row"),
        gpu_series("Temperature", "celsius",
                   Query(f"DCGM_FI_DEV_GPU_TEMP{{{GPU}}}", legend=f"GPU {legend}"),
                   Query(f"DCGM_FI_DEV_MEMORY_TEMP{{{GPU}}}", legend=f"memory {legend}"), w=8),
        gpu_series("Power", "watt", Query(f"DCGM_FI_DEV_POWER_USAGE{{{GPU}}}", legend=legend),
                   min=0, w=8),
        gpu_series("Energy rate", "watt",
                   Query(f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__rate_interval])"
                         " / 1000", legend=legend), min=0, w=8,
                   description="From the energy counter (mJ), so it averages between reads."),
        Panel("Errors", "row"),
        gpu_series("XIDs by code", "none",
                   Query(f"sum by (cluster, Hostname, gpu, xid) "
                         f"(stepscope_xid_errors_total{{{GPU}}})",
                         legend="{{Hostname}} gpu {{gpu}} xid {{xid}}"),
                   Query(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", legend=f"last XID {legend}"), w=8,
                   min=0, description="Counts per XID code since the exporter started, and "
                   "the last code reported."),
        gpu_series("ECC errors and row remapping", "none",
                   Query(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}", legend=f"DBE {legend}"),
                   Query(f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU}}}", legend=f"SBE {legend}"),
                   Query(f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{GPU}}}",
                         legend=f"remapped rows (unc.) {legend}"),
                   Query(f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{GPU}}}",
                         legend=f"remap pending {legend}"),
                   Query(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}",
                         legend=f"remap failure {legend}"),
                   w=8, min=0),
        gpu_series("PCIe replays", "ops",
                   Query(f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{GPU}}}[$__rate_interval])",
                         legend=legend), w=8, min=0,
                   description="Replays per second: a flaky riser or cable."),
        Panel("Interconnect and memory", "row"),
        gpu_series("PCIe throughput", "Bps",
                   Query(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{GPU}}}", legend=f"tx {legend}"),
                   Query(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{GPU}}}", legend=f"rx {legend}"), w=8),
        gpu_series("NVLink throughput", "Bps",
                   Query(f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{GPU}}}", legend=f"tx {legend}"),
                   Query(f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{GPU}}}", legend=f"rx {legend}"), w=8),
        gpu_series("Framebuffer", "bytes",
                   Query(f"DCGM_FI_DEV_FB_USED{{{GPU}}} * 1048576", legend=f"used {legend}"),
                   Query(f"DCGM_FI_DEV_FB_FREE{{{GPU}}} * 1048576", legend=f"free {legend}"),
                   w=8, min=0),
    ]
    return dashboard("stepscope-node", "stepscope / Node and GPU",
                     "Everything one node's GPUs report: activity, pipes, clocks and their "
                     "reasons, temperature, power, errors, interconnect, memory.", panels)


# --- 3. Training job ----------------------------------------------------------------------

def training() -> Json:
    rank_legend = "rank {{rank}} ({{Hostname}} gpu {{gpu}})"
    panels = [
        Panel("Step time (mean)", "stat", (Query(
            f'training_job:stepscope_step_duration_seconds:mean2m{{{JOB}}}', instant=True,
            legend="{{training_job}}"),), unit="s", w=6, h=4),
        Panel("Tokens/s", "stat", (Query(f'training_job:stepscope_tokens:rate2m{{{JOB}}}',
                                         instant=True, legend="{{training_job}}"),),
              unit="suffix: tok/s", w=6, h=4),
        Panel("MFU (mean over ranks)", "stat", (Query(
            f'training_job:stepscope_mfu_ratio:avg{{{JOB}}}', instant=True,
            legend="{{training_job}}"),),
              unit="percentunit", w=6, h=4,
              # orange from StepscopeLowMfu's threshold; green where large LLM training is good
              thresholds=(("red", None), ("orange", FLEET.low_mfu_share), ("green", 0.4))),
        Panel("Straggler score (worst rank)", "stat", (Query(
            f'training_job:stepscope_straggler_score:max{{{JOB}}}', instant=True,
            legend="{{training_job}}"),),
              w=6, h=4, thresholds=(("orange", STRAGGLER),)),
        Panel("Step time per rank", "timeseries", (Query(
            f"training_job_rank:stepscope_step_duration_seconds:mean2m{{{RANK}}}",
            legend=rank_legend),),
              unit="s", w=12, min=0, description="Mean wall time per step over 2 minutes."),
        Panel("Step time distribution", "heatmap", (Query(
            f"sum by (le) (rate(stepscope_job_step_duration_seconds_bucket{{{RANK}}}"
            "[$__rate_interval]))", legend="{{le}}", heatmap=True),), unit="s", w=12),
        Panel("Where the step goes (mean over ranks)", "timeseries", (Query(
            f"avg by (phase) (training_job_rank:stepscope_step_phase_seconds:mean2m{{{RANK}}})",
            legend="{{phase}}"),), unit="s", stack=True, w=12, min=0, description=(
                "data_wait: waiting for the next batch; compute; comm: exposed communication; "
                "other: the rest of the step.")),
        Panel("Exposed communication and data wait per rank", "timeseries", (
            Query(f'training_job_rank:stepscope_step_phase_seconds:mean2m{{{RANK}, phase="comm"}}',
                  legend=f"comm {rank_legend}"),
            Query(f'training_job_rank:stepscope_step_phase_seconds:mean2m'
                  f'{{{RANK}, phase="data_wait"}}',
                  legend=f"data wait {rank_legend}"),
        ), unit="s", w=12, min=0, description=(
            "A straggler shows as comm time on the other ranks, which wait for it.")),
        Panel("Straggler score per rank", "timeseries", (Query(
            f"training_job_rank:stepscope_straggler_score:ratio{{{RANK}}}", legend=rank_legend),),
              w=12, thresholds=(("orange", STRAGGLER),), description=(
                  "Busy time per step (the step less exposed communication) over the job's "
                  "median rank. 1 is typical. " + STRAGGLER_ALERTS)),
        Panel("MFU per rank", "timeseries", (Query(
            f"stepscope_mfu_ratio{{{RANK}}}", legend=rank_legend),), unit="percentunit",
              w=12, min=0),
        Panel("Tokens/s per job", "timeseries", (Query(
            f'training_job:stepscope_tokens:rate2m{{{JOB}}}', legend="{{training_job}}"),),
              unit="suffix: tok/s", w=12, min=0),
        Panel("Bottleneck verdict per rank", "state-timeline", (Query(
            f"stepscope_bottleneck{{{RANK}}} == 1", legend="rank {{rank}}: {{kind}}"),),
              w=12, description="The diagnosis' verdict per rank over time."),
        Panel("Ranks per verdict modifier", "timeseries", (Query(
            f"sum by (modifier) (stepscope_bottleneck_modifier{{{RANK}}})",
            legend="{{modifier}}"),), w=12, min=0,
              description="thermal_throttle, power_cap, fp32_no_tensor, low_occupancy, "
              "tcp_suspected."),
        Panel("Seconds since last step", "timeseries", (Query(
            f"time() - stepscope_last_step_timestamp_seconds{{{RANK}}}", legend=rank_legend),),
              unit="s", w=12, min=0, description="Growing without bound: a hung rank."),
        Panel("GPU-hours lost by cause", "row"),
        Panel("GPU-hours lost by cause over the time range", "table", (Query(
            "sum by (training_job, badput_type) (increase("
            f"stepscope_job_badput_gpu_seconds_total{{{RANK}}}[$__range])) / 3600",
            instant=True),), w=8, labels=("training_job", "badput_type"),
              columns={"A": ("GPU-hours", "none")}, sort_by="A", sort_desc=True,
              description="GPU-hours each cause cost the job over the dashboard's time range, "
              "summed over its nodes (and clusters of that name): GPU-seconds its ranks' "
              "GPUs spent waiting for data, in exposed communication, checkpointing, "
              "warming up, idle while held... `stepscope diagnose --prometheus URL --job "
              "NAME` prints the same with goodput and each cause's share."),
        Panel("Goodput ratio", "timeseries", (Query(
            f"{GOODPUT_RATIO}{{{JOB}}}", legend="{{training_job}}"),),
              unit="percentunit", w=16, min=0, max=1, description=(
                  "Productive GPU time over all the GPU time the job held (goodput plus "
                  f"every cause of badput), over {FLEET.goodput_window}. A job still "
                  "compiling, or hung from the start, reads 0.")),
        Panel("GPUs' worth lost by cause", "timeseries", (Query(
            f"sum by (badput_type) ({BADPUT_RATE}{{{JOB}}})", legend="{{badput_type}}"),),
              unit="suffix: GPUs", stack=True, w=24, min=0, description=(
                  "GPU-seconds lost per second, by cause, over "
                  f"{FLEET.goodput_window}: 3 means three GPUs' worth of the job's GPUs "
                  "were, on average, doing nothing productive for that reason.")),
    ]
    return dashboard("stepscope-training", "stepscope / Training job",
                     "One training job: step time per rank, where the step goes, MFU, "
                     "tokens/s, straggler score, the diagnosis' verdicts and the GPU-hours "
                     "lost by cause.", panels)


DASHBOARDS = {
    "stepscope-fleet.json": fleet,
    "stepscope-node.json": node,
    "stepscope-training.json": training,
}


def render(host_label: str = "Hostname") -> dict[str, str]:
    """File name → JSON text of every dashboard for ``host_label``, exactly as committed."""
    return {name: with_host_label(json.dumps(build(), indent=2, sort_keys=True) + "\n",
                                  host_label)
            for name, build in DASHBOARDS.items()}


def files() -> dict[Path, str]:
    """Path in the checkout -> JSON text, for every dashboard and host label."""
    return {out_dir / name: text
            for host_label, out_dir in OUT_DIRS.items()
            for name, text in render(host_label).items()}


def write(repo: Path = REPO) -> list[str]:
    """Rewrite the dashboards that changed; one line per file written."""
    return sync(repo, files())
