"""Where things are in the checkout, and this checkout's exporter for scripts run where
stepscope is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
EXPORTER = REPO / "exporter"


def use_checkout_exporter() -> None:
    """Make ``import stepscope`` load this checkout's ``exporter/`` when no stepscope is
    importable (the GPU machines have the dependencies, not the package)."""
    if importlib.util.find_spec("stepscope") is None:
        sys.path.insert(0, str(EXPORTER))
