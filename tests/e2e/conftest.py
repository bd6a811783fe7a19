"""The end-to-end modules' order: the scale-out tier's minutes run beside other modules'.

tests/e2e/test_scale_out.py waits about 2.5 minutes on its rules' shipped `for:` (and
Alertmanager's group_wait) using ~10% of 2 cores. When it is in the run, its tier is
started just before the first module of :data:`BESIDE_SCALE_OUT`, those modules run one
after another while it waits, and its own tests run right after them, taking over the
running tier (they check states it reaches, with deadlines from its start; nothing of
theirs is timed by the CPU). The modules beside it are server-clock tests too: Prometheus,
vmalert and Alertmanager timelines fed with synthetic values (steps sent with the
durations they claim, or slept by the fleet's ranks; simulated GPUs), none measuring CPU
shares or wall-clock windows of its own processes. Every other test runs with nothing
beside it, as before: the tier is stopped when its module ends, before the next module
starts. One deterministic check runs in the background during that window too: mypy
(tests/repo/test_lint.py), whose output does not depend on when it runs; it holds one
core, the window's servers need less than the other, and it is waited for before the
scale-out module ends, so nothing after the window runs beside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

SCALE_OUT = "test_scale_out.py"
# wait-bound modules that run while the scale-out tier waits: together well under its
# ~2.5 minutes, so its tests still run at the time they would alone (its pages' 5 m
# group_interval is far off)
BESIDE_SCALE_OUT = (
    "test_diagnose_fleet.py",
    "test_fail_slow_rules.py",
    "test_ha.py",
    "test_meta_monitoring.py",
    "test_native_histogram_rules.py",
    "test_native_histograms.py",
    "test_prometheus.py",
)


# deterministic checks started in the background after the tier, one process each, and
# waited for before the window ends (a module with start_early, wait_early, stop_early):
# mypy, ~35 s of one core (tests/repo/test_lint.py), beside a window that uses ~0.4 of 2
BACKGROUND = ("test_lint.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules beside the scale-out tier, then its own, where the first of them was;
    every module's tests stay in their order, every other module where it was."""
    scale = [i for i in items if i.path.name == SCALE_OUT]
    beside = [i for i in items if i.path.name in BESIDE_SCALE_OUT]
    if not scale or not beside:
        return
    moved = {id(i) for i in scale + beside}
    first = items.index(beside[0])
    before = [i for i in items[:first] if id(i) not in moved]
    after = [i for i in items[first:] if id(i) not in moved]
    items[:] = [*before, *beside, *scale, *after]


def _modules(session: pytest.Session, names: tuple[str, ...]) -> list[Any]:
    """The test modules of ``names`` that the run holds."""
    found = {}
    for item in session.items:
        if item.path.name in names and item.path.name not in found:
            found[item.path.name] = item.module  # type: ignore[attr-defined]
    return list(found.values())


@pytest.fixture(scope="session")
def _scale_out_started_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The scale-out tier, started once, ahead of its module, then the BACKGROUND checks
    the run holds; whatever no test took over is stopped at the end of the run."""
    started = _modules(request.session, (SCALE_OUT,))
    if started:
        started += _modules(request.session, BACKGROUND)
    for module in started:
        module.start_early(tmp_path_factory)
    yield
    for module in started:
        module.stop_early()


@pytest.fixture(scope="module", autouse=True)
def _beside_the_scale_out_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """The first module of BESIDE_SCALE_OUT starts the window, before its own fixtures
    (autouse fixtures come first within a scope, and it has none wider than a module);
    the scale-out module ends it: the background checks are waited for, so that nothing
    runs beside the modules after it."""
    if request.node.path.name in BESIDE_SCALE_OUT:
        request.getfixturevalue("_scale_out_started_early")
    yield
    if request.node.path.name == SCALE_OUT:
        for module in _modules(request.session, BACKGROUND):
            module.wait_early()
