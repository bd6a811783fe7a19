"""The diagnosis as an analysis stage: verdicts over a window of Snapshots, each pass.

The sampler runs it after the reads; it keeps the bounded window and the little state
that must outlive it (critical XIDs held against a GPU until it is seen reset or
``fault_hold`` passes; ranks whose process has ended), calls the pure rules
(:func:`~stepscope.diagnose.engine.diagnose`) and renders the verdict families. Its
result rides beside the Snapshot it was computed for, so ``/metrics``,
``/api/v1/diagnosis`` and ``/`` all show the same verdicts and no request computes any.
On the passes that make verdicts it also books each job's goodput and badput
(:class:`~stepscope.diagnose.goodput.GoodputLedger`), with those verdicts.

Above :data:`EVERY_PASS_RANKS` ranks the verdicts are made on the passes a scraper is
expected to read and at least every :data:`REUSE_SECONDS`; the window and the trackers
still see every pass (at 512 ranks verdicts cost ~12 ms: every second, 1.2% of a core).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from stepscope.core.exposition import Family
from stepscope.core.registry import Analysis
from stepscope.core.snapshot import Snapshot
from stepscope.diagnose.engine import diagnose
from stepscope.diagnose.faults import FaultTracker, HeldXid
from stepscope.diagnose.finished import FinishedRank, FinishedTracker
from stepscope.diagnose.goodput import GoodputLedger
from stepscope.diagnose.metrics import diagnosis_families, goodput_families
from stepscope.diagnose.model import Diagnosis
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import SnapshotWindow
from stepscope.ingest.aggregate import INGEST_PART

DIAGNOSIS = "diagnosis"
# Up to this many ranks the verdicts are made every pass (64 ranks: ~3 ms).
EVERY_PASS_RANKS = 64
# Above it, on passes nobody is expected to read, verdicts this old may stand in.
REUSE_SECONDS = 5.0


class DiagnosisAnalysis(Analysis[Diagnosis]):
    """Keeps the window, held faults and finished ranks; ``thresholds`` may be swapped on
    reload."""

    name = DIAGNOSIS

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self._window = SnapshotWindow()
        self._faults = FaultTracker()
        self._finished = FinishedTracker()
        self._held: Mapping[str, HeldXid] = {}
        self._gone: Mapping[tuple[str, int], FinishedRank] = {}
        self._ledger = GoodputLedger()

    def observe(self, snapshot: Snapshot) -> None:
        th = self.thresholds
        self._held = self._faults.update(snapshot, th.fault_hold)
        self._gone = self._finished.update(snapshot, th.window)
        self._window.push(snapshot, th.window)

    def run(self, snapshot: Snapshot) -> Diagnosis:
        self.observe(snapshot)
        diag = diagnose(self._window, self.thresholds, self._held, self._gone)
        kinds = {
            (v.subject.job, v.subject.rank): v.kind
            for v in diag.verdicts
            if v.subject.rank is not None
        }
        books = self._ledger.update(
            snapshot.part(INGEST_PART), snapshot.monotonic, kinds, self._gone
        )
        return replace(diag, goodput=books)

    def reuse_for(self, snapshot: Snapshot) -> float:
        training = snapshot.part(INGEST_PART)
        ranks = len(training.ranks) if training is not None else 0
        return REUSE_SECONDS if ranks > EVERY_PASS_RANKS else 0.0

    def families(self, result: Diagnosis, snapshot: Snapshot) -> Iterable[Family]:
        return [
            *diagnosis_families(result, snapshot.labels),
            *goodput_families(result, snapshot.labels),
        ]
