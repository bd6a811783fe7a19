"""The connection guard's request timeout bounds what a client controls, a request's
arrival, never the time its answer takes (issue 27: a basic-auth check against a cost-18
hash, ~15 s, was cut by the 10 s timeout instead of answering 401)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from stepscope.web.guard import ConnectionGuard
from tests.support.clocks import ManualClock


class FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _guard_with_connection() -> tuple[ConnectionGuard, ManualClock, FakeTransport]:
    clock = ManualClock()
    guard = ConnectionGuard(request_timeout=10.0, keepalive_timeout=75.0, clock=clock)
    transport = FakeTransport()
    assert guard._opened(transport) is not None  # type: ignore[arg-type]
    return guard, clock, transport


def test_a_silent_connection_is_closed_after_the_request_timeout() -> None:
    guard, clock, transport = _guard_with_connection()
    clock.t = 10.5
    assert guard.sweep() == 1 and transport.aborted


def test_a_request_in_its_handler_is_not_cut_however_long_the_answer_takes() -> None:
    guard, clock, transport = _guard_with_connection()
    release = asyncio.Event()
    swept: list[int] = []

    async def slow_handler(request: Any) -> web.StreamResponse:
        clock.t = 25.0  # the answer (a costly bcrypt check) takes 25 s
        swept.append(guard.sweep())
        await release.wait()
        return web.Response(status=401)

    async def run() -> web.StreamResponse:
        request = SimpleNamespace(transport=transport)
        task = asyncio.create_task(guard.middleware(request, slow_handler))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        release.set()
        return await task

    response = asyncio.run(run())
    assert response.status == 401
    assert swept == [0] and not transport.aborted
    # answered: the connection may idle for keep-alive, then must send its next request
    clock.t = 25.0 + 75.0 + 10.0 - 0.1
    assert guard.sweep() == 0
    clock.t += 0.2
    assert guard.sweep() == 1 and transport.aborted
