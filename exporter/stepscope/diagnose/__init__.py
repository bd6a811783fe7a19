"""Bottleneck diagnosis: verdicts per rank (and per GPU without a rank) over a window.

``engine.diagnose`` is a pure function over a window of Snapshots; the sampler keeps
the window (``window.SnapshotWindow``) and puts the result in the Snapshot it
publishes. ``model`` holds the plain data, ``thresholds`` the rule thresholds.
docs/diagnosis.md describes every rule and threshold.
"""
