"""Shared fixtures: a running exporter process and helpers to scrape it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def promtool() -> str:
    """Path of promtool; skips the test without it unless CI demands it."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("STEPSCOPE_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is required (STEPSCOPE_REQUIRE_PROMTOOL is set)")
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path


@dataclass
class Exporter:
    """A `stepscope serve` subprocess on a free loopback port."""

    proc: subprocess.Popen[str]
    address: str
    stderr_lines: list[str]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def metrics(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, body
        return body.decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


@pytest.fixture
def exporters() -> Iterator[list[Exporter]]:
    """Exporters a test starts (append them); killed at the end whatever happened."""
    started: list[Exporter] = []
    yield started
    for exp in started:
        if exp.proc.poll() is None:
            exp.proc.kill()
            exp.proc.wait()


# Every exporter process the tests started: one a test forgot to stop (a failed assertion
# before its finally) is killed when the run ends, so none outlives it. (Per session, not
# per test: module fixtures share an exporter between tests.)
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True, scope="session")
def _no_exporter_outlives_the_run() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_exporter(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 30.0
) -> Exporter:
    """Start the exporter and wait (with a deadline) until it says where it serves."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("STEPSCOPE_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "serve", "--listen", "127.0.0.1:0", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=full_env,
    )
    _STARTED.append(proc)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if " on http" in line and "/metrics" in line:
            address = line.rsplit("://", 1)[1].split("/metrics")[0]
            exporter = Exporter(proc, address, lines)
            _drain(proc, lines)
            return exporter
    proc.kill()
    raise AssertionError("exporter did not start:\n" + "".join(lines))


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Keep reading stderr in the background so the pipe never fills."""
    import threading

    def run() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=run, daemon=True).start()


@pytest.fixture
def exporter_factory() -> Iterator[type[Exporter] | object]:
    started: list[Exporter] = []

    def factory(args: Sequence[str], env: dict[str, str] | None = None) -> Exporter:
        exp = start_exporter(args, env)
        started.append(exp)
        return exp

    yield factory
    for exp in started:
        if exp.proc.poll() is None:
            exp.proc.kill()
            exp.proc.wait()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by their exact served name (prometheus_client's parser renames
    counters to *_total, which would hide dcgm-exporter's counter names)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparseable sample line: {line!r}"
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s (last: {last!r})")


def make_sampler(
    backend: Any,
    *,
    hostname: str = "node-a",
    interval: float = 1.0,
    slow_interval: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sources: Sequence[Any] = (),
    analyses: Sequence[Any] = (),
) -> Any:
    """A real Sampler over ``backend``'s GPUs plus ``sources`` (registered after the GPU
    source, in order) and ``analyses``, as ``stepscope serve`` builds one."""
    from stepscope.core.registry import Registry
    from stepscope.core.sampler import Sampler, SamplerSettings
    from stepscope.gpu.source import GpuSource

    registry = Registry()
    registry.register(GpuSource(backend))
    for source in sources:
        registry.register(source)
    for analysis in analyses:
        registry.register_analysis(analysis)
    return Sampler(
        registry,
        SamplerSettings(hostname, interval, slow_interval),
        clock=clock,
        wall_clock=wall_clock,
        build_labels={"backend": backend.name},
    )
