"""A training job's goodput for real: `stepscope diagnose --prometheus URL --job NAME
--since` against a real Prometheus holding 26 hours of the job's GPU-seconds counters.

The history is backfilled with `promtool tsdb create-blocks-from openmetrics` before
Prometheus starts, as each node's exporter would have served it (one sample a minute):
job llama on two nodes of cluster west and one of cluster east (the same host name as a
west node: three nodes), each counter growing at a constant rate, one node's exporter
restarted ten hours ago (its counters start again from zero), and another job, gpt, on a
third west node. The samples run on 30 minutes past now, so a window ending at any moment
of the test has samples on both sides of each end and `increase()` is exact: the printed
GPU-hours are known to the hundredth.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.app.cli import main
from tests.support import promtool
from tests.support.prometheus import Prometheus

STEP = 60
HOUR = 3600
GOODPUT = "stepscope_job_goodput_gpu_seconds_total"
BADPUT = "stepscope_job_badput_gpu_seconds_total"
# (cluster, host, job, badput_type or None for goodput) -> GPU-seconds per second
RATES = {
    ("west", "node-a", "llama", None): 6.0,
    ("west", "node-a", "llama", "data_loading_sync"): 1.0,
    ("west", "node-a", "llama", "exposed_communication"): 0.5,
    ("west", "node-a", "llama", "unproductive_checkpoint_save_time"): 0.5,
    ("west", "node-b", "llama", None): 5.0,
    ("west", "node-b", "llama", "data_loading_sync"): 2.0,
    ("west", "node-b", "llama", "exposed_communication"): 1.0,
    ("east", "node-a", "llama", None): 3.0,
    ("east", "node-a", "llama", "idle"): 1.0,
    ("west", "node-c", "gpt", None): 8.0,
}  # fmt: skip
RESTARTED = ("west", "node-b")  # its exporter restarted 10 h ago


def _history(path: Path, now: int) -> None:
    """26 h before ``now`` to 30 min after, as OpenMetrics (a family's samples together)."""
    start, end, restart = now - 26 * HOUR, now + 30 * 60, now - 10 * HOUR
    with path.open("w") as f:
        for family, cause_is_set in ((GOODPUT, False), (BADPUT, True)):
            f.write(f"# TYPE {family.removesuffix('_total')} counter\n")
            for (cluster, host, job, cause), rate in RATES.items():
                if (cause is not None) != cause_is_set:
                    continue
                labels = f'cluster="{cluster}",Hostname="{host}",training_job="{job}"'
                labels += f',badput_type="{cause}"' if cause else ""
                for t in range(start, end + 1, STEP):
                    since = restart if (cluster, host) == RESTARTED and t > restart else start
                    f.write(f"{family}{{{labels}}} {rate * (t - since)} {t}\n")
        f.write("# EOF\n")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("goodput")
    _history(tmp / "history.om", int(time.time()) // STEP * STEP)
    subprocess.run([promtool(), "tsdb", "create-blocks-from", "openmetrics",
                    str(tmp / "history.om"), str(tmp / "data")],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    (tmp / "no-rules").mkdir()
    server = Prometheus(tmp, [], tmp / "no-rules")
    try:
        yield server
    finally:
        server.stop()


def _table(out: str) -> list[list[str]]:
    lines = out.splitlines()
    return [line.split() for line in lines[3:lines.index("", 3)]]


def test_the_jobs_gpu_hours_over_the_last_day_per_cause_across_nodes_and_clusters(
    prom: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    # the default period, 24 h: 20 GPUs' worth held, 14 productive
    assert main(["diagnose", "--prometheus", prom.url, "--job", "llama"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert out.splitlines()[0] == (f"training job llama, last 24h via {prom.url}: 3 node(s) "
                                   "in clusters east (1), west (2)")  # fmt: skip
    assert _table(out) == [
        ["held", "480.00", "100.0%"], ["goodput", "336.00", "70.0%"],
        ["badput", "144.00", "30.0%"], ["data_loading_sync", "72.00", "15.0%"],
        ["exposed_communication", "36.00", "7.5%"], ["idle", "24.00", "5.0%"],
        ["unproductive_checkpoint_save_time", "12.00", "2.5%"]]  # fmt: skip
    assert out.rstrip().endswith("goodput ratio 70.0%")
    # the same with --since spelled out
    assert main(["diagnose", "--prometheus", prom.url, "--job", "llama", "--since", "1d"]) == 0
    assert _table(capsys.readouterr().out)[1] == ["goodput", "336.00", "70.0%"]


def test_a_shorter_period_as_json(prom: Prometheus, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--prometheus", prom.url, "--job", "llama", "--since", "1h30m",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    hours = report["gpu_hours"]
    assert (hours["held"], hours["goodput"], hours["badput"]) == (
        pytest.approx(30), pytest.approx(21), pytest.approx(9))
    assert report["goodput_ratio"] == pytest.approx(0.7)
    assert [(c["badput_type"], round(c["gpu_hours"], 6)) for c in report["badput"]] == [
        ("data_loading_sync", 4.5), ("exposed_communication", 2.25), ("idle", 1.5),
        ("unproductive_checkpoint_save_time", 0.75)]  # fmt: skip
    assert report["clusters"] == [{"cluster": "east", "nodes": 1},
                                  {"cluster": "west", "nodes": 2}]  # fmt: skip


def test_a_job_without_series_exits_2_naming_the_jobs_there_are(
    prom: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagnose", "--prometheus", prom.url, "--job", "lama"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("stepscope: error: no goodput or badput series for training job "
                          f"'lama' in the last 24h at {prom.url}; jobs with goodput there: "
                          "gpt, llama")  # fmt: skip
