"""Exponential (native histogram) bucket counts of step times, bounded per series.

Why schema 3: each power of two is cut into 2**3 = 8 buckets, each bound 2**(1/8) ≈ 1.09
times the previous, so a bucket is ~9% wide and a quantile read from it is off by at most
that (about half on average) at any step time, where the classic bounds are 25-100%
apart. It is client_golang's recommended default (bucket factor 1.1), and a rank's steps
rarely spread over more than a factor of 4 (16 buckets).

Memory is bounded: counts are kept dense from the lowest to the highest bucket seen, at
most :data:`MAX_BUCKETS` of them; an observation that would need more halves the
resolution (schema 3 → 2 → …, adjacent buckets merged, as client_golang does) until the
range fits. At schema 3, 160 buckets span a factor of 2**20 (1 ms to 17 min); a rank
whose steps range wider is read at ~19% buckets from then on.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

from stepscope.core.exposition import NativeHistogram

SCHEMA = 3
MIN_SCHEMA = -4  # the coarsest Prometheus accepts
MAX_BUCKETS = 160
# client_golang's default: an observation this small (never a step time) is "zero"
ZERO_THRESHOLD = 2.0**-128

# the schema-3 bucket bounds within one power of two, as fractions of math.frexp
_BOUNDS = tuple(2.0 ** (i / 2**SCHEMA) / 2 for i in range(2**SCHEMA))


def bucket_index(value: float, schema: int = SCHEMA) -> int:
    """The index of the bucket holding ``value`` (> 0) at ``schema`` (<= 3): the ``i``
    with ``2**((i-1)/2**schema) < value <= 2**(i/2**schema)``."""
    frac, exp = math.frexp(value)
    key: int = bisect_left(_BOUNDS, frac) + (exp - 1) * 8  # 8 = 2**SCHEMA
    if schema < SCHEMA:  # ceil(key / 2**(3 - schema)): buckets merged in runs
        key = -((-key) >> (SCHEMA - schema))
    return key


@dataclass(slots=True)
class NativeCounts:
    """Mutable exponential bucket counts of one series (a rank's or a job's steps)."""

    schema: int = SCHEMA
    zero_count: int = 0
    offset: int = 0  # the bucket index of counts[0]
    counts: list[int] = field(default_factory=list)

    def observe(self, value: float) -> None:
        """Count one observation."""
        if value <= ZERO_THRESHOLD:
            self.zero_count += 1
            return
        key = bucket_index(value, self.schema)
        counts = self.counts
        i = key - self.offset
        if 0 <= i < len(counts):
            counts[i] += 1
            return
        if not counts:
            self.offset = key
            counts.append(1)
            return
        lo = min(key, self.offset)
        hi = max(key, self.offset + len(counts) - 1)
        while hi - lo + 1 > MAX_BUCKETS and self.schema > MIN_SCHEMA:
            self._halve()
            key = -((-key) >> 1)
            lo = min(key, self.offset)
            hi = max(key, self.offset + len(self.counts) - 1)
        counts = self.counts
        if key < self.offset:
            counts[:0] = [0] * (self.offset - key)
            self.offset = key
        elif key >= self.offset + len(counts):
            counts.extend([0] * (key - self.offset - len(counts) + 1))
        counts[key - self.offset] += 1

    def _halve(self) -> None:
        """One schema coarser: bucket ``i`` joins bucket ``ceil(i / 2)``."""
        merged: dict[int, int] = {}
        for k, c in enumerate(self.counts):
            j = -((-(self.offset + k)) >> 1)
            merged[j] = merged.get(j, 0) + c
        self.schema -= 1
        self.offset = min(merged)
        self.counts = [merged.get(j, 0) for j in range(self.offset, max(merged) + 1)]

    def view(self) -> NativeHistogram:
        """An immutable copy for the snapshot."""
        return NativeHistogram(
            self.schema, ZERO_THRESHOLD, self.zero_count, self.offset, tuple(self.counts)
        )
