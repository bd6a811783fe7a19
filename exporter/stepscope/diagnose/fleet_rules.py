"""Every judgement made outside the process, defined once: the thresholds and windows of
the shipped alert and recording rules and of ``stepscope diagnose --prometheus``.

Three places judge a fleet: the alert rules in the fleet's Prometheus, the fleet view
(``stepscope diagnose --prometheus``) and each node's own diagnosis. They must agree on
what a straggler and a throttled GPU are, or Alertmanager and the fleet view contradict
each other on the same data. So:

- ``python -m generate`` renders ``deploy/prometheus/rules-src/*.yml`` into
  ``deploy/prometheus/rules/`` with :data:`FLEET` (its ``<% name %>`` placeholders), and
  from there the ``hostname`` variants, the chart's copies and the plain manifests;
  ``python -m generate --check`` fails on a hand edit or a value changed here only;
- the fleet view reads the series the recording rules record (the straggler score, the
  node's SM activity against its peers, the thermal share) and compares them with the
  same numbers (:func:`stepscope.diagnose.cli.analyse_fleet`);
- the node's own thresholds (:class:`stepscope.diagnose.thresholds.Thresholds`) take
  their defaults from here where they mean the same thing (``throttle_share``,
  ``sm_active_busy``, ``pcie_replays_per_minute``), and its critical XIDs
  (:data:`stepscope.diagnose.faults.CRITICAL_XIDS`) are ``drain_xids``.

docs/diagnosis.md ("One source for every judgement") lists them; a test keeps it equal.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from stepscope.diagnose.kinds import BOTTLENECK_KINDS, KINDS

# A placeholder of a rule source: ``<% name %>`` or ``<% name | format %>``. Neither
# PromQL nor Prometheus' templates (``{{ ... }}``) use ``<%``.
PLACEHOLDER = re.compile(r"<%\s*([a-z_]+)\s*(?:\|\s*([a-z]+)\s*)?%>")
# A line of a rule source that only PromQL evaluates: ``<% promql_only %>`` after the
# line's indentation. vmalert 1.79's MetricsQL has no histogram_count/histogram_sum (the
# native-histogram branches of the step-time rules; VictoriaMetrics 1.79 stores no native
# histograms either), so the MetricsQL rendering drops such lines and the PromQL one keeps
# them without the marker. Each marked line is a whole alternative (``or ...``) whose
# removal leaves the expression valid.
PROMQL_ONLY = re.compile(r"(?m)^([ \t]*)<% promql_only %>(.*\n?)")
#: The query languages the rules are rendered for: Prometheus' (and Mimir's, Thanos', AMP's
#: rulers), and VictoriaMetrics' vmalert (deploy/prometheus/rules-victoriametrics/).
DIALECTS = ("promql", "metricsql")


@dataclass(frozen=True)
class FleetRules:
    """The numbers of the fleet's judgements. Shares and ratios are 0-1; windows and
    ``for:`` durations are Prometheus durations; lists (codes, kinds) tuples."""

    # -- windows
    # rate() window of the rank busy time that the straggler score reads: short, since the
    # score compares a rank with its job's median at the same instant (a whole fleet
    # slowing together moves the median with it)
    straggler_window: str = "1m"
    # how long a straggler or a throttled GPU must last before it pages. Measured on
    # benchmarks/bench_fleet_onset.py (15 s scrape): a rank's score crosses its threshold
    # ~70 s after onset (the 1m window has to tilt, then a scrape and an evaluation), a
    # thermal ratio ~45 s after, a node's SM ratio ~30 s after; these keep each alert
    # within two minutes of onset (docs/diagnosis.md, "From onset to verdict and alert")
    # while a transient shorter than the window and this does not page
    # a rank straggler pages once it has lasted this long, so a transient (a save, a
    # burst of jitter) does not; a rank 8% slower pages ~3 minutes after its onset
    # (docs/diagnosis.md, "Fail-slow ranks and GPUs")
    rank_straggler_for: str = "2m"
    node_straggler_for: str = "1m"
    thermal_for: str = "45s"
    # -- paging (docs/runbooks.md, "Paging"): tuned with the shipped Alertmanager's
    # group_wait (30s) so that a node's cause and its symptoms land in one message.
    # A GPU off the bus raises its drain XID (no `for:`) at the evaluation that first
    # sees it and reads down at the same scrape: down for this long, it fires one or two
    # 15 s evaluations later, inside the XID's group_wait, so both page together. Two
    # scrapes in a row, not one NVML hiccup.
    gpu_down_for: str = "15s"
    # An exporter unscraped this long pages (prod clusters) and inhibits every alert of
    # its node. Shorter than the 2-minute windows of the GPU rules, so a dead node's GPU
    # alerts, which still read its last samples, are inhibited before they would resolve
    # (and send "resolved" for a node that is gone); four missed 15 s scrapes, longer
    # than a DaemonSet's rolling restart.
    exporter_down_for: str = "1m"
    # -- stragglers
    # a node whose least active GPU is under this share of its peer group's median node
    node_straggler_share: float = 0.6
    # ... counting only nodes holding work (this share of their framebuffer in use) ...
    busy_fb_share: float = 0.05
    # ... while the median node computes (SM active above this; the node's own diagnosis
    # counts a GPU without a rank at/above it as computing)
    sm_active_busy: float = 0.5
    # a rank whose busy time per step (the step less exposed communication) is above this
    # multiple of the median rank of its group (the ranks of its job that report the same
    # group: a pipeline stage, a role; the whole job where none is reported), or has risen
    # this much over its own past while its job's ranks have not: the rank every other
    # rank waits for. 8% slower is caught (the 1m mean crosses 1.06 three quarters of the
    # way in); per-step jitter of +-4% averages out far below it
    rank_straggler_ratio: float = 1.06
    # the rank's own past: its busy time per step averaged over this window, ending
    # fail_slow_offset ago (long enough back that an onset is not yet its own past when
    # the alert is due, 5 minutes after it)
    fail_slow_baseline: str = "30m"
    fail_slow_offset: str = "5m"
    # a GPU under load (utilisation at/above this, %) whose SM clock averaged over a
    # minute is under gpu_clock_lag_ratio of the median of its node's other loaded GPUs
    # of the same model and enforced power limit, for gpu_clock_for: a fail-slow GPU,
    # whatever its violation counters say (a clock held down without a thermal or power
    # event). 8% lower is caught; clocks under a shared power cap sit within a few bins
    clock_load_gpu_util: float = 90.0
    gpu_clock_lag_ratio: float = 0.94
    gpu_clock_for: str = "2m"
    # -- GPU health
    # share of the time under thermal (or power) clock events from which a GPU counts as
    # throttled (the node's own diagnosis: over its window)
    throttle_share: float = 0.1
    # a GPU capped for power this many points above the median GPU of its node or
    # training job is capped unlike its peers (a fleet uniformly at its cap is healthy)
    power_cap_peer_margin: float = 0.2
    # an enforced power limit under this share of the board's default is lowered
    power_limit_floor: float = 0.95
    # PCIe replays a minute from which the link is faulty (DCGM's health check's limit)
    pcie_replays_per_minute: float = 8.0
    # XIDs after which the GPU must be drained and reset (StepscopeGpuXidDrain; the node's
    # gpu_fault holds the same codes): those whose immediate action in NVIDIA's XID
    # catalogue is RESET_GPU, RESTART_BM or a workflow ending in one (48 DBE ECC, 74
    # NVLink, 144-150 NVLink5). Not 63 (row remap recorded) nor 94 (contained error:
    # restart the application).
    drain_xids: tuple[int, ...] = (
        46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143,
        144, 145, 146, 147, 148, 149, 150, 155, 156, 158,
    )  # fmt: skip
    # -- training
    # a rank silent for more than this multiple of its usual (lifetime mean) step time ...
    stalled_step_factor: float = 10.0
    # ... and at least this long has stalled (so has a rank silent this long with no
    # measured step yet): StepscopeTrainingStalled
    stalled_min_silence: str = "2m"
    # a job whose MFU averaged over its ranks stays under this runs poorly
    # (StepscopeLowMfu; 40-50% is good for large LLM training)
    low_mfu_share: float = 0.2
    # the verdict kinds StepscopeBottleneck warns on: the diagnosis' bottlenecks (time
    # leaking, `stepscope diagnose` exits 1), but gpu_fault, which the hardware alerts page
    # for at once. Made from the kinds, so a new bottleneck kind is alerted on as it lands.
    bottleneck_kinds: tuple[str, ...] = tuple(
        k for k in KINDS if k in BOTTLENECK_KINDS and k != "gpu_fault")
    # -- goodput
    # rate() window of the GPUs' worth of goodput and badput per job and cluster: a few
    # 15 s scrapes, since a step's time is counted when the step reports and a long step
    # (a checkpoint save, a compilation) lands as one jump
    goodput_window: str = "5m"
    # -- meta-monitoring: the monitoring's own health (stepscope-meta.yml,
    # docs/runbooks.md "Meta-monitoring")
    # a cluster whose exporters' `up` has no sample centrally for this long (its agents
    # died, or cannot write), or reads 0 on every target over it, is blind: eight 15 s
    # scrapes, longer than the agents' batch deadline (5 s) and retry backoff (10 s)
    silent_window: str = "2m"
    # ... and pages (StepscopeClusterSilent, StepscopeAgentSilent) after this; a cluster
    # counts as known for an hour after its last sample, then is forgotten (one taken out
    # of service stops alerting by itself)
    silent_for: str = "1m"
    silent_known: str = "1h"
    # a share of an agent's remote-write samples failing or retried, of an Alertmanager's
    # notifications failing, above which the path is broken, not blipping ...
    meta_failed_share: float = 0.01
    # ... for this long (StepscopeRemoteWriteFailing, StepscopeRemoteWriteBehind,
    # StepscopeRemoteWriteShardsMaxed, StepscopeRuleEvaluationFailures,
    # StepscopeNotificationsFailing): a sustained condition, within 5 minutes
    meta_for: str = "5m"
    # an agent whose newest sample sent is this far behind its newest sample scraped (or,
    # for vmagent, whose queue holds this long at its current send rate) is behind: the
    # central rules judge a past that long ago
    remote_write_lag: str = "2m"


#: The shipped values.
FLEET = FleetRules()

_UNITS = {"s": ("second", 1), "m": ("minute", 60), "h": ("hour", 3600)}


def duration_seconds(text: str) -> float:
    """Seconds in a one-unit Prometheus duration (``90s``, ``1m``, ``2h``); ValueError
    otherwise."""
    match = re.fullmatch(r"(\d+)([smh])", text)
    if match is None:
        raise ValueError(f"expected a duration such as 30s, 1m or 2h, got {text!r}")
    return float(int(match[1]) * _UNITS[match[2]][1])


def _words(text: str) -> str:
    """``1m`` -> ``1 minute``, ``90s`` -> ``90 seconds``: a duration as a description says it."""
    duration_seconds(text)
    number, unit = int(text[:-1]), _UNITS[text[-1]][0]
    return f"{number} {unit}" + ("" if number == 1 else "s")


def _number(value: float) -> str:
    return f"{value:g}"


FORMATS: dict[str, Callable[[object], str]] = {
    # 0.1 -> 10%: a share as a description says it
    "pct": lambda v: f"{100 * float(str(v)):g}%",
    # 0.2 -> 20: a share in percentage points
    "points": lambda v: f"{100 * float(str(v)):g}",
    # 1.25 -> 1.25x
    "x": lambda v: f"{float(str(v)):g}x",
    "words": lambda v: _words(str(v)),
    # 2m -> 120: a duration as PromQL compares it with seconds
    "seconds": lambda v: _number(duration_seconds(str(v))),
    # (46, 48) -> 46|48: a list as a label matcher's regular expression
    "regex": lambda v: "|".join(_items(v)),
}


def _items(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple):
        raise ValueError(f"expected a list, got {value!r}")
    return tuple(str(v) for v in value)


def plain(value: object) -> str:
    """A value as a placeholder without a format writes it: ``0.6``, ``1m``, a list as
    ``46, 48, 62``."""
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, tuple):
        return ", ".join(_items(value))
    return str(value)


def render(text: str, rules: FleetRules = FLEET, dialect: str = "promql") -> str:
    """``text`` with every ``<% name %>`` / ``<% name | format %>`` replaced by that value
    of ``rules``, and its ``<% promql_only %>`` lines kept (``promql``) or dropped
    (``metricsql``); ValueError naming an unknown name, format or dialect."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r} (known: {', '.join(DIALECTS)})")
    text = PROMQL_ONLY.sub(r"\1\2" if dialect == "promql" else "", text)
    values = dataclasses.asdict(rules)

    def one(match: re.Match[str]) -> str:
        name, fmt = match[1], match[2]
        if name not in values:
            raise ValueError(f"unknown fleet threshold <% {name} %> (known: {', '.join(values)})")
        if fmt is None:
            return plain(values[name])
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r} in <% {name} | {fmt} %> "
                             f"(known: {', '.join(FORMATS)})")
        return FORMATS[fmt](values[name])

    return PLACEHOLDER.sub(one, text)
