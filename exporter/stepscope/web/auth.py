"""Basic auth for ``--web-config``: bcrypt off the event loop, in threads of its own.

The scraper always gets in. Its repeated scrapes cost no bcrypt (accepted credentials
are cached under a keyed hash, as exporter-toolkit caches them), and its first check
after a restart is never queued behind a stranger's:

- a configured user's check runs in a lane of its own (hashes up to cost 10; costlier
  ones, ~15 s at cost 18, in a second), bounded per lane and per peer
  (:mod:`stepscope.web.peers`: an address, or on this host the uid that owns the
  connecting socket): one peer may have two checks pending, so a flood of wrong
  passwords for a user name it knows costs a stranger its own budget, not the scraper's;
- an unknown user is checked against exporter-toolkit's fixed cost-10 dummy hash in a
  third lane, never in a configured user's: it is answered when a cost-10 check arriving
  then would be (behind the checks queued in the cost-10 lane), and answered 429 when a
  cost-10 user would be (its peer's budget spent, or that lane full), so neither its
  timing nor its status tells which names exist. One dummy check runs at a time; an
  unknown user arriving meanwhile waits as long as the last one took, at no CPU.

The connection's request timeout does not cut a check (the guard times a request's
arrival, not its handler: see :mod:`stepscope.web.guard`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from stepscope.web.peers import peer_key

log = logging.getLogger(__name__)

# bcrypt at cost 10 is ~60 ms of CPU; exporter-toolkit runs one check at a time. One
# thread per lane keeps a wrong-password flood to at most three cores of a training node.
BCRYPT_WORKERS = 1
# Distinct checks of configured users queued or running in one lane before further new
# credentials get 429: a flood cannot build an unbounded queue waiting for bcrypt, and
# the scraper's first check waits behind at most this many (~1 s at cost 10).
MAX_PENDING_CHECKS = 16
# Checks of configured users one peer may have queued or running: a stranger who knows
# a user name fills its own budget, never the lane (that takes 8 peers).
PEER_PENDING_CHECKS = 2
# exporter-toolkit's dummy (web/handler.go): the bcrypt hash of "fakepassword", cost 10.
# An unknown user is checked against it whatever the table's costs.
DUMMY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
# Hashes up to this cost share a lane (the one an unknown user is timed against);
# costlier ones (~0.2 s at 12, ~15 s at 18 on one core) get their own, so a slow check
# never queues a cheap one.
CHEAP_COST = 10
# Results remembered (each way), as exporter-toolkit's cache of 100.
AUTH_CACHE_SIZE = 100
_BCRYPT_MAX_PASSWORD = 72  # bcrypt reads no further; Go and htpasswd truncate here too
_DUMMY_SECONDS = 0.06  # a cost-10 check on one core, until the first dummy check is timed
LANES = ("cheap", "costly", "unknown")
RESULTS = ("accepted", "rejected", "throttled")


class BasicAuth:
    """HTTP basic auth against bcrypt hashes, never on the event loop.

    Checks run in pools of ``workers`` threads of their own (bcrypt releases the GIL):
    configured users' hashes of cost 10 or less in one lane, costlier ones in another,
    unknown users (against :data:`DUMMY_HASH`) in a third. A configured user's new
    credentials get 429 at once when their lane has ``max_pending`` distinct checks
    queued or running, or their peer ``peer_pending``; an unknown user's get 429 in the
    same cases (as a cost-10 user's would) and are otherwise answered 401 when a
    cost-10 check arriving with them would be. The last ``cache_size`` accepted and
    rejected credentials are remembered under a keyed hash (no passwords kept), so a
    scraper's repeated scrape costs no bcrypt and a flood of rejects cannot evict it.
    ``verify`` is ``bcrypt.checkpw``'s signature (tests pass a recording one).
    ``answers`` counts requests by result, ``checks`` bcrypt checks by lane.
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        workers: int = BCRYPT_WORKERS,
        max_pending: int = MAX_PENDING_CHECKS,
        peer_pending: int = PEER_PENDING_CHECKS,
        cache_size: int = AUTH_CACHE_SIZE,
        verify: Callable[[bytes, bytes], bool] | None = None,
    ) -> None:
        import bcrypt

        self._users = {name.encode(): hashed for name, hashed in users.items()}
        self.dummy_hash = DUMMY_HASH
        self._verify = verify or bcrypt.checkpw
        self._lanes = {
            lane: ThreadPoolExecutor(workers, thread_name_prefix=f"stepscope-auth-{lane}")
            for lane in LANES
        }
        self._pending = {lane: 0 for lane in LANES}
        self._max_pending = max_pending
        self._peer_pending: Counter[str] = Counter()
        self._max_peer_pending = peer_pending
        self._tail: dict[str, asyncio.Future[bool]] = {}  # the last check queued per lane
        self._dummy_seconds = _DUMMY_SECONDS
        self._cache_size = cache_size
        self._secret = os.urandom(32)
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._rejected: OrderedDict[bytes, None] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[bool]] = {}
        self._busy_logged: dict[str, float] = {}
        self.answers: Counter[str] = Counter()
        self.checks: Counter[str] = Counter()

    async def check(
        self, authorization: str | None, peer: Callable[[], str] = lambda: "unknown"
    ) -> bool | None:
        """Whether an ``Authorization`` header names a user and their password; None
        when too many checks are pending to start another. ``peer`` names the client
        (:func:`~stepscope.web.peers.peer_key`); it is asked only when a check is due."""
        parsed = _parse_basic(authorization)
        if parsed is None:
            return False
        user, password = parsed
        hashed = self._users.get(user)
        key = self._cache_key(user, hashed or self.dummy_hash, password)
        if key in self._accepted:
            self._accepted.move_to_end(key)
            return True
        if key in self._rejected:
            return False
        future = self._inflight.get(key)
        if future is None:
            who = peer()
            lane = "cheap" if hashed is None or _cost(hashed) <= CHEAP_COST else "costly"
            if self._peer_pending[who] >= self._max_peer_pending:
                self._log_busy("peer", who)
                return None
            if self._pending[lane] >= self._max_pending:
                self._log_busy(lane, who)
                return None
            if hashed is None:
                future = asyncio.ensure_future(self._unknown(password))
                future.add_done_callback(partial(self._settle, key, None, "", False))
            else:
                future = asyncio.get_running_loop().run_in_executor(
                    self._lanes[lane], self._check, password, hashed
                )
                self.checks[lane] += 1
                self._tail[lane] = future
                self._pending[lane] += 1
                self._peer_pending[who] += 1
                future.add_done_callback(partial(self._settle, key, lane, who, True))
            self._inflight[key] = future
        # shielded: a client hanging up must not cancel a check others wait on
        return await asyncio.shield(future) and hashed is not None

    async def _unknown(self, password: bytes) -> bool:
        """Answer an unknown user as late as a cost-10 user arriving now: behind the
        checks queued in the cost-10 lane, then one check's time (the dummy's, or, while
        a dummy check runs, as long as the last one took)."""
        tail = self._tail.get("cheap")
        if tail is not None and not tail.done():
            await asyncio.wait([tail])
        if self._pending["unknown"]:
            await asyncio.sleep(self._dummy_seconds)
            return False
        self._pending["unknown"] += 1
        self.checks["unknown"] += 1
        timed = asyncio.get_running_loop().run_in_executor(
            self._lanes["unknown"], self._timed_check, password, self.dummy_hash
        )
        timed.add_done_callback(self._dummy_done)
        await asyncio.shield(timed)
        return False

    def _dummy_done(self, future: asyncio.Future[float]) -> None:
        self._pending["unknown"] -= 1
        if not future.cancelled() and future.exception() is None:
            self._dummy_seconds = future.result()

    def _timed_check(self, password: bytes, hashed: bytes) -> float:
        start = time.perf_counter()
        self._check(password, hashed)
        return time.perf_counter() - start

    def _check(self, password: bytes, hashed: bytes) -> bool:
        try:
            return self._verify(password[:_BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            return False

    def _settle(
        self, key: bytes, lane: str | None, who: str, known: bool, future: asyncio.Future[bool]
    ) -> None:
        del self._inflight[key]
        if lane is not None:
            self._pending[lane] -= 1
            self._peer_pending[who] -= 1
            if not self._peer_pending[who]:
                del self._peer_pending[who]
            if self._tail.get(lane) is future:
                del self._tail[lane]
        if future.cancelled() or future.exception() is not None:
            return
        cache = self._accepted if future.result() and known else self._rejected
        cache[key] = None
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    def _cache_key(self, user: bytes, hashed: bytes, password: bytes) -> bytes:
        h = hashlib.blake2b(key=self._secret, digest_size=32)
        for part in (user, hashed, password):
            h.update(len(part).to_bytes(4, "big") + part)
        return h.digest()

    def _log_busy(self, why: str, who: str) -> None:
        now = time.monotonic()
        if now - self._busy_logged.get(why, -60.0) < 60.0:
            return  # one line a minute per reason, however many requests
        self._busy_logged[why] = now
        if why == "peer":
            log.warning(
                "basic auth: a client (%s) has %d password checks pending, answering 429 "
                "to its new credentials (a wrong-password flood?); other clients and "
                "cached credentials are unaffected",
                who,
                self._max_peer_pending,
            )
        else:
            log.warning(
                "basic auth: %d password checks pending (%s hashes), answering 429 to new "
                "credentials (a wrong-password flood from many clients?); scrapes with "
                "cached credentials are unaffected",
                self._pending[why],
                "cost 10 or less" if why == "cheap" else "cost above 10",
            )

    @property
    def middleware(self) -> Middleware:
        """The aiohttp middleware: 401 with a challenge, 429 when checks are saturated."""

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            ok = await self.check(
                request.headers.get("Authorization"), lambda: peer_key(request.transport)
            )
            if ok:
                self.answers["accepted"] += 1
                return await handler(request)
            if ok is None:
                self.answers["throttled"] += 1
                return web.Response(
                    status=429,
                    text="Too many authentication attempts in progress\n",
                    headers={"Retry-After": "1"},
                )
            self.answers["rejected"] += 1
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="stepscope"'},
            )

        return middleware


def _cost(hashed: bytes) -> int:
    """A bcrypt hash's cost ("$2y$10$..." -> 10); hashes are validated at load."""
    return int(hashed[4:6])


def _parse_basic(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) bytes from ``Basic <base64>``, as Go's Request.BasicAuth."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = raw.partition(b":")
    return (user, password) if colon else None
