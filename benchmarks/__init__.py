"""Benchmarks: scripts that print tables of speed and memory, never timed assertions in
the test suite. Run each from the repository root: ``python -m benchmarks.NAME --help``."""

from tests.support.paths import use_checkout_exporter

use_checkout_exporter()
