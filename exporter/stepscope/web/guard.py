"""Connections the HTTP server will hold: a cap, and deadlines no client can stretch.

aiohttp closes a keep-alive connection that idles after a response, but not one that never
sends a complete request: 1,100 silent or slow-header connections once held every file
descriptor the unit allowed and every real scrape failed. :class:`ConnectionGuard` wraps
the server's protocol factory:

- at most ``max_connections`` at once: one more is closed at accept (a warning at most
  once a minute, counted in ``stepscope_http_connections_rejected_total``);
- a connection must complete a request within ``request_timeout`` of opening, and the
  next one within ``request_timeout`` plus aiohttp's keep-alive of the last response;
  one that does not (silent, or dripping headers) is closed by a sweep once a second.
  The timeout bounds what the client controls, a request's arrival: once a request is
  in its handler the connection is not swept until the answer is written (a basic-auth
  check against a cost-18 bcrypt hash takes ~15 s and must end in its 401, not a cut;
  the auth bounds its own work, :mod:`stepscope.web.auth`).

The sweep and the bookkeeping run on the event loop; a request's completion is marked by
:meth:`ConnectionGuard.middleware`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from stepscope.core.exposition import COUNTER, GAUGE, Family
from stepscope.core.labels import LabelSchema
from stepscope.core.source import PartKey, ReadContext, Source

log = logging.getLogger("stepscope.web")

_WARN_EVERY_S = 60.0


@dataclass(slots=True)
class _Conn:
    transport: asyncio.Transport | None
    deadline: float


class _GuardedProtocol(asyncio.Protocol):
    """The aiohttp protocol of one connection, seen through the guard."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._conn: _Conn | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._conn = self._guard._opened(transport)
        if self._conn is None:
            transport.abort()  # over the cap: refuse before aiohttp sees it
            return
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._guard._closed(self._conn)
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def __getattr__(self, name: str) -> Any:  # aiohttp's own attributes (keep-alive state)
        return getattr(self._inner, name)


class ConnectionGuard:
    """Caps and times out the connections of one server (event-loop thread only)."""

    def __init__(
        self,
        max_connections: int = 512,
        request_timeout: float = 10.0,
        keepalive_timeout: float = 75.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.keepalive_timeout = keepalive_timeout
        self._clock = clock
        self._open: dict[int, _Conn] = {}
        self._by_transport: dict[int, _Conn] = {}
        self.rejected = 0
        self.timed_out = 0
        self._last_warning: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def open_connections(self) -> int:
        """Connections held now."""
        return len(self._open)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` that goes through the guard."""

        def make() -> asyncio.Protocol:
            return _GuardedProtocol(self, factory())

        return make

    def start(self) -> None:
        """Start the once-a-second sweep (call on the running loop)."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    def _warn(self, message: str, *args: object) -> None:
        now = self._clock()
        # one line a minute per kind of trouble, however many connections
        if now - self._last_warning.get(message, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._last_warning[message] = now
            log.warning(message, *args)

    def _opened(self, transport: asyncio.Transport) -> _Conn | None:
        if len(self._open) >= self.max_connections:
            self.rejected += 1
            self._warn(
                "refusing HTTP connections: %d open (max_connections); %d refused so far",
                len(self._open),
                self.rejected,
            )
            return None
        conn = _Conn(transport, self._clock() + self.request_timeout)
        self._open[id(conn)] = conn
        self._by_transport[id(transport)] = conn
        return conn

    def _closed(self, conn: _Conn) -> None:
        self._open.pop(id(conn), None)
        if conn.transport is not None:
            self._by_transport.pop(id(conn.transport), None)
        conn.transport = None

    def sweep(self) -> int:
        """Close every connection past its deadline; returns how many."""
        now = self._clock()
        late = [c for c in self._open.values() if c.deadline < now]
        for conn in late:
            if conn.transport is not None:
                conn.transport.abort()
            self._closed(conn)
        if late:
            self.timed_out += len(late)
            self._warn(
                "closed %d HTTP connection(s) that sent no complete request in %g s "
                "(%d so far)",
                len(late),
                self.request_timeout,
                self.timed_out,
            )
        return len(late)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.sweep()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks a completed request: the connection may idle for keep-alive, then must
        send its next request within the request timeout. While the handler runs the
        connection has no deadline: the request has arrived, the wait is ours."""
        transport = request.transport
        conn = self._by_transport.get(id(transport)) if transport is not None else None
        if conn is not None:
            conn.deadline = float("inf")
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.deadline = self._clock() + self.keepalive_timeout + self.request_timeout


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """The guard's counters at one pass."""

    open: int
    rejected: int
    timed_out: int
    max_connections: int


class HttpSource(Source[ConnectionCounts]):
    """The HTTP server's connections as a source: read on the sampler thread (plain
    integer reads of the loop's counters), served as ``stepscope_http_*``."""

    key: PartKey[ConnectionCounts] = PartKey("http")

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def read(self, ctx: ReadContext) -> ConnectionCounts:
        g = self._guard
        return ConnectionCounts(g.open_connections, g.rejected, g.timed_out, g.max_connections)

    def families(self, part: ConnectionCounts, labels: LabelSchema) -> Iterable[Family]:
        return [
            Family.single(
                "stepscope_http_connections",
                GAUGE,
                "HTTP connections the exporter holds now (max_connections caps them).",
                float(part.open),
            ),
            Family.single(
                "stepscope_http_max_connections",
                GAUGE,
                "The max_connections setting.",
                float(part.max_connections),
            ),
            Family.single(
                "stepscope_http_connections_rejected_total",
                COUNTER,
                "HTTP connections closed at accept because max_connections were open.",
                float(part.rejected),
            ),
            Family.single(
                "stepscope_http_connections_timed_out_total",
                COUNTER,
                "HTTP connections closed for sending no complete request within "
                "http_request_timeout (silent or slow-header clients).",
                float(part.timed_out),
            ),
        ]
