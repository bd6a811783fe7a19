"""Connections the HTTP server will hold: a cap no idle peer can fill, and deadlines no
client can stretch.

aiohttp closes a keep-alive connection that idles after a response, but not one that never
sends a complete request: 1,100 silent or slow-header connections once held every file
descriptor the unit allowed and every real scrape failed, and 512 silent ones (the cap)
once made every new scrape wait for the sweep (6-10 s). :class:`ConnectionGuard` wraps the
server's protocol factory:

- at most ``max_connections`` at once. Past the cap, a new connection from the peer that
  holds the most connections (:mod:`stepscope.web.peers`: an address, or on this host
  the uid that owns the socket) is closed at accept, before aiohttp builds anything for
  it (``stepscope_http_connections_rejected_total``); anyone else's takes the place of
  one waiting for a request (silent or dripping headers since it opened, or idle in
  keep-alive since its last response), which is closed
  (``stepscope_http_connections_evicted_total``): the longest waiting of that largest
  peer, or, where every peer holds one, the longest waiting of all. A peer holding
  thousands of idle connections, reconnecting as fast as they are closed, gets none
  more, and a scraper's new connection is answered at once. Only when every connection
  has a request in its handler is anyone's new one refused;
- a connection must complete a request within ``request_timeout`` of opening, and the
  next one within ``request_timeout`` plus aiohttp's keep-alive of the last response
  (Go's ReadHeaderTimeout and IdleTimeout); one that does not is closed by a sweep once
  a second. The timeout bounds what the client controls, a request's arrival: once a
  request is in its handler the connection is neither swept nor evicted until the answer
  is written (a basic-auth check against a cost-18 bcrypt hash takes ~15 s and must end
  in its 401, not a cut; the auth bounds its own work, :mod:`stepscope.web.auth`).

Each warning is logged at most once a minute. The bookkeeping runs on the event loop in
O(1) per connection (queues in waiting order, peers in buckets by load); a request's
start and end are marked by :meth:`ConnectionGuard.middleware`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from stepscope.core.exposition import COUNTER, GAUGE, Family, label_string
from stepscope.core.labels import LabelSchema
from stepscope.core.source import PartKey, ReadContext, Source
from stepscope.web.auth import LANES, RESULTS, BasicAuth
from stepscope.web.peers import peer_key

log = logging.getLogger("stepscope.web")

_WARN_EVERY_S = 60.0
# File descriptors the process needs besides its HTTP connections (ingest, /proc reads,
# NVML, the sampler's files, logs), with room to spare.
FD_HEADROOM = 256


@dataclass(slots=True, eq=False)
class _Conn:
    transport: asyncio.Transport | None
    deadline: float
    waiting_since: float  # opened, or its last response (inf: a request in its handler)
    peer: str


class _PeerLoad:
    """Connections per peer, with the largest holder found in O(1) (counts move by one:
    peers are kept in buckets by count, as an LFU cache keeps its keys)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._by_count: dict[int, dict[str, None]] = {}
        self.most = 0

    def _move(self, peer: str, old: int, new: int) -> None:
        if old:
            bucket = self._by_count[old]
            del bucket[peer]
            if not bucket:
                del self._by_count[old]
        if new:
            self._by_count.setdefault(new, {})[peer] = None
            self._count[peer] = new
        else:
            del self._count[peer]
        # counts move by one: a new top, or the top bucket emptied for the one below
        if new > self.most or (old == self.most and old not in self._by_count):
            self.most = new

    def add(self, peer: str) -> None:
        n = self._count.get(peer, 0)
        self._move(peer, n, n + 1)

    def remove(self, peer: str) -> None:
        n = self._count[peer]
        self._move(peer, n, n - 1)

    def largest(self) -> dict[str, None]:
        """The peers holding the most connections (empty without connections)."""
        return self._by_count.get(self.most, {})


class _GuardedProtocol(asyncio.Protocol):
    """The aiohttp protocol of one connection, seen through the guard."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._factory = factory
        self._conn: _Conn | None = None
        self._inner: asyncio.Protocol  # built once admitted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._conn = self._guard._opened(transport)
        if self._conn is None:
            transport.abort()  # refused: before aiohttp builds anything for it (cheap)
            return
        self._inner = self._factory()
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
        if name == "_inner":  # not admitted (yet): no aiohttp protocol to ask
            raise AttributeError(name)
        return getattr(self._inner, name)


class ConnectionGuard:
    """Caps and times out the connections of one server (event-loop thread only)."""

    def __init__(
        self,
        max_connections: int = 512,
        request_timeout: float = 10.0,
        keepalive_timeout: float = 75.0,
        clock: Callable[[], float] = time.monotonic,
        peer_of: Callable[[Any], str] = peer_key,
    ) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.keepalive_timeout = keepalive_timeout
        self._clock = clock
        self._open: dict[int, _Conn] = {}
        self._by_transport: dict[int, _Conn] = {}
        # Connections waiting for a request, oldest first (insertion order is deadline
        # order, each queue having one timeout): none completed yet, and kept alive.
        self._fresh: OrderedDict[int, _Conn] = OrderedDict()
        self._kept: OrderedDict[int, _Conn] = OrderedDict()
        # the same connections by peer, each peer's oldest first, and each peer's load
        self._peer_of = peer_of
        self._peer_waiting: dict[str, OrderedDict[int, _Conn]] = {}
        self._load = _PeerLoad()
        self.rejected = 0
        self.evicted = 0
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
            return _GuardedProtocol(self, factory)

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
        peer = self._peer_of(transport)
        if len(self._open) >= self.max_connections:
            hog = self._load.most > 1 and peer in self._load.largest()
            oldest = None if hog else self._longest_waiting()
            if oldest is None:
                # the peer holding the most gets no more (its own reconnects are the
                # cheapest to refuse), nor anyone while all have a request in progress
                self.rejected += 1
                self._warn(
                    "refusing HTTP connections: %d open (max_connections); %d refused so "
                    "far, the last from %s",
                    len(self._open),
                    self.rejected,
                    peer,
                )
                return None
            self._close(oldest)
            self.evicted += 1
            self._warn(
                "HTTP connections at max_connections (%d): closing the one that waited "
                "longest for a request to make room for each new one (%d so far)",
                self.max_connections,
                self.evicted,
            )
        now = self._clock()
        conn = _Conn(transport, now + self.request_timeout, now, peer)
        self._open[id(conn)] = conn
        self._by_transport[id(transport)] = conn
        self._load.add(conn.peer)
        self._wait(conn, self._fresh)
        return conn

    def _wait(self, conn: _Conn, queue: OrderedDict[int, _Conn]) -> None:
        queue[id(conn)] = conn
        self._peer_waiting.setdefault(conn.peer, OrderedDict())[id(conn)] = conn

    def _unwait(self, conn: _Conn) -> None:
        self._fresh.pop(id(conn), None)
        self._kept.pop(id(conn), None)
        waiting = self._peer_waiting.get(conn.peer)
        if waiting is not None:
            waiting.pop(id(conn), None)
            if not waiting:
                del self._peer_waiting[conn.peer]

    def _longest_waiting(self) -> _Conn | None:
        """The connection to close for a new one: the one that has waited longest for a
        request among those of the peer holding the most connections, where that is more
        than one (a flood's, never a scraper's one or two); else the one that has waited
        longest of all (a new connection is the youngest, so a scrape's is the last)."""
        if self._load.most > 1:
            for peer in self._load.largest():
                waiting = self._peer_waiting.get(peer)
                if waiting:
                    return next(iter(waiting.values()))
        heads = [next(iter(q.values())) for q in (self._fresh, self._kept) if q]
        return min(heads, key=lambda c: c.waiting_since, default=None)

    def _closed(self, conn: _Conn) -> None:
        if self._open.pop(id(conn), None) is None:
            return  # closed already (evicted or swept, then its connection_lost)
        self._unwait(conn)
        self._load.remove(conn.peer)
        if conn.transport is not None:
            self._by_transport.pop(id(conn.transport), None)
        conn.transport = None

    def _close(self, conn: _Conn) -> None:
        if conn.transport is not None:
            conn.transport.abort()
        self._closed(conn)

    def sweep(self) -> int:
        """Close every connection past its deadline; returns how many."""
        now = self._clock()
        late = 0
        for waiting in (self._fresh, self._kept):
            while waiting:
                _, conn = next(iter(waiting.items()))
                if conn.deadline >= now:
                    break
                self._close(conn)
                late += 1
        if late:
            self.timed_out += late
            self._warn(
                "closed %d HTTP connection(s) that sent no complete request in %g s "
                "(%d so far)",
                late,
                self.request_timeout,
                self.timed_out,
            )
        return late

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.sweep()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks a request's start and end: while its handler runs the connection has no
        deadline and is never evicted (the request has arrived, the wait is ours); then
        it may idle for keep-alive and must send its next request within the request
        timeout."""
        transport = request.transport
        conn = self._by_transport.get(id(transport)) if transport is not None else None
        if conn is not None:
            conn.deadline = conn.waiting_since = float("inf")
            self._unwait(conn)
        try:
            return await handler(request)
        finally:
            if conn is not None and conn.transport is not None:
                conn.waiting_since = self._clock()
                conn.deadline = conn.waiting_since + self.keepalive_timeout + self.request_timeout
                self._wait(conn, self._kept)


def defer_accept(sock: socket.socket, seconds: float) -> None:
    """Have the kernel hand a connection to ``accept`` only once its first bytes arrive
    (Linux ``TCP_DEFER_ACCEPT``, nginx's ``deferred``), for up to ``seconds``: a silent
    connection waits in the kernel's queue of half-open ones (no file descriptor, no
    slot under max_connections) and reaches the server only when that time is up."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds)))


def listen_backlog() -> int:
    """The kernel's ``somaxconn``, the backlog Go's ``net.Listen`` asks for: with
    asyncio's 100 a peer reconnecting as fast as its connections are closed fills the
    accept queue, and a scrape's SYN is dropped and retried a second later."""
    try:
        return max(128, int(Path("/proc/sys/net/core/somaxconn").read_text()))
    except (OSError, ValueError):
        return 1024


def raise_file_limit(max_connections: int) -> None:
    """Raise the soft open-file limit to the hard one, as Go does at start (a server with
    ``max_connections`` open must not fail ``accept`` first); warn once when even the
    hard limit leaves less than :data:`FD_HEADROOM` above ``max_connections``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < max_connections + FD_HEADROOM:
        log.warning(
            "open-file limit %d is close to max_connections %d: connections past %d fail "
            "at accept and scrapes wait; raise the limit (LimitNOFILE=, ulimit -n) or lower "
            "max_connections",
            soft,
            max_connections,
            max(soft - FD_HEADROOM, 0),
        )


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """The guard's (and basic auth's) counters at one pass."""

    open: int
    rejected: int
    evicted: int
    timed_out: int
    max_connections: int
    auth_answers: tuple[tuple[str, int], ...] = ()
    auth_checks: tuple[tuple[str, int], ...] = ()


class HttpSource(Source[ConnectionCounts]):
    """The HTTP server's connections (and basic auth, when configured) as a source: read
    on the sampler thread (plain integer reads of the loop's counters), served as
    ``stepscope_http_*``."""

    key: PartKey[ConnectionCounts] = PartKey("http")

    def __init__(self, guard: ConnectionGuard, auth: BasicAuth | None = None) -> None:
        self._guard = guard
        self._auth = auth

    def read(self, ctx: ReadContext) -> ConnectionCounts:
        g, auth = self._guard, self._auth
        return ConnectionCounts(
            g.open_connections,
            g.rejected,
            g.evicted,
            g.timed_out,
            g.max_connections,
            tuple((r, auth.answers[r]) for r in RESULTS) if auth else (),
            tuple((lane, auth.checks[lane]) for lane in LANES) if auth else (),
        )

    def families(self, part: ConnectionCounts, labels: LabelSchema) -> Iterable[Family]:
        families = [
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
                "HTTP connections closed at accept because max_connections were open: "
                "from the peer holding the most, or while all had a request in progress.",
                float(part.rejected),
            ),
            Family.single(
                "stepscope_http_connections_evicted_total",
                COUNTER,
                "HTTP connections closed to make room at max_connections: the one that "
                "had waited longest for a request (silent, slow-header, or idle).",
                float(part.evicted),
            ),
            Family.single(
                "stepscope_http_connections_timed_out_total",
                COUNTER,
                "HTTP connections closed for sending no complete request within "
                "http_request_timeout (silent or slow-header clients).",
                float(part.timed_out),
            ),
        ]
        if part.auth_answers:
            answers = Family(
                "stepscope_http_basic_auth_requests_total",
                COUNTER,
                "Requests basic auth answered, by result: accepted, rejected (401), "
                "throttled (429: the client's or the lane's password checks were full).",
            )
            for result, n in part.auth_answers:
                answers.add(label_string([("result", result)]), float(n))
            checks = Family(
                "stepscope_http_basic_auth_checks_total",
                COUNTER,
                "bcrypt checks run, by lane: cheap (configured users, cost 10 or less), "
                "costly (above 10), unknown (unknown users, against the dummy hash).",
            )
            for lane, n in part.auth_checks:
                checks.add(label_string([("lane", lane)]), float(n))
            families += [answers, checks]
        return families
