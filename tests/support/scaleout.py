"""The scale-out path's real servers, each a process on a free loopback port with its data in
a tmp dir: Prometheus agents configured from the shipped deploy/prometheus/agent-ec2.yml,
a central Prometheus with the remote-write receiver and the shipped rules, VictoriaMetrics
with vmalert, Alertmanager with the shipped deploy/alertmanager/alertmanager.yml, and a
webhook receiver that records every notification (tests/e2e/test_scale_out.py)."""

from __future__ import annotations

import json
import subprocess
import threading
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
from tests.support.prometheus import CLUSTER, shortened_rules
from tests.support.tools import prometheus_binary, require_tool

AGENT_CONFIG = REPO / "deploy" / "prometheus" / "agent-ec2.yml"
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = REPO / "deploy" / "prometheus" / "rules"
# CI sets it; vmalert and victoria-metrics come in one Debian package
REQUIRED_BY = "STEPSCOPE_REQUIRE_PROMTOOL"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


class Server:
    """A server process: its URL, its log, stopped (then killed) by ``stop``."""

    def __init__(self, tmp: Path, name: str, argv: Sequence[str], port: int,
                 ready_path: str) -> None:  # fmt: skip
        tmp.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp / f"{name}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=tmp)  # fmt: skip
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


def shipped_remote_write() -> dict[str, Any]:
    """The shipped agent's remote_write entry: its keep list and queue settings."""
    (remote,) = yaml.safe_load(AGENT_CONFIG.read_text())["remote_write"]
    assert isinstance(remote, dict)
    return remote


def prometheus_agent(tmp: Path, name: str, targets: list[str], write_urls: list[str]) -> Server:
    """Prometheus 2.42 in agent mode scraping ``targets`` every second (the cluster a
    target label, as shipped) and remote-writing to each URL with the shipped
    write_relabel_configs and queue settings, batches sent after 1 s instead of 5 s."""
    shipped = shipped_remote_write()
    queue = {**shipped["queue_config"], "batch_send_deadline": "1s"}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{
            "job_name": "stepscope", "honor_labels": False,
            "static_configs": [{"targets": targets, "labels": {"cluster": CLUSTER}}],
        }],
        "remote_write": [{"url": url, "queue_config": queue,
                          "write_relabel_configs": shipped["write_relabel_configs"]}
                         for url in write_urls],
    }  # fmt: skip
    (tmp / name).mkdir(parents=True)
    (tmp / name / "agent.yml").write_text(json.dumps(config))
    port = free_port()
    return Server(tmp / name, name, [
        prometheus_binary(), "--enable-feature=agent",
        f"--config.file={tmp / name / 'agent.yml'}", f"--storage.agent.path={tmp / name / 'wal'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ], port, "/-/ready")  # fmt: skip


def central_prometheus(tmp: Path, alertmanager: str | None) -> Server:
    """A Prometheus that scrapes nothing, receives remote write and evaluates the shipped
    rules (every ``for:`` 5 s) every second, sending alerts to ``alertmanager``."""
    (tmp / "central").mkdir(parents=True)
    rules = shortened_rules(tmp / "central" / "rules", RULES)
    config: dict[str, Any] = {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [alertmanager.removeprefix("http://")]}]}]}
    (tmp / "central" / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    return Server(tmp / "central", "central", [
        prometheus_binary(), f"--config.file={tmp / 'central' / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'central' / 'data'}", "--web.enable-remote-write-receiver",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ], port, "/-/ready")  # fmt: skip


def victoria_metrics(tmp: Path) -> Server:
    """Single-node VictoriaMetrics; a sample is queryable at once (its default
    -search.latencyOffset hides the last 30 s from queries)."""
    binary = require_tool("victoria-metrics", "victoria-metrics", REQUIRED_BY)
    port = free_port()
    return Server(tmp / "vm", "victoria-metrics", [
        binary, f"-storageDataPath={tmp / 'vm' / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
        "-search.latencyOffset=0s", "-retentionPeriod=1d", "-loggerLevel=WARN",
    ], port, "/health")  # fmt: skip


def vmalert(tmp: Path, vm: str, notifier: str) -> Server:
    """vmalert evaluating the shipped rules (every ``for:`` 5 s) every second against
    VictoriaMetrics, writing recorded series back to it."""
    binary = require_tool("vmalert", "victoria-metrics", REQUIRED_BY)
    (tmp / "vmalert").mkdir(parents=True)
    rules = shortened_rules(tmp / "vmalert" / "rules", RULES)
    port = free_port()
    return Server(tmp / "vmalert", "vmalert", [
        binary, *[f"-rule={p}" for p in rules], f"-datasource.url={vm}",
        f"-remoteWrite.url={vm}", "-remoteWrite.flushInterval=500ms", f"-notifier.url={notifier}",
        "-evaluationInterval=1s", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN",
    ], port, "/health")  # fmt: skip


def alertmanager(tmp: Path, receiver: str, wait: str = "5s") -> Server:
    """Alertmanager with the shipped configuration, every receiver's webhook pointed at
    ``receiver`` and group_wait / group_interval set to ``wait`` (nothing else changes:
    routes, grouping and inhibition are as shipped)."""
    binary = require_tool("prometheus-alertmanager", "prometheus-alertmanager", REQUIRED_BY)
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())

    def shorten(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = wait
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    for rec in config["receivers"]:
        for hook in rec.get("webhook_configs", []):
            hook["url"] = f"{receiver}/{rec['name']}"
    (tmp / "alertmanager").mkdir(parents=True)
    (tmp / "alertmanager" / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    return Server(tmp / "alertmanager", "alertmanager", [
        binary, f"--config.file={tmp / 'alertmanager' / 'alertmanager.yml'}",
        f"--storage.path={tmp / 'alertmanager' / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # one instance: no gossip port
        "--log.level=warn",
    ], port, "/-/ready")  # fmt: skip


class Webhook:
    """An HTTP server on a free port that keeps every JSON body POSTed to it with its path
    (Alertmanager's webhook notifications; vmalert's alert posts)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append((self.path, json.loads(body or b"null")))
                self.send_response(200)
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
