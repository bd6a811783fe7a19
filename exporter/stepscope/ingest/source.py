"""``IngestSource``: the training ranks the ingest aggregated, once per pass.

The listener feeds the aggregator on the event loop; this source takes its immutable
view on the sampler thread (one short lock). The ranks it names give the label schema
its rank label sets and the host source the pids to look at.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stepscope.core.exposition import Family
from stepscope.core.labels import LabelSchema, RankIdentity
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
