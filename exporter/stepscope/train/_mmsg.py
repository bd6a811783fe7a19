"""Several datagrams in one ``sendmmsg(2)`` call, the GIL held throughout (Linux).

Python's ``socket.send`` releases the GIL for every datagram. While the training thread
holds the GIL (its Python between CUDA calls; the benchmark's busy loop), the sending
thread gets it back only when the interpreter forces a switch (every 5 ms,
``sys.getswitchinterval()``): one datagram per forced switch, each switch an interruption
of the training thread at an arbitrary point, inside ``step()`` now and then, and a cold
cache for the steps after it. ``sendmmsg`` called through ``ctypes.PyDLL`` (which, unlike
``CDLL``, keeps the GIL) sends a slice's datagrams in one non-blocking system call, so a
slice costs the training thread one switch at most, not one per step.

:func:`batch_sender` returns None where this is not available (not Linux, no
``sendmmsg`` in the C library, ctypes missing); the caller then sends one by one.
Standard library only, imported on the sending thread, never by ``import
stepscope.train``.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from collections.abc import Sequence

_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_char_p), ("iov_len", ctypes.c_size_t))


class _MsgHdr(ctypes.Structure):  # struct msghdr, as glibc lays it out
    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    )


class _MMsgHdr(ctypes.Structure):
    _fields_ = (("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint))


class BatchSender:
    """Sends up to ``capacity`` datagrams per call on a connected datagram socket."""

    def __init__(self, capacity: int) -> None:
        fn = ctypes.PyDLL(None, use_errno=True).sendmmsg
        fn.argtypes = (ctypes.c_int, ctypes.POINTER(_MMsgHdr), ctypes.c_uint, ctypes.c_int)
        fn.restype = ctypes.c_int
        self._fn = fn
        self.capacity = capacity
        self._iov = (_IoVec * capacity)()
        self._msgs = (_MMsgHdr * capacity)()
        for i in range(capacity):  # one buffer per message, its own iovec
            hdr = self._msgs[i].msg_hdr
            hdr.msg_iov = ctypes.pointer(self._iov[i])
            hdr.msg_iovlen = 1

    def send(self, sock: socket.socket, datagrams: Sequence[bytes]) -> int:
        """Send the leading datagrams (at most ``capacity``) without blocking; how many
        the kernel took. Raises ``OSError`` when it took none (``EAGAIN``: the receiver's
        queue is full; ``ECONNREFUSED``: no receiver)."""
        n = min(len(datagrams), self.capacity)
        iov = self._iov
        for i in range(n):
            data = datagrams[i]
            v = iov[i]
            v.iov_base = data  # ctypes keeps the bytes alive in the array until replaced
            v.iov_len = len(data)
        sent: int = self._fn(sock.fileno(), self._msgs, n, _MSG_DONTWAIT)
        if sent < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return sent


def batch_sender(capacity: int) -> BatchSender | None:
    """A :class:`BatchSender`, or None where ``sendmmsg`` is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return BatchSender(capacity)
    except (AttributeError, OSError, TypeError):
        return None
