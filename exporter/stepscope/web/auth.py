"""Basic auth for ``--web-config``: bcrypt off the event loop, in threads of its own.

An unknown user costs a check against exporter-toolkit's fixed cost-10 dummy hash, so
timing does not tell which users of the usual cost exist and an unknown user is never
more expensive than a cost-10 check; recent results are cached, as exporter-toolkit does.
Checks against costlier hashes (cost 18 is ~15 s of CPU) run in a lane of their own, so
they neither delay cheap checks nor are cut by the connection's request timeout (the
guard times a request's arrival, not its handler: see :mod:`stepscope.web.guard`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

log = logging.getLogger(__name__)

# bcrypt at cost 10 is ~60 ms of CPU; exporter-toolkit runs one check at a time. One
# thread per lane keeps a wrong-password flood to at most two cores of a training node.
BCRYPT_WORKERS = 1
# Distinct checks queued or running in one lane before further unknown credentials for
# it get 429: a flood cannot build an unbounded queue of requests waiting for bcrypt.
MAX_PENDING_CHECKS = 8
# exporter-toolkit's dummy (web/handler.go): the bcrypt hash of "fakepassword", cost 10.
# An unknown user is checked against it whatever the table's costs.
DUMMY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
# Hashes up to this cost share the dummy's lane; costlier ones (~0.2 s at 12, ~15 s at
# 18 on one core) get their own, so a slow check never queues a cheap one.
CHEAP_COST = 10
# Results remembered (each way), as exporter-toolkit's cache of 100.
AUTH_CACHE_SIZE = 100
_BCRYPT_MAX_PASSWORD = 72  # bcrypt reads no further; Go and htpasswd truncate here too


class BasicAuth:
    """HTTP basic auth against bcrypt hashes, never on the event loop.

    Checks run in a pool of ``workers`` threads of its own (bcrypt releases the GIL),
    so a wrong-password flood costs those threads, not scrapes; with
    ``max_pending`` distinct checks queued or running, further new credentials get 429
    at once. An unknown user is checked against a fixed cost-10 dummy hash
    (:data:`DUMMY_HASH`), as exporter-toolkit does; hashes above cost 10 are checked in
    a second lane with its own thread and bound, so a cost-18 check (~15 s) delays no
    cheap one. The last ``cache_size`` accepted and rejected
    credentials are remembered under a keyed hash (no passwords kept), so a scraper's
    repeated scrape costs no bcrypt and a flood of rejects cannot evict it. ``verify``
    is ``bcrypt.checkpw``'s signature (tests pass a recording one).
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        workers: int = BCRYPT_WORKERS,
        max_pending: int = MAX_PENDING_CHECKS,
        cache_size: int = AUTH_CACHE_SIZE,
        verify: Callable[[bytes, bytes], bool] | None = None,
    ) -> None:
        import bcrypt

        self._users = {name.encode(): hashed for name, hashed in users.items()}
        self.dummy_hash = DUMMY_HASH
        self._verify = verify or bcrypt.checkpw
        self._lanes = {
            lane: ThreadPoolExecutor(workers, thread_name_prefix=f"stepscope-auth-{lane}")
            for lane in ("cheap", "costly")
        }
        self._pending = {lane: 0 for lane in self._lanes}
        self._max_pending = max_pending
        self._cache_size = cache_size
        self._secret = os.urandom(32)
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._rejected: OrderedDict[bytes, None] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[bool]] = {}
        self._busy_logged = 0.0

    async def check(self, authorization: str | None) -> bool | None:
        """Whether an ``Authorization`` header names a user and their password; None
        when too many checks are pending to start another."""
        parsed = _parse_basic(authorization)
        if parsed is None:
            return False
        user, password = parsed
        hashed = self._users.get(user)
        target = hashed if hashed is not None else self.dummy_hash
        key = self._cache_key(user, target, password)
        if key in self._accepted:
            self._accepted.move_to_end(key)
            return True
        if key in self._rejected:
            return False
        future = self._inflight.get(key)
        if future is None:
            lane = "cheap" if _cost(target) <= CHEAP_COST else "costly"
            if self._pending[lane] >= self._max_pending:
                self._log_busy(lane)
                return None
            future = asyncio.get_running_loop().run_in_executor(
                self._lanes[lane], self._check, password, target
            )
            self._inflight[key] = future
            self._pending[lane] += 1
            future.add_done_callback(partial(self._settle, key, lane, hashed is not None))
        # shielded: a client hanging up must not cancel a check others wait on
        return await asyncio.shield(future) and hashed is not None

    def _check(self, password: bytes, hashed: bytes) -> bool:
        try:
            return self._verify(password[:_BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            return False

    def _settle(self, key: bytes, lane: str, known: bool, future: asyncio.Future[bool]) -> None:
        del self._inflight[key]
        self._pending[lane] -= 1
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

    def _log_busy(self, lane: str) -> None:
        now = time.monotonic()
        if now - self._busy_logged >= 60.0:
            self._busy_logged = now
            log.warning(
                "basic auth: %d password checks pending (%s hashes), answering 429 to new "
                "credentials (a wrong-password flood?); scrapes with cached credentials "
                "are unaffected",
                self._pending[lane],
                "cost 10 or less" if lane == "cheap" else "cost above 10",
            )

    @property
    def middleware(self) -> Middleware:
        """The aiohttp middleware: 401 with a challenge, 429 when checks are saturated."""

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            ok = await self.check(request.headers.get("Authorization"))
            if ok:
                return await handler(request)
            if ok is None:
                return web.Response(
                    status=429,
                    text="Too many authentication attempts in progress\n",
                    headers={"Retry-After": "1"},
                )
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
