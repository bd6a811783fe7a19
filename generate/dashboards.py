"""stepscope's Grafana dashboards, generated from code into ``dashboards/json/`` and
``dashboards/json-hostname/`` (``python -m generate`` runs it with the other generators).

Built with Grafana's own typed builders, grafana-foundation-sdk (the build for Grafana
10.4, whose dashboard schema, version 39, the files declare): every panel, option, query
and variable is a typed builder call, so a misspelt option or a value Grafana does not
know fails the type check (``mypy --python-version 3.11 generate/dashboards.py``: the
SDK's types need 3.11) or the builder's own checks, not a browser. The helpers below give
every panel of a kind the same look (legend, tooltip, line style, table options); a
dashboard is a list of panels placed left to right, top to bottom, by the SDK's
``Dashboard.with_panel``, which starts a new line once one is full but does not move a
panel that would overflow it: each line of panels fills the 24 columns exactly
(tests/deploy/test_dashboards.py checks the grid). Every dashboard has the variables
``datasource``, ``cluster``, ``training_job``, ``Hostname`` and ``gpu``; queries use them
as ``$cluster``, ``$training_job``, ``$Hostname``, ``$gpu`` (regex matchers, so "All" is
``.*``, which also matches a series without the label). The queries read the recording
rules of deploy/prometheus/rules/ where one exists, so a fleet of hundreds of nodes stays
fast. docs/dashboards.md describes every panel.

What the SDK cannot say, and what the generator does instead:

- a transformation's ``options`` and an override's property values are untyped in the
  SDK, as in Grafana's schema (each transformer and property defines its own): plain JSON;
- a query variable's ``definition`` (the text the dashboard settings' list of variables
  shows) has no field in the SDK's variable model: added to the JSON after it
  (:func:`_with_definitions`);
- a data-source variable's ``refresh`` and ``options`` and the dashboard's
  ``schemaVersion`` have no builder method: set on the built, still typed, model;
- a data-source variable's ``current`` is left out: the SDK's option would write
  ``{"text": null, "value": null}``, and Grafana's default is the ``{}`` the hand-built
  JSON had (the default data source).

The dashboards are written once, for the host label ``Hostname``; ``json-hostname/`` is
the same set for dcgm-exporter's newer ``hostname`` label, rewritten by
:func:`stepscope.core.labels.with_host_label` (the rules use the same function).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import common as viz
from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.builders import (
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as schema
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

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
SCHEMA_VERSION = 39  # Grafana 10.4 / 11; the SDK's own default is older (36)
DATASOURCE = schema.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUNBOOKS = "https://github.com/stepscope/stepscope/blob/main/docs/runbooks.md"

# Selectors every query of a dashboard uses, so variables filter consistently.
HOST = 'cluster=~"$cluster", Hostname=~"$Hostname"'
GPU = f'{HOST}, gpu=~"$gpu"'
RANK = f'training_job=~"$training_job", {HOST}'
JOB = 'cluster=~"$cluster", training_job=~"$training_job"'

Json = dict[str, Any]
# a threshold step drawn over the base (green): (colour, value from which it applies)
Step = tuple[str, float | None]
# table columns: a query's refId -> (column title, unit)
Columns = dict[str, tuple[str, str]]
PanelBuilder = TypeVar("PanelBuilder", timeseries.Panel, stat.Panel, table.Panel,
                       heatmap.Panel, statetimeline.Panel)
Panel = (timeseries.Panel | stat.Panel | table.Panel | heatmap.Panel | statetimeline.Panel
         | grafana.Row)


# --- Queries --------------------------------------------------------------------------------

def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return (prometheus.Dataquery().datasource(DATASOURCE).editor_mode(QueryEditorMode.CODE)
            .expr(expr).legend_format(legend or "__auto"))


def query(expr: str, legend: str = "") -> prometheus.Dataquery:
    """A range query: a series over the dashboard's time range."""
    return _query(expr, legend).range()


def instant(expr: str, legend: str = "") -> prometheus.Dataquery:
    """An instant query as a table: the latest value, for stats and tables."""
    return _query(expr, legend).instant().format(PromQueryFormat.TABLE)


def buckets(expr: str, legend: str) -> prometheus.Dataquery:
    """A range query of histogram buckets, for a heatmap of a distribution."""
    return _query(expr, legend).range().format(PromQueryFormat.HEATMAP)


def ref_id(i: int) -> str:
    return chr(ord("A") + i)


# --- Panels ---------------------------------------------------------------------------------

def _panel(panel: PanelBuilder, title: str, queries: Sequence[prometheus.Dataquery], *,
           unit: str, w: int, h: int, thresholds: Sequence[Step] = (),
           by_thresholds: bool = False) -> PanelBuilder:
    """What every panel shares: data source, size, unit, thresholds (green, then
    ``thresholds``), colours by threshold or by series, the queries A, B, C..."""
    steps = [schema.Threshold(color="green", value=None)]
    steps += [schema.Threshold(color=color, value=value) for color, value in thresholds]
    color = (schema.FieldColorModeId.THRESHOLDS if by_thresholds or thresholds
             else schema.FieldColorModeId.PALETTE_CLASSIC)
    panel = (panel.title(title).description("").datasource(DATASOURCE).span(w).height(h)
             .unit(unit).overrides([])
             .thresholds(grafana.ThresholdsConfig().mode(schema.ThresholdsMode.ABSOLUTE)
                         .steps(steps))
             .color_scheme(grafana.FieldColor().mode(color)))
    for i, target in enumerate(queries):
        panel = panel.with_target(target.ref_id(ref_id(i)))
    return panel


def stat_panel(title: str, target: prometheus.Dataquery, *, unit: str = "none", w: int = 4,
               h: int = 4, thresholds: Sequence[Step] = ()) -> stat.Panel:
    """One number, the latest value, its background coloured by the thresholds."""
    return (_panel(stat.Panel(), title, [target], unit=unit, w=w, h=h, thresholds=thresholds,
                   by_thresholds=True)
            .reduce_options(viz.ReduceDataOptions().calcs(["lastNotNull"]).fields("")
                            .values(False))
            .color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.NONE)
            .text_mode(common.BigValueTextMode.AUTO)
            .justify_mode(common.BigValueJustifyMode.AUTO)
            .orientation(common.VizOrientation.AUTO))


def series_panel(title: str, unit: str, *targets: prometheus.Dataquery, w: int = 12, h: int = 8,
                 stack: bool = False, thresholds: Sequence[Step] = ()) -> timeseries.Panel:
    """Lines over time (stacked areas with ``stack``), a table legend on the right with
    each series' last and highest value."""
    return (_panel(timeseries.Panel(), title, targets, unit=unit, w=w, h=h,
                   thresholds=thresholds)
            .draw_style(common.GraphDrawStyle.LINE).line_width(1)
            .fill_opacity(60 if stack else 10).show_points(common.VisibilityMode.NEVER)
            .span_nulls(False)
            .stacking(viz.StackingConfig().group("A").mode(
                common.StackingMode.NORMAL if stack else common.StackingMode.NONE))
            .legend(viz.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                    .placement(common.LegendPlacement.RIGHT).show_legend(True)
                    .calcs(["lastNotNull", "max"]))
            .tooltip(viz.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                     .sort(common.SortOrder.DESCENDING)))


def value_field(queries: int, ref: str) -> str:
    """Grafana's name for a table query's value column: "Value", or "Value #A" for several."""
    return "Value" if queries == 1 else f"Value #{ref}"


def _transformation(kind: str, options: Json) -> schema.DataTransformerConfig:
    # a transformation's options are plain JSON in Grafana's schema too (each
    # transformer defines its own)
    return schema.DataTransformerConfig(id_val=kind, options=options)


def table_panel(title: str, *targets: prometheus.Dataquery, columns: Columns,
                labels: Sequence[str] = ("Hostname",), sort_by: str = "", desc: bool = False,
                w: int = 12, h: int = 8) -> table.Panel:
    """The latest value of each query, one row per series, merged on their labels: the
    label columns ``labels`` and one value column per ``columns`` entry (its title and
    unit), sorted by the value column of the query ``sort_by``."""
    panel = (_panel(table.Panel(), title, targets, unit="none", w=w, h=h, by_thresholds=True)
             .show_header(True).cell_height(common.TableCellHeight.SM)
             .footer(viz.TableFooterOptions().show(False)))
    for ref, (column, unit) in columns.items():
        panel = panel.override_by_name(value_field(len(targets), ref), [
            schema.DynamicConfigValue(id_val="displayName", value=column),
            schema.DynamicConfigValue(id_val="unit", value=unit),
        ])
    keep = [*labels, *(value_field(len(targets), ref) for ref in columns)]
    panel = (panel.with_transformation(_transformation("merge", {}))
             .with_transformation(_transformation("filterFieldsByName",
                                                  {"include": {"names": keep}})))
    if sort_by:
        panel = panel.with_transformation(_transformation("sortBy", {"sort": [
            {"field": value_field(len(targets), sort_by), "desc": desc}]}))
    return panel


def heatmap_panel(title: str, target: prometheus.Dataquery, *, unit: str, w: int = 12,
                  h: int = 8) -> heatmap.Panel:
    """A row per series (or bucket), the colour its value: red low, green high."""
    return (_panel(heatmap.Panel(), title, [target], unit=unit, w=w, h=h)
            .calculate(False).cell_gap(1)
            .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME)
                   .scheme("RdYlGn").steps(64).reverse(False)
                   # the SDK writes these two, which only the opacity mode reads: Grafana's
                   # own defaults, not the SDK's (0 and "")
                   .exponent(0.5).fill("dark-orange"))
            .y_axis(heatmap.YAxisConfig().axis_placement(common.AxisPlacement.LEFT))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.AUTO))
            .show_legend().mode(common.TooltipDisplayMode.SINGLE).hide_y_histogram()
            .show_value(common.VisibilityMode.NEVER))


def timeline_panel(title: str, target: prometheus.Dataquery, *, w: int = 12,
                   h: int = 8) -> statetimeline.Panel:
    """A band per series, its text the state; equal neighbours merged."""
    return (_panel(statetimeline.Panel(), title, [target], unit="none", w=w, h=h)
            .show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.9)
            .legend(viz.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                    .placement(common.LegendPlacement.BOTTOM).show_legend(False))
            # Grafana's default; the SDK's would sort ascending
            .tooltip(viz.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE)
                     .sort(common.SortOrder.NONE)))


def row(title: str) -> grafana.Row:
    """A row header; the panels after it, up to the next row, sit under it (expanded)."""
    return grafana.Row(title).collapsed(False)


# --- Dashboards -----------------------------------------------------------------------------

def _variable(name: str, label: str, query_text: str) -> grafana.QueryVariable:
    return (grafana.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"query": query_text, "refId": f"{name}-variable"})
            # on time range change: new nodes and jobs appear
            .refresh(schema.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True).all_value(".*").multi(True)
            .current(schema.VariableOption(selected=True, text=["All"], value=["$__all"]))
            # by the first number in the value: node-2 before node-10, gpu 2 before 10
            .sort(schema.VariableSort.NUMERICAL_ASC)
            .hide(schema.VariableHide.DONT_HIDE).options([]).regex(""))


def variables() -> list[grafana.QueryVariable | grafana.DatasourceVariable]:
    """The variables every dashboard has, in the order Grafana shows them."""
    source = (grafana.DatasourceVariable("datasource").label("Data source").type("prometheus")
              .hide(schema.VariableHide.DONT_HIDE).include_all(False).multi(False).regex(""))
    # no builder method for these two: set on the typed model
    source.build().refresh = schema.VariableRefresh.ON_DASHBOARD_LOAD
    source.build().options = []
    return [
        source,
        _variable("cluster", "Cluster", "label_values(DCGM_FI_DEV_GPU_UTIL, cluster)"),
        _variable("training_job", "Training job",
                  'label_values(stepscope_steps_total{cluster=~"$cluster"}, training_job)'),
        _variable("Hostname", "Node",
                  'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, Hostname)'),
        _variable("gpu", "GPU", f"label_values(DCGM_FI_DEV_GPU_UTIL{{{HOST}}}, gpu)"),
    ]


def dashboard(uid: str, title: str, description: str, panels: list[Panel]) -> schema.Dashboard:
    """A stepscope dashboard of ``panels``, numbered 1, 2, ... in order."""
    built = (grafana.Dashboard(title).uid(uid).description(description)
             .tags(["stepscope", "gpu", "training"]).timezone("browser").editable()
             .tooltip(schema.DashboardCursorSync.CROSSHAIR).refresh("30s")
             .time("now-1h", "now").version(1)
             .links([
                 grafana.DashboardLink("stepscope dashboards")
                 .type(schema.DashboardLinkType.DASHBOARDS).tags(["stepscope"])
                 .as_dropdown(True).include_vars(True).keep_time(True),
                 grafana.DashboardLink("Runbooks").type(schema.DashboardLinkType.LINK)
                 .url(RUNBOOKS).target_blank(True),
             ])
             .annotation(grafana.AnnotationQuery().built_in(1).name("Annotations & Alerts")
                         .datasource(schema.DataSourceRef(type_val="grafana",
                                                          uid="-- Grafana --"))
                         .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)")
                         .type("dashboard")))
    for variable in variables():
        built = built.with_variable(variable)
    for pid, panel in enumerate(panels, start=1):
        if isinstance(panel, grafana.Row):
            built = built.with_row(panel.id(pid))
        else:
            built = built.with_panel(panel.id(pid))
    model = built.build()
    model.schema_version = SCHEMA_VERSION  # no builder method
    return model


# --- 1. Fleet / stragglers ----------------------------------------------------------------

def fleet() -> schema.Dashboard:
    zero_per_host = f"0 * Hostname:stepscope_gpu_down:sum{{{HOST}}}"
    panels: list[Panel] = [
        stat_panel("Nodes", instant(f"count(Hostname:DCGM_FI_DEV_GPU_UTIL:avg{{{HOST}}})"))
        .description("Nodes reporting GPU metrics."),
        stat_panel("GPUs down", instant(f"sum(Hostname:stepscope_gpu_down:sum{{{HOST}}})"),
                   thresholds=[("red", 1)])
        .description("GPUs that stopped answering NVML."),
        stat_panel("Nodes throttling (thermal)", instant(
            f"count(Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}"
            f" > {THROTTLED}) or vector(0)"), thresholds=[("orange", 1)])
        .description("Nodes with a GPU held down for temperature over "
                     f"{FLEET.throttle_share:.0%} of the time."),
        stat_panel("XIDs", instant(
            f"sum(Hostname:stepscope_xid_errors_total:sum{{{HOST}}}) or vector(0)"),
                   thresholds=[("red", 1)])
        .description("XID errors since the exporters started, all nodes."),
        stat_panel("Lowest SM active, fleet median", instant(
            f"quantile(0.5, Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}})"),
                   unit="percentunit").min(0).max(1)
        .description("Median over nodes of each node's least active GPU."),
        stat_panel("Firing stepscope alerts", instant(
            'count(ALERTS{alertstate="firing", alertname=~"Stepscope.*"}) or vector(0)'),
                   thresholds=[("orange", 1)]),
        table_panel(
            "Stragglers: nodes by lowest SM active",
            instant(f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}"),
            instant(f"Hostname:DCGM_FI_PROF_SM_ACTIVE:avg{{{HOST}}}"),
            instant(f"Hostname:DCGM_FI_DEV_GPU_UTIL:avg{{{HOST}}}"),
            instant(f"Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}"),
            instant(f"Hostname:DCGM_FI_DEV_POWER_VIOLATION:max_ratio_rate2m{{{HOST}}}"),
            instant(f"Hostname:stepscope_xid_errors_total:sum{{{HOST}}} or {zero_per_host}"),
            instant(f"Hostname:stepscope_gpu_down:sum{{{HOST}}}"),
            w=24, h=10, sort_by="A", columns={
                "A": ("SM active (lowest GPU)", "percentunit"),
                "B": ("SM active (avg)", "percentunit"),
                "C": ("GPU util (avg)", "percent"),
                "D": ("Thermal violation (worst GPU)", "percentunit"),
                "E": ("Power violation (worst GPU)", "percentunit"),
                "F": ("XIDs", "none"),
                "G": ("GPUs down", "none"),
            })
        .description(
            "One row per node, the least active first: a node far below the others while "
            "they work is the straggler. Thermal/power violation is the share of time the "
            "worst GPU's clocks were held down. GPU util reads 100% even while a GPU spins in "
            "a collective; SM active does not."),
        heatmap_panel("Lowest SM active per node over time", query(
            f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}", "{{Hostname}}"),
                      unit="percentunit", h=10).min(0).max(1)
        .description("A row per node; the straggler is the row that stays red."),
        heatmap_panel("SM active per GPU", query(
            f"DCGM_FI_PROF_SM_ACTIVE{{{GPU}}}", "{{Hostname}} gpu {{gpu}}"),
                      unit="percentunit", h=10).min(0).max(1),
        series_panel("Lowest SM active per node", "percentunit", query(
            f"Hostname:DCGM_FI_PROF_SM_ACTIVE:min{{{HOST}}}", "{{Hostname}}")).min(0).max(1)
        .description("min by (cluster, Hostname) (DCGM_FI_PROF_SM_ACTIVE), recorded."),
        series_panel("Thermal violation (worst GPU per node)", "percentunit", query(
            f"Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m{{{HOST}}}",
            "{{Hostname}}"), thresholds=[("orange", FLEET.throttle_share)]).min(0)
        .description("Share of time clocks were held down for temperature; above the "
                     f"line for {FLEET.thermal_for} alerts (StepscopeGpuThermalViolation)."),
        series_panel("Power violation (worst GPU per node)", "percentunit", query(
            f"Hostname:DCGM_FI_DEV_POWER_VIOLATION:max_ratio_rate2m{{{HOST}}}",
            "{{Hostname}}")).min(0),
        table_panel("Training ranks by straggler score", instant(
            f"training_job_rank:stepscope_straggler_score:ratio{{{RANK}}}"),
                    sort_by="A", desc=True,
                    labels=("cluster", "training_job", "rank", "Hostname", "gpu"),
                    columns={"A": ("Busy time / job median", "none")})
        .description("Needs the training SDK. " + STRAGGLER_ALERTS),
    ]
    return dashboard("stepscope-fleet", "stepscope / Fleet: stragglers",
                     "Which node or GPU holds the fleet back: SM activity per node, "
                     "throttling, XIDs, GPUs down.", panels)


# --- 2. Node / GPU ------------------------------------------------------------------------

def node() -> schema.Dashboard:
    legend = "{{Hostname}} gpu {{gpu}}"
    panels: list[Panel] = [
        stat_panel("GPUs up", instant(f"sum(stepscope_gpu_up{{{GPU}}})")),
        stat_panel("GPUs down", instant(f"count(stepscope_gpu_up{{{GPU}}} == 0) or vector(0)"),
                   thresholds=[("red", 1)]),
        stat_panel("Energy in range", instant(
            f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__range])) / 3.6e9"),
                   unit="kwatth"),
        table_panel("GPUs", instant(f"stepscope_gpu_info{{{GPU}}}"), columns={}, h=4,
                    labels=("Hostname", "gpu", "modelName", "UUID", "driver_version",
                            "serial", "vbios_version", "profiling", "mig_mode"))
        .description("Model, driver, serial, VBIOS, profiling support."),
        row("Activity"),
        series_panel("GPU util vs SM active vs SM occupancy", "percentunit",
                     query(f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}} / 100", f"util {legend}"),
                     query(f"DCGM_FI_PROF_SM_ACTIVE{{{GPU}}}", f"SM active {legend}"),
                     query(f"DCGM_FI_PROF_SM_OCCUPANCY{{{GPU}}}", f"occupancy {legend}"),
                     w=24).min(0).max(1)
        .description("GPU util only says a kernel ran; SM active says how busy the SMs were, "
                     "occupancy how full. Busy is not full."),
        series_panel("Tensor vs FP32 / FP16 / FP64 pipes", "percentunit",
                     query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU}}}", f"tensor {legend}"),
                     query(f"DCGM_FI_PROF_PIPE_FP32_ACTIVE{{{GPU}}}", f"fp32 {legend}"),
                     query(f"DCGM_FI_PROF_PIPE_FP16_ACTIVE{{{GPU}}}", f"fp16 {legend}"),
                     query(f"DCGM_FI_PROF_PIPE_FP64_ACTIVE{{{GPU}}}", f"fp64 {legend}"))
        .min(0).max(1)
        .description("FP32 busy with tensor near 0: an fp32 run not using tensor cores "
                     "(mixed precision would move the work to the tensor pipe)."),
        series_panel("DRAM active", "percentunit",
                     query(f"DCGM_FI_PROF_DRAM_ACTIVE{{{GPU}}}", legend)).min(0).max(1),
        row("Clocks and throttling"),
        series_panel("SM and memory clocks", "hertz",
                     query(f"DCGM_FI_DEV_SM_CLOCK{{{GPU}}} * 1e6", f"SM {legend}"),
                     query(f"DCGM_FI_DEV_MEM_CLOCK{{{GPU}}} * 1e6", f"mem {legend}")),
        series_panel("GPUs per active clock-event reason", "none",
                     query(f"sum by (reason) (stepscope_gpu_clock_event_active{{{GPU}}})",
                           "{{reason}}")).min(0)
        .description("How many of the selected GPUs have each clock-event reason active "
                     "(sw_thermal_slowdown, sw_power_cap, gpu_idle, ...)."),
        series_panel("Violations (share of time clocks held down)", "percentunit",
                     query(f"Hostname_gpu:DCGM_FI_DEV_THERMAL_VIOLATION:ratio_rate2m{{{GPU}}}",
                           f"thermal {legend}"),
                     query(f"Hostname_gpu:DCGM_FI_DEV_POWER_VIOLATION:ratio_rate2m{{{GPU}}}",
                           f"power {legend}"),
                     query(f"rate(DCGM_FI_DEV_SYNC_BOOST_VIOLATION{{{GPU}}}[$__rate_interval])"
                           " / 1e9", f"sync boost {legend}"),
                     query(f"rate(DCGM_FI_DEV_BOARD_LIMIT_VIOLATION{{{GPU}}}[$__rate_interval])"
                           " / 1e9", f"board limit {legend}")).min(0),
        series_panel("Clock-event time by reason", "percentunit",
                     query(f"sum by (cluster, Hostname, gpu, reason) "
                           f"(rate(stepscope_gpu_clock_event_seconds_"
                           f"total{{{GPU}}}[$__rate_interval]))", f"{{{{reason}}}} {legend}"))
        .min(0).description("Software vs hardware thermal slowdown, power cap."),
        row("Temperature and power"),
        series_panel("Temperature", "celsius",
                     query(f"DCGM_FI_DEV_GPU_TEMP{{{GPU}}}", f"GPU {legend}"),
                     query(f"DCGM_FI_DEV_MEMORY_TEMP{{{GPU}}}", f"memory {legend}"), w=8),
        series_panel("Power", "watt", query(f"DCGM_FI_DEV_POWER_USAGE{{{GPU}}}", legend),
                     w=8).min(0),
        series_panel("Energy rate", "watt", query(
            f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__rate_interval]) / 1000",
            legend), w=8).min(0)
        .description("From the energy counter (mJ), so it averages between reads."),
        row("Errors"),
        series_panel("XIDs by code", "none",
                     query(f"sum by (cluster, Hostname, gpu, xid) "
                           f"(stepscope_xid_errors_total{{{GPU}}})",
                           "{{Hostname}} gpu {{gpu}} xid {{xid}}"),
                     query(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", f"last XID {legend}"), w=8)
        .min(0).description("Counts per XID code since the exporter started, and the last "
                            "code reported."),
        series_panel("ECC errors and row remapping", "none",
                     query(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}", f"DBE {legend}"),
                     query(f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU}}}", f"SBE {legend}"),
                     query(f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{GPU}}}",
                           f"remapped rows (unc.) {legend}"),
                     query(f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{GPU}}}", f"remap pending {legend}"),
                     query(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}", f"remap failure {legend}"),
                     w=8).min(0),
        series_panel("PCIe replays", "ops", query(
            f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{GPU}}}[$__rate_interval])", legend),
                     w=8).min(0)
        .description("Replays per second: a flaky riser or cable."),
        row("Interconnect and memory"),
        series_panel("PCIe throughput", "Bps",
                     query(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{GPU}}}", f"tx {legend}"),
                     query(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{GPU}}}", f"rx {legend}"), w=8),
        series_panel("NVLink throughput", "Bps",
                     query(f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{GPU}}}", f"tx {legend}"),
                     query(f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{GPU}}}", f"rx {legend}"), w=8),
        series_panel("Framebuffer", "bytes",
                     query(f"DCGM_FI_DEV_FB_USED{{{GPU}}} * 1048576", f"used {legend}"),
                     query(f"DCGM_FI_DEV_FB_FREE{{{GPU}}} * 1048576", f"free {legend}"),
                     w=8).min(0),
    ]
    return dashboard("stepscope-node", "stepscope / Node and GPU",
                     "Everything one node's GPUs report: activity, pipes, clocks and their "
                     "reasons, temperature, power, errors, interconnect, memory.", panels)


# --- 3. Training job ----------------------------------------------------------------------

def training() -> schema.Dashboard:
    rank_legend = "rank {{rank}} ({{Hostname}} gpu {{gpu}})"
    panels: list[Panel] = [
        stat_panel("Step time (mean)", instant(
            f"training_job:stepscope_step_duration_seconds:mean2m{{{JOB}}}",
            "{{training_job}}"), unit="s", w=6),
        stat_panel("Tokens/s", instant(f"training_job:stepscope_tokens:rate2m{{{JOB}}}",
                                       "{{training_job}}"), unit="suffix: tok/s", w=6),
        stat_panel("MFU (mean over ranks)", instant(
            f"training_job:stepscope_mfu_ratio:avg{{{JOB}}}", "{{training_job}}"),
                   unit="percentunit", w=6,
                   # orange from StepscopeLowMfu's threshold; green where large LLM training
                   # is good
                   thresholds=[("red", None), ("orange", FLEET.low_mfu_share),
                               ("green", 0.4)]),
        stat_panel("Straggler score (worst rank)", instant(
            f"training_job:stepscope_straggler_score:max{{{JOB}}}", "{{training_job}}"),
                   w=6, thresholds=[("orange", STRAGGLER)]),
        series_panel("Step time per rank", "s", query(
            f"training_job_rank:stepscope_step_duration_seconds:mean2m{{{RANK}}}",
            rank_legend)).min(0)
        .description("Mean wall time per step over 2 minutes."),
        heatmap_panel("Step time distribution", buckets(
            f"sum by (le) (rate(stepscope_job_step_duration_seconds_bucket{{{RANK}}}"
            "[$__rate_interval]))", "{{le}}"), unit="s"),
        series_panel("Where the step goes (mean over ranks)", "s", query(
            f"avg by (phase) (training_job_rank:stepscope_step_phase_seconds:mean2m{{{RANK}}})",
            "{{phase}}"), stack=True).min(0)
        .description("data_wait: waiting for the next batch; compute; comm: exposed "
                     "communication; other: the rest of the step."),
        series_panel("Exposed communication and data wait per rank", "s",
                     query(f'training_job_rank:stepscope_step_phase_seconds:mean2m'
                           f'{{{RANK}, phase="comm"}}', f"comm {rank_legend}"),
                     query(f'training_job_rank:stepscope_step_phase_seconds:mean2m'
                           f'{{{RANK}, phase="data_wait"}}', f"data wait {rank_legend}"))
        .min(0).description("A straggler shows as comm time on the other ranks, which wait "
                            "for it."),
        series_panel("Straggler score per rank", "none", query(
            f"training_job_rank:stepscope_straggler_score:ratio{{{RANK}}}", rank_legend),
                     thresholds=[("orange", STRAGGLER)])
        .description("Busy time per step (the step less exposed communication) over the "
                     "job's median rank. 1 is typical. " + STRAGGLER_ALERTS),
        series_panel("MFU per rank", "percentunit", query(
            f"stepscope_mfu_ratio{{{RANK}}}", rank_legend)).min(0),
        series_panel("Tokens/s per job", "suffix: tok/s", query(
            f"training_job:stepscope_tokens:rate2m{{{JOB}}}", "{{training_job}}")).min(0),
        timeline_panel("Bottleneck verdict per rank", query(
            f"stepscope_bottleneck{{{RANK}}} == 1", "rank {{rank}}: {{kind}}"))
        .description("The diagnosis' verdict per rank over time."),
        series_panel("Ranks per verdict modifier", "none", query(
            f"sum by (modifier) (stepscope_bottleneck_modifier{{{RANK}}})", "{{modifier}}"))
        .min(0).description("thermal_throttle, power_cap, fp32_no_tensor, low_occupancy, "
                            "tcp_suspected."),
        series_panel("Seconds since last step", "s", query(
            f"time() - stepscope_last_step_timestamp_seconds{{{RANK}}}", rank_legend)).min(0)
        .description("Growing without bound: a hung rank."),
        row("GPU-hours lost by cause"),
        table_panel("GPU-hours lost by cause over the time range", instant(
            "sum by (training_job, badput_type) (increase("
            f"stepscope_job_badput_gpu_seconds_total{{{RANK}}}[$__range])) / 3600"),
                    w=8, labels=("training_job", "badput_type"),
                    columns={"A": ("GPU-hours", "none")}, sort_by="A", desc=True)
        .description("GPU-hours each cause cost the job over the dashboard's time range, "
                     "summed over its nodes (and clusters of that name): GPU-seconds its "
                     "ranks' GPUs spent waiting for data, in exposed communication, "
                     "checkpointing, warming up, idle while held... `stepscope diagnose "
                     "--prometheus URL --job NAME` prints the same with goodput and each "
                     "cause's share."),
        series_panel("Goodput ratio", "percentunit", query(
            f"{GOODPUT_RATIO}{{{JOB}}}", "{{training_job}}"), w=16).min(0).max(1)
        .description("Productive GPU time over all the GPU time the job held (goodput plus "
                     f"every cause of badput), over {FLEET.goodput_window}. A job still "
                     "compiling, or hung from the start, reads 0."),
        series_panel("GPUs' worth lost by cause", "suffix: GPUs", query(
            f"sum by (badput_type) ({BADPUT_RATE}{{{JOB}}})", "{{badput_type}}"),
                     stack=True, w=24).min(0)
        .description("GPU-seconds lost per second, by cause, over "
                     f"{FLEET.goodput_window}: 3 means three GPUs' worth of the job's GPUs "
                     "were, on average, doing nothing productive for that reason."),
    ]
    return dashboard("stepscope-training", "stepscope / Training job",
                     "One training job: step time per rank, where the step goes, MFU, "
                     "tokens/s, straggler score, the diagnosis' verdicts and the GPU-hours "
                     "lost by cause.", panels)


def _with_definitions(dash: Json) -> Json:
    """Each query variable's ``definition``, the query text the dashboard settings' list of
    variables shows: the SDK's variable model has no such field."""
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":
            variable["definition"] = variable["query"]["query"]
    return dash


def to_json(model: schema.Dashboard) -> str:
    """The dashboard as the JSON text Grafana reads: keys sorted, two-space indent."""
    dash = _with_definitions(json.loads(json.dumps(model, cls=JSONEncoder)))
    return json.dumps(dash, indent=2, sort_keys=True) + "\n"


DASHBOARDS = {
    "stepscope-fleet.json": fleet,
    "stepscope-node.json": node,
    "stepscope-training.json": training,
}


def render(host_label: str = "Hostname") -> dict[str, str]:
    """File name → JSON text of every dashboard for ``host_label``, exactly as committed."""
    return {name: with_host_label(to_json(build()), host_label)
            for name, build in DASHBOARDS.items()}


def files() -> dict[Path, str]:
    """Path in the checkout -> JSON text, for every dashboard and host label."""
    return {out_dir / name: text
            for host_label, out_dir in OUT_DIRS.items()
            for name, text in render(host_label).items()}


def write(repo: Path = REPO) -> list[str]:
    """Rewrite the dashboards that changed; one line per file written."""
    return sync(repo, files())
