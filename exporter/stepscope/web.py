"""The HTTP side: serves the latest rendered Snapshot, never calls a source.

Routes: ``/metrics`` (text exposition, gzip when asked), ``/`` (landing page),
``/healthz`` (the process answers) and ``/readyz`` (a snapshot newer than three
intervals exists).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from stepscope.diagnose.api import diagnosis_document
from stepscope.diagnose.page import render_status_page
from stepscope.exposition import CONTENT_TYPE
from stepscope.snapshot import RenderedSnapshot

STALE_INTERVALS = 3.0


class SnapshotSource(Protocol):
    """Anything that holds the latest rendered snapshot (the Sampler)."""

    @property
    def latest(self) -> RenderedSnapshot | None: ...


def _accepts_gzip(request: web.Request) -> bool:
    for part in request.headers.get("Accept-Encoding", "").split(","):
        token, _, params = part.strip().partition(";")
        if token.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def readiness(latest: RenderedSnapshot | None, now: float) -> tuple[bool, str]:
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
) -> web.Application:
    """The aiohttp application serving ``source``'s snapshots."""

    async def metrics(request: web.Request) -> web.Response:
        latest = source.latest
        if latest is None:
            return web.Response(status=503, text="no snapshot yet\n")
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if _accepts_gzip(request):
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=latest.gzipped(), headers=headers)
        return web.Response(body=latest.body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ok, reason = readiness(source.latest, clock())
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def index(request: web.Request) -> web.Response:
        latest = source.latest
        _, reason = readiness(latest, clock())
        page = render_status_page(latest.snapshot if latest else None, reason)
        return web.Response(text=page, content_type="text/html")

    async def diagnosis(request: web.Request) -> web.Response:
        latest = source.latest
        return web.json_response(diagnosis_document(latest.snapshot if latest else None))

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/diagnosis", diagnosis)
    return app
