"""The HTTP side: serves the latest published Snapshot, never calls a source.

Routes: ``/metrics`` (text exposition, or the protobuf one when the scraper prefers it
(:func:`wants_protobuf`), gzip when asked), ``/healthz`` (the process
answers), ``/readyz`` (a snapshot newer than three intervals exists), and the pages a
domain package adds (the diagnosis adds ``/`` and ``/api/v1/diagnosis``). A page is
rendered at most once per snapshot (and readiness): many clients cost one rendering.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from stepscope.core import exposition_proto
from stepscope.core.exposition import CONTENT_TYPE
from stepscope.core.snapshot import BODY, GZIP, PROTOBUF, PROTOBUF_GZIP, Published

T = TypeVar("T")

STALE_INTERVALS = 3.0

# Every response: never sniffed into another type. Pages also: nothing framed, loaded or
# run from anywhere (the status page is self-contained: inline CSS, no scripts).
NOSNIFF = {"X-Content-Type-Options": "nosniff"}
PAGE_SECURITY = {
    **NOSNIFF,
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class SnapshotSource(Protocol):
    """Anything that holds the latest published snapshot (the Sampler)."""

    @property
    def latest(self) -> Published | None: ...


@dataclass(frozen=True)
class Page:
    """A route rendered from the latest snapshot: ``render(latest, readiness)`` returns
    the body; it runs once per snapshot and readiness state (ready or stale), whatever
    the request rate."""

    content_type: str
    render: Callable[[Published | None, str], bytes]


async def _off_loop(latest: Published, key: object, make: Callable[[], T]) -> T:
    """``make()``: at once when the rendering ``key`` of ``latest`` exists, else on a
    worker thread, so a large rendering (hundreds of ranks: tens of ms) holds up no other
    request on the loop. Concurrent requests for the same rendering make it once."""
    if latest.has(key):
        return make()
    return await asyncio.get_running_loop().run_in_executor(None, make)


def _accepts_gzip(request: web.Request) -> bool:
    for part in request.headers.get("Accept-Encoding", "").split(","):
        token, _, params = part.strip().partition(";")
        if token.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _media_ranges(accept: str) -> list[tuple[str, dict[str, str]]]:
    """An Accept header's media ranges, most preferred first: by q-value, then exact
    types before ``type/*`` before ``*/*`` (ties keep their order); q=0 ranges, which
    refuse a type, are left out."""
    ranges: list[tuple[float, int, str, dict[str, str]]] = []
    for part in accept.split(","):
        media, *params = part.split(";")
        kind = media.strip().lower()
        if not kind:
            continue
        q = 1.0
        named: dict[str, str] = {}
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            else:
                named[key] = value
        if q > 0:
            precision = 0 if kind == "*/*" else 1 if kind.endswith("/*") else 2
            ranges.append((-q, -precision, kind, named))
    ranges.sort(key=lambda r: (r[0], r[1]))
    return [(kind, named) for _, _, kind, named in ranges]


def wants_protobuf(accept: str) -> bool:
    """Whether the scraper prefers the protobuf exposition, as client_golang's
    ``expfmt.Negotiate`` decides: the first acceptable range that names a format served
    here wins; delimited MetricFamily messages and text 0.0.4 are served (the protobuf
    text encodings and OpenMetrics are not, so they never win); anything else, ``*/*``
    or no header, is text."""
    for kind, params in _media_ranges(accept):
        if (
            kind == "application/vnd.google.protobuf"
            and params.get("proto") == "io.prometheus.client.MetricFamily"
            and params.get("encoding") == "delimited"
        ):
            return True
        if kind == "text/plain" and params.get("version", "0.0.4") == "0.0.4":
            return False
    return False


def readiness(latest: Published | None, now: float) -> tuple[bool, str]:
    """Whether a fresh snapshot exists, and a one-line reason."""
    if latest is None:
        return False, "no snapshot yet: the first sampling pass has not completed"
    snap = latest.snapshot
    age = snap.age(now)
    limit = STALE_INTERVALS * snap.interval
    if age > limit:
        return False, f"stale: last snapshot is {age:.1f} s old (limit {limit:.1f} s)"
    return True, f"ok: last snapshot {age:.1f} s old"


def make_app(
    source: SnapshotSource,
    clock: Callable[[], float] = time.monotonic,
    middlewares: tuple[Middleware, ...] = (),
    pages: Mapping[str, Page] | None = None,
) -> web.Application:
    """The aiohttp application serving ``source``'s snapshots and ``pages``."""

    async def metrics(request: web.Request) -> web.Response:
        latest = source.latest
        if latest is None:
            return web.Response(status=503, text="no snapshot yet\n")
        gz = _accepts_gzip(request)
        headers = {"Vary": "Accept, Accept-Encoding", **NOSNIFF}
        if wants_protobuf(request.headers.get("Accept", "")):
            headers["Content-Type"] = exposition_proto.CONTENT_TYPE
            key = PROTOBUF_GZIP if gz else PROTOBUF
            body = await _off_loop(latest, key, lambda: latest.protobuf(gz))
        else:
            headers["Content-Type"] = CONTENT_TYPE
            if gz:
                body = await _off_loop(latest, GZIP, latest.gzipped)
            else:
                body = await _off_loop(latest, BODY, lambda: latest.body)
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ok, reason = readiness(source.latest, clock())
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    def page_handler(path: str, page: Page) -> Callable[[web.Request], object]:
        async def handle(request: web.Request) -> web.Response:
            latest = source.latest
            ok, reason = readiness(latest, clock())
            if latest is None:
                body = page.render(None, reason)
            else:  # once per snapshot and readiness state: a stale page says it once
                key = (path, ok)
                body = await _off_loop(
                    latest, key, lambda: latest.memo(key, lambda: page.render(latest, reason))
                )
            return web.Response(
                body=body, headers={"Content-Type": page.content_type, **PAGE_SECURITY}
            )

        return handle

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    for path, page in (pages or {}).items():
        app.router.add_get(path, page_handler(path, page))  # type: ignore[arg-type]
    return app
