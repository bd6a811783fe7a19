"""What an exporter runs: its sources and the analyses over each finished Snapshot.

Sources (:mod:`stepscope.core.source`) fill the Snapshot; an :class:`Analysis` reads the
finished one (the diagnosis). The :class:`Registry` keeps both in order, names unique.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from stepscope.core.exposition import Family
from stepscope.core.snapshot import Snapshot
from stepscope.core.source import Source

T = TypeVar("T")
R = TypeVar("R")


class Analysis(Generic[R]):
    """A stage over the finished Snapshot (the diagnosis): its result rides beside it.

    It may keep state across passes (a window of Snapshots); it runs on the sampler
    thread after the reads, wrapped like a source (timed, isolated, health served).
    A costly one may skip passes nobody is expected to read: :meth:`reuse_for` says for
    how long its last result may stand in, and :meth:`observe` then keeps its state.
    """

    name: str

    def run(self, snapshot: Snapshot) -> R:
        """The result for ``snapshot`` (the newest of the passes seen so far)."""
        raise NotImplementedError

    def observe(self, snapshot: Snapshot) -> None:
        """Keep what must see every pass, on a pass whose result is not made."""

    def reuse_for(self, snapshot: Snapshot) -> float:
        """Seconds the last result may stand in for passes nobody is expected to read
        (0: made every pass, the default)."""
        return 0.0

    def families(self, result: R, snapshot: Snapshot) -> Iterable[Family]:
        """The metric families of ``result``."""
        return ()


@dataclass
class Registry:
    """Every source and analysis of an exporter, in reading order; names are unique."""

    sources: list[Source[object]] = field(default_factory=list)
    analyses: list[Analysis[object]] = field(default_factory=list)

    def register(self, source: Source[T]) -> Source[T]:
        """Add a source (read after those registered before it). Returns it."""
        self._check(source.name)
        self.sources.append(source)  # type: ignore[arg-type]
        return source

    def register_analysis(self, analysis: Analysis[R]) -> Analysis[R]:
        """Add an analysis (run after every source, in registration order). Returns it."""
        self._check(analysis.name)
        self.analyses.append(analysis)  # type: ignore[arg-type]
        return analysis

    def _check(self, name: str) -> None:
        if not name or not name.replace("_", "").isalnum():
            raise ValueError(f"source name {name!r}: use letters, digits and _")
        if name in self.names():
            raise ValueError(f"a source named {name!r} is already registered")

    def names(self) -> Iterator[str]:
        """Every registered name."""
        yield from (s.name for s in self.sources)
        yield from (a.name for a in self.analyses)
