"""A real Prometheus server the test starts, and its binary."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support import wait_for
from tests.support.exporter import terminate
from tests.support.ports import free_port
from tests.support.tools import prometheus_binary

# The cluster label the test Prometheus stamps on every target (external label).
CLUSTER = "e2e"



class Prometheus:
    """A prometheus server process on a free loopback port, TSDB in a tmp dir.

    ``flags``: more command-line flags (``--enable-feature=native-histograms``);
    ``**job``: more settings of the scrape job."""

    host_label = "Hostname"

    def __init__(
        self, tmp: Path, targets: list[str], rules_dir: Path, flags: Sequence[str] = (),
        **job: Any,
    ) -> None:
        rules = shortened_rules(tmp / "rules", rules_dir)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "900ms"},
            "rule_files": [str(p) for p in rules],
            "scrape_configs": [{
                "job_name": "stepscope",
                # as shipped: the scrape's labels win; the cluster is a target label
                "honor_labels": False,
                "static_configs": [{"targets": targets, "labels": {"cluster": CLUSTER}}],
                **job,
            }],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}",
             "--log.level=warn", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.ready(), timeout=30, interval=0.2)

    def ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited: see prometheus.log"
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()


def panel_queries(dashboards_dir: Path, variables: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, query) of every panel query of the dashboards in the
    folder, with ``$__rate_interval`` and ``$__range`` at 1m and the template variables
    filled as Grafana would (``variables``: name -> value, without the ``$``)."""
    fill = {"__rate_interval": "1m", "__range": "1m", **variables}
    out = []
    for path in sorted(dashboards_dir.glob("*.json")):
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for name in sorted(fill, key=len, reverse=True):
                    expr = expr.replace(f"${name}", fill[name])
                assert "$" not in expr, expr
                out.append((dash["uid"], panel["title"], expr))
    return out


def shortened_rules(dest: Path, rules_dir: Path) -> list[Path]:
    """The shipped rule files with every `for:` set to 5 s; nothing else changes."""
    dest.mkdir()
    out = []
    for path in sorted(rules_dir.glob("*.yml")):
        text, n = re.subn(r"(?m)^(\s+)for: \S+$", r"\1for: 5s", path.read_text())
        assert n or "alert:" not in text
        (dest / path.name).write_text(text)
        out.append(dest / path.name)
    return out
