"""The exporter as a user runs it: a real process, real HTTP, promtool on what it serves."""

from __future__ import annotations

import gzip
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stepscope.gpu.fields import FIELDS
from tests.support import REPO, parse_samples, promtool, start_exporter, wait_for

# What promtool may say about our output: only what dcgm-exporter's names impose.
ALLOWED_LINT = (
    re.compile(r'^DCGM_FI_\w+ counter metrics should have "_total" suffix$'),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
    re.compile(r"^\w+ label names should be written in 'snake_case' not 'camelCase'$"),
)


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    # the served text must also be valid for prometheus_client's own parser
    list(text_string_to_metric_families(text))
    return parse_samples(text)


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_simulated_node_serves_every_dcgm_family_for_every_gpu() -> None:
    exp = start_exporter(["--simulate", "8", "--hostname", "node-7"])
    try:
        fams = parse(exp.metrics())
        for spec in FIELDS:
            gpus = {lbl["gpu"] for lbl, _ in fams.get(spec.name, [])}
            if spec.once_active:  # a tensor pipe, once it ran: bf16 work runs HMMA only
                assert gpus == ({str(i) for i in range(8)} if "hmma" in spec.name else set())
                continue
            assert gpus == {str(i) for i in range(8)}, spec.name
        uuids = {lbl["UUID"] for lbl, _ in fams["stepscope_gpu_up"]}
        assert len(uuids) == 8
        assert all(lbl["Hostname"] == "node-7" for lbl, _ in fams["DCGM_FI_DEV_GPU_UTIL"])
        build = fams["stepscope_build_info"][0][0]
        assert build["backend"] == "simulated"
        for _, v in fams["DCGM_FI_PROF_SM_ACTIVE"]:
            assert 0.0 <= v <= 1.0
    finally:
        assert exp.stop() == 0


def test_served_text_passes_promtool_except_dcgm_naming() -> None:
    tool = promtool()
    exp = start_exporter(["--simulate", "2"])
    try:
        text = exp.metrics()
    finally:
        exp.stop()
    result = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60)
    findings = [ln.strip() for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    unexpected = [f for f in findings if not any(p.match(f) for p in ALLOWED_LINT)]
    assert unexpected == [], unexpected


def test_gzip_scrape_and_content_type() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        status, headers, body = exp.get("/metrics", {"Accept-Encoding": "gzip"})
        assert status == 200
        assert headers["Content-Encoding"] == "gzip"
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"DCGM_FI_DEV_SM_CLOCK" in gzip.decompress(body)
        status, headers, body = exp.get("/metrics")
        assert "Content-Encoding" not in headers and b"DCGM_FI_DEV_SM_CLOCK" in body
    finally:
        exp.stop()


def test_health_readiness_and_landing_page() -> None:
    exp = start_exporter(["--simulate", "2"])
    try:
        assert exp.get("/healthz")[0] == 200
        status, _, body = exp.get("/readyz")
        assert status == 200 and body.startswith(b"ok")
        status, headers, body = exp.get("/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b'href="metrics"' in body and b"simulated" in body
        assert exp.get("/nope")[0] == 404
    finally:
        exp.stop()


def test_values_advance_between_passes() -> None:
    exp = start_exporter(["--simulate", "1", "--interval", "0.2"])
    try:
        def ts() -> float:
            return parse(exp.metrics())["stepscope_last_collect_timestamp_seconds"][0][1]

        first = ts()
        wait_for(lambda: ts() > first)
    finally:
        exp.stop()


def test_sigterm_stops_cleanly() -> None:
    exp = start_exporter(["--simulate", "1"])
    exp.proc.send_signal(signal.SIGTERM)
    assert exp.proc.wait(timeout=15) == 0
    assert not any("Traceback" in ln for ln in exp.stderr_lines)


def test_sighup_reloads_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "stepscope.yaml"
    cfg.write_text("simulate: 1\ninterval: 1\nslow_interval: 10\n")
    exp = start_exporter(["--config", str(cfg)])
    try:
        def slow_interval() -> float:
            fams = parse(exp.metrics())["stepscope_sampling_interval_seconds"]
            return {lbl["tier"]: v for lbl, v in fams}["slow"]

        assert slow_interval() == 10
        cfg.write_text("simulate: 1\ninterval: 1\nslow_interval: 20\n")
        exp.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: slow_interval() == 20)
        # a broken file on reload is reported and the exporter keeps running
        cfg.write_text("interval: [\n")
        exp.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: any("reload failed" in ln for ln in exp.stderr_lines))
        assert slow_interval() == 20
    finally:
        assert exp.stop() == 0


def test_no_driver_is_one_clear_line_and_status_2() -> None:
    pytest.importorskip("pynvml")
    from stepscope.gpu.model import NoDriverError
    from stepscope.gpu.nvml_backend import NvmlBackend

    try:
        NvmlBackend().close()
    except NoDriverError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    result = run_cli("serve", "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no NVIDIA driver/NVML found" in lines[0]
    assert "--simulate N" in lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--interval", "0"], "interval: must be between 0.1 and 3600 seconds, got '0'"),
        (["--simulate", "-3"], "simulate: must be between 1 and 64 GPUs"),
        (["--listen", "localhost"], "listen: expected HOST:PORT"),
    ],
)
def test_bad_flags_exit_2_naming_the_key(args: list[str], fragment: str) -> None:
    result = run_cli("serve", *args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_config_file_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulate: 2\nlisten: [oops\n")
    result = run_cli("serve", "--config", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "line" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_scenario_exits_2_naming_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "scenario.yaml"
    bad.write_text("version: 1\ngpus: 2\nnot_a_key: 3\n")
    result = run_cli("serve", "--scenario", str(bad), "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert "not_a_key" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_a_clear_error() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        result = run_cli("serve", "--simulate", "1", "--listen", exp.address)
        assert result.returncode == 1
        assert f"cannot serve on {exp.address}" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        exp.stop()


def test_every_served_family_is_documented() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        names = set(parse_samples(exp.metrics()))
    finally:
        exp.stop()
    doc = (REPO / "docs" / "metrics.md").read_text()
    missing = [n for n in sorted(names) if f"`{n}`" not in doc and not n.startswith("process_")]
    assert missing == []


def test_scenario_faults_show_up_on_exactly_the_gpus_they_hit(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "version: 1\ngpus: 4\n"
        "devices:\n  0: {profiling: false}\n"
        "timeline:\n"
        "  - {at: 0.5s, gpus: [1], xid: 79}\n"
        "  - {at: 0.6s, gpus: [1], xid: 13}\n"
        "  - {at: 0.7s, gpus: [1], xid: 79}\n"
        "  - {at: 1s, gpus: [2], fall_off_bus: true}\n"
        "  - {at: 0s, until: 1h, gpus: [3], thermal: sw}\n"
    )
    exp = start_exporter(["--scenario", str(scenario), "--interval", "0.2",
                          "--slow-interval", "0.2"])
    try:
        def fams() -> dict[str, list[tuple[dict[str, str], float]]]:
            return parse(exp.metrics())

        def by_gpu(f: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, float]:
            return {lbl["gpu"]: v for lbl, v in f.get(name, [])}

        f = wait_for(lambda: (f := fams()) and by_gpu(f, "stepscope_gpu_up").get("2") == 0 and
                     sum(v for _, v in f.get("stepscope_xid_errors_total", [])) == 3 and f)
        assert by_gpu(f, "stepscope_gpu_up") == {"0": 1, "1": 1, "2": 0, "3": 1}
        xids = {(lbl["gpu"], lbl["xid"]): v for lbl, v in f["stepscope_xid_errors_total"]}
        assert xids == {("1", "79"): 2, ("1", "13"): 1}
        assert by_gpu(f, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0, "1": 79, "2": 0, "3": 0}
        # the lost GPU keeps only up/info; the GPU without GPM has no PROF series at all
        assert "2" not in by_gpu(f, "DCGM_FI_DEV_GPU_UTIL")
        assert set(by_gpu(f, "DCGM_FI_PROF_SM_ACTIVE")) == {"1", "3"}
        info = {lbl["gpu"]: lbl["profiling"] for lbl, _ in f["stepscope_gpu_info"]}
        assert info["0"] == "unsupported" and info["1"] == "supported"
        # GPU 3 throttles: clock event active, clocks lower, violation time rising
        active = {(lbl["gpu"], lbl["reason"]): v
                  for lbl, v in f["stepscope_gpu_clock_event_active"]}
        assert active[("3", "sw_thermal_slowdown")] == 1
        assert ("1", "sw_thermal_slowdown") not in active  # inactive reasons are absent
        clocks = by_gpu(f, "DCGM_FI_DEV_SM_CLOCK")
        assert clocks["3"] < clocks["1"]
        first = by_gpu(f, "DCGM_FI_DEV_THERMAL_VIOLATION")["3"]
        wait_for(lambda: by_gpu(fams(), "DCGM_FI_DEV_THERMAL_VIOLATION")["3"] > first)
        assert by_gpu(fams(), "DCGM_FI_DEV_THERMAL_VIOLATION")["1"] == 0
    finally:
        assert exp.stop() == 0
