"""The fleet tier's HA, with the real binaries run as deploy/kubernetes/fleet.yaml runs them.

VictoriaMetrics 1.79, an HA pair of vmalert evaluating the shipped MetricsQL rules
(rules-victoriametrics/, the vmalert ConfigMap's copy) with their state written to and
read back from the store, and a two-member Alertmanager cluster with the shipped
configuration; both vmalerts notify both members. Each process gets its container's
arguments from fleet.yaml with only URLs, paths and the clock substituted: the store
deduplicates at 1 s and the rulers evaluate every 1 s (15 s shipped: the agents' scrape
interval), and Alertmanager's group_wait is 1 s (30 s shipped, which would make the test
a minute longer; group_interval and everything else as shipped).

The exporters' series are written straight into the store (its import API, once a
second, the label sets an exporter serves): what is under test is the tier, not the
scrape. VictoriaMetrics makes a new series searchable about 10 s after it arrives
(measured: 9.9 s for a series written once a second); the writer asks it to flush after
each write (/internal/force_flush), so the test waits seconds instead.

- node-1's GPU 1 is down from the start: StepscopeGpuDown (`for: 15s`) goes pending on
  both rulers. Once its ALERTS_FOR_STATE is in the store both are restarted, one as
  shipped and one without -remoteRead.url (the counter-case): the first keeps the
  pending alert's activeAt and fires 15 s after it, the second starts its `for:` over.
- node-2 reports a row-remap failure (no `for:`): paged at once, by one member. That
  member is killed (SIGKILL) once its notification log reached the other; node-3 then
  reports one too and the survivor pages it. Each group reaches the webhook once.

Wall time: about 27 s on 2 cores: the 15 s `for:`, and Alertmanager's 15 s peer timeout,
after which the second member checks the first's notification log before it would send
(it also holds a new group that long while its dead peer is only suspected, up to ~24 s
after the kill with two members: seen when node-1 fired sooner).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from tests.support.ports import free_port
from tests.support.scaleout import Server, Webhook, alertmanager_config, get_json
from tests.support.tier import alertmanager, victoria_metrics, vmalert

pytestmark = pytest.mark.timeout(120)

CLUSTER = "prod-ha"
CLOCK = {"evaluationInterval": "1s", "datasource.queryStep": "1s"}
GPU = 'cluster="{c}",Hostname="{h}",gpu="{g}",UUID="GPU-{h}-{g}",pci_bus_id="00000000:{g}8:00.0",'\
      'modelName="NVIDIA H100 80GB HBM3",instance="{h}:9400",job="stepscope"'  # fmt: skip


def gpu_labels(host: str, gpu: int) -> str:
    return "{" + GPU.format(c=CLUSTER, h=host, g=gpu) + "}"


class StoreWriter:
    """Writes ``lines`` (exposition lines without timestamps) into VictoriaMetrics once a
    second, then flushes it, until stopped."""

    def __init__(self, url: str, lines: list[str]) -> None:
        self.url = url
        self.lines = lines
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                body = "\n".join(self.lines).encode() + b"\n"
            try:
                request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus",
                                                 data=body, method="POST")
                urllib.request.urlopen(request, timeout=5).close()
                urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=5).close()
            except OSError:
                pass  # the store stopping at the end
            self.stop.wait(1)


@dataclass
class Tier:
    tmp: Path
    vm: Server
    writer: StoreWriter
    webhook: Webhook
    members: list[Server]
    rulers: dict[str, Server]
    notifiers: list[str]
    servers: list[Server] = field(default_factory=list)
    # set by _kill_the_first_pager: the member that paged node-2 and was killed
    killed: threading.Event = field(default_factory=threading.Event)
    sender: int = -1


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    tmp = tmp_path_factory.mktemp("ha")
    servers: list[Server] = []
    webhook = Webhook()
    writer = None
    try:
        vm = victoria_metrics(tmp, clock={"dedup.minScrapeInterval": "1s"})
        servers.append(vm)
        writer = StoreWriter(vm.url, [
            f"stepscope_gpu_up{gpu_labels('node-1', 0)} 1",
            f"stepscope_gpu_up{gpu_labels('node-1', 1)} 0",
            f"DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu_labels('node-2', 0)} 1",
        ])
        config = alertmanager_config(webhook.url, wait="1s")
        gossip = [free_port(), free_port()]
        members = [alertmanager(tmp, f"am-{i}", config, gossip, i) for i in (0, 1)]
        servers += members
        notifiers = [m.url for m in members]
        rulers = {r: vmalert(tmp, f"vmalert-{r}", vm.url, notifiers, CLOCK) for r in "ab"}
        servers += rulers.values()
        ha = Tier(tmp, vm, writer, webhook, members, rulers, notifiers, servers)
        # on its own thread, so the member's death runs beside the rulers' restart
        threading.Thread(target=_kill_the_first_pager, args=(ha,), daemon=True).start()
        yield ha
    finally:
        if writer is not None:
            writer.stop.set()
            writer.thread.join(timeout=5)
        for server in reversed(servers):
            server.stop()
        webhook.stop()


def gpu_down(ruler: Server) -> dict[str, Any] | None:
    """node-1's StepscopeGpuDown as the ruler holds it (state, activeAt), or None."""
    for alert in get_json(f"{ruler.url}/api/v1/alerts")["data"]["alerts"] or []:
        if alert["name"] == "StepscopeGpuDown" and alert["labels"].get("Hostname") == "node-1":
            assert isinstance(alert, dict)
            return alert
    return None


def unix(stamp: str) -> float:
    """vmalert's activeAt (RFC 3339 with nanoseconds) as Unix seconds."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{frac or 0}")


def _query(store: Server, expr: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr})
    result: list[dict[str, Any]] = get_json(f"{store.url}/api/v1/query?{query}")["data"]["result"]
    return result


def test_a_restarted_vmalert_keeps_a_pending_alerts_for_timer(tier: Tier) -> None:
    """Restarted with -remoteRead.url, vmalert reads ALERTS_FOR_STATE back: node-1's GPU
    down keeps the activeAt it had before and fires `for:` after it; restarted without,
    the same alert starts its `for:` over from the restart."""
    before = {r: wait_for(lambda r=r: gpu_down(tier.rulers[r]), timeout=30, interval=0.2)
              for r in "ab"}  # type: ignore[misc]
    assert [b["state"] for b in before.values()] == ["pending", "pending"], before
    # the pair went pending up to one evaluation apart; the store holds either's activeAt,
    # in whole seconds
    earliest = min(unix(b["activeAt"]) for b in before.values()) // 1
    latest = max(unix(b["activeAt"]) for b in before.values())
    wait_for(lambda: _query(tier.vm, 'ALERTS_FOR_STATE{alertname="StepscopeGpuDown"}'),
             timeout=20, interval=0.2)  # fmt: skip
    for ruler in tier.rulers.values():
        ruler.stop()
    restarted = time.time()
    tier.rulers["a"] = vmalert(tier.tmp, "vmalert-a", tier.vm.url, tier.notifiers, CLOCK)
    tier.rulers["b"] = vmalert(tier.tmp, "vmalert-b", tier.vm.url, tier.notifiers, CLOCK,
                               drop=("remoteRead.url",))  # fmt: skip
    tier.servers += tier.rulers.values()
    assert latest < restarted - 2, "restarted while the alert was new: nothing to tell apart"

    kept = wait_for(lambda: gpu_down(tier.rulers["a"]), timeout=10, interval=0.2)
    lost = wait_for(lambda: gpu_down(tier.rulers["b"]), timeout=10, interval=0.2)
    assert earliest <= unix(kept["activeAt"]) <= latest, (kept, before)
    assert unix(lost["activeAt"]) > restarted - 1, (lost, restarted)

    fired = wait_for(lambda: (a := gpu_down(tier.rulers["a"])) and a["state"] == "firing" and a,
                     timeout=30, interval=0.2)  # fmt: skip
    assert earliest <= unix(fired["activeAt"]) <= latest, (fired, before)


def _groups(webhook: Webhook) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for _, body in webhook.notifications():
        if body["receiver"] != "heartbeat":  # StepscopeWatchdog: every minute, by design
            groups.setdefault(body["groupLabels"].get("Hostname", ""), []).append(body)
    return groups


def _member(tier: Tier, body: dict[str, Any]) -> int:
    """Which member sent a notification: its externalURL names its listen port."""
    (index,) = [i for i, m in enumerate(tier.members)
                if body["externalURL"].endswith(":" + m.url.rsplit(":", 1)[1])]  # fmt: skip
    return index


def _sample(server: Server, series: str) -> float:
    """The value of one series (name and labels as exposed) on a server's /metrics."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kill_the_first_pager(tier: Tier) -> None:
    """Kill (SIGKILL) the member that paged node-2, once the other holds its notification
    log; then node-3 reports a row-remap failure too."""
    first = wait_for(lambda: _groups(tier.webhook).get("node-2"), timeout=40, interval=0.2)
    tier.sender = _member(tier, first[0])
    survivor = tier.members[1 - tier.sender]
    # an "update" is a notification log entry (no silences here); killed before it
    # arrives, the survivor sends node-2's page again after its peer timeout
    # (Alertmanager delivers at least once: seen when this waited for any message)
    wait_for(lambda: _sample(survivor, 'alertmanager_cluster_messages_received_total'
                                       '{msg_type="update"}'), timeout=10, interval=0.1)
    tier.members[tier.sender].proc.kill()
    tier.members[tier.sender].proc.wait()
    tier.writer.add(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu_labels('node-3', 0)} 1")
    tier.killed.set()


def test_one_alertmanager_killed_notifications_continue_each_group_once(tier: Tier) -> None:
    """Both rulers send every alert to both members. node-2's page came from one member,
    killed once the other held its notification log; node-3's page then comes from the
    survivor, and so does node-1's GPU down. Each group reaches the webhook exactly once,
    including after the survivor's own peer timeout for node-2's group (it was the second
    member then: it waits 15 s, finds the first's entry, and sends nothing)."""
    assert tier.killed.wait(timeout=60), "node-2 was never paged"
    survivor = tier.members[1 - tier.sender]
    third = wait_for(lambda: _groups(tier.webhook).get("node-3"), timeout=40, interval=0.2)
    assert _member(tier, third[0]) == 1 - tier.sender
    wait_for(lambda: _groups(tier.webhook).get("node-1"), timeout=40, interval=0.2)
    # the survivor looked in its notification log for each of the three groups
    wait_for(lambda: survivor.metric("alertmanager_nflog_queries_total") >= 3,
             timeout=30, interval=0.2)  # fmt: skip
    groups = _groups(tier.webhook)
    assert {h: len(b) for h, b in groups.items()} == {"node-1": 1, "node-2": 1, "node-3": 1}
    for host, (body,) in groups.items():
        assert body["receiver"] == "oncall-pager", (host, body["receiver"])
        assert [a["status"] for a in body["alerts"]] == ["firing"], body
        if host != "node-2":
            assert _member(tier, body) == 1 - tier.sender, host
