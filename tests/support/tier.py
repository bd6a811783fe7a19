"""The shipped fleet tier (deploy/kubernetes/fleet.yaml) as the tests run it: its objects,
and VictoriaMetrics, vmalert and Alertmanager started as real processes with the
arguments of its containers, substituting only URLs, paths and, where a test says so, the
clock (tests/deploy/test_fleet_tier.py, tests/e2e/test_ha.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.scaleout import REQUIRED_BY, Server
from tests.support.tools import require_tool

FLEET = REPO / "deploy" / "kubernetes" / "fleet.yaml"


def fleet_objects() -> list[dict[str, Any]]:
    """Every object of fleet.yaml, in file order."""
    return [d for d in yaml.safe_load_all(FLEET.read_text()) if d]


def _named(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in fleet_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def workload(name: str) -> dict[str, Any]:
    """The StatefulSet or Deployment called ``name``."""
    (obj,) = [o for o in fleet_objects() if o["kind"] in ("StatefulSet", "Deployment")
              and o["metadata"]["name"] == name]  # fmt: skip
    return obj


def container_args(name: str) -> list[str]:
    """The arguments of the one container of workload ``name``."""
    (container,) = workload(name)["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def files_of(kind: str, name: str) -> dict[str, str]:
    """File name -> text that the ConfigMap (``data``) or Secret (``stringData``) holds."""
    obj = _named(kind, name)
    data: dict[str, str] = obj["data"] if kind == "ConfigMap" else obj["stringData"]
    return data


def flag_values(argv: Sequence[str]) -> dict[str, list[str]]:
    """Flag name (without dashes) -> its values, in order."""
    out: dict[str, list[str]] = {}
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        out.setdefault(name, []).append(value)
    return out


def substitute(argv: Sequence[str], values: Mapping[str, str | Sequence[str]],
               drop: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """``argv`` with each named flag's value replaced (a flag given several times, such as
    one -notifier.url per Alertmanager, takes a list: its values replace them all, where
    the first stood) and the flags of ``drop`` left out. Every flag named must be there: a
    test substitutes only what the manifest has."""
    have = flag_values(argv)
    missing = [f for f in [*values, *drop] if f not in have]
    assert not missing, f"not in the manifest's arguments: {missing}"
    out = []
    done: set[str] = set()
    for arg in argv:
        dashes = "--" if arg.startswith("--") else "-"
        name = arg[len(dashes):].partition("=")[0]
        if name in drop or name in done:
            continue
        if name in values:
            new = values[name]
            out += [f"{dashes}{name}={v}" for v in ([new] if isinstance(new, str) else new)]
            done.add(name)
        else:
            out.append(arg)
    return out


def _write(directory: Path, files: Mapping[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def victoria_metrics(tmp: Path, name: str = "victoria-metrics",
                     clock: Mapping[str, str] | None = None,
                     extra: Sequence[str] = (), port: int | None = None,
                     scrape_config: Path | None = None) -> Server:  # fmt: skip
    """VictoriaMetrics with fleet.yaml's arguments: its data directory, listen address,
    relabel file (the ConfigMap's) and scrape file substituted, and the flags of ``clock``
    (the test's scrape interval, say); ``extra``: flags added after them (a later one
    wins); ``port``: where it listens, else a free port. ``scrape_config``: what it
    scrapes; by default nothing (the ConfigMap's scrape.yml names the tier's pods by their
    Kubernetes DNS names, which resolve nowhere here)."""
    binary = require_tool("victoria-metrics", "victoria-metrics", REQUIRED_BY)
    config = _write(tmp / name / "config", files_of("ConfigMap", "victoria-metrics"))
    if scrape_config is None:
        scrape_config = config / "scrape-nothing.yml"
        scrape_config.write_text("scrape_configs: []\n")
    port = port or free_port()
    argv = substitute(container_args("victoria-metrics"), {
        "storageDataPath": str(tmp / name / "data"), "httpListenAddr": f"127.0.0.1:{port}",
        "relabelConfig": str(config / "relabel.yml"),
        "promscrape.config": str(scrape_config), **(clock or {})})  # fmt: skip
    return Server(tmp / name, name, [binary, *argv, *extra], port, "/health")


def vmalert(tmp: Path, name: str, store: str, notifiers: Sequence[str],
            clock: Mapping[str, str] | None = None, drop: Sequence[str] = (),
            extra: Sequence[str] = (), port: int | None = None) -> Server:  # fmt: skip
    """vmalert with fleet.yaml's arguments: the rules of its ConfigMap from a directory, the
    store's and Alertmanagers' URLs, its listen address substituted, and the flags of
    ``clock``; ``drop``: flags left out (a counter-case); ``extra``: flags added;
    ``port``: where it listens (a scraper named first), else a free port."""
    binary = require_tool("vmalert", "victoria-metrics", REQUIRED_BY)
    rules = _write(tmp / name / "rules", files_of("ConfigMap", "vmalert"))
    port = port or free_port()
    argv = substitute(container_args("vmalert"), {
        "rule": f"{rules}/*.yml", "datasource.url": store, "remoteWrite.url": store,
        "remoteRead.url": store, "notifier.url": notifiers,
        "httpListenAddr": f"127.0.0.1:{port}", **(clock or {})}, drop)  # fmt: skip
    return Server(tmp / name, name, [binary, *argv, *extra], port, "/health")


def alertmanager(tmp: Path, name: str, config: Mapping[str, Any], gossip: Sequence[int],
                 member: int) -> Server:  # fmt: skip
    """Member ``member`` of the Alertmanager cluster with fleet.yaml's arguments: its
    configuration ``config`` (the Secret's, receivers substituted), storage, listen and
    gossip addresses, and the peers (every member's port of ``gossip``) substituted."""
    binary = require_tool("prometheus-alertmanager", "prometheus-alertmanager", REQUIRED_BY)
    (tmp / name).mkdir(parents=True, exist_ok=True)
    (tmp / name / "alertmanager.yml").write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    argv = substitute(container_args("alertmanager"), {
        "config.file": str(tmp / name / "alertmanager.yml"),
        "storage.path": str(tmp / name / "data"), "web.listen-address": f"127.0.0.1:{port}",
        "cluster.listen-address": f"127.0.0.1:{gossip[member]}",
        "cluster.advertise-address": f"127.0.0.1:{gossip[member]}",
        "cluster.peer": [f"127.0.0.1:{g}" for g in gossip]})  # fmt: skip
    return Server(tmp / name, name, [binary, *argv], port, "/-/ready")
