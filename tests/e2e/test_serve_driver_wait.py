"""``stepscope serve`` without an NVIDIA driver, as a process: by hand it exits at once,
as a service it waits for the driver."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import parse_samples, wait_for
from tests.support.exporter import served_address

# The exporter with build_backend replaced: no driver until a file appears, then simulated
# GPUs. Everything else (flags, waiting, logging, serving) is the real command.
_LATE_DRIVER = """
import dataclasses, os, sys
import stepscope.app.serve as serve
from stepscope.gpu.model import NoDriverError
real = serve.build_backend
def late(cfg):
    if not os.path.exists(sys.argv[1]):
        raise NoDriverError("NVML unavailable: the NVIDIA kernel driver is not loaded")
    return real(dataclasses.replace(cfg, simulate=2))
serve.build_backend = late
from stepscope.app.cli import main
sys.exit(main(["serve", *sys.argv[2:]]))
"""


def _serve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", STEPSCOPE_INGEST=f"unix://{tmp_path}/i.sock")
    return subprocess.run(
        [sys.executable, "-m", "stepscope", "serve", "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )


def _have_nvidia_driver() -> bool:
    return os.path.exists("/proc/driver/nvidia/version")


@pytest.mark.skipif(_have_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_by_hand_without_a_driver_serve_exits_2_without_waiting(tmp_path: Path) -> None:
    run = _serve([], tmp_path)
    assert run.returncode == 2
    assert "waiting" not in run.stderr
    assert run.stderr.startswith("stepscope: error: no NVIDIA driver/NVML found: ")
    assert "--simulate" in run.stderr


@pytest.mark.skipif(_have_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_as_a_service_without_a_driver_it_waits_logs_once_then_exits_2(tmp_path: Path) -> None:
    run = _serve(["--wait-for-driver", "2"], tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert sum("waiting up to 2 s" in line for line in lines) == 1, run.stderr
    assert lines[-1].startswith("stepscope: error: no NVIDIA driver/NVML found after waiting 2 s")


def test_a_driver_that_arrives_while_the_service_waits_gets_served(tmp_path: Path) -> None:
    marker = tmp_path / "driver-loaded"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", _LATE_DRIVER, str(marker), "--wait-for-driver", "120",
         "--listen", "127.0.0.1:0", "--ingest", f"unix://{tmp_path}/i.sock"],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("waiting up to 120 s" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stderr.readline())
        marker.touch()
        address = None
        while address is None:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            line = proc.stderr.readline()
            lines.append(line)
            address = served_address(line) or address
        import urllib.request

        def scrape() -> str:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
                return str(resp.read().decode())

        samples = wait_for(lambda: parse_samples(scrape()).get("stepscope_gpu_up"))
        assert len(samples) == 2
        assert sum("waiting up to" in line for line in lines) == 1
        assert any("NVIDIA driver found" in line for line in lines)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


