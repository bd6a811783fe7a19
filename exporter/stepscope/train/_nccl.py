"""Which network NCCL chose for this rank, read from NCCL's own debug output.

Opt-in (``StepReporter(nccl_transport=True)`` or ``STEPSCOPE_NCCL_TRANSPORT=1``).
NCCL says which network it uses only in its debug log (``Using network Socket``,
``NET/OFI Selected provider is efa``), so:

- **NCCL_DEBUG unset** (NCCL logs nothing): the reporter sets ``NCCL_DEBUG=INFO``,
  ``NCCL_DEBUG_SUBSYS=INIT,NET`` and ``NCCL_DEBUG_FILE`` to a file of its own per process
  (``nccl.%h.%p.log`` in a fresh private directory under the temp dir). NCCL then writes
  its initialisation and network lines there (a few KB per communicator) and nothing to
  the job's output. The choice of network itself is untouched: these variables only
  govern logging.
- **NCCL_DEBUG set by the user**: nothing is changed. With ``NCCL_DEBUG_FILE`` set
  (and a level of ``INFO`` or ``TRACE``) that file is read; without it NCCL writes to
  the job's stdout, which a library cannot read: one warning says so and no transport
  is reported.

NCCL reads these variables when it first initialises, at the first collective of the
process group: construct the reporter before that (before ``init_process_group`` is
simplest). The file is read by the SDK's sender thread, at most once a second, without
blocking (a FIFO or other non-regular file is refused) and at most :data:`MAX_BYTES`
of it; the parser is ``stepscope nccl-check``'s (:mod:`stepscope.shared.nccl_log`).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import tempfile
import time
from collections.abc import Callable, MutableMapping

from stepscope.shared.nccl_log import process_transport

log = logging.getLogger("stepscope.train")

ENV = "STEPSCOPE_NCCL_TRANSPORT"
_TRUE = frozenset({"1", "true", "yes", "on"})
# The levels at which NCCL logs its INFO lines (the network choice is one).
_INFO_LEVELS = frozenset({"INFO", "TRACE"})
MAX_BYTES = 1 << 20  # a debug file beyond this is not read further
POLL_SECONDS = 1.0


def wanted(flag: bool | None, env: MutableMapping[str, str]) -> bool:
    """The argument if given, else ``$STEPSCOPE_NCCL_TRANSPORT`` (``1``/``true``/``yes``)."""
    if flag is not None:
        return flag
    return env.get(ENV, "").strip().lower() in _TRUE


def configure(
    env: MutableMapping[str, str], make_dir: Callable[[], str] | None = None
) -> str | None:
    """Point NCCL's debug output at a file this process can read; return its path
    template (NCCL's ``%h``/``%p`` left in), or None when there is none to read.

    Changes ``env`` only when ``NCCL_DEBUG`` is unset (see the module's docstring)."""
    level = env.get("NCCL_DEBUG", "").strip()
    if level:
        path = env.get("NCCL_DEBUG_FILE", "").strip()
        if not path:
            log.warning(
                "stepscope: nccl_transport: NCCL_DEBUG=%s is yours and NCCL writes it to "
                "stdout, which stepscope cannot read; set NCCL_DEBUG_FILE (e.g. "
                "/tmp/nccl.%%h.%%p.log) for it to report the transport, or unset NCCL_DEBUG",
                level,
            )
            return None
        if level.upper() not in _INFO_LEVELS:
            log.warning(
                "stepscope: nccl_transport: NCCL_DEBUG=%s logs no network choice (INFO "
                "does); no transport will be reported", level,
            )  # fmt: skip
            return None
        return path
    directory = (make_dir or (lambda: tempfile.mkdtemp(prefix="stepscope-nccl-")))()
    path = os.path.join(directory, "nccl.%h.%p.log")
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    env["NCCL_DEBUG_FILE"] = path
    return path


def expand(template: str, pid: int, hostname: str | None = None) -> str:
    """The file NCCL writes for ``template``: ``%h`` is the host name up to its first
    dot (NCCL's getHostName), ``%p`` the process id."""
    host = (hostname if hostname is not None else socket.gethostname()).split(".", 1)[0]
    return template.replace("%h", host).replace("%p", str(pid))


class TransportWatcher:
    """Reads one process's NCCL debug file as it grows; ``poll()`` returns the transport
    once the log names it (one of :data:`~stepscope.shared.datagram.NCCL_TRANSPORTS`).

    Called from the sender thread every tick; it looks at the file at most every
    ``interval`` seconds. Never raises; a file that cannot be read is retried (NCCL
    creates it at its first log line), one that is not a regular file is given up.
    """

    def __init__(
        self,
        path: str,
        pid: int,
        interval: float = POLL_SECONDS,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.pid = pid
        self.interval = interval
        self.max_bytes = max_bytes
        self.clock = clock
        self.transport: str | None = None
        self.done = False
        self._next = 0.0
        self._offset = 0
        self._partial = b""
        self._lines: list[str] = []

    def poll(self) -> str | None:
        """The transport known so far (None: not yet)."""
        now = self.clock()
        if self.done or now < self._next:
            return self.transport
        self._next = now + self.interval
        try:
            if self._read():
                found = process_transport(self._lines, self.pid)
                if found is not None:
                    self.transport = found
        except Exception as err:
            self.done = True
            log.warning("stepscope: nccl_transport: reading %s failed: %r", self.path, err)
        return self.transport

    def _read(self) -> bool:
        """Read what was appended; True when new complete lines arrived."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # NCCL has not initialised (or logged) yet
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.done = True
                log.warning("stepscope: nccl_transport: %s is not a regular file", self.path)
                return False
            budget = self.max_bytes - self._offset
            chunk = os.pread(fd, budget, self._offset) if budget > 0 else b""
        finally:
            os.close(fd)
        self._offset += len(chunk)
        if self._offset >= self.max_bytes:
            self.done = True  # what it said so far stands
        data = self._partial + chunk
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        lines = [
            line
            for line in data[:cut].decode("utf-8", "replace").splitlines()
            if " NCCL " in line  # other writers of a shared file, blank lines
        ]
        self._lines.extend(lines)
        return bool(lines)
