"""Acceptance scripts: stepscope on real GPUs (or rehearsed on CPUs), each writing the
evidence kept in docs/validation/. Run each from the repository root:
``python -m validation.NAME --help``."""

from tests.support.paths import use_checkout_exporter

use_checkout_exporter()
