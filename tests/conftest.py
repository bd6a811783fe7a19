"""Shared fixtures: exporter processes a test starts, killed whatever happens; the web
layer's certificates. What the tests share besides fixtures is in :mod:`tests.support`."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.exporter import Exporter, start_exporter, stop_all
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
