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
starts.

The same window runs the :data:`BACKGROUND` modules' deterministic checks (mypy,
promtool's unit tests: a command's exit status and output, whatever the timing) on the
background lane (tests/support/background.py): one command at a time, at most one core,
the window's servers needing less than the other. The window does not end before the
lane has; those modules run after it and read the results.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import background

SCALE_OUT = "test_scale_out.py"
# wait-bound modules that run while the scale-out tier waits, in this order (the light
# ones first, while the background lane holds a core; the fleet's 8 exporters last):
# together about its ~2.5 minutes, so its tests still run at the time they would alone
# (its pages' 5 m group_interval is far off)
BESIDE_SCALE_OUT = (
    "test_fail_slow_rules.py",
    "test_ha.py",
    "test_meta_monitoring.py",
    "test_native_histograms.py",
    "test_native_histogram_rules.py",
    "test_prometheus.py",
    "test_diagnose_fleet.py",
)
# modules with a queue_early(lane): checks queued on the background lane in the window,
# in this order (mypy ~35 s, then promtool's unit test files ~25 s, one after another)
BACKGROUND = ("test_lint.py", "test_rules.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules beside the scale-out tier (in BESIDE_SCALE_OUT's order), then its own,
    where the first of them was, then the BACKGROUND modules that came before them; every
    module's tests stay in their order, every other module where it was."""
    scale = [i for i in items if i.path.name == SCALE_OUT]
    beside = [i for i in items if i.path.name in BESIDE_SCALE_OUT]
    if not scale or not beside:
        return
    beside.sort(key=lambda i: BESIDE_SCALE_OUT.index(i.path.name))  # stable: tests in order
    first = min(items.index(i) for i in beside)
    early = [i for i in items[:first] if i.path.name in BACKGROUND]
    moved = {id(i) for i in scale + beside + early}
    before = [i for i in items[:first] if id(i) not in moved]
    after = [i for i in items[first:] if id(i) not in moved]
    items[:] = [*before, *beside, *scale, *early, *after]


def _modules(session: pytest.Session, names: tuple[str, ...]) -> list[Any]:
    """The test modules of ``names`` that the run holds, in that order."""
    found: dict[str, Any] = {}
    for item in session.items:
        if item.path.name in names and item.path.name not in found:
            found[item.path.name] = item.module  # type: ignore[attr-defined]
    return [found[name] for name in names if name in found]


@pytest.fixture(scope="session")
def _scale_out_started_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The scale-out tier, started once, ahead of its module, then the background lane
    with the checks of the BACKGROUND modules the run holds. What no module took over is
    stopped at the end of the run."""
    tier = _modules(request.session, (SCALE_OUT,))
    if not tier:
        yield
        return
    tier[0].start_early(tmp_path_factory)
    lane = background.Lane(tmp_path_factory.mktemp("background"))
    for module in _modules(request.session, BACKGROUND):
        module.queue_early(lane)
    background.LANE = lane
    lane.start()
    yield
    lane.stop()
    tier[0].stop_early()


@pytest.fixture(scope="module", autouse=True)
def _beside_the_scale_out_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """The first module of BESIDE_SCALE_OUT starts the window, before its own fixtures
    (autouse fixtures come first within a scope, and it has none wider than a module);
    the scale-out module ends it, once the background lane has run its checks, so that
    nothing runs beside the modules after it."""
    if request.node.path.name in BESIDE_SCALE_OUT:
        request.getfixturevalue("_scale_out_started_early")
    yield
    if request.node.path.name == SCALE_OUT and background.LANE is not None:
        background.LANE.wait()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the background lane ran and how long each took (it shares the window's cores:
    a lane longer than the window makes the scale-out module's teardown wait)."""
    ran = background.LANE.ran if background.LANE is not None else {}
    if ran:
        took = ", ".join(f"{name} {done.seconds:.1f} s" for name, done in ran.items())
        total = sum(done.seconds for done in ran.values())
        terminalreporter.write_line(f"background lane: {took} (total {total:.1f} s)")
