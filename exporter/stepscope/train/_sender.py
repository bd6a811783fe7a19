"""Fire-and-forget datagrams to the node's ingest, sent off the training thread.

The training thread only puts the step's raw numbers in a ring (:mod:`._steps`). A
daemon thread wakes on its own timer, every ``flush_interval`` seconds (the training
thread never wakes it), and works in slices: it takes a slice of entries from its
``poll`` (the reporter's bookkeeping, the CUDA timeline), encodes them and sends them
through a non-blocking, connected datagram socket, several in one ``sendmmsg`` call
where Linux has it (:mod:`._mmsg`: the GIL is held through the call, so a slice is one
hand-over of the GIL, not one per datagram), then lets the training thread run before
the next slice. Before a slice it checks that the training thread is not inside
``step()`` (``busy``); if it is, it gives the GIL back at once, a few times at most, so
the slice lands between steps. Why not send inline: a datagram to a sleeping receiver
makes the kernel wake that process, and on a VM that wake-up alone measured ~20 us per
send (benchmarks/bench_sdk.py), twice the per-step budget; polling from a thread costs
the training thread nothing per step and never wakes anyone from it.

Whatever goes wrong (no exporter, a full receive queue, an exporter restarted under
us), datagrams are dropped and counted; nothing raises and nothing blocks. A full
receive queue (EAGAIN) leaves the rest of the batch for a retry a millisecond later
(logged only when it stays full for a second: a busy exporter lets its queue fill
between drains); the queue itself is bounded, and what does not fit is dropped and
counted. When the exporter is absent the socket is retried at most once per
``retry_interval`` seconds, so a late-starting exporter is picked up.

The reporter's ``poll`` also reads the CUDA events that have completed into step
records and the rank's NCCL debug file, so neither costs the training thread anything.
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
from collections.abc import Callable
from itertools import islice
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
# Slices per wake-up at most (each of the poll's slice size): the rest waits for the next.
_MAX_SLICES = 64
# Times a slice waits for the training thread to leave step() (each a GIL hand-over).
_BUSY_YIELDS = 3
_NO_BATCH: Any = object()  # batch sending not tried yet
_BATCH = 64  # datagrams per sendmmsg call

# poll(final) -> (items to send, None for each one lost; whether more are waiting)
Poll = Callable[[bool], tuple[list[Any], bool]]

_live: weakref.WeakSet[DatagramSender] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The sending thread does not survive fork(); a child that reports starts its own.
    for sender in list(_live):
        sender.thread = None
        sender._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class DatagramSender:
    """Sends what its ``poll`` hands over to one ingest address, from its own thread.

    ``poll(final)`` runs on the sending thread (and once with ``final=True`` at
    ``close``) and returns a slice of items, None for each one lost (counted), and
    whether more are waiting. ``encode(item, dropped)`` makes an item's datagram,
    ``dropped`` being the count as of that moment. ``busy()``, when set, says the
    training thread is inside a step: a slice waits for it to leave.
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
        self.dropped_here = 0  # by the training thread (lost before it was handed over)
        self.dropped_sending = 0  # by the sending thread
        self.sent = 0
        # the latest refusal the exporter answered with (None: none so far)
        self.refusal: Refusal | None = None
        self._queue: deque[bytes] = deque()  # encoded, waiting to be sent
        self._sock: socket.socket | None = None
        self._next_try = 0.0
        self._full_since: float | None = None  # when the receiver's queue was first found full
        self._logged: set[str] = set()
        self.thread: threading.Thread | None = None  # the sending thread, once started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.poll: Poll | None = None
        self.busy: Callable[[], bool] | None = None
        self._batch: Any = _NO_BATCH  # a _mmsg.BatchSender, or None: one by one
        _live.add(self)

    @property
    def dropped(self) -> int:
        """Datagrams that were not sent (and never will be)."""
        return self.dropped_here + self.dropped_sending

    def drop(self) -> None:
        """Count one report lost before it was handed over (the training thread's side)."""
        self.dropped_here += 1

    def start(self) -> None:
        """Start the sending thread if it is not running."""
        if self.thread is None and not self._stop.is_set():
            self._start()

    def flush(self) -> None:
        """Poll and send what is waiting now, from the calling thread (non-blocking)."""
        with self._lock:
            while self._poll_locked(False) and self._flush_locked():
                pass
            self._flush_locked()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread, send what is left (up to ``timeout`` s), close the socket.
        Whatever could not be sent is counted in ``dropped``."""
        self._stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                while self._poll_locked(True):
                    pass
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
        self.thread = thread
        thread.start()

    def _run(self) -> None:
        wait = self._stop.wait
        delay = self.flush_interval
        while not wait(delay):
            try:
                done = self._tick()
            except Exception as err:  # never let the thread die silently mid-run
                self._log_once("thread", "stepscope: sender: %r", err)
                done = True
            # A receiver whose queue is full (Linux's net.unix.max_dgram_qlen can be
            # as low as 10) is retried soon: only this thread waits.
            delay = self.flush_interval if done else _BUSY_RETRY

    def _tick(self) -> bool:
        """One wake-up: slices of the poll's items, each sent before the next is taken,
        the GIL given back between them. False if a full receiver left some queued."""
        done = True
        for _ in range(_MAX_SLICES):
            self._between_steps()
            with self._lock:
                more = self._poll_locked(False)
                done = self._flush_locked()
                self._read_answers()
            if not more or not done or self._stop.is_set():
                break
            time.sleep(0)  # the training thread runs before the next slice
        return done

    def _between_steps(self) -> None:
        """Wait (give the GIL back) while the training thread is inside a step: this
        thread got the GIL there only because the interpreter forced a switch."""
        busy = self.busy
        if busy is None:
            return
        for _ in range(_BUSY_YIELDS):
            if not busy():
                return
            time.sleep(0)

    def _poll_locked(self, final: bool) -> bool:
        """Queue a slice of the poll's items, encoded; whether more are waiting."""
        poll = self.poll
        if poll is None:
            return False
        items, more = poll(final)
        queue = self._queue
        encode = self.encode
        for item in items:
            if item is None or len(queue) >= _MAX_QUEUED:
                self.dropped_sending += 1
                continue
            try:
                queue.append(encode(item, self.dropped))
            except Exception as err:  # an item that does not encode: drop it, go on
                self.dropped_sending += 1
                self._log_once("encode", "stepscope: could not encode a step: %r", err)
        return more

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
                sent = self._send(sock, queue)
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
            for _ in range(sent):
                queue.popleft()
            self.sent += sent
            self._full_since = None
        return True

    def _send(self, sock: socket.socket, queue: deque[bytes]) -> int:
        """Send the leading datagrams: a batch in one call where the kernel has
        ``sendmmsg``, else the first alone. How many were sent (raises if none)."""
        batch = self._batch
        if batch is _NO_BATCH:
            from stepscope.train._mmsg import batch_sender  # ctypes: on this thread only

            batch = self._batch = batch_sender(_BATCH)
        if batch is not None and len(queue) > 1:
            head = list(islice(queue, _BATCH))
            return int(batch.send(sock, head))
        sock.send(queue[0])
        return 1

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
