"""The diagnosis as an analysis stage: verdicts over a window of Snapshots, each pass.

The sampler runs it after the reads; it keeps the bounded window and the little state
that must outlive it (critical XIDs held against a GPU until it is seen reset or
``fault_hold`` passes; ranks whose process has ended), calls the pure rules
(:func:`~stepscope.diagnose.engine.diagnose`) and renders the verdict families. Its
result rides beside the Snapshot it was computed for, so ``/metrics``,
``/api/v1/diagnosis`` and ``/`` all show the same verdicts and no request computes any.
"""

from __future__ import annotations

from collections.abc import Iterable

from stepscope.core.exposition import Family
from stepscope.core.snapshot import Snapshot
from stepscope.core.source import Analysis
from stepscope.diagnose.engine import diagnose
from stepscope.diagnose.faults import FaultTracker
from stepscope.diagnose.finished import FinishedTracker
from stepscope.diagnose.metrics import diagnosis_families
from stepscope.diagnose.model import Diagnosis
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import SnapshotWindow

DIAGNOSIS = "diagnosis"


class DiagnosisAnalysis(Analysis[Diagnosis]):
    """Keeps the window, held faults and finished ranks; ``thresholds`` may be swapped on
    reload."""

    name = DIAGNOSIS

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self._window = SnapshotWindow()
        self._faults = FaultTracker()
        self._finished = FinishedTracker()

    def run(self, snapshot: Snapshot) -> Diagnosis:
        th = self.thresholds
        held = self._faults.update(snapshot, th.fault_hold)
        finished = self._finished.update(snapshot, th.window)
        self._window.push(snapshot, th.window)
        return diagnose(self._window, th, held, finished)

    def families(self, result: Diagnosis, snapshot: Snapshot) -> Iterable[Family]:
        return diagnosis_families(result, snapshot.labels)
