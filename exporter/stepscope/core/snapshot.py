"""The Snapshot: everything the exporter knows at one instant, immutable.

It holds each source's part by the source's name, each source's health and the pass's
label schema; analyses (the diagnosis) ride beside it in :class:`Published`, with the
bytes rendered once for ``/metrics`` (text or protobuf, each also gzipped). The sampler
builds one per pass and swaps a reference; everything that serves reads the latest one.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from stepscope.core.exposition import Family, render
from stepscope.core.exposition_proto import render_protobuf
from stepscope.core.labels import LabelSchema
from stepscope.core.source import PartKey, SourceHealth

T = TypeVar("T")

# the memo keys of the /metrics exposition, of its gzip form, and of the protobuf
# exposition (and its gzip form) a Prometheus with native histograms asks for
BODY = "body"
GZIP = "gzip"
PROTOBUF = "protobuf"
PROTOBUF_GZIP = "protobuf-gzip"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One sampling pass.

    ``timestamp`` is wall-clock time (served), ``monotonic`` the monotonic time used for
    staleness and windows. ``parts`` holds each source's latest part by name (a source
    that has nothing to report has none); ``evidence`` its lines for the diagnosis.
    """

    timestamp: float
    monotonic: float
    hostname: str
    interval: float
    slow_interval: float
    labels: LabelSchema
    parts: Mapping[str, object] = field(default_factory=dict)
    health: Mapping[str, SourceHealth] = field(default_factory=dict)
    evidence: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    collect_duration_seconds: float = 0.0

    def part(self, key: PartKey[T]) -> T | None:
        """The part of the source named by ``key``, or None."""
        return cast("T | None", self.parts.get(key.name))

    def age(self, now_monotonic: float) -> float:
        """Seconds since this snapshot was taken."""
        return now_monotonic - self.monotonic


class Published:
    """A snapshot, its analyses' results and its exposition, rendered at most once,
    served many times. The exposition is rendered when first asked for, unless the
    sampler rendered it ahead (for a pass it expects a scraper to read: its
    ``ReadForecast`` learns from ``read_at``); the gzip form likewise, and the protobuf
    form (a Prometheus with native histograms on) the same way. Other renderings
    (JSON, the status page) are made on the first request that asks for them and kept
    for the life of this snapshot.

    ``families`` makes the pass's metric families; each format writes them once. The
    list is not kept between formats (at 512 ranks, ~20,000 samples held for a whole
    interval): a snapshot read in both text and protobuf builds it twice.
    """

    __slots__ = (
        "_clock", "_families", "_lock", "_memo", "_read", "gzip_requested",
        "protobuf_requested", "read_at", "results", "snapshot",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        results: Mapping[str, object],
        families: Callable[[], Sequence[Family]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.snapshot = snapshot
        self.results = results
        self._memo: dict[object, Any] = {}
        self._lock = threading.RLock()  # a rendering may need another (gzip: the body)
        self._clock = clock
        # when the exposition was first asked for (the sampler's rendering ahead is not
        # asking): the sampler learns from it when the next scrape will come
        self.read_at: float | None = None
        self._read = threading.Event()
        self.gzip_requested = False
        self.protobuf_requested = False
        self._families = families

    @property
    def requested(self) -> bool:
        """Whether anyone asked for the exposition (or its gzip form)."""
        return self.read_at is not None

    def _asked(self) -> None:
        if self.read_at is None:
            self.read_at = self._clock()
            self._read.set()

    def wait_read(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the exposition to be asked for; whether it was."""
        return self._read.wait(timeout)

    @property
    def body(self) -> bytes:
        """The ``/metrics`` exposition (rendered now if nobody has yet)."""
        self._asked()
        return self.render()

    def render(self) -> bytes:
        """The exposition, rendered once; does not count as a request."""
        return self.memo(BODY, lambda: render(self._families()))

    def has(self, key: object) -> bool:
        """Whether the rendering ``key`` (:data:`BODY`, :data:`GZIP`, a page's) exists."""
        return key in self._memo

    def result(self, name: str, kind: type[T]) -> T | None:
        """The result of the analysis ``name`` if it is a ``kind``, else None."""
        value = self.results.get(name)
        return value if isinstance(value, kind) else None

    def memo(self, key: object, make: Callable[[], T]) -> T:
        """``make()`` once per snapshot for ``key``; later calls return the same object."""
        try:
            return cast(T, self._memo[key])
        except KeyError:
            pass
        with self._lock:  # requests run on one loop; the lock guards thread-pool callers
            if key not in self._memo:
                self._memo[key] = make()
            return cast(T, self._memo[key])

    def gzipped(self) -> bytes:
        """The body gzip-compressed (level 1: the text compresses ~10x anyway)."""
        self._asked()
        self.gzip_requested = True
        return self.render_gzip()

    def render_gzip(self) -> bytes:
        """The gzip form, made once; does not count as a request."""
        return self.memo(GZIP, lambda: gzip.compress(self.render(), compresslevel=1, mtime=0))

    def protobuf(self, gzipped: bool = False) -> bytes:
        """The protobuf exposition (delimited MetricFamily messages; ``gzipped``: its
        gzip form), rendered now if nobody has yet."""
        self._asked()
        self.protobuf_requested = True
        if gzipped:
            self.gzip_requested = True
        return self.render_protobuf(gzipped)

    def render_protobuf(self, gzipped: bool = False) -> bytes:
        """The protobuf exposition (or its gzip form), made once; not a request."""
        if gzipped:
            return self.memo(
                PROTOBUF_GZIP,
                lambda: gzip.compress(self.render_protobuf(), compresslevel=1, mtime=0),
            )
        return self.memo(PROTOBUF, lambda: render_protobuf(self._families()))

    def render_ahead(self, gzipped: bool, protobuf: bool = False) -> None:
        """Make the exposition now, on the caller's thread (``gzipped``: its gzip form
        too; ``protobuf``: the protobuf form instead), so the scrape expected for this
        snapshot finds its bytes ready."""
        if protobuf:
            self.render_protobuf(gzipped)
        elif gzipped:
            self.render_gzip()
        else:
            self.render()
