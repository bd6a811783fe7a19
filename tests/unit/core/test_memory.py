"""The exporter hands freed memory back (glibc): ``core/memory.py``.

Each case runs in a fresh interpreter: what it measures is that process's resident size.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO

EXPORTER = REPO / "exporter"

FREED = """
import sys
sys.path.insert(0, {exporter!r})
from stepscope.core import memory

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

# 60 MB of 1 kB buffers (above pymalloc's 512 bytes: glibc's), freed, with one buffer
# made last still alive: the heap's top stays in use, so free() alone returns nothing
chunks = [bytes(1000) + bytes([i % 256]) for i in range(60_000)]
keep = bytes(1000) + b"x"
del chunks
freed = rss()
done = memory.trim() if {trim} else None
print(freed, rss(), done)
"""


def resident(trim: bool) -> tuple[int, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", FREED.format(exporter=str(EXPORTER), trim=trim)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    return int(out[0]), int(out[1]), out[2]


def glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not glibc(), reason="trim and arenas are glibc's (musl/macOS: no-ops)")
def test_freed_memory_stays_resident_until_trimmed_and_then_goes_back() -> None:
    before, after, _ = resident(trim=False)
    assert after > before - (8 << 20), "without a trim glibc keeps what was freed"
    before, after, done = resident(trim=True)
    assert done == "True" and after < before - (30 << 20), (before, after)


LARGE_FREED = """
import sys
sys.path.insert(0, {exporter!r})
from stepscope.core import memory

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

if {tune}:
    assert memory.tune()
base = rss()
body = b"x" * 6_000_000  # a rendered body: mapped, and freeing it raises glibc's threshold
del body
body = b"x" * 6_000_000  # the next one: from the heap, unless the threshold is fixed
above = b"y" * 200_000  # allocated after it, from the top of the heap: above it
del body
print(rss() - base)
"""


@pytest.mark.skipif(not glibc(), reason="mallopt is glibc's")
@pytest.mark.parametrize("tune", [False, True])
def test_a_freed_body_stays_resident_unless_the_mmap_threshold_is_fixed(tune: bool) -> None:
    out = subprocess.run(
        [sys.executable, "-c", LARGE_FREED.format(exporter=str(EXPORTER), tune=tune)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    kept = int(out)
    if tune:
        assert kept < 1 << 20, kept
    else:
        assert kept > 5 << 20, f"glibc returned the body without the fix ({kept} bytes kept)"


@pytest.mark.skipif(not glibc(), reason="mallopt is glibc's")
def test_tuning_applies_on_glibc_and_every_call_is_a_no_op_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepscope.core import memory

    assert memory.tune() is True
    monkeypatch.setattr(memory, "_libc", None)
    monkeypatch.setattr(memory.ctypes, "CDLL", _no_libc)
    assert memory.tune() is False and memory.trim() is False


def _no_libc(*_: object) -> object:
    raise OSError("no C library here")
