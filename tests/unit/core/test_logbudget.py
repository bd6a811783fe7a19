"""Log lines a sender can cause are on a budget per (logger, reason): a burst, then a few
a minute, then one summary line a minute with how many were suppressed."""

from __future__ import annotations

import logging

import pytest

from stepscope.core.logbudget import BURST, MAX_REASONS, PER_MINUTE, LogBudget, flush_all
from tests.support.clocks import ManualClock


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_flood_writes_the_burst_then_the_rate_then_one_summary_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(0.0)
    budget = LogBudget(logging.getLogger("t.flood"), clock=clock)
    with caplog.at_level(logging.INFO, logger="t.flood"):
        # 150,000 events over 5 s: the burst only
        for i in range(150_000):
            clock.t = i * 5.0 / 150_000
            budget.log("not_owner", logging.WARNING, "refused %d", i)
        assert lines(caplog) == [f"refused {i}" for i in range(BURST)]
        assert budget.suppressed("not_owner") == 150_000 - BURST
        flush_all()  # not a minute since the first suppressed line: nothing yet
        assert len(caplog.records) == BURST
        clock.t = 61.0
        flush_all()
        assert lines(caplog)[-1].startswith(
            f"{150_000 - BURST} more log lines for not_owner suppressed in the last 61 s"
        )
        flush_all()  # said once
        assert len(caplog.records) == BURST + 1
        # a minute later, the bucket has refilled at PER_MINUTE a minute (up to BURST)
        clock.t = 61.0 + 60.0
        written = sum(budget.log("not_owner", logging.WARNING, "again") for _ in range(100))
        assert written == min(BURST, int(PER_MINUTE))


def test_reasons_have_budgets_of_their_own_and_a_flood_of_new_ones_shares_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = LogBudget(logging.getLogger("t.reasons"), clock=ManualClock(0.0))
    with caplog.at_level(logging.INFO, logger="t.reasons"):
        for _ in range(20):
            budget.log("a", logging.INFO, "a")
            budget.log("b", logging.INFO, "b")
        assert lines(caplog).count("a") == BURST
        assert lines(caplog).count("b") == BURST
        caplog.clear()
        # reasons are the code's words, but should a bug let a sender choose them, the
        # reasons past MAX_REASONS share one budget: the lines stay bounded
        for i in range(10 * MAX_REASONS):
            budget.log(f"r{i}", logging.INFO, "r")
        # one line each for the reasons that still get a bucket, then the shared burst
        assert len(caplog.records) == (MAX_REASONS - 2) + BURST


def test_a_level_the_logger_does_not_write_costs_no_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = LogBudget(logging.getLogger("t.level"), clock=ManualClock(0.0))
    with caplog.at_level(logging.WARNING, logger="t.level"):
        for _ in range(50):
            assert budget.log("x", logging.DEBUG, "quiet") is False
        assert budget.log("x", logging.WARNING, "loud") is True
    assert lines(caplog) == ["loud"]
