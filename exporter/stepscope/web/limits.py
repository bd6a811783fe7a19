"""``--web-config``'s rate limit and response headers, as aiohttp middlewares."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware


class TokenBucket:
    """Go's rate.Limiter.Allow: ``burst`` tokens, one more every ``interval`` s."""

    def __init__(
        self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        """Take a token if one is there."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def rate_limit_middleware(bucket: TokenBucket) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if bucket.allow():
            return await handler(request)
        return web.Response(status=429, text="Too Many Requests\n")

    return middleware


def response_headers_middleware(headers: Mapping[str, str]) -> Middleware:
    """Add the configured headers to every response, errors included; as in
    exporter-toolkit (which sets them before the handler runs) a header the handler
    set itself wins."""

    def add(target: Any) -> None:
        for name, value in headers.items():
            if name not in target:
                target[name] = value

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            add(exc.headers)
            raise
        if not response.prepared:  # a streamed response has sent its headers already
            add(response.headers)
        return response

    return middleware
