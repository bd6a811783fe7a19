"""The scale-out path's real servers, each a process on a free loopback port with its data in
a tmp dir: Prometheus agents configured from the shipped deploy/prometheus/agent-ec2.yml,
a central Prometheus with the remote-write receiver and the shipped rules, VictoriaMetrics
with vmalert, Alertmanager with the shipped deploy/alertmanager/alertmanager.yml, and a
webhook receiver that records every notification (tests/e2e/test_scale_out.py)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support.exporter import terminate
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.tools import prometheus_binary, require_tool

AGENT_CONFIG = REPO / "deploy" / "prometheus" / "agent-ec2.yml"
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = REPO / "deploy" / "prometheus" / "rules"
VM_RULES = REPO / "deploy" / "prometheus" / "rules-victoriametrics"
VM_SCRAPE = REPO / "deploy" / "victoriametrics" / "scrape.yml"
# the single-Prometheus config whose meta-monitoring jobs (`prometheus`, `alertmanager`)
# the central Prometheus runs
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus-ec2.yml"
# CI sets it; vmalert and victoria-metrics come in one Debian package
REQUIRED_BY = "STEPSCOPE_REQUIRE_PROMTOOL"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


class Server:
    """A server process: its URL, its log, stopped (then killed) by ``stop``."""

    def __init__(self, tmp: Path, name: str, argv: Sequence[str], port: int,
                 ready_path: str, env: dict[str, str] | None = None) -> None:  # fmt: skip
        tmp.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.argv = list(argv)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp / f"{name}.log"
        self.log = self.log_path.open("a")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=tmp, env={**os.environ, **(env or {})})  # fmt: skip
        try:
            wait_for(lambda: self._ready(ready_path), timeout=30, interval=0.2)
        except BaseException:  # never ready: nobody else holds it to stop it
            self.stop()
            raise

    def _ready(self, path: str) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()

    def metric(self, name: str) -> float:
        """The sum of ``name``'s samples on the server's own /metrics (0 when absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.split("{", 1)[0].split(" ", 1)[0] == name)  # fmt: skip


def shipped_remote_write() -> dict[str, Any]:
    """The shipped agent's remote_write entry: its keep list and queue settings."""
    (remote,) = yaml.safe_load(AGENT_CONFIG.read_text())["remote_write"]
    assert isinstance(remote, dict)
    return remote


def prometheus_agent(tmp: Path, name: str, targets: dict[str, str], write_urls: list[str],
                     replica: str, scrape_interval: str = "5s",
                     cluster: str | None = None) -> Server:  # fmt: skip
    """Prometheus 2.42 in agent mode with the shipped deploy/prometheus/agent-ec2.yml.
    Substituted: the targets (its file_sd job reads a file listing ``targets``, address ->
    cluster, where `stepscope discover` would write one; the EC2 job, which needs AWS, is
    left out; its own job scrapes its port, labelled ``cluster``, by default the one cluster
    of ``targets``), the remote_write URLs (one copy of the shipped entry each, without its
    AMP SigV4), and the scrape interval (``scrape_interval``, shipped 15s: the test's clock).
    Everything else is as shipped: relabelling, keep list, queue, native histograms sent,
    the ``replica`` external label from STEPSCOPE_AGENT_REPLICA."""
    config = yaml.safe_load(AGENT_CONFIG.read_text())
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["scrape_timeout"] = scrape_interval
    jobs = [job for job in config["scrape_configs"] if "file_sd_configs" in job]
    (own,) = [job for job in config["scrape_configs"] if job["job_name"] == "prometheus-agent"]
    assert len(jobs) == 1 and len(config["scrape_configs"]) == 3, config["scrape_configs"]
    (tmp / name).mkdir(parents=True)
    targets_file = tmp / name / "stepscope.json"
    targets_file.write_text(json.dumps([{"targets": [address], "labels": {"cluster": cluster}}
                                        for address, cluster in targets.items()]))
    jobs[0]["file_sd_configs"] = [{"files": [str(targets_file)], "refresh_interval": "5s"}]
    port = free_port()
    if cluster is None:
        (cluster,) = set(targets.values())
    (static,) = own["static_configs"]
    static.update(targets=[f"127.0.0.1:{port}"], labels={"cluster": cluster})
    config["scrape_configs"] = [*jobs, own]
    (shipped,) = config["remote_write"]
    assert "sigv4" in shipped
    config["remote_write"] = [
        {**{k: v for k, v in shipped.items() if k != "sigv4"}, "url": url} for url in write_urls
    ]
    (tmp / name / "agent.yml").write_text(yaml.safe_dump(config))
    return Server(tmp / name, name, [
        prometheus_binary(), "--enable-feature=agent,expand-external-labels",
        f"--config.file={tmp / name / 'agent.yml'}", f"--storage.agent.path={tmp / name / 'wal'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        # on stop, give up on what a dead store has not taken at once (1m by default)
        "--storage.remote.flush-deadline=1s",
    ], port, "/-/ready", env={"STEPSCOPE_AGENT_REPLICA": replica})  # fmt: skip


def _meta_jobs(config: dict[str, Any], targets: dict[str, list[str]],
               interval: str) -> list[dict[str, Any]]:  # fmt: skip
    """The shipped config's scrape jobs named in ``targets`` (job -> addresses), with only
    their targets and interval substituted."""
    jobs = [job for job in config["scrape_configs"] if job["job_name"] in targets]
    assert {job["job_name"] for job in jobs} == set(targets), config["scrape_configs"]
    for job in jobs:
        (static,) = job["static_configs"]
        static["targets"] = targets[job["job_name"]]
        job["scrape_interval"] = interval
    return jobs


def central_prometheus(tmp: Path, alertmanagers: Sequence[str],
                       evaluation_interval: str = "5s",
                       extra_rules: Sequence[Path] = ()) -> Server:  # fmt: skip
    """A Prometheus that receives remote write and evaluates the shipped rules, unchanged
    (and ``extra_rules``), every ``evaluation_interval``, sending alerts to every member of
    ``alertmanagers`` (an HA pair gets each alert from each ruler). It scrapes what the
    meta-monitoring rules read of the central tier, as the shipped prometheus-ec2.yml's
    `prometheus` and `alertmanager` jobs do: itself and ``alertmanagers``."""
    (tmp / "central").mkdir(parents=True)
    port = free_port()
    members = [am.removeprefix("http://") for am in alertmanagers]
    shipped = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config: dict[str, Any] = {
        "global": {"evaluation_interval": evaluation_interval},
        "rule_files": [str(p) for p in [*sorted(RULES.glob("*.yml")), *extra_rules]],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": members}]}]},
        "scrape_configs": _meta_jobs(shipped, {"prometheus": [f"127.0.0.1:{port}"],
                                               "alertmanager": members}, evaluation_interval),
    }  # fmt: skip
    assert shipped["alerting"]["alertmanagers"][0]["static_configs"]
    (tmp / "central" / "prometheus.yml").write_text(json.dumps(config))
    return Server(tmp / "central", "central", [
        prometheus_binary(), f"--config.file={tmp / 'central' / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'central' / 'data'}", "--web.enable-remote-write-receiver",
        "--enable-feature=native-histograms",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ], port, "/-/ready")  # fmt: skip


def victoria_metrics(tmp: Path, scrape_interval: str = "5s",
                     extra: Sequence[str] = (),
                     scrape: dict[str, list[str]] | None = None) -> Server:  # fmt: skip
    """Single-node VictoriaMetrics as deploy/kubernetes/fleet.yaml runs it (the documented
    flags, docs/deploy/fleet.md): the agent pair's ``replica`` dropped
    (deploy/victoriametrics/relabel.yml) and one sample kept per series and
    ``scrape_interval`` (15 s shipped), the last 5 s (an agent's batch) hidden from queries
    instead of the default 30 s. ``extra``: more flags (a benchmark's scrape config, its
    fleet-size limits). ``scrape``: the central tier's own series scraped with the shipped
    deploy/victoriametrics/scrape.yml, only its targets (job -> addresses; itself added)
    and interval substituted."""
    from tests.support import tier  # it starts servers with this module's Server

    port = free_port()
    config = None
    if scrape is not None:
        shipped = yaml.safe_load(VM_SCRAPE.read_text())
        targets = {**scrape, "victoria-metrics": [f"127.0.0.1:{port}"]}
        shipped["scrape_configs"] = _meta_jobs(shipped, targets, scrape_interval)
        (tmp / "vm").mkdir(parents=True, exist_ok=True)
        config = tmp / "vm" / "scrape.yml"
        config.write_text(yaml.safe_dump(shipped))
    return tier.victoria_metrics(tmp, "vm", {"dedup.minScrapeInterval": scrape_interval},
                                 ["-loggerLevel=WARN", *extra], port=port,
                                 scrape_config=config)  # fmt: skip


def vmalert(tmp: Path, vm: str, notifiers: Sequence[str], evaluation_interval: str = "5s",
            extra: Sequence[str] = (), extra_rules: Sequence[Path] = (),
            port: int | None = None) -> Server:  # fmt: skip
    """vmalert as deploy/kubernetes/fleet.yaml runs it, evaluating the shipped MetricsQL
    rules (rules-victoriametrics/), unchanged, against VictoriaMetrics every
    ``evaluation_interval`` (15 s shipped): recorded series and alert state written back
    to it, state restored from it on a restart, a value looked up at most one evaluation
    back (-datasource.queryStep, 5m by default, kept a dead node's series readable for
    minutes). ``extra``: more flags (a fleet-size remote-write queue); ``extra_rules``:
    more rule files; ``port``: where it listens (a scraper named first), else a free
    port."""
    from tests.support import tier

    clock = {"evaluationInterval": evaluation_interval,
             "datasource.queryStep": evaluation_interval}
    more = [f"-rule={p}" for p in extra_rules]
    return tier.vmalert(tmp, "vmalert", vm, notifiers, clock,
                        extra=["-loggerLevel=WARN", *more, *extra], port=port)  # fmt: skip


def alertmanager_config(receiver: str, wait: str | None = None,
                        keys: Sequence[str] = ("group_wait",)) -> dict[str, Any]:
    """The shipped Alertmanager configuration with every receiver's webhook pointed at
    ``receiver``/<receiver name>; with ``wait``, each of ``keys`` (group_wait,
    group_interval) set to it on every route that has it (the test's clock)."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())

    def shorten(route: dict[str, Any]) -> None:
        for key in keys:
            if key in route:
                route[key] = wait
        for child in route.get("routes", []):
            shorten(child)

    if wait is not None:
        shorten(config["route"])
    for rec in config["receivers"]:
        for hook in rec.get("webhook_configs", []):
            hook["url"] = f"{receiver}/{rec['name']}"
    return config


def alertmanager(tmp: Path, name: str, receiver: str, peers: Sequence[str] = (),
                 gossip_port: int | None = None, wait: str | None = None) -> Server:  # fmt: skip
    """Alertmanager with the shipped configuration, only every receiver's webhook
    pointed at ``receiver``/<receiver name>; a cluster member gossiping on
    ``gossip_port`` with ``peers`` (host:port) where given, else alone. ``wait``:
    every group_wait and group_interval set to it (the routing tests' clock), else as
    shipped."""
    binary = require_tool("prometheus-alertmanager", "prometheus-alertmanager", REQUIRED_BY)
    (tmp / name).mkdir(parents=True)
    (tmp / name / "alertmanager.yml").write_text(
        yaml.safe_dump(alertmanager_config(receiver, wait, ("group_wait", "group_interval"))))
    port = free_port()
    cluster = ([f"--cluster.listen-address=127.0.0.1:{gossip_port}",
                *[f"--cluster.peer={p}" for p in peers], "--cluster.settle-timeout=5s"]
               if gossip_port is not None else ["--cluster.listen-address="])  # fmt: skip
    return Server(tmp / name, name, [
        binary, f"--config.file={tmp / name / 'alertmanager.yml'}",
        f"--storage.path={tmp / name / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", *cluster, "--log.level=warn",
    ], port, "/-/ready")  # fmt: skip


class Webhook:
    """An HTTP server on a free port that keeps every JSON body POSTed to it with its path
    (Alertmanager's webhook notifications; vmalert's alert posts) and answers 200, or the
    status of the first prefix of ``statuses`` the path starts with (a broken receiver, a
    store refusing remote write: then the body is kept as bytes)."""

    def __init__(self, statuses: dict[str, int] | None = None) -> None:
        answers = dict(statuses or {})
        self.received: list[tuple[str, Any]] = []
        lock = threading.Lock()
        received = self.received
        self.arrived: list[float] = []  # time.monotonic() of each, in order
        arrived = self.arrived

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = next((code for prefix, code in answers.items()
                               if self.path.startswith(prefix)), 200)  # fmt: skip
                with lock:
                    received.append((self.path, json.loads(body or b"null")
                                     if status == 200 else body))  # fmt: skip
                    arrived.append(time.monotonic())
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def notifications(self) -> list[tuple[str, dict[str, Any]]]:
        """Alertmanager notifications so far: (receiver path, payload)."""
        return [(p, b) for p, b in list(self.received) if isinstance(b, dict) and "groupKey" in b]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
