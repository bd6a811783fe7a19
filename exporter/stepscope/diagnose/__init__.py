"""Bottleneck diagnosis: verdicts per rank (and per GPU without a rank) over a window.

``engine.diagnose`` is a pure function over a window of Snapshots; ``analysis``
runs it each pass as the sampler's analysis stage (keeping the window), ``model`` holds
the plain data, ``thresholds`` the rule thresholds, ``api`` and ``page`` serve the
result, ``cli`` prints it. docs/diagnosis.md describes every rule and threshold.
"""
