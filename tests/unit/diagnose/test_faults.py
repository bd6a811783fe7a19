"""Hardware health outranks performance: the `faults` scenario through the real sampler.

Every faulted GPU reads `gpu_fault` naming its fault; a critical XID is held beyond the
window until the GPU is seen reset, or for `fault_hold`; a GPU that is down shows no
reading anywhere (JSON, page, CLI). Time is the fake clock of test_diagnose_rules.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from stepscope.core.snapshot import Published
from stepscope.diagnose.api import diagnosis_document
from stepscope.diagnose.cli import render_local
from stepscope.diagnose.faults import CRITICAL_XIDS
from stepscope.diagnose.model import Diagnosis
from stepscope.diagnose.page import render_status_page
from stepscope.gpu.scenario import shipped_scenarios
from tests.support import REPO
from tests.support.diagnosis import Node, by_gpu, by_rank


def faults() -> dict[str, Any]:
    """The shipped `faults` scenario as a mapping (the test node takes one)."""
    data: dict[str, Any] = yaml.safe_load(shipped_scenarios()["faults"].read_text())
    return data


def latest(node: Node) -> Published:
    published = node.sampler.latest
    assert published is not None
    return published  # type: ignore[no-any-return]


def test_every_faulted_gpu_of_the_faults_scenario_reads_gpu_fault_naming_its_fault() -> None:
    node = Node(faults(), window=20)
    v = by_gpu(node.run(65))  # every fault has happened; GPU 4's replays run until 70 s
    assert (v[1].kind, v[1].modifiers) == ("gpu_fault", ("xid_critical",))
    assert "XID 79" in " ".join(v[1].evidence) and "reboot" in v[1].advice
    assert (v[2].kind, v[2].modifiers) == ("gpu_fault", ("gpu_down", "xid_critical"))
    assert "reboot it" in v[2].advice  # XID 79's action, more precise than "down"
    assert v[3].kind == "gpu_fault"
    assert v[3].modifiers == ("xid_critical", "ecc_uncorrectable", "row_remap_pending")
    assert "XID 48" in " ".join(v[3].evidence)
    assert (v[4].kind, v[4].modifiers) == ("gpu_fault", ("pcie_replay_storm",))
    assert "riser" in v[4].advice
    # the misconfigurations are performance verdicts, not faults
    assert (v[0].kind, v[0].modifiers) == ("compute", ("power_cap",))
    assert (v[5].kind, v[5].modifiers) == ("compute", ("fp32_no_tensor",))
    assert v[6].kind == v[7].kind == "unknown"
    assert all(x.bottleneck for x in (v[1], v[2], v[3], v[4]))
    diag = latest(node).result("diagnosis", Diagnosis)
    assert diag is not None and {f.subject.gpu for f in diag.faults} == {1, 2, 3, 4}


def test_a_down_gpu_shows_no_stale_reading_in_json_page_or_cli() -> None:
    node = Node(faults(), window=20)
    node.run(45)  # GPU 2 fell off the bus at 40 s, after reading SM active ~0.9
    doc = json.loads(json.dumps(diagnosis_document(latest(node))))
    gpu2 = next(v for v in doc["verdicts"] if v["subject"]["gpu"] == 2)
    assert gpu2["signals"] == {"gpu_up": 0} and gpu2["fault"] is True
    assert gpu2["history"] == {"sm_active": [], "gpu_util": []}
    assert {f["gpu"] for f in doc["faults"]} == {1, 2, 4}  # 4: the PCIe replays
    assert "gpu_down" in next(f for f in doc["faults"] if f["gpu"] == 2)["modifiers"]
    page = render_status_page(latest(node), "ready")
    assert "<title>FAULT (3) - stepscope</title>" in page
    banner = page[page.index('<section id="faults"'):page.index("</section>")]
    assert "gpu 1" in banner and "gpu 2" in banner and "gpu_down" in banner
    card = page[page.index('data-subject="gpu 2"'):]
    card = card[: card.index("</section>")]
    assert "GPU down: no current reading" in card and 'data-signal="SM active"' not in card
    # faulted cards come first
    subjects = re.findall(r'data-subject="([^"]+)"', page)
    assert subjects[:3] == ["gpu 1", "gpu 2", "gpu 4"]
    text = render_local(doc)
    assert text.splitlines()[2].startswith("HARDWARE FAULT on 3 subject(s)")
    row = next(line for line in text.splitlines() if line.startswith("gpu 2 "))
    assert row.split()[2] == "DOWN" and "%" not in row


def test_a_critical_xid_is_held_past_the_window_until_fault_hold() -> None:
    node = Node({"gpus": 2, "timeline": [{"at": 5, "gpus": [1], "xid": 79}]}, window=10)
    assert by_gpu(node.run(300))[1].kind == "gpu_fault"  # far outside the 10 s window
    assert by_gpu(node.run(300))[1].kind == "gpu_fault"  # 600 s after the XID...
    v = by_gpu(node.run(5))[1]  # ... and then it is released
    assert (v.kind, v.modifiers) == ("compute", ())


def test_a_gpu_seen_reset_is_released_at_once() -> None:
    node = Node({"gpus": 2, "timeline": [
        {"at": 5, "gpus": [1], "xid": 48}, {"at": 5, "gpus": [1], "ecc_dbe": 1},
        {"at": 60, "gpus": [1], "reset": True},
    ]}, window=10)  # fmt: skip
    v = by_gpu(node.run(58))[1]
    assert v.modifiers == ("xid_critical", "ecc_uncorrectable", "row_remap_pending")
    v = by_gpu(node.run(3))[1]  # being reset: unreachable
    assert v.modifiers[0] == "gpu_down"
    # back after the down GPU's retry (slow cadence): remap applied, counters cleared
    v = by_gpu(node.run(25))[1]
    assert (v.kind, v.modifiers) == ("compute", ())


def test_a_rank_on_a_faulted_gpu_reads_gpu_fault_and_a_non_critical_xid_is_evidence() -> None:
    node = Node({"gpus": 2, "timeline": [
        {"at": 3, "gpus": [0], "row_remap_failure": True}, {"at": 3, "gpus": [1], "xid": 13},
    ]})  # fmt: skip

    def both() -> None:
        node.step(0, 0.5, gpu=0)
        node.step(1, 0.5, gpu=1)

    v = by_rank(node.run(20, both))
    assert (v[0].kind, v[0].modifiers) == ("gpu_fault", ("row_remap_failed",))
    assert "RMA" in v[0].advice
    assert "steps of 0.500 s" in v[0].evidence[0]  # the step evidence is kept
    assert v[1].kind == "compute"  # XID 13 is the application's, not the hardware's
    assert any("XID 13" in e and "application" in e for e in v[1].evidence)


def test_the_critical_xids_are_the_catalogues_reset_and_reboot_codes() -> None:
    assert {48, 74, 79, 95, 119, 120, 140} <= set(CRITICAL_XIDS)
    assert not {13, 31, 43, 45, 63, 92, 94} & set(CRITICAL_XIDS)
    assert CRITICAL_XIDS[79].action == "RESTART_BM"


def test_the_drain_alert_and_the_diagnosis_hold_the_same_xids() -> None:
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules" / "stepscope-alerts.yml")
                           .read_text())  # fmt: skip
    drain = next(r for g in rules["groups"] for r in g["rules"]
                 if r.get("alert") == "StepscopeGpuXidDrain")  # fmt: skip
    (codes,) = set(re.findall(r'xid=~"([0-9|]+)"', drain["expr"]))
    assert set(map(int, codes.split("|"))) == set(CRITICAL_XIDS)
