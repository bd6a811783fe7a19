"""Fire-and-forget datagrams to the node's ingest, sent off the training thread.

The training thread only appends the step's numbers to an in-memory queue (a
``deque`` append, well under a microsecond). A daemon thread wakes every
``flush_interval`` seconds, encodes, and sends what is queued through a non-blocking,
connected datagram socket. Why not send inline: a datagram to a sleeping receiver
makes the kernel wake that process, and on a VM that wake-up alone measured ~20 us
per send (benchmarks/bench_sdk.py), twice the per-step budget; polling from a
thread costs the training thread nothing per step and never wakes anyone from it.

Whatever goes wrong (no exporter, a full receive queue, an exporter restarted under
us), datagrams are dropped and counted; nothing raises and nothing blocks. A full
receive queue (EAGAIN) leaves the rest of the batch for a retry a millisecond later
(logged only when it stays full for a second: a busy exporter lets its queue fill
between drains); the queue itself is bounded, and what does not fit is dropped and
counted. When the exporter is absent the socket is retried at most once per
``retry_interval`` seconds, so a late-starting exporter is picked up.

The thread also runs the reporter's ``poll`` each tick (before sending): reading CUDA
events that have completed into step records, and the rank's NCCL debug file, so
neither costs the training thread anything.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from stepscope.shared.datagram import MAX_REFUSAL_BYTES, Refusal, parse_refusal
from stepscope.train._env import IngestAddress

log = logging.getLogger("stepscope.train")

# A full queue: the exporter is there but behind. Keep the socket, try later.
_BUSY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})
_BUSY_RETRY = 0.001  # seconds
# A full receive queue is normal for a moment (a busy exporter drains it every few ms);
# only one that stays full this long is worth a line in the training log.
FULL_WARN_SECONDS = 1.0
_MAX_QUEUED = 1024  # steps; at one step per 10 ms that is 10 s without an exporter drain

_live: weakref.WeakSet[DatagramSender] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The sending thread does not survive fork(); a child that reports starts its own.
    for sender in list(_live):
        sender._thread = None
        sender._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class DatagramSender:
    """Queues items for one ingest address; a thread encodes and sends them.

    ``encode(item, dropped)`` makes the datagram's bytes on the sending thread,
    ``dropped`` being the count as of the moment it is sent. ``poll(final)``, when set,
    runs on the sending thread before each send (and once with ``final=True`` at
    ``close``) and returns items to queue, None for each one lost (counted).
    """

    def __init__(
        self,
        address: IngestAddress,
        encode: Callable[[Any, int], bytes],
        retry_interval: float = 1.0,
        flush_interval: float = 0.05,
    ) -> None:
        self.address = address
        self.encode = encode
        self.retry_interval = retry_interval
        self.flush_interval = flush_interval
        # Two counters, each written by one thread only: no lost increments.
        self.dropped_here = 0  # by the training thread (queue full, lost before queueing)
        self.dropped_sending = 0  # by the sending thread
        self.sent = 0
        # the latest refusal the exporter answered with (None: none so far)
        self.refusal: Refusal | None = None
        self._queue: deque[Any] = deque()
        self._sock: socket.socket | None = None
        self._next_try = 0.0
        self._full_since: float | None = None  # when the receiver's queue was first found full
        self._logged: set[str] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.poll: Callable[[bool], Iterable[Any]] | None = None
        _live.add(self)

    @property
    def dropped(self) -> int:
        """Datagrams that were not sent (and never will be)."""
        return self.dropped_here + self.dropped_sending

    def drop(self) -> None:
        """Count one report lost before it was queued (the training thread's side)."""
        self.dropped_here += 1

    def submit(self, item: Any) -> None:
        """Queue one item to send; never blocks. A full queue, or a closed sender,
        drops it (counted)."""
        queue = self._queue
        if len(queue) >= _MAX_QUEUED or self._stop.is_set():
            self.dropped_here += 1
            return
        queue.append(item)
        if self._thread is None:
            self._start()

    def start(self) -> None:
        """Start the sending thread if it is not running (steps queued elsewhere, for
        ``poll`` to hand over, need it as much as submitted ones)."""
        if self._thread is None and not self._stop.is_set():
            self._start()

    def flush(self) -> None:
        """Poll and send what is queued now, from the calling thread (non-blocking)."""
        with self._lock:
            self._poll_locked(False)
            self._flush_locked()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread, send what is left (up to ``timeout`` s), close the socket.
        Whatever could not be sent is counted in ``dropped``."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                self._poll_locked(True)
            except Exception as err:
                self._log_once("thread", "stepscope: sender: %r", err)
            while self._queue and time.monotonic() < deadline:
                if not self._flush_locked():
                    time.sleep(0.005)  # receiver busy: close() may wait, steps never do
            self.dropped_sending += len(self._queue)
            self._queue.clear()
            self._close_socket()

    # -- the sending thread -------------------------------------------------------

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="stepscope-sender", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        wait = self._stop.wait
        delay = self.flush_interval
        while not wait(delay):
            try:
                with self._lock:
                    self._poll_locked(False)
                    done = self._flush_locked()
                    self._read_answers()
            except Exception as err:  # never let the thread die silently mid-run
                self._log_once("thread", "stepscope: sender: %r", err)
                done = True
            # A receiver whose queue is full (Linux's net.unix.max_dgram_qlen can be
            # as low as 10) is retried soon: only this thread waits.
            delay = self.flush_interval if done else _BUSY_RETRY

    def _poll_locked(self, final: bool) -> None:
        poll = self.poll
        if poll is None:
            return
        queue = self._queue
        for item in poll(final):
            if item is None or len(queue) >= _MAX_QUEUED:
                self.dropped_sending += 1
            else:
                queue.append(item)

    def _flush_locked(self) -> bool:
        """Send the queue in order; False if a full receiver left some queued."""
        queue = self._queue
        while queue:
            sock = self._sock
            if sock is None:
                now = time.monotonic()
                if now < self._next_try or (sock := self._connect(now)) is None:
                    self.dropped_sending += len(queue)
                    queue.clear()
                    return True
            try:
                sock.send(self.encode(queue[0], self.dropped))
            except OSError as err:
                if err.errno in _BUSY:
                    now = time.monotonic()
                    if self._full_since is None:
                        self._full_since = now
                    elif now - self._full_since >= FULL_WARN_SECONDS:
                        self._log_once(
                            "busy",
                            "stepscope: ingest %s has been full for %.0f s; steps wait "
                            "(is the exporter running behind?)",
                            self.address.url, now - self._full_since,
                        )  # fmt: skip
                    return False
                # ECONNREFUSED (exporter gone or restarted), ENOENT, EPIPE, ...:
                # drop this one, reconnect later (follows a re-created socket path).
                queue.popleft()
                self.dropped_sending += 1
                self._log_once("send", "stepscope: sending to %s failed: %s", self.address.url, err)
                self._close_socket()
                self._next_try = time.monotonic() + self.retry_interval
                continue
            except Exception as err:  # an item that does not encode: drop it, go on
                queue.popleft()
                self.dropped_sending += 1
                self._log_once("encode", "stepscope: could not encode a step: %r", err)
                continue
            queue.popleft()
            self.sent += 1
            self._full_since = None
        return True

    def _connect(self, now: float) -> socket.socket | None:
        self._next_try = now + self.retry_interval
        sock = None
        try:
            sock = socket.socket(self.address.family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            if self.address.family == socket.AF_UNIX:
                # an abstract name the kernel picks, so the exporter can answer a refusal
                with contextlib.suppress(OSError):
                    sock.bind("")
            sock.connect(self.address.address)
        except OSError as err:
            if sock is not None:
                sock.close()
            self._log_once(
                "connect",
                "stepscope: ingest %s unavailable (%s); steps are dropped and counted "
                "until it appears (retrying every %.0f s)",
                self.address.url,
                err.strerror or err,
                self.retry_interval,
            )
            return None
        self._sock = sock
        return sock

    def _read_answers(self) -> None:
        """The exporter's answers, if any: it answers only a refused step, saying why.
        Each reason is logged once; the latest is kept in ``refusal``."""
        sock = self._sock
        if sock is None or self.address.family != socket.AF_UNIX:
            return
        for _ in range(8):  # a few per tick: the exporter answers at most every few seconds
            try:
                data = sock.recv(MAX_REFUSAL_BYTES + 1)
            except OSError:  # nothing waiting (EAGAIN), or the socket is gone
                return
            refusal = parse_refusal(data)
            if refusal is not None:
                self.refusal = refusal
                self._log_once(f"refused:{refusal.reason}", "stepscope: %s; steps of this "
                               "reason are dropped by the exporter", refusal.describe())

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _log_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)
