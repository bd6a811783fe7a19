"""`stepscope diagnose` against a running exporter, the fleet analysis, `nccl-check`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepscope.app.cli import main
from stepscope.diagnose.cli import analyse_fleet, render_fleet
from tests.support import REPO

NCCL = REPO / "tests" / "fixtures" / "nccl"


def test_nccl_check_names_each_ranks_network_and_why_it_fell_back_to_sockets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["nccl-check", "--json", *map(str, sorted(NCCL.glob("*.log")))]) == 1
    rows = {(r["host"], r["rank"]): r for r in json.loads(capsys.readouterr().out)}
    efa0 = rows[("ip-10-0-1-11", 0)]
    assert (efa0["transport"], efa0["verdict"], efa0["provider"]) == ("efa", "ok", "efa")
    assert efa0["nranks"] == 4 and efa0["nnodes"] == 2 and efa0["plugin"] == "Libfabric"
    assert rows[("ip-10-0-1-11", 1)]["network"] == "AWS Libfabric"  # older plugin wording
    sock = rows[("ip-10-0-1-12", 2)]
    assert (sock["transport"], sock["verdict"]) == ("socket", "slow")
    assert "No plugin found" in sock["why"] and "No device found" in sock["why"]
    tcp = rows[("ip-10-0-1-12", 3)]
    assert (tcp["transport"], tcp["verdict"]) == ("libfabric", "slow")
    assert "'tcp' is not EFA" in tcp["why"] and "fi_getinfo" in tcp["why"]
    assert rows[("dgx-07", 0)]["transport"] == "ib"  # mpirun's [1,0]<stdout>: prefix
    single = rows[("dgx-07", 1)]
    assert (single["transport"], single["verdict"]) == ("socket", "ok")  # one node
    # a healthy EFA log alone exits 0; a log without NCCL lines cannot tell
    assert main(["nccl-check", str(NCCL / "efa-node-a.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("RANK") and "EFA through libfabric" in out
    assert main(["nccl-check", str(REPO / "README.md")]) == 2
    assert main(["nccl-check", str(NCCL / "missing.log")]) == 2


def _series(metric: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": metric, "value": [1.7e9, str(value)]}


def test_fleet_view_names_the_slow_rank_its_cause_the_waiting_ranks_and_the_rest() -> None:
    # what the recording rules record: each rank's busy time per step and straggler score,
    # its phases, each node's least active GPU over its peers' median, thermal shares
    def labels(r: int, host: str) -> dict[str, str]:
        return {"cluster": "c", "training_job": "j", "rank": str(r), "Hostname": host,
                "gpu": "0"}

    def rank(r: int, host: str, **phases: float) -> list[dict[str, Any]]:
        return [_series({**labels(r, host), "phase": name}, v) for name, v in phases.items()]

    def verdict(r: int, host: str, kind: str, **extra: str) -> dict[str, Any]:
        return _series({**labels(r, host), **extra, "kind": kind}, 1)

    gpus = [_series({"cluster": "c", "Hostname": f"node-{h}", "gpu": str(g)}, 1)
            for h in "abcd" for g in range(2)]
    busy = {0: ("node-a", 0.31), 1: ("node-b", 0.31), 2: ("node-c", 0.46), 3: ("node-x", 0.32)}
    median = 0.315
    phases = [*rank(0, "node-a", compute=0.30, comm=0.15, data_wait=0.01),
              *rank(1, "node-b", compute=0.30, comm=0.15, data_wait=0.01),
              *rank(2, "node-c", compute=0.45, comm=0.01, data_wait=0.01),
              *rank(3, "node-x", compute=0.31, comm=0.14, data_wait=0.01)]
    report = analyse_fleet({
        "gpus": gpus,
        "node_straggler": [
            _series({"cluster": "c", "Hostname": "node-d", "peer_group": "j"}, 0.45),
            _series({"cluster": "c", "Hostname": "node-a", "peer_group": "j"}, 1.0),
            _series({"cluster": "c", "Hostname": "node-b", "peer_group": "j"}, 0.61)],
        "thermal": [_series({"cluster": "c", "Hostname": "node-c", "gpu": "0"}, 0.8),
                    _series({"cluster": "c", "Hostname": "node-b", "gpu": "0"}, 0.1),
                    _series({"cluster": "c", "Hostname": "node-a", "gpu": "0"}, 0.0)],
        "busy": [_series(labels(r, h), v) for r, (h, v) in busy.items()],
        "score": [_series(labels(r, h), v / median) for r, (h, v) in busy.items()],
        "phase_per_step": phases,
        "verdicts": [verdict(0, "node-a", "communication"),
                     verdict(1, "node-b", "waiting_on_peer"),
                     verdict(2, "node-c", "compute"),
                     verdict(3, "node-x", "input_cpu"),
                     _series({"cluster": "c", "Hostname": "node-e", "gpu": "3",
                              "kind": "gpu_fault"}, 1)],
        "modifiers": [_series({"cluster": "c", "training_job": "j", "rank": "2",
                               "Hostname": "node-c", "modifier": "thermal_throttle"}, 1),
                      _series({"cluster": "c", "training_job": "j", "rank": "0",
                               "Hostname": "node-a", "modifier": "tcp_suspected"}, 1),
                      _series({"cluster": "c", "Hostname": "node-e", "gpu": "3",
                               "modifier": "xid_critical"}, 1)],
        "gpu_down": [_series({"cluster": "c", "Hostname": "node-f", "gpu": "1"}, 0)],
        "zones": [_series({"training_job": "j"}, 2), _series({"training_job": "k"}, 1)],
    })  # fmt: skip
    found = {(f["kind"], f.get("Hostname"), f.get("gpu"), f.get("rank"), f.get("job"))
             for f in report["findings"]}  # fmt: skip
    # judged by the alerts' thresholds (fleet_rules.FLEET): node straggler under 0.6 of the
    # median node, throttled above 10% (node-b's 10% is not), score above 1.06
    assert found == {
        ("straggler", "node-d", None, None, "j"),
        ("thermal_throttle", "node-c", "0", None, None),
        ("slow_rank", "node-c", "0", "2", "j"),
        ("input_cpu", "node-x", "0", "3", "j"),  # the verdict of a rank not waiting
        ("gpu_fault", "node-e", "3", None, None),
        ("gpu_down", "node-f", "1", None, None),
        ("cross_az", None, None, None, "j"),
    }  # ranks 0 and 1 wait for rank 2: not findings of their own, nor is rank 0's tcp
    assert (report["gpus"], report["nodes"]) == (8, 4)
    (job,) = report["jobs"]
    (slow,) = job["slow_ranks"]
    assert slow["cause"] == "compute+thermal_throttle" and "temperature" in slow["advice"]
    assert slow["ratio"] == pytest.approx(0.46 / 0.315)  # the recorded score
    assert "vs the job's median 0.315 s: 1.46x (threshold 1.06x)" in slow["detail"]
    assert (job["waiting_ranks"], job["waiting_nodes"]) == (2, 2)
    report["status"] = "bottleneck"
    text = render_fleet(report, "http://prom")
    assert "SLOW: rank 2 on node-c (gpu 0)" in text
    assert "likely cause, node-c's own verdict: compute+thermal_throttle" in text
    assert "2 other rank(s) on 2 other node(s) wait for it" in text
    # at the thresholds exactly, nothing: the alerts compare with > and <
    assert analyse_fleet({
        "gpus": gpus,
        "node_straggler": [_series({"cluster": "c", "Hostname": "node-d"}, 0.6)],
        "thermal": [_series({"cluster": "c", "Hostname": "node-c", "gpu": "0"}, 0.1)],
        "busy": [_series(labels(0, "node-a"), 0.3), _series(labels(1, "node-b"), 0.318)],
        "score": [_series(labels(0, "node-a"), 1.0), _series(labels(1, "node-b"), 1.06)],
        "fail_slow": [_series(labels(0, "node-a"), 1.0), _series(labels(1, "node-b"), 1.06)],
        "over_past": [_series(labels(0, "node-a"), 1.0), _series(labels(1, "node-b"), 1.2)],
    })["findings"] == []  # fmt: skip


def test_fleet_view_judges_a_rank_against_its_group_or_its_own_past_as_the_alert_does() -> None:
    # a pipeline job: stage0 ranks busier by design (their own group's median: 1.0), rank 3
    # of stage1 10% over its group; rank 4 (stage2, alone) 9% over its own past while its
    # job's ranks did not change; rank 5 slowed 9% with its whole job (its score 1.0)
    def labels(r: int, group: str) -> dict[str, str]:
        return {"cluster": "c", "training_job": "pp", "rank": str(r), "Hostname": f"n{r}",
                "gpu": "0", "group": group}

    rows = [(0, "stage0", 0.65, 1.0, 1.0, 1.0), (1, "stage0", 0.65, 1.0, 1.0, 1.0),
            (2, "stage1", 0.5, 1.0, 1.0, 1.0), (3, "stage1", 0.55, 1.1, 1.0, 1.0),
            (4, "stage2", 0.545, 1.0, 1.09, 1.09), (5, "stage3", 0.5, 1.0, 1.0, 1.09)]
    report = analyse_fleet({
        "busy": [_series(labels(r, g), b) for r, g, b, *_ in rows],
        "score": [_series(labels(r, g), s) for r, g, _, s, _, _ in rows],
        "fail_slow": [_series(labels(r, g), f) for r, g, _, _, f, _ in rows],
        "over_past": [_series(labels(r, g), o) for r, g, *_, o in rows],
    })  # fmt: skip
    (job,) = report["jobs"]
    slow = {f["rank"]: f for f in job["slow_ranks"]}
    assert set(slow) == {"3", "4"}
    assert slow["3"]["compared_with"] == "group" and slow["3"]["ratio"] == pytest.approx(1.1)
    assert "vs group stage1's median 0.500 s: 1.10x (threshold 1.06x)" in slow["3"]["detail"]
    assert slow["4"]["compared_with"] == "past"
    assert "1.09x its own of before while its job's ranks did not slow as much: 1.09x" in \
        slow["4"]["detail"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--job", "llama"], "--job reads the goodput counters from Prometheus: add --prometheus URL"),
    (["--prometheus", ":9090", "--since", "24h"], "--since goes with --job NAME"),
    (["--prometheus", ":9090", "--job", " "], "--job: expected a training job's name, got ' '"),
    (["--prometheus", ":9090", "--job", "llama", "--since", "1 day"],
     "--since: expected a Prometheus duration such as 24h, 7d or 1h30m, got '1 day'"),
    (["--prometheus", "ftp://prom", "--job", "llama"], "--prometheus: expected http://"),
])  # fmt: skip
def test_a_jobs_goodput_flags_wrong_exit_2_in_one_line_naming_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagnose", *argv]) == 2  # checked before any request
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"stepscope: error: {message}"), err
