"""The ingest listener: a datagram socket on the event loop, feeding the aggregator.

``unix:///run/stepscope/ingest.sock`` (default) or ``udp://127.0.0.1:9401``. For a
Unix socket the parent directory is created when possible, a stale socket file left
by a dead exporter is replaced (a live one is not), and the socket is made
world-writable (0666) so training processes of any user or container that can reach
the path can report; what they can send is bounded by validation and the caps.

Binding failures never stop the exporter: it logs one warning, serves GPU metrics as
usual and exports ``stepscope_ingest_up 0``.

Why ``loop.add_reader`` and not ``create_datagram_endpoint``: asyncio's datagram
transport reads one datagram per readiness callback, so a busy node would pay an
event-loop iteration per step report. Here one callback drains the socket (up to
:data:`MAX_BATCH` datagrams, then yields to HTTP). Target: 50,000 datagrams/s on one
core with no loss (benchmarks/bench_ingest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import stat
from pathlib import Path
from urllib.parse import urlsplit

from stepscope.datagram import MAX_DATAGRAM_BYTES, Rejection, parse_datagram
from stepscope.ingest.aggregate import Aggregator

log = logging.getLogger("stepscope.ingest")

MAX_BATCH = 4096
# Ask for a large receive buffer so bursts (all ranks ending a step together) queue
# instead of dropping; the kernel caps it at net.core.rmem_max.
RECEIVE_BUFFER_BYTES = 8 << 20
SOCKET_MODE = 0o666


class IngestError(OSError):
    """The ingest socket could not be set up; the message says why."""


def _bind_unix(path: Path) -> socket.socket:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IngestError(f"cannot create {path.parent}: {exc.strerror or exc}") from None
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise IngestError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise IngestError(f"{path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()  # stale: nobody is bound to it (an exporter that died)
        except OSError as exc:
            raise IngestError(f"cannot check {path}: {exc.strerror or exc}") from None
        else:
            raise IngestError(f"{path} is in use by another process (another exporter?)")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        sock.close()
        raise IngestError(f"cannot bind {path}: {exc.strerror or exc}") from None
    return sock


def _bind_udp(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise IngestError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise IngestError(f"cannot bind udp {host}:{port}: {exc.strerror or exc}") from None
    try:
        if not ipaddress.ip_address(addr[0]).is_loopback:
            log.warning("ingest listens on %s, not loopback: any host can report steps", addr[0])
    except ValueError:  # pragma: no cover - getaddrinfo returns numeric addresses
        pass
    return sock


class IngestListener:
    """Receives step datagrams on ``url`` and hands them to ``aggregator``."""

    def __init__(self, url: str, aggregator: Aggregator) -> None:
        self.url = url
        self._aggregator = aggregator
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unix_path: Path | None = None
        self._unix_inode: int | None = None
        self._logged_internal = False

    @property
    def up(self) -> bool:
        """Whether the socket is bound and being read."""
        return self._sock is not None

    def _bind(self) -> socket.socket:
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            path = Path(parts.path)
            sock = _bind_unix(path)
            self._unix_path = path
            self._unix_inode = path.stat().st_ino
        elif parts.scheme == "udp" and parts.hostname and parts.port is not None:
            sock = _bind_udp(parts.hostname, parts.port)
        else:
            raise IngestError(f"unsupported ingest URL {self.url!r}")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        sock.setblocking(False)
        return sock

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Bind and start reading on ``loop``; False (and one warning) if binding failed."""
        try:
            sock = self._bind()
        except OSError as exc:
            log.warning(
                "training ingest disabled: %s. GPU metrics are served as usual; "
                "stepscope_ingest_up is 0. Set --ingest to a writable path (e.g. "
                "unix:///tmp/stepscope/ingest.sock) or udp://127.0.0.1:9401.",
                exc,
            )
            self._aggregator.set_listening(None)
            return False
        self._sock = sock
        self._loop = loop
        loop.add_reader(sock.fileno(), self._drain)
        self._aggregator.set_listening(self.url)
        log.info(
            "training ingest listening on %s (receive buffer %d KiB)",
            self.url,
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 1024,
        )
        return True

    def _drain(self) -> None:
        """Read every queued datagram (up to MAX_BATCH) and aggregate it."""
        sock = self._sock
        if sock is None:
            return
        recv = sock.recv
        agg = self._aggregator
        add = agg.add
        reject = agg.reject
        size = MAX_DATAGRAM_BYTES + 1  # a longer datagram is truncated to this: oversize
        for _ in range(MAX_BATCH):
            try:
                data = recv(size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.EAGAIN):
                    log.debug("ingest recv failed: %s", exc)
                return
            try:
                rec = parse_datagram(data, agg.limits)
                if isinstance(rec, Rejection):
                    reject(rec.reason)
                else:
                    add(rec)
            except Exception:  # a bug must not stop the ingest or the exporter
                reject("internal")
                if not self._logged_internal:
                    self._logged_internal = True
                    log.exception("processing an ingest datagram failed")

    def close(self) -> None:
        """Stop reading, close the socket and remove the socket file we created."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
        self._aggregator.set_listening(None)
        path = self._unix_path
        if path is not None:
            # only our own socket: another exporter may have replaced it since
            with contextlib.suppress(OSError):
                if path.stat().st_ino == self._unix_inode:
                    path.unlink()
