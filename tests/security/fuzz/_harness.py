"""What the fuzz targets share: libFuzzer's command line through atheris.

Each target is ``python -m tests.security.fuzz.NAME [libFuzzer flags] CORPUS...``:
coverage-guided (atheris instruments the stepscope modules it imports), it stops at the
first exception or broken invariant and writes the input that caused it (``crash-*``).
``tests/security/test_fuzz.py`` runs each for a bounded time from the seeds kept in
``tests/security/corpus/NAME/``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def fuzz(target: Callable[[bytes], None]) -> None:
    """Run ``target`` under libFuzzer with this process's command line."""
    import atheris

    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
