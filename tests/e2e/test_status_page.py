"""The live status page in a real browser: headless Chromium renders it from a live exporter.

Assertions are on the DOM Chromium rendered (``--dump-dom``); a screenshot is kept as
an artifact ($STEPSCOPE_ARTIFACTS/status-page.png when set, else in the test's tmp dir).
Needs the Debian ``chromium`` package; skipped without it unless
STEPSCOPE_REQUIRE_CHROMIUM is set (CI sets it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("STEPSCOPE_REQUIRE_CHROMIUM"):
        pytest.fail("chromium is required (STEPSCOPE_REQUIRE_CHROMIUM is set)")
    pytest.skip("chromium not installed (Debian package chromium)")


def browse(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{time.monotonic_ns()}"
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_page_shows_a_card_per_gpu_and_rank_with_verdicts_in_chromium(
    exporter_factory: Any, tmp_path: Path
) -> None:
    chromium()
    port = _free_udp_port()
    scenario = tmp_path / "node.yaml"
    scenario.write_text(json.dumps({
        "gpus": 3, "model": "NVIDIA H200",
        "timeline": [{"gpus": [1], "thermal": "sw"}, {"gpus": [2], "precision": "fp32"}],
    }))  # fmt: skip
    cfg = tmp_path / "stepscope.yaml"
    cfg.write_text(
        f"interval: 0.3\nslow_interval: 1\nscenario: {scenario}\nhostname: node-7\n"
        f"ingest: udp://127.0.0.1:{port}\ndiagnosis: {{window: 3}}\n"
    )
    exp = exporter_factory(["--config", str(cfg)])
    uuid0 = next(v["subject"]["uuid"] for v in json.loads(exp.get("/api/v1/diagnosis")[2])[
        "verdicts"] if v["subject"]["gpu"] == 0)  # fmt: skip
    stop = threading.Event()

    def rank() -> None:  # an input-starved rank on GPU 0: 60% of each step waits for data
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            step = 0
            while not stop.is_set():
                s.sendto(json.dumps({
                    "v": 1, "type": "step", "job": "resnet", "rank": 0, "local_rank": 0,
                    "step": step, "t": time.time(), "dur": 0.1, "data": 0.06, "compute": 0.035,
                    "comm": 0.0, "uuid": uuid0, "world_size": 1, "warmup": step < 2,
                }).encode(), ("127.0.0.1", port))  # fmt: skip
                step += 1
                stop.wait(0.1)

    sender = threading.Thread(target=rank, daemon=True)
    sender.start()
    try:
        wait_for(lambda: any(
            v["kind"] == "input" for v in json.loads(exp.get("/api/v1/diagnosis")[2])["verdicts"]
        ), timeout=20)  # fmt: skip
        url = exp.url + "/"
        dom = browse(url, tmp_path, "--dump-dom", "--virtual-time-budget=1000")
        assert dom.returncode == 0, dom.stderr
        shot_dir = Path(os.environ.get("STEPSCOPE_ARTIFACTS") or tmp_path)
        shot_dir.mkdir(parents=True, exist_ok=True)
        shot = shot_dir / "status-page.png"
        png = browse(url, tmp_path, f"--screenshot={shot}", "--window-size=1280,1000",
                     "--hide-scrollbars")  # fmt: skip
        assert png.returncode == 0, png.stderr
    finally:
        stop.set()
        sender.join()
    html = dom.stdout
    cards = re.findall(
        r'<section class="card ([a-z_ ]+)" data-kind="([a-z_]+)" data-modifiers="([a-z0-9_,]*)" '
        r'data-subject="([^"]+)">',
        html,
    )
    by_subject = {subject: (cls, kind, mods) for cls, kind, mods, subject in cards}
    # the rank's input kind is split by this machine's own CPUs and IO pressure (the
    # UDP rank names no process): input, or input_io while the host's disks are busy
    rank_kind = by_subject.get("resnet/rank 0 (gpu 0)", ("", "", ""))[1]
    assert rank_kind in ("input", "input_io", "input_cpu"), by_subject
    assert by_subject == {
        "resnet/rank 0 (gpu 0)": ("bottleneck", rank_kind, ""),
        "gpu 1": ("bottleneck", "compute", "thermal_throttle"),
        "gpu 2": ("compute", "compute", "fp32_no_tensor"),
    }
    assert "node-7" in html and 'id="status">bottleneck<' in html
    advice = {"input": "raise num_workers", "input_io": "faster storage",
              "input_cpu": "lighten the augmentation"}[rank_kind]
    assert advice in html and "mixed precision" in html
    rank_card = html[html.index('data-subject="resnet/rank 0 (gpu 0)"'):]
    rank_card = rank_card[: rank_card.index("</section>")]
    assert "<svg" in rank_card and "<rect" in rank_card  # the step-phase chart drew bars
    assert 'data-signal="SM active"' in rank_card and "step 0.100 s" in rank_card
    assert '<meta http-equiv="refresh"' in html
    # no external assets: every src/href is relative to the exporter
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_a_hardware_fault_cannot_be_missed_and_a_down_gpu_shows_no_reading_in_chromium(
    exporter_factory: Any, tmp_path: Path
) -> None:
    """GPU 1 logs XID 79 and falls off the bus one second in: a red banner names it, the
    title says FAULT, its card comes first and shows no reading."""
    chromium()
    scenario = tmp_path / "node.yaml"
    scenario.write_text(json.dumps({
        "gpus": 3, "model": "NVIDIA H200",
        "timeline": [{"at": 1, "gpus": [1], "xid": 79},
                     {"at": 1, "gpus": [1], "fall_off_bus": True}],
    }))  # fmt: skip
    cfg = tmp_path / "stepscope.yaml"
    cfg.write_text(
        f"interval: 0.3\nslow_interval: 1\nscenario: {scenario}\nhostname: node-9\n"
        f"ingest: unix://{tmp_path / 'ingest.sock'}\ndiagnosis: {{window: 3}}\n"
    )
    exp = exporter_factory(["--config", str(cfg)])
    wait_for(lambda: json.loads(exp.get("/api/v1/diagnosis")[2]).get("faults"), timeout=20)
    url = exp.url + "/"
    dom = browse(url, tmp_path, "--dump-dom", "--virtual-time-budget=1000")
    assert dom.returncode == 0, dom.stderr
    shot_dir = Path(os.environ.get("STEPSCOPE_ARTIFACTS") or tmp_path)
    shot_dir.mkdir(parents=True, exist_ok=True)
    shot = shot_dir / "status-page-fault.png"
    png = browse(url, tmp_path, f"--screenshot={shot}", "--window-size=1280,1000",
                 "--hide-scrollbars")  # fmt: skip
    assert png.returncode == 0, png.stderr
    html = dom.stdout
    assert "<title>FAULT (1) - stepscope</title>" in html
    banner = re.search(r'<section id="faults" class="faults" role="alert">(.*?)</section>', html)
    assert banner and "gpu 1" in banner.group(1) and "gpu_down" in banner.group(1)
    assert "reboot it" in banner.group(1)  # XID 79: NVIDIA's action is a node reboot
    cards = re.findall(r'<section class="card ([a-z_ ]+)" data-kind="([a-z_]+)" '
                       r'data-modifiers="([a-z0-9_,]*)" data-subject="([^"]+)">', html)
    assert cards[0] == ("fault", "gpu_fault", "gpu_down,xid_critical", "gpu 1")
    card = html[html.index('data-subject="gpu 1"'):]
    card = card[: card.index("</section>")]
    assert "GPU down: no current reading" in card and "data-signal" not in card
    assert shot.exists() and shot.stat().st_size > 20_000
