"""A service started before the NVIDIA driver waits for it (``--wait-for-driver``); run by
hand on a machine that will never have one, ``stepscope serve`` still exits 2 at once.

The retry loop is tested on a fake clock; the command itself on this machine, which has
no NVIDIA driver, and with a driver that "arrives" while the process waits.
"""

from __future__ import annotations

import pytest

from stepscope.app.cli import DriverLoadedLate, build_backend_waiting
from stepscope.app.config import Config
from stepscope.gpu.model import GpuBackend, NoDriverError
from tests.support.clocks import ManualClock


class DriverAfter:
    """build_backend stand-in: no driver until the clock reaches ``at`` seconds."""

    def __init__(self, clock: ManualClock, at: float) -> None:
        self.clock = clock
        self.at = at
        self.calls = 0

    def __call__(self, cfg: Config) -> GpuBackend:
        self.calls += 1
        if self.clock() < self.at:
            raise NoDriverError("NVML unavailable: the NVIDIA kernel driver is not loaded")
        return object()  # type: ignore[return-value]


def test_without_waiting_no_driver_is_an_error_at_the_first_try() -> None:
    clock = ManualClock()
    build = DriverAfter(clock, at=1e9)
    with pytest.raises(NoDriverError):
        build_backend_waiting(Config(), build, clock=clock, sleep=clock.sleep)
    assert build.calls == 1 and clock.sleeps == []


def test_a_driver_that_loads_during_the_wait_is_picked_up_and_the_wait_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    build = DriverAfter(clock, at=40)
    with caplog.at_level("DEBUG", logger="stepscope"):
        backend = build_backend_waiting(
            Config(wait_for_driver=300), build, clock=clock, sleep=clock.sleep,
            driver_loaded=lambda: True,
        )
    assert backend is not None
    # back-off: quick retries first, then a steady pace that never exceeds 15 s
    assert clock.sleeps == [1, 2, 4, 8, 15, 15]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "waiting up to 300 s" in warnings[0].getMessage()
    assert "kernel driver is not loaded" in warnings[0].getMessage()
    assert any(r.getMessage() == "NVIDIA driver found; serving" for r in caplog.records)


def test_the_wait_ends_at_its_deadline_with_no_driver_error() -> None:
    clock = ManualClock()
    build = DriverAfter(clock, at=1e9)
    with pytest.raises(NoDriverError):
        build_backend_waiting(
            Config(wait_for_driver=20), build, clock=clock, sleep=clock.sleep,
            driver_loaded=lambda: False,
        )
    assert sum(clock.sleeps) == 20  # the last sleep is cut to the deadline
    assert clock.sleeps == [1, 2, 4, 8, 5]


def test_a_kernel_driver_loaded_after_start_while_nvml_still_fails_asks_for_a_restart() -> None:
    # systemd resolves DeviceAllow=char-nvidia* at unit start: a module loaded later is
    # not in the allow-list, NVML keeps failing, and only a restart helps.
    clock = ManualClock()
    build = DriverAfter(clock, at=1e9)
    loaded = iter([False, False, True])
    with pytest.raises(DriverLoadedLate):
        build_backend_waiting(
            Config(wait_for_driver=300), build, clock=clock, sleep=clock.sleep,
            driver_loaded=lambda: next(loaded),
        )
    assert build.calls == 3


