"""False alarms: a healthy simulated fleet with ranks, 30 simulated minutes.

    python -m benchmarks.bench_false_alarms [--nodes 8] [--gpus 8] [--minutes 30] [--sanity]
                                            [--jitter 0.04] [--stages 4]

Each node is a real ``Sampler`` (the registry ``stepscope serve`` builds: GPU source over a
simulated 8 x H100 node, the ingest's ``IngestSource`` over a real ``Aggregator``, an RDMA
source, the diagnosis as its analysis stage, default thresholds) on one fake clock shared
by all nodes, so 30 minutes take a minute or two of CPU. Time is compressed, not skipped:
every simulated second each node makes one sampling pass, and every rank reports every
step it finished that second, as the SDK would (a DDP job across all nodes, steps of
~0.5 s with deterministic jitter: data wait 1-3%, compute ~85%, exposed comm 5-10%, the
rest ~5%; ``--checkpoint-every M``: a 20 s checkpoint every M minutes, which the SDK
counts in the next step's ``other``; ``--jitter J``: each step's time off by up to
+-J instead of +-3%; ``--stages S``: a pipeline, the ranks in S stages in rank order,
each reporting its stage as its ``group``, the first and last stages 30% busier per step
by design). What is scripted rather than read: the host (CPUs
30% busy, the rank's process ~1 core spinning on CUDA syncs, 4 DataLoader workers at
0.5 core each, no IO pressure) and the RDMA ports (EFA moving 5 GB/s), since /proc and
/sys cannot run on a fake clock.

Two counts, after the first diagnosis window (warm-up: too few steps to judge):

1. **verdicts**: every verdict of every pass; healthy is ``compute`` without a modifier
   that is a bottleneck. Everything else is counted by kind.
2. **would-be alerts**: every node's ``/metrics`` body every 15 s (a 15 s scrape, labels
   ``instance``/``job``/``cluster`` added as Prometheus would, plus ``up``) becomes the
   input series of a ``promtool test rules`` file that evaluates the shipped recording and
   alert rules (deploy/prometheus/rules, unchanged) every 15 s and expects no alert at
   each minute; promtool's failures are the alerts that would have fired.

Goal: zero and zero. Needs ``promtool`` (Debian package ``prometheus``) for count 2.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from stepscope.core.registry import Registry
from stepscope.core.sampler import Sampler, SamplerSettings
from stepscope.core.source import ReadContext, Source
from stepscope.diagnose.analysis import DIAGNOSIS, DiagnosisAnalysis
from stepscope.diagnose.model import Diagnosis
from stepscope.gpu.simulated import (
    SimulatedBackend,
    default_scenario,
    parse_scenario,
)
from stepscope.gpu.source import GpuSource
from stepscope.host.model import HOST_PART, HostReading, ProcessReading
from stepscope.ingest.aggregate import Aggregator, TrainingSettings
from stepscope.ingest.source import IngestSource
from stepscope.net.rdma import RdmaPort
from stepscope.net.source import RdmaSource
from stepscope.shared.datagram import Limits, StepRecord
from tests.support import REPO

RULES = REPO / "deploy" / "prometheus" / "rules"
SCRAPE = 15  # seconds between "scrapes" that feed promtool
JOB = "llama-healthy"
PID0 = 50_000
CHECKPOINT_SECONDS = 20.0


class Clock:
    """The fake clock every node, GPU and aggregator shares."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ScriptedHost(Source[HostReading]):
    """A healthy host as read by the host source: the ranks' processes and their workers."""

    key = HOST_PART

    def __init__(self, pids: list[int]) -> None:
        self.reading = HostReading(
            96, (0.3,) * 96,
            processes={p: ProcessReading(p, 0.95, 4, 2.0) for p in pids},
        )  # fmt: skip

    def read(self, ctx: ReadContext) -> HostReading:
        return self.reading


class ScriptedRdma(RdmaSource):
    """The node's EFA ports moving 5 GB/s (the real source's families render them)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def read(self, ctx: ReadContext) -> tuple[RdmaPort, ...]:
        moved = 2.5e9 * self.clock.t
        return tuple(RdmaPort(f"rdmap{i}s0", "1", {"tx_bytes": moved, "rx_bytes": moved})
                     for i in range(4))  # fmt: skip


def jitter(*key: int) -> float:
    """Deterministic noise in [0, 1) from integers (no `random`: reproducible)."""
    x = 0
    for k in key:
        x = (x * 0x9E3779B1 + k + 0x7F4A7C15) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
        x ^= x >> 12
    return (x & 0xFFFFFF) / 0x1000000


class Node:
    """One exporter: a real sampler over simulated GPUs and the scripted host."""

    def __init__(self, index: int, gpus: int, world: int, clock: Clock,
                 sick: bool = False, checkpoint: float = 0.0, spread: float = 0.03,
                 stages: int = 0) -> None:  # fmt: skip
        self.host = f"node-{index:02d}"
        scenario = default_scenario(gpus)
        if sick:  # --sanity: GPU 0 throttles for temperature from the start
            scenario = parse_scenario({"gpus": gpus, "timeline": [{"gpus": [0], "thermal": "sw"}]})
        self.sick = sick
        self.checkpoint = checkpoint  # seconds between checkpoints (0: none)
        self.backend = SimulatedBackend(scenario, hostname=self.host, clock=clock)
        self.uuids = [d.uuid for d in self.backend.devices()]
        self.ranks = [index * gpus + g for g in range(gpus)]
        self.agg = Aggregator(TrainingSettings(limits=Limits(max_ranks_per_job=world)),
                              clock=clock)  # fmt: skip
        self.agg.set_listening(f"unix:///run/stepscope/{self.host}.sock")  # the socket is up
        registry = Registry()
        registry.register(GpuSource(self.backend))
        registry.register(IngestSource(self.agg))
        registry.register(ScriptedHost([PID0 + r for r in self.ranks]))
        registry.register(ScriptedRdma(clock))
        registry.register_analysis(DiagnosisAnalysis())
        self.sampler = Sampler(registry, SamplerSettings(self.host, 1.0, 10.0), clock=clock,
                               wall_clock=clock)  # fmt: skip
        self.next_step = {r: (jitter(r) * 0.5, 0) for r in self.ranks}  # (end time, number)
        self.world = world
        self.spread = spread  # +-share of each step's time
        self.stages = stages

    def report(self, now: float) -> None:
        """Every step each rank finished up to ``now``, as StepRecords."""
        for local, r in enumerate(self.ranks):
            end, n = self.next_step[r]
            while end <= now:
                stage = r * self.stages // self.world if self.stages else None
                # the first and last stages carry the embedding and the loss
                heavy = 1.3 if stage in (0, self.stages - 1) else 1.0
                dur = 0.5 * heavy * (1 - self.spread + 2 * self.spread * jitter(r, n))
                data = dur * (0.01 + 0.02 * jitter(r, n, 1))
                if self.sick and local == 0:
                    data = 0.4 * dur  # --sanity: this rank's loader cannot keep up
                comm = dur * (0.05 + 0.05 * jitter(r, n, 2))
                other = dur * 0.05
                if self.checkpoint and n and (end // self.checkpoint) != (
                        (end - dur) // self.checkpoint):
                    # a checkpoint: 20 s between two steps, counted in the next one's
                    # `other` as the SDK does
                    other += CHECKPOINT_SECONDS
                    dur += CHECKPOINT_SECONDS
                self.agg.add(StepRecord(
                    JOB, r, local, n, end, dur, data, dur - data - comm - other, comm, other,
                    n < 3, 4096, 0.45 * 989.4e12 * dur, "bf16", self.world, PID0 + r,
                    self.uuids[local], 0,
                    group=f"stage{stage}" if stage is not None else None))  # fmt: skip
                n += 1
                end += dur
            self.next_step[r] = (end, n)


def scrape_series(body: str, host: str, names: set[str]) -> dict[str, float]:
    """`series text -> value` for the metric names the rules use, labelled as scraped."""
    out: dict[str, float] = {}
    extra = f'instance="{host}:9400",job="stepscope",cluster="sim"'
    for line in body.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, brace, labels = head.partition("{")
        if name not in names and not name.startswith("stepscope_rdma_"):
            continue
        labels = labels.rstrip("}")
        out[f"{name}{{{labels + ',' if brace and labels else ''}{extra}}}"] = float(value)
    out[f"up{{{extra}}}"] = 1.0
    return out


def rule_metric_names() -> set[str]:
    """The metric names the shipped rules read (histogram and summary parts included)."""
    exprs = [r.get("expr", "") for doc in [yaml.safe_load(p.read_text())
             for p in RULES.glob("*.yml")] for g in doc["groups"] for r in g["rules"]]
    tokens = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(exprs)))
    return {t for t in tokens if t.startswith(("DCGM_", "stepscope_"))} | {
        t + s for t in tokens for s in ("_sum", "_count", "_bucket") if t.startswith("stepscope_")}


def promtool_alerts(series: dict[str, list[float | None]], minutes: int,
                    tmp: Path) -> list[tuple[str, str, str]]:  # fmt: skip
    """(time, alertname, labels) of every alert promtool sees fire on ``series``."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool not found (Debian package prometheus)")
    alerts = sorted({r["alert"] for p in RULES.glob("*.yml")
                     for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]
                     if "alert" in r})  # fmt: skip
    rules = [str(p) for p in sorted(RULES.glob("*.yml"))]

    def values(vs: list[float | None]) -> str:
        return " ".join("_" if v is None else repr(v) for v in vs)

    doc = {
        "rule_files": rules,
        "evaluation_interval": f"{SCRAPE}s",
        "tests": [{
            "interval": f"{SCRAPE}s",
            "input_series": [{"series": s, "values": values(vs)} for s, vs in series.items()],
            "alert_rule_test": [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []}
                                for m in range(1, minutes + 1) for a in alerts],
        }],
    }  # fmt: skip
    path = tmp / "false_alarms_test.yml"
    path.write_text(yaml.safe_dump(doc, width=1 << 20))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=1800)  # fmt: skip
    if "SUCCESS" in result.stdout:
        return []
    fired = []
    for block in re.split(r"\n\s*alertname: ", result.stdout + result.stderr)[1:]:
        m = re.match(r"(\S+), time: (\S+),", block)
        if not m:
            continue
        got = block.split("got:", 1)[1] if "got:" in block else ""
        for labels in re.findall(r"Labels:\{([^}]*)\}", got):
            fired.append((m.group(2), m.group(1), labels))
    if not fired:
        raise SystemExit("promtool failed without naming alerts:\n" + result.stdout
                         + result.stderr)  # fmt: skip
    return fired


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--no-promtool", action="store_true", help="count verdicts only")
    ap.add_argument("--checkpoint-every", type=float, default=0.0, metavar="MINUTES",
                    help="a 20 s checkpoint every MINUTES on every rank (default: none)")
    ap.add_argument("--jitter", type=float, default=0.03,
                    help="each step's time off by up to +-this share (default 0.03)")
    ap.add_argument("--stages", type=int, default=0,
                    help="a pipeline of this many stages, each its own group (default none)")
    ap.add_argument("--sanity", action="store_true",
                    help="make node 0 sick (GPU 0 hot, rank 0 data-starved): both counts must "
                    "then be non-zero, which proves they can see an alarm")
    args = ap.parse_args()
    clock = Clock()
    world = args.nodes * args.gpus
    nodes = [Node(i, args.gpus, world, clock, sick=args.sanity and i == 0,
                  checkpoint=60 * args.checkpoint_every, spread=args.jitter,
                  stages=args.stages) for i in range(args.nodes)]
    names = rule_metric_names()
    seconds = args.minutes * 60
    samples = seconds // SCRAPE + 1
    series: dict[str, list[float | None]] = {}
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}
    warmup = 0.0
    t0 = time.perf_counter()
    for second in range(1, seconds + 1):
        clock.t = float(second)
        for node in nodes:
            node.report(clock.t)
            published = node.sampler.sample_once()
            diag = published.result(DIAGNOSIS, Diagnosis)
            assert diag is not None
            warmup = diag.thresholds.window + 5  # the first window: too few steps to judge
            if second > warmup:
                for v in diag.verdicts:
                    healthy = v.kind == "compute" and not v.bottleneck
                    label = "healthy (compute)" if healthy else v.kind + "".join(
                        f"+{m}" for m in v.modifiers)
                    kinds[label] += 1
                    if not healthy and label not in examples:
                        examples[label] = f"t={second}s {node.host} {v.subject.name}: " + \
                            "; ".join(v.evidence)
            if second % SCRAPE == 0 and not args.no_promtool:
                index = second // SCRAPE
                for s, value in scrape_series(published.body.decode(), node.host,
                                              names).items():  # fmt: skip
                    series.setdefault(s, [None] * samples)[index] = value
    elapsed = time.perf_counter() - t0
    judged = sum(kinds.values())
    unhealthy = judged - kinds["healthy (compute)"]
    shape = f", {args.stages} pipeline stages" if args.stages else ""
    print(f"# False alarms: {args.nodes} nodes x {args.gpus} GPUs, one {world}-rank job"
          f"{shape}, step jitter +-{args.jitter:.0%}, {args.minutes} simulated minutes "
          f"({elapsed:.0f} s of CPU time)\n")
    print(f"Verdicts after the first {warmup:.0f} s (one per rank per pass, "
          f"{args.nodes} nodes x 1 pass/s):\n")
    print("| verdict | count |\n|---|---|")
    for label, n in kinds.most_common():
        print(f"| `{label}` | {n} |")
    print(f"\nNon-healthy verdicts: **{unhealthy}** of {judged}")
    for label, ex in examples.items():
        print(f"- first `{label}`: {ex}")
    if args.no_promtool:
        return 0 if unhealthy == 0 else 1
    with tempfile.TemporaryDirectory(prefix="stepscope-false-alarms-") as tmp:
        fired = promtool_alerts(series, args.minutes, Path(tmp))
    print(f"\nWould-be alerts: the shipped rules evaluated by promtool every {SCRAPE} s over "
          f"{len(series)} scraped series, no alert expected at each of {args.minutes} "
          f"minutes: **{len({(a, lbl) for _, a, lbl in fired})}** distinct alerts fired "
          f"({len(fired)} alert-minutes)")
    first: dict[str, tuple[str, str]] = {}
    for when, alert, labels in fired:
        first.setdefault(alert, (when, labels))
    for alert, (when, labels) in first.items():
        print(f"- {alert}, first at {when}: {{{labels}}}")
    return 0 if unhealthy == 0 and not fired else 1


if __name__ == "__main__":
    sys.exit(main())
