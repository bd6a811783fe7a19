"""The exporter's memory, given back: glibc's allocator kept from hoarding freed pages.

A pass at 512 ranks builds a 6 MB exposition (and its gzip form, a 1-2 MB JSON, a 5-9 MB
status page) from ~36,000 short strings, on the sampler thread or on a worker thread of
the web server. glibc gives each thread that allocates its own arena (up to 8 per core)
and keeps what a thread freed for that thread's next allocation, so the resident size
creeps up to the sum of every arena's peak: RSS that grows for minutes without a leak.
Two arenas are plenty for three threads that allocate, and once a minute, after the full
collection, what is free at the top of each heap is handed back (``malloc_trim``).

Both are no-ops where the C library is not glibc (musl, macOS): nothing to tune there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("stepscope.memory")

_M_ARENA_MAX = -8  # mallopt parameter (glibc's malloc.h)
ARENAS = 2

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


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas (call before threads start); whether it applied."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def trim() -> bool:
    """Hand freed memory at the top of the heaps back to the OS; whether any was."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
