"""One way in for everything the sampler reads: :class:`Source`.

A source has a name (its ``collector`` label and the key of its part in the Snapshot),
a tier (every pass, the slow cadence, or its own interval), ``read()`` returning an
immutable part, and the metric families of that part. Optional hooks let a source
name the node's GPUs or training ranks (for the label schema), attribute extra labels
to GPUs (the enrichment stage) or add evidence lines to the diagnosis. Adding a source
is one file (a subclass) and one registration line (``stepscope/app/sources.py``);
the registry and the analyses over finished Snapshots are in :mod:`stepscope.core.registry`.

The sampler wraps every read the same way: timed, failures isolated (a failing source
costs its own part, never the pass), and served per source as node_exporter does:
``stepscope_collector_success``, ``stepscope_collector_duration_seconds``,
``stepscope_collector_errors_total``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from stepscope.core.exposition import Family
from stepscope.core.labels import GpuIdentity, LabelSchema, Pairs, RankIdentity

T = TypeVar("T")


class Tier(enum.Enum):
    """How often a source (or a GPU field) is read: every pass, or on the slow cadence."""

    FAST = "fast"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class PartKey(Generic[T]):
    """The typed name of a source's part: ``snapshot.part(GPU_PART)`` is a ``GpuPart``."""

    name: str


@dataclass(slots=True)
class ReadContext:
    """What a read may know about the pass: its time, the intervals, and the GPUs and
    ranks named by the sources read before it (registration order).

    ``error()`` counts a partial failure (one GPU getter, one bad file) without failing
    the whole read; it shows in ``stepscope_collector_errors_total``.
    """

    now: float
    interval: float
    slow_interval: float
    gpus: tuple[GpuIdentity, ...] = ()
    ranks: tuple[RankIdentity, ...] = ()
    errors: int = 0

    def error(self, n: int = 1) -> None:
        """Count ``n`` partial failures of this read."""
        self.errors += n


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """A source's last read: whether it succeeded, how long it took, errors so far.

    ``pending``: a background read has not completed yet (served as success 0, with
    the time it has been running as its duration).
    """

    success: bool
    duration_seconds: float
    errors_total: int
    last_error: str = ""
    pending: bool = False


class Source(Generic[T]):
    """Base of every source. Subclasses set ``key`` and implement :meth:`read`.

    ``tier``: ``Tier.FAST`` (every pass), ``Tier.SLOW`` (every ``slow_interval``) or a
    number of seconds (its own interval; ``math.inf``: read once). ``background``: the
    read may block (network, a remote socket), so it runs in its own thread and the pass
    takes its latest part; a pass never waits for it.
    """

    key: PartKey[T]
    tier: Tier | float = Tier.FAST
    background: bool = False

    @property
    def name(self) -> str:
        """The ``collector`` label value and the part's key in the Snapshot."""
        return self.key.name

    def read(self, ctx: ReadContext) -> T | None:
        """Read and return an immutable part (None: nothing to report this time)."""
        raise NotImplementedError

    def families(self, part: T, labels: LabelSchema) -> Iterable[Family]:
        """The metric families of ``part``; labels come from the pass's schema."""
        return ()

    def gpus(self, part: T) -> Sequence[GpuIdentity]:
        """The node's GPUs, if this source is the one that names them."""
        return ()

    def ranks(self, part: T) -> Sequence[RankIdentity]:
        """The training ranks on this node, if this source is the one that knows them."""
        return ()

    def gpu_labels(self, part: T, gpus: Sequence[GpuIdentity]) -> Mapping[str, Pairs]:
        """Enrichment: extra label pairs per GPU UUID (e.g. the job or pod using it)."""
        return {}

    def evidence(self, part: T) -> Sequence[str]:
        """Sentences the diagnosis should show about this node, from this part."""
        return ()

    def close(self) -> None:
        """Release what the source holds (the sampler calls it on stop)."""
