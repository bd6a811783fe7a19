"""The ingest listener: a datagram socket read by a thread of its own, feeding the
aggregator.

``unix:///run/stepscope/ingest.sock`` (default) or ``udp://127.0.0.1:9401`` (loopback
only), in the grammar of :func:`stepscope.shared.datagram.parse_ingest_url`, the SDK's own.

The Unix socket is the authenticated transport (docs/ingest.md#threat-model): every
datagram arrives with the sender's uid, gid and pid as the kernel vouches for them
(``SO_PASSCRED`` / ``SCM_CREDENTIALS``), which the allow-lists, the pid check and the
aggregator's ownership rules use. It is created safely:

- its directory is made 0755 when missing; an existing one must belong to this exporter's
  uid or root and be writable by no one else unless sticky (else another user could
  swap the socket for a symlink between two calls), and is opened without following a
  symlink; everything after that works relative to that directory's descriptor;
- the socket's mode comes from the umask at ``bind`` (default 0660), never from a
  ``chmod`` of the path afterwards; a configured group is set with ``lchown`` semantics
  (never through a symlink);
- a stale socket file left by a dead exporter is replaced, a live one is not.

UDP carries no sender: whoever reaches the port may report as any rank. It is off unless
asked for and binds loopback only.

A binding failure of the default socket does not stop the exporter: it logs one warning,
serves GPU metrics as usual and exports ``stepscope_ingest_up 0``. An ingest configured
explicitly (another URL) that cannot be bound stops the start (``start(required=True)``).

Why a thread of its own, and batches: a node's ranks report a step each, spread over the
second, and the kernel queues at most ``net.unix.max_dgram_qlen`` datagrams (10 by
default) on a Unix socket, so every datagram must be read as it comes: a wake-up per
datagram. On the event loop each cost an iteration (epoll, the handle, a failing
``recvmsg``) and found the parser's and the aggregator's data cold: ~120 us of CPU per
datagram in situ at 512 ranks (~14 us in a loop). Here a thread blocks in ``recvmsg``
(one system call per datagram), keeps what it reads, and checks and aggregates a batch
at once, :data:`BATCH_SECONDS` after its first datagram or at :data:`MAX_BATCH`. Busy
(:data:`BUSY_RATE` datagrams a second or more), it stops waking for each one: it drains
the queue without blocking, then sleeps while about half the queue refills
(:func:`pause`): at 512 ranks 103 wake-ups a second instead of 511, the thread's CPU
3.5 -> 2.8% of a core (benchmarks/bench_diagnosis.py --exporter; docs/benchmarks.md).
The aggregate is read once a second, so neither wait is seen. A full kernel queue makes
the SDK keep its steps for its next send a millisecond later, not lose them.
"""

from __future__ import annotations

import array
import contextlib
import ipaddress
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.core.errors import ConfigError
from stepscope.ingest.aggregate import Aggregator, Sender
from stepscope.ingest.refusals import Refusals
from stepscope.shared.datagram import (
    MAX_DATAGRAM_BYTES,
    MAX_UNIX_PATH_BYTES,
    Rejection,
    StepRecord,
    parse_datagram,
    parse_ingest_url,
)

log = logging.getLogger("stepscope.ingest")

# A batch is checked and aggregated this long after its first datagram (or when it has
# MAX_BATCH): long enough to find the code and the data warm, short against the 1 s pass.
BATCH_SECONDS = 0.05
MAX_BATCH = 256
_BATCH_TIMEOUT = struct.pack("ll", 0, int(BATCH_SECONDS * 1e6))  # struct timeval
_NO_TIMEOUT = struct.pack("ll", 0, 0)
# Busy: at BUSY_RATE datagrams a second or more, a wake-up per datagram costs more than the
# datagram (~20 us each on a VM); the thread then drains the queue every pause instead,
# the pause sized so about half the kernel's queue fills (a full one makes senders wait a
# millisecond: the SDK keeps its steps), at most MAX_PAUSE. Measured a second at a time.
BUSY_RATE = 200.0
MAX_PAUSE = 0.02
_UDP_QUEUE = 64  # UDP queues by bytes (the receive buffer), not by count: ample
# Ask for a large receive buffer so bursts (all ranks ending a step together) queue
# instead of dropping; the kernel caps it at net.core.rmem_max.
RECEIVE_BUFFER_BYTES = 8 << 20

# struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_UCRED = struct.Struct("iII")
_CRED_SPACE = socket.CMSG_SPACE(_UCRED.size)
_SCM_CREDENTIALS: int | None = getattr(socket, "SCM_CREDENTIALS", None)
_SO_PASSCRED: int | None = getattr(socket, "SO_PASSCRED", None)
# getsockopt(SO_MEMINFO): u32 counters of the socket; index 8 (SK_MEMINFO_DROPS, Linux
# >= 4.15) is the datagrams the kernel dropped because the receive buffer was full.
# Python does not name the option; 55 is its number in the generic Linux ABI (x86, Arm).
_SO_MEMINFO = 55 if sys.platform == "linux" else None
_MEMINFO_DROPS = 8
_SENDER_CACHE = 1024  # distinct credentials remembered (a node has a few processes)

# one datagram as received: its bytes, control messages, flags, the sender's address
_Received = tuple[bytes, list[tuple[int, int, bytes]], int, Any]


class IngestError(OSError):
    """The ingest socket could not be set up; the message says why."""


@dataclass(frozen=True)
class IngestAccess:
    """Who can reach the Unix socket: its mode (set by the umask at bind) and group.

    ``group`` None: the group the directory gives new files (the exporter's, or the
    directory's when it is set-group-ID). World-writable modes are allowed when asked
    for: any local user can then connect, and ownership still keeps each sender to its
    own jobs.
    """

    mode: int = 0o660
    group: int | None = None


def _socket_dir(directory: Path) -> int:
    """Create (0755) or check the socket's directory; a descriptor for it.

    Refused: a symlink, a directory another uid (not root) owns, or one writable by
    others without the sticky bit. Each lets another user replace the socket.
    """
    # the documented 0755 whatever the service's umask (process-wide: the listener
    # starts before the exporter's other threads)
    old = os.umask(0o022)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise IngestError(f"cannot create {directory}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if directory.is_symlink():
            raise IngestError(
                f"{directory} is a symlink; give the real directory in the ingest URL"
            ) from None
        raise IngestError(f"cannot open {directory}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    me = os.geteuid()
    problem = None
    if st.st_uid not in (me, 0):
        problem = (
            f"{directory} belongs to uid {st.st_uid}, not to this exporter (uid {me}) or "
            "root: its owner could replace the socket"
        )
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        problem = (
            f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) "
            "without the sticky bit: they could replace the socket"
        )
    if problem is not None:
        os.close(fd)
        raise IngestError(f"{problem}; refusing it (docs/ingest.md#the-socket)")
    return fd


def _at(dir_fd: int, name: str, fallback: Path) -> str:
    """A path to ``name`` in the directory held open as ``dir_fd``.

    ``bind`` and ``connect`` take a path, not a directory descriptor; through
    /proc/self/fd the path resolves to the directory we checked even if an ancestor
    is renamed meanwhile. Without /proc (or when too long), the plain path.
    """
    via = f"/proc/self/fd/{dir_fd}/{name}"
    if len(via.encode()) <= MAX_UNIX_PATH_BYTES and os.path.isdir(f"/proc/self/fd/{dir_fd}"):
        return via
    return str(fallback)


def _clear_stale(dir_fd: int, name: str, target: str, path: Path) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise IngestError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise IngestError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(target)
    except ConnectionRefusedError:
        try:  # stale: nobody is bound to it (an exporter that died)
            os.unlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise IngestError(f"cannot remove stale {path}: {exc.strerror or exc}") from None
    except OSError as exc:
        raise IngestError(f"cannot check {path}: {exc.strerror or exc}") from None
    else:
        raise IngestError(f"{path} is in use by another process (another exporter?)")
    finally:
        probe.close()


def _bind_unix(path: Path, access: IngestAccess, dir_fd: int) -> tuple[socket.socket, int]:
    """Bind ``path`` in the checked directory ``dir_fd``; the socket and its inode."""
    name = path.name
    target = _at(dir_fd, name, path)
    _clear_stale(dir_fd, name, target, path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        if _SO_PASSCRED is not None:  # before bind: no datagram arrives without a sender
            sock.setsockopt(socket.SOL_SOCKET, _SO_PASSCRED, 1)
        # bind creates the file 0777 & ~umask: the mode is right from its first instant,
        # and no chmod of a path another user might have swapped (the umask is
        # process-wide: the listener starts before the exporter's other threads).
        old = os.umask(0o777 & ~access.mode)
        try:
            sock.bind(target)
        finally:
            os.umask(old)
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise IngestError(f"{path} was replaced right after bind; not using it")
        wider = stat.S_IMODE(st.st_mode) & ~access.mode
        if wider:
            raise IngestError(
                f"{path} came out mode {stat.S_IMODE(st.st_mode):04o}, wider than "
                f"{access.mode:04o} (a default ACL on {path.parent}?)"
            )
        if access.group is not None and st.st_gid != access.group:
            try:  # follow_symlinks=False: fchownat(AT_SYMLINK_NOFOLLOW), never a symlink's target
                os.chown(name, -1, access.group, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise IngestError(
                    f"cannot give {path} to group {access.group}: {exc.strerror or exc} (the "
                    "exporter must be root or a member of the group, and chown allowed; under "
                    "systemd prefer Group= for the socket's group)"
                ) from None
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=dir_fd)
        if isinstance(exc, IngestError):
            raise
        raise IngestError(f"cannot bind {path}: {exc.strerror or exc}") from None
    return sock, st.st_ino


def _bind_udp(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise IngestError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    if not ipaddress.ip_address(addr[0]).is_loopback:
        # config rejects non-loopback literals; a name could still resolve elsewhere
        raise IngestError(
            f"udp ingest binds loopback only (it is unauthenticated); {host} is {addr[0]}"
        )
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise IngestError(f"cannot bind udp {host}:{port}: {exc.strerror or exc}") from None
    return sock


def kernel_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped on ``sock`` (receive buffer full), cumulative;
    None where the kernel does not say (not Linux, or older than 4.15)."""
    if _SO_MEMINFO is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 4 * (_MEMINFO_DROPS + 1))
    except OSError:
        return None
    if len(raw) < 4 * (_MEMINFO_DROPS + 1):
        return None
    return int(struct.unpack_from("I", raw, 4 * _MEMINFO_DROPS)[0])


def pause(rate: float, fill: int) -> float:
    """Seconds between drains of the ingest queue at ``rate`` datagrams a second: none
    (a wake-up per datagram) below :data:`BUSY_RATE`, else the time ``fill`` datagrams
    take to arrive, at most :data:`MAX_PAUSE`."""
    if rate < BUSY_RATE:
        return 0.0
    return min(MAX_PAUSE, fill / rate)


def _unix_queue_length() -> int:
    """How many datagrams the kernel queues on a Unix socket (``net.unix.max_dgram_qlen``,
    per network namespace); 10, Linux's default, when it cannot be read."""
    try:
        return max(1, int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text()))
    except (OSError, ValueError):
        return 10


class PidCheck:
    """Whether the pid a datagram reports is the sender's, given the kernel's pid.

    The kernel gives the sender's pid in the exporter's PID namespace (0 when it cannot
    name it there: the check is then skipped); the SDK reports ``os.getpid()`` in its
    own. They differ when the sender is in a namespace below ours (a container, the
    exporter on the host's): its own pid is the last ``NSpid`` of ``/proc/<pid>/status``.
    That is read once per sending process and remembered.
    """

    def __init__(self, proc: Path = Path("/proc"), remember: int = 4096) -> None:
        self._proc = proc
        self._remember = remember
        self._own: dict[int, int] = {}  # kernel pid -> the pid in its own namespace

    def matches(self, kernel_pid: int, reported: int) -> bool:
        """True when ``reported`` is the process ``kernel_pid`` (0: cannot tell, True)."""
        if kernel_pid == 0 or kernel_pid == reported:
            return True
        own = self._own.get(kernel_pid)
        if own is None:
            own = self._read(kernel_pid)
            if own < 0:  # gone (or hidden): not remembered, its pid may be reused
                return False
            if len(self._own) >= self._remember:
                self._own.clear()
            self._own[kernel_pid] = own
        return own == reported

    def _read(self, pid: int) -> int:
        """The innermost NSpid, or -1 (the process is gone, or /proc hides it)."""
        try:
            with open(self._proc / str(pid) / "status", "rb") as f:
                for line in f:
                    if line.startswith(b"NSpid:"):
                        return int(line.split()[-1])
        except (OSError, ValueError, IndexError):
            pass
        return -1


class IngestListener:
    """Receives step datagrams on ``url`` and hands them to ``aggregator``."""

    def __init__(
        self,
        url: str,
        aggregator: Aggregator,
        access: IngestAccess | None = None,
        receive_buffer: int = RECEIVE_BUFFER_BYTES,
    ) -> None:
        self.url = url
        self._aggregator = aggregator
        self._access = access or IngestAccess()
        self._receive_buffer = receive_buffer
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        # seconds between drains now, 0 while it wakes for each datagram (see pause())
        self.pace = 0.0
        self._unix_path: Path | None = None
        self._unix_inode: int | None = None
        self._dir_fd: int | None = None
        self._logged: set[str] = set()
        self._senders: dict[bytes, Sender] = {}
        self._pids = PidCheck()
        self._refusals = Refusals()

    @property
    def up(self) -> bool:
        """Whether the socket is bound and being read."""
        return self._sock is not None

    def _bind(self) -> socket.socket:
        address = parse_ingest_url(self.url)
        if isinstance(address.address, str):
            path = Path(address.address)
            dir_fd = _socket_dir(path.parent)
            try:
                sock, inode = _bind_unix(path, self._access, dir_fd)
            except BaseException:
                os.close(dir_fd)
                raise
            self._unix_path, self._unix_inode, self._dir_fd = path, inode, dir_fd
        else:
            sock = _bind_udp(*address.address)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer)
        sock.setblocking(True)  # the receiving thread blocks in recvmsg
        return sock

    def start(self, required: bool = False) -> bool:
        """Bind and start the receiving thread; False (and one warning) if binding failed,
        or with ``required`` (an ingest configured explicitly) ConfigError naming it."""
        try:
            sock = self._bind()
        except (OSError, ValueError) as exc:
            if required:
                raise ConfigError(f"ingest: cannot listen on {self.url}: {exc}") from None
            log.warning(
                "training ingest disabled: %s. GPU metrics are served as usual; "
                "stepscope_ingest_up is 0. Set --ingest to a writable path (e.g. "
                "unix:///tmp/stepscope/ingest.sock) or udp://127.0.0.1:9401.",
                exc,
            )
            self._aggregator.set_listening(None)
            return False
        self._sock = sock
        self._stopping = False
        # read once per pass by the sampler, not per datagram
        known = kernel_drops(sock) is not None
        self._aggregator.set_drop_counter((lambda: kernel_drops(sock)) if known else None)
        self._thread = threading.Thread(
            target=self._receive, args=(sock,), name="stepscope-ingest", daemon=True
        )
        self._thread.start()
        self._aggregator.set_listening(self.url)
        buffer_kib = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 1024
        if sock.family == socket.AF_UNIX:
            assert self._unix_path is not None and self._dir_fd is not None
            st = os.stat(self._unix_path.name, dir_fd=self._dir_fd, follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            log.info(
                "training ingest listening on %s (mode %04o, owner %d, group %d; senders "
                "authenticated by the kernel; receive buffer %d KiB)",
                self.url, mode, st.st_uid, st.st_gid, buffer_kib,
            )
            if mode & 0o002:
                log.warning(
                    "the ingest socket is world-writable (ingest_mode %04o): any local user "
                    "can report (each only as its own jobs' owner)", mode,
                )
        else:
            log.info(
                "training ingest listening on %s: UDP, unauthenticated (any local process "
                "can report as any rank); receive buffer %d KiB", self.url, buffer_kib,
            )
        return True

    def _receive(self, sock: socket.socket) -> None:
        """The receiving thread: read each datagram as it comes, take them in batches.

        Blocks in ``recvmsg`` while nothing is pending; with a batch pending, waits at
        most :data:`BATCH_SECONDS` (``SO_RCVTIMEO``) so a quiet moment still ends it.
        Busy (:data:`BUSY_RATE` or more a second), it drains the queue without blocking
        every :func:`pause` instead of waking for each datagram. ``close`` wakes it with
        ``shutdown``; what it holds then is taken, not lost."""
        unix = sock.family == socket.AF_UNIX
        ancillary = _CRED_SPACE if unix else 0
        fill = max(1, _unix_queue_length() // 2) if unix else _UDP_QUEUE // 2
        # Into one buffer, then a copy of the datagram's own size: recvmsg(size) would
        # malloc a 4 KiB block per datagram and shrink it in place, on the heap the
        # sampler's long-lived objects share with this thread (glibc arenas are capped).
        buffer = bytearray(MAX_DATAGRAM_BYTES + 1)  # a longer datagram is truncated: oversize
        view = memoryview(buffer)
        into = [view]
        recvmsg_into = sock.recvmsg_into
        clock = time.monotonic
        sleep = time.sleep
        dontwait = socket.MSG_DONTWAIT
        batch: list[_Received] = []
        due = 0.0
        timed = False  # SO_RCVTIMEO is set
        after_stop = MAX_BATCH  # datagrams still read once stopping (UDP may keep coming)
        counted = 0  # datagrams since `since`, for the rate
        since = clock()
        wait = 0.0  # > 0: busy, the queue drained every `wait` seconds

        def repace(now: float) -> float:
            """Once a second, the pause the last second's rate calls for (see pause())."""
            nonlocal counted, since, wait
            if now - since >= 1.0:
                wait = self.pace = pause(counted / (now - since), fill)
                counted, since = 0, now
            return wait

        while True:
            try:
                n, control, flags, addr = recvmsg_into(into, ancillary, dontwait if wait else 0)
                item = (view[:n].tobytes(), control, flags, addr)
            except OSError as exc:
                if self._stopping:
                    break
                if not isinstance(exc, (BlockingIOError, InterruptedError)):
                    log.debug("ingest recv failed: %s", exc)
                    sleep(BATCH_SECONDS)  # a broken socket must not spin a core
                elif wait:  # busy, and the queue is drained: sleep while it refills
                    now = clock()
                    repace(now)
                    if batch and (now >= due or not wait):
                        self._take(batch, unix)
                        batch = []
                    if wait:
                        sleep(wait)
                    continue
                # else SO_RCVTIMEO ran out: the batch is due
            else:
                if self._stopping:
                    # shut down: the queue is read to its end, then recvmsg returns an
                    # empty read with no sender (a sender's empty datagram has one)
                    after_stop -= 1
                    if (not item[0] and not item[1] and item[3] is None) or after_stop < 0:
                        break
                counted += 1
                now = clock()
                if not batch:
                    due = now + BATCH_SECONDS
                batch.append(item)
                if len(batch) < MAX_BATCH:
                    if wait or repace(now):
                        continue  # busy: drain on
                    if now < due:
                        if not timed:
                            timed = self._timeout(sock, _BATCH_TIMEOUT)
                        continue
            if batch:
                self._take(batch, unix)
                batch = []
            if timed:
                timed = not self._timeout(sock, _NO_TIMEOUT)
        if batch:
            self._take(batch, unix)

    @staticmethod
    def _timeout(sock: socket.socket, timeval: bytes) -> bool:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        except OSError:
            return False
        return True

    def _take(self, batch: list[_Received], authenticated: bool) -> None:
        """Check and aggregate a batch. ``authenticated`` (Unix): every datagram carries
        its sender's credentials, which the allow-lists, the pid check and the
        aggregator's ownership rules use; UDP's come with no sender."""
        try:
            agg = self._aggregator
            add, reject, limits, settings = agg.add, agg.reject, agg.limits, agg.settings
        except Exception:  # a bug must not stop the ingest or the exporter
            self._internal("processing an ingest batch failed")
            return
        allow_uids, allow_gids = settings.allow_uids, settings.allow_gids
        restricted = bool(allow_uids or allow_gids)
        senders = self._senders
        pid_matches = self._pids.matches
        for data, ancillary, _flags, addr in batch:
            try:
                sender = None
                rec = None
                if authenticated:
                    # the common case, one credentials message, first; else the slow path
                    if len(ancillary) == 1 and ancillary[0][1] == _SCM_CREDENTIALS:
                        raw = ancillary[0][2]
                        sender = senders.get(raw) or self._sender(raw)
                    else:
                        sender = self._sender_of(ancillary)
                    if sender is None:  # SO_PASSCRED is set: the kernel always says who
                        self._internal("an ingest datagram came without credentials")
                        continue
                    if restricted and sender.uid not in allow_uids and sender.gid not in allow_gids:
                        reject("not_allowed")  # before parsing: costs a refused sender least
                        self._refused(addr, "not_allowed", None, sender)
                        continue
                reason: str | None
                parsed = parse_datagram(data, limits)
                if isinstance(parsed, Rejection):
                    reason = parsed.reason
                    reject(reason)
                else:
                    rec = parsed
                    if (
                        sender is not None
                        and rec.pid is not None
                        and rec.pid != sender.pid
                        and not pid_matches(sender.pid, rec.pid)
                    ):
                        reason = "bad_pid"
                        reject(reason)
                    else:
                        reason = add(rec, sender)
                if reason is not None:
                    self._refused(addr, reason, rec, sender)
            except Exception:  # a bug must not stop the ingest or the exporter
                self._internal("processing an ingest datagram failed")

    def _refused(
        self, addr: Any, reason: str, rec: StepRecord | None, sender: Sender | None
    ) -> None:
        """Tell the log and the sender (both rate-limited; UDP senders are not answered)."""
        self._refusals.refused(self._sock, addr, reason, rec, sender)

    def _sender(self, raw: bytes) -> Sender | None:
        if len(raw) < _UCRED.size:
            return None
        pid, uid, gid = _UCRED.unpack_from(raw)
        sender = Sender(uid, gid, pid)
        if len(self._senders) >= _SENDER_CACHE:
            self._senders.clear()
        self._senders[raw] = sender
        return sender

    def _sender_of(self, ancillary: list[tuple[int, int, bytes]]) -> Sender | None:
        """The credentials among several control messages; file descriptors a hostile
        sender attached (should any fit in the buffer) are closed, never kept."""
        sender = None
        for level, kind, raw in ancillary:
            if level != socket.SOL_SOCKET:
                continue
            if kind == _SCM_CREDENTIALS:
                sender = self._senders.get(raw) or self._sender(raw)
            elif kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        return sender

    def _internal(self, message: str) -> None:
        self._aggregator.reject("internal")
        if message not in self._logged:  # once: a flood must not flood the log
            self._logged.add(message)
            log.error(message, exc_info=sys.exc_info()[0] is not None)

    def close(self) -> None:
        """Stop reading (what was read is aggregated first), close the socket and
        remove the socket file we created."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._stopping = True
        with contextlib.suppress(OSError):  # wakes the blocked recvmsg (UDP: ENOTCONN, still woken)
            sock.shutdown(socket.SHUT_RDWR)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)
            if thread.is_alive():  # never seen; closing under a blocked thread is worse
                log.error("the ingest thread did not stop; leaving its socket open")
                return
        self._aggregator.set_drop_counter(None)
        sock.close()
        self._aggregator.set_listening(None)
        dir_fd, self._dir_fd = self._dir_fd, None
        if dir_fd is None or self._unix_path is None:
            return
        name = self._unix_path.name
        # only our own socket: another exporter may have replaced it since
        with contextlib.suppress(OSError):
            if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == self._unix_inode:
                os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)
