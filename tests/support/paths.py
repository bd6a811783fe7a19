"""Where things are in the checkout, and this checkout's exporter for scripts run where
stepscope is not installed."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
EXPORTER = REPO / "exporter"


def use_checkout_exporter() -> None:
    """Make ``import stepscope`` load this checkout's ``exporter/`` when no stepscope is
    importable (the GPU machines have the dependencies, not the package)."""
    if importlib.util.find_spec("stepscope") is None:
        sys.path.insert(0, str(EXPORTER))


def source_tree(dest: Path) -> Path:
    """What a build of the package reads (pyproject.toml, README.md, LICENSE, exporter/),
    copied to ``dest`` so the build leaves no trace in the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(
        EXPORTER, dest / "exporter",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    return dest
