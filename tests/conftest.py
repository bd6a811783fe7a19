"""Shared fixtures: exporter processes a test starts, killed whatever happens; the web
layer's certificates. What the tests share besides fixtures is in :mod:`tests.support`."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.exporter import Exporter, start_exporter, stop_all
from tests.support.imds import FULL, FakeImds, _serve
from tests.support.kubelet import KubeletServer, running_kubelet
from tests.support.web import make_certs


@pytest.fixture
def exporters() -> Iterator[list[Exporter]]:
    """Exporters a test starts (append them); killed at the end whatever happened."""
    started: list[Exporter] = []
    yield started
    for exp in started:
        if exp.proc.poll() is None:
            exp.proc.kill()
            exp.proc.wait()


@pytest.fixture(autouse=True, scope="session")
def _no_exporter_outlives_the_run() -> Iterator[None]:
    """One a test forgot to stop (a failed assertion before its finally) is killed when
    the run ends, so none outlives it (per session: module fixtures share exporters)."""
    yield
    stop_all()


@pytest.fixture
def exporter_factory() -> Iterator[object]:
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


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of certificates made by ``openssl`` (:func:`tests.support.web.make_certs`
    names them); skips without ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("certs")
    make_certs(d)
    return d


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletServer]:
    """A fake kubelet serving the pod-resources protocol on a Unix socket."""
    yield from running_kubelet(tmp_path)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    """A fake IMDSv2 of an instance in a placement group (partition 3)."""
    yield from _serve(FULL)


@pytest.fixture
def base() -> Iterator[Path]:
    """A 0755 directory under /tmp (short enough for Unix socket paths), removed after."""
    path = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
