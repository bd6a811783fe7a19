"""The exporter's memory, given back: glibc's allocator kept from hoarding freed pages.

A pass at 512 ranks builds a 6 MB exposition (and its gzip form, a 1-2 MB JSON, a 5-9 MB
status page) from ~36,000 short strings, on the sampler thread or on a worker thread of
the web server. glibc gives each thread that allocates its own arena (up to 8 per core)
and keeps what a thread freed for that thread's next allocation, so the resident size
creeps up to the sum of every arena's peak: RSS that grows for minutes without a leak.
Two arenas are plenty for three threads that allocate; blocks of 256 KiB and more (the
bodies, the page) get pages of their own, unmapped when freed, instead of growing a heap;
and once a minute, after the full collection, what is free in the heaps is handed back
(``malloc_trim``).

All are no-ops where the C library is not glibc (musl, macOS): nothing to tune there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("stepscope.memory")

_M_ARENA_MAX = -8  # mallopt parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
ARENAS = 2
# Blocks this large or larger get pages of their own (mmap), returned when freed. glibc
# starts at 128 KiB but raises the threshold to the size of each mapped block freed (up
# to 32 MiB), so after the first 6 MB body was freed every later one came from the heap,
# where a small block allocated above it keeps the heap from shrinking: resident size
# that crept up for 15 minutes at 512 ranks. Setting it fixes it (and the trim threshold).
MMAP_THRESHOLD = 256 << 10

_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt  # noqa: B018 - glibc has both; musl has neither
            libc.malloc_trim  # noqa: B018
        except (OSError, AttributeError):
            return None
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        _libc = libc
    return _libc


def tune(arenas: int = ARENAS, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap glibc's malloc arenas and fix its mmap threshold (call before threads start);
    whether both applied."""
    libc = _glibc()
    if libc is None:
        return False
    capped = bool(libc.mallopt(_M_ARENA_MAX, arenas))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and capped


def trim() -> bool:
    """Hand freed memory at the top of the heaps back to the OS; whether any was."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
