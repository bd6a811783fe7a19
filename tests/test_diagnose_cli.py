"""`stepscope diagnose` against a running exporter, the fleet analysis, `nccl-check`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, wait_for
from stepscope.cli import main
from stepscope.diagnose.cli import analyse_fleet

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


def _write_config(tmp_path: Path, scenario: dict[str, Any]) -> Path:
    (tmp_path / "scenario.yaml").write_text(json.dumps(scenario))
    cfg = tmp_path / "stepscope.yaml"
    cfg.write_text(
        f"interval: 0.2\nslow_interval: 1\nscenario: {tmp_path / 'scenario.yaml'}\n"
        "ingest: udp://127.0.0.1:0\ndiagnosis: {window: 2}\n"
    )
    return cfg


def test_diagnose_reads_the_local_exporter_and_exits_by_what_it_found(
    exporter_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write_config(
        tmp_path, {"gpus": 2, "timeline": [{"gpus": [1], "thermal": "sw"}]}
    )
    exp = exporter_factory(["--config", str(cfg)])

    def diagnosed() -> Any:
        _, _, body = exp.get("/api/v1/diagnosis")
        doc = json.loads(body)
        return doc if doc.get("window_seconds", 0) >= 1 else None

    doc = wait_for(diagnosed)
    assert doc["status"] == "bottleneck" and doc["thresholds"]["window"] == 2
    kinds = {v["subject"]["gpu"]: (v["kind"], v["modifiers"]) for v in doc["verdicts"]}
    assert kinds == {0: ("compute", []), 1: ("compute", ["thermal_throttle"])}
    assert main(["diagnose", "--exporter", exp.url]) == 1
    out = capsys.readouterr().out
    assert "compute+thermal_throttle" in out and "gpu 1: compute: Clocks lowered" in out
    assert main(["diagnose", "--exporter", exp.url, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "bottleneck"
    assert "stepscope_bottleneck{" in exp.metrics()
    exp.stop()
    assert main(["diagnose", "--exporter", exp.url, "--timeout", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_diagnose_exits_0_on_a_healthy_node(
    exporter_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = exporter_factory(["--config", str(_write_config(tmp_path, {"gpus": 2}))])
    wait_for(lambda: json.loads(exp.get("/api/v1/diagnosis")[2])["samples"] >= 3)
    assert main(["diagnose", "--exporter", exp.url]) == 0
    assert "healthy" in capsys.readouterr().out


def _series(metric: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": metric, "value": [1.7e9, str(value)]}


def test_fleet_view_names_the_straggler_the_hot_gpu_the_slow_rank_and_cross_az_jobs() -> None:
    sm = [_series({"Hostname": f"node-{h}", "gpu": str(g)}, 0.9) for h in "abc" for g in range(2)]
    sm.append(_series({"Hostname": "node-d", "gpu": "0"}, 0.4))
    report = analyse_fleet({
        "sm_active": sm,
        "thermal": [_series({"Hostname": "node-c", "gpu": "1"}, 8e8),
                    _series({"Hostname": "node-a", "gpu": "0"}, 0.0)],
        "compute_per_step": [_series({"job": "j", "rank": str(r), "Hostname": "x"}, 0.5)
                             for r in range(3)]
        + [_series({"job": "j", "rank": "3", "Hostname": "node-c"}, 0.8)],
        "verdicts": [_series({"kind": "input_cpu", "job": "j", "rank": "0"}, 1),
                     _series({"kind": "compute", "job": "j", "rank": "1"}, 1)],
        "modifiers": [_series({"modifier": "tcp_suspected", "job": "j", "rank": "2"}, 1)],
        "zones": [_series({"job": "j"}, 2), _series({"job": "k"}, 1)],
    })  # fmt: skip
    found = {(f["kind"], f.get("Hostname"), f.get("gpu"), f.get("rank"), f.get("job"))
             for f in report["findings"]}  # fmt: skip
    assert found == {
        ("straggler", "node-d", "0", None, None),
        ("thermal_throttle", "node-c", "1", None, None),
        ("slow_rank", "node-c", None, "3", "j"),
        ("input_cpu", None, None, "0", "j"),
        ("tcp_suspected", None, None, "2", "j"),
        ("cross_az", None, None, None, "j"),
    }
    assert analyse_fleet({"sm_active": sm[:6]})["findings"] == []
