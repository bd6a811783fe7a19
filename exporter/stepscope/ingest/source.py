"""``IngestSource``: the training ranks the ingest aggregated, once per pass.

The listener feeds the aggregator on the event loop; this source takes its immutable
view on the sampler thread (one short lock). The ranks it names give the label schema
its rank label sets and the host source the pids to look at; the enrichment stage puts
each rank's training job on the series of the GPU it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from stepscope.core.exposition import Family
from stepscope.core.labels import TRAINING_JOB_LABEL, GpuIdentity, LabelSchema, Pairs, RankIdentity
from stepscope.core.source import ReadContext, Source
from stepscope.ingest.aggregate import INGEST_PART, Aggregator, TrainingView
from stepscope.ingest.metrics import training_families


class IngestSource(Source[TrainingView]):
    """The aggregator's view of every live rank, and the ingest's health."""

    key = INGEST_PART

    def __init__(self, aggregator: Aggregator) -> None:
        self._aggregator = aggregator

    def read(self, ctx: ReadContext) -> TrainingView:
        return self._aggregator.view()

    def families(self, part: TrainingView, labels: LabelSchema) -> Iterable[Family]:
        return training_families(part, labels)

    def ranks(self, part: TrainingView) -> Sequence[RankIdentity]:
        return tuple(r.identity for r in part.ranks)

    def gpu_labels(self, part: TrainingView, gpus: Sequence[GpuIdentity]) -> Mapping[str, Pairs]:
        """Training-job attribution: a GPU used by a reporting rank carries its job, so
        fleet rules can compare nodes within a job (jobs sharing a GPU: joined by ",")."""
        jobs: dict[str, set[str]] = {}
        for r in part.ranks:
            if r.uuid:
                jobs.setdefault(r.uuid, set()).add(r.job)
        return {uuid: ((TRAINING_JOB_LABEL, ",".join(sorted(js))),) for uuid, js in jobs.items()}
