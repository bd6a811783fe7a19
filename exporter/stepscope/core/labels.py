"""The label schema: every label set stepscope serves, defined once and rendered once.

Three kinds of series carry labels of their subject:

- **GPU** series: dcgm-exporter's set ``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
  ``modelName``, and the host label, plus whatever the enrichment stage attributes to
  the GPU (``training_job`` of the ranks using it, ``hpc_job``, Kubernetes ``pod``...);
- **rank** series (a training rank, and the verdict about it): ``training_job``,
  ``rank``, ``local_rank`` and the ``gpu``, ``UUID``, ``modelName`` and host label of
  the rank's GPU (absent where the rank has no GPU of this node). A verdict about a GPU
  that no rank reported uses the same set without the rank labels;
- **node** series: the host label alone.

The host label is ``Hostname`` (dcgm-exporter before its rename, the default) or
``hostname`` (dcgm-exporter after it), one name per installation. The training job is
``training_job``, never ``job``: ``job`` and ``instance`` belong to Prometheus. No label
is ever served with an empty value (:func:`~stepscope.core.exposition.label_string`
leaves such pairs out): Prometheus stores an empty label as absent anyway.

The sampler builds one :class:`LabelSchema` per pass from the identities the sources
read and the enrichment they attribute; renderers ask it for rendered label strings and
never assemble label sets themselves. Rendered strings are kept across passes while
the facts behind them stay the same, so a steady node escapes each label set once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stepscope.core.exposition import join_labels, label_string

# The host label's name: dcgm-exporter's older spelling (default) or its newer one.
HOST_LABELS = ("Hostname", "hostname")
HOST_LABEL = HOST_LABELS[0]
# The training job's label (``job`` is Prometheus' own).
TRAINING_JOB_LABEL = "training_job"
# Labels of a GPU's own identity: enrichment never adds one of these a second time.
GPU_IDENTITY_LABELS = frozenset({"gpu", "UUID", "pci_bus_id", "device", "modelName", *HOST_LABELS})

# Extra (name, value) label pairs the enrichment stage attributes to a GPU.
Pairs = tuple[tuple[str, str], ...]

# Caches are cleared when they grow past this (hostnames, jobs and pods change over a
# long life; a node never has this many live label sets at once).
_MAX_CACHED = 16384


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What names a GPU in labels: read once, the same on every series of that GPU."""

    index: int
    uuid: str
    pci_bus_id: str
    model_name: str

    @property
    def device(self) -> str:
        """The ``device`` label dcgm-exporter uses: ``nvidia<index>``."""
        return f"nvidia{self.index}"


@dataclass(frozen=True, slots=True)
class RankIdentity:
    """What names a training rank in labels, and where it runs (its GPU, its pid).

    ``pid`` is the pid the rank reports (its own PID namespace's: the ``pid`` label);
    ``proc`` the pid of its process in this exporter's ``/proc``, None where the
    exporter cannot see it (a rank in another pod: the kernel names no sender, or one
    that differs from the pid it reports, often 1 in a container)."""

    job: str
    rank: int
    local_rank: int
    uuid: str | None = None
    pid: int | None = None
    proc: int | None = None
    # the rank's group of peers in its job (a pipeline stage, a role), where it reports one
    group: str | None = None


class LabelSchema:
    """The label sets of one pass: GPUs by UUID, ranks, the node. Immutable once built."""

    __slots__ = (
        "_gpu", "_gpus", "_node", "_rank_cache", "_ranks", "host_label", "hostname", "ranks"
    )  # fmt: skip

    def __init__(
        self,
        hostname: str,
        gpus: Sequence[GpuIdentity],
        gpu_labels: Mapping[str, str],
        ranks: Sequence[RankIdentity],
        rank_cache: dict[tuple[object, ...], str],
        host_label: str = HOST_LABEL,
    ) -> None:
        self.hostname = hostname
        self.host_label = host_label
        self._gpus = {g.uuid: g for g in gpus}
        self._gpu = gpu_labels
        self.ranks: tuple[RankIdentity, ...] = tuple(ranks)
        self._rank_cache = rank_cache
        self._node = label_string(((host_label, hostname),))

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        """Every GPU of the node, in the order the GPU source read them."""
        return tuple(self._gpus.values())

    def gpu_identity(self, uuid: str | None) -> GpuIdentity | None:
        """The GPU with this UUID on this node, or None."""
        return self._gpus.get(uuid) if uuid else None

    def gpu(self, uuid: str) -> str:
        """The GPU's full label set (dcgm-exporter's plus enrichment), rendered."""
        return self._gpu[uuid]

    def node(self) -> str:
        """``{Hostname="..."}`` (or ``hostname``, as configured)."""
        return self._node

    def rank(self, rank: RankIdentity) -> str:
        """The label set of a rank's series, joined with its GPU by UUID (and its
        ``group`` where it reports one)."""
        return self.subject(rank.job, rank.rank, rank.local_rank, rank.uuid, rank.group)

    def subject(
        self,
        job: str,
        rank: int | None,
        local_rank: int | None,
        uuid: str | None,
        group: str | None = None,
    ) -> str:
        """The rank label set for any subject: a rank, or a GPU without one (rank None)."""
        gpu = self.gpu_identity(uuid)
        key = (job, rank, local_rank, gpu, self.hostname, self.host_label, group)
        cached = self._rank_cache.get(key)
        if cached is None:
            if len(self._rank_cache) > _MAX_CACHED:
                self._rank_cache.clear()
            cached = self._rank_cache[key] = label_string(
                (
                    (TRAINING_JOB_LABEL, job),
                    ("rank", "" if rank is None else str(rank)),
                    ("local_rank", "" if local_rank is None else str(local_rank)),
                    ("group", group or ""),
                    ("gpu", str(gpu.index) if gpu else ""),
                    ("UUID", gpu.uuid if gpu else ""),
                    ("modelName", gpu.model_name if gpu else ""),
                    (self.host_label, self.hostname),
                )
            )
        return cached

    @staticmethod
    def extend(labels: str, pairs: Iterable[tuple[str, str]]) -> str:
        """``labels`` with more pairs appended (``{reason="..."}`` on a GPU's set)."""
        return join_labels(labels, label_string(pairs))


class LabelSchemaBuilder:
    """Builds each pass's :class:`LabelSchema`, reusing rendered strings across passes."""

    def __init__(self, host_label: str = HOST_LABEL) -> None:
        if host_label not in HOST_LABELS:
            raise ValueError(f"host label must be one of {', '.join(HOST_LABELS)}")
        self.host_label = host_label
        self._gpu_cache: dict[tuple[GpuIdentity, str, Pairs], str] = {}
        self._rank_cache: dict[tuple[object, ...], str] = {}

    def build(
        self,
        hostname: str,
        gpus: Sequence[GpuIdentity],
        ranks: Sequence[RankIdentity] = (),
        enrichment: Mapping[str, Pairs] | None = None,
    ) -> LabelSchema:
        """The schema for these facts; ``enrichment`` maps a GPU UUID to its extra pairs."""
        cache = self._gpu_cache
        if len(cache) > _MAX_CACHED:
            cache.clear()
        rendered: dict[str, str] = {}
        for g in gpus:
            extra = enrichment.get(g.uuid, ()) if enrichment else ()
            key = (g, hostname, extra)
            labels = cache.get(key)
            if labels is None:
                labels = cache[key] = label_string(
                    (
                        ("gpu", str(g.index)),
                        ("UUID", g.uuid),
                        ("pci_bus_id", g.pci_bus_id),
                        ("device", g.device),
                        ("modelName", g.model_name),
                        (self.host_label, hostname),
                        *extra,
                    )
                )
            rendered[g.uuid] = labels
        return LabelSchema(
            hostname, gpus, rendered, ranks, self._rank_cache, self.host_label
        )


_HOST_TOKEN = re.compile(r"(?<![A-Za-z0-9_])Hostname(?![A-Za-z0-9])")


def with_host_label(text: str, host_label: str) -> str:
    """``text`` (PromQL, rules, dashboard JSON written for ``Hostname``) for ``host_label``.

    The shipped rules and dashboards are written once, for ``Hostname``; the variant for
    dcgm-exporter's newer ``hostname`` is this rewrite of every ``Hostname`` token: the
    label in selectors, ``by``/``on`` lists, ``$labels.Hostname``, ``{{Hostname}}``
    legends, the ``$Hostname`` variable and recording-rule levels (``Hostname:...``).
    """
    if host_label not in HOST_LABELS:
        raise ValueError(f"host label must be one of {', '.join(HOST_LABELS)}")
    return text if host_label == HOST_LABEL else _HOST_TOKEN.sub(host_label, text)
