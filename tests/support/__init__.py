"""What the tests share: the repository's paths, an exporter process, the exposition
parser, polling with a deadline, free ports, clocks, fakes (NVML) and the real tools
(promtool, Prometheus). Benchmarks and GPU acceptance scripts import it too (run them
from the repository root with ``python -m``)."""

from __future__ import annotations

from tests.support.exporter import Exporter, start_exporter
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.sampler import make_sampler
from tests.support.samples import parse_samples
from tests.support.tools import promtool

__all__ = [
    "REPO",
    "Exporter",
    "make_sampler",
    "parse_samples",
    "promtool",
    "start_exporter",
    "wait_for",
]
