"""The ingest socket is created safely and its kernel drops are visible (issue 15,
finding 7 and the UDP receive-buffer drops).

The socket used to be chmod-ed to 0666 after bind: with an attacker-writable socket
directory, swapping the socket for a symlink between the two calls turned a root-owned
0600 file 0666; an existing socket directory was reused whoever owned it. A UDP flood
lost 6.75 M datagrams in the kernel without a trace in the exporter's metrics.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.core.exposition import render
from stepscope.ingest.aggregate import Aggregator, TrainingView
from stepscope.ingest.listener import (
    BUSY_RATE,
    MAX_PAUSE,
    IngestAccess,
    IngestListener,
    kernel_drops,
    pause,
)
from stepscope.ingest.metrics import ingest_families
from tests.support import parse_samples
from tests.support.ingest import NOBODY, step


class Running:
    """An IngestListener with its receiving thread, and its aggregator."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self.aggregator = Aggregator()
        self.listener = IngestListener(url, self.aggregator, **kwargs)

    def start(self) -> bool:
        return self.listener.start()

    def pump_until(
        self, done: Callable[[TrainingView], bool], timeout: float = 15.0
    ) -> TrainingView:
        """Poll the aggregator until ``done(view)``, with a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.aggregator.view()
            if done(view):
                return view
            assert time.monotonic() < deadline, f"not reached; last view {view!r}"
            time.sleep(0.01)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for r in made:
        r.close()


def listen(made: list[Running], url: str, **kwargs: Any) -> Running:
    r = Running(url, **kwargs)
    made.append(r)
    return r


def refuses(made: list[Running], url: str, words: str, caplog: pytest.LogCaptureFixture,
            **kwargs: Any) -> None:
    r = listen(made, url, **kwargs)
    assert r.start() is False
    assert not r.aggregator.view().ingest_up
    (warning,) = [rec.getMessage() for rec in caplog.records if "ingest disabled" in
                  rec.getMessage()]
    assert words in warning, warning


def test_the_socket_gets_its_mode_at_bind_and_a_missing_directory_is_made_0755(
    base: Path, running: list[Running]
) -> None:
    path = base / "new" / "ingest.sock"
    r = listen(running, f"unix://{path}", access=IngestAccess(mode=0o620))
    assert r.start()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(path.stat().st_mode) == 0o620
    r.listener.close()
    assert not path.exists()


def test_an_existing_directory_of_another_user_is_refused(
    base: Path, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another uid owns needs root")
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    refuses(running, f"unix://{theirs}/ingest.sock", f"{theirs} belongs to uid 65534", caplog)
    assert list(theirs.iterdir()) == []


def test_a_directory_other_users_can_write_is_refused_unless_sticky(
    base: Path, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    refuses(running, f"unix://{open_dir}/ingest.sock", "writable by other users (mode 0777)",
            caplog)
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others cannot rename or remove what we create
    r = listen(running, f"unix://{sticky}/ingest.sock")
    assert r.start()


def test_a_symlinked_socket_directory_is_refused(
    base: Path, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    real = base / "real"
    real.mkdir()
    (base / "link").symlink_to(real)
    refuses(running, f"unix://{base}/link/ingest.sock", "is a symlink", caplog)


@pytest.mark.parametrize("group", [None, NOBODY])
def test_a_socket_swapped_for_a_symlink_after_bind_never_changes_the_target(
    base: Path, running: list[Running], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, group: int | None,
) -> None:
    """The race of finding 7, made deterministic: right after bind, "the attacker"
    replaces the socket with a symlink to a root-only file. The old code then chmod-ed
    the symlink's target 0666; now nothing after bind follows a path."""
    victim = base / "shadow"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    before = victim.stat()
    sticky = base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    path = sticky / "ingest.sock"
    real_bind = socket.socket.bind

    def bind_then_swap(self: socket.socket, address: Any) -> None:
        real_bind(self, address)
        if self.family == socket.AF_UNIX:
            path.unlink()
            path.symlink_to(victim)

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)
    refuses(running, f"unix://{path}", "was replaced right after bind", caplog,
            access=IngestAccess(mode=0o666, group=group))
    after = victim.stat()
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (
        0o600, before.st_uid, before.st_gid)
    assert victim.read_text() == "secret\n"


def test_udp_receive_buffer_drops_are_counted(running: list[Running]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # a small buffer, and nobody draining while the burst arrives
    r = listen(running, f"udp://127.0.0.1:{port}", receive_buffer=16 << 10)
    assert r.start()
    if kernel_drops(r.listener._sock) is None:  # type: ignore[arg-type]
        pytest.skip("this kernel does not count socket drops (SO_MEMINFO, Linux >= 4.15)")
    data = json.dumps(step("burst", 0, 0, time.time(), None)).encode()
    sent = 2000
    # Nobody draining: the receiving thread stops at its first batch, waiting for the
    # aggregator, while the burst overflows the 16 KiB buffer. (Without holding it, a
    # sender slowed by a busy machine let the thread keep up: no drop, a failed test.)
    with r.aggregator._lock, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for _ in range(sent):
            sender.sendto(data, ("127.0.0.1", port))
    view = r.pump_until(lambda v: v.accepted + (v.kernel_dropped or 0) == sent)
    assert view.kernel_dropped and view.kernel_dropped > 0 and view.accepted > 0
    served = parse_samples(render(ingest_families(view)).decode())
    assert served["stepscope_ingest_kernel_dropped_total"] == [({}, view.kernel_dropped)]


@pytest.mark.parametrize("room", ["credentials", "fds too"])
def test_file_descriptors_a_sender_attaches_are_not_kept(
    base: Path, running: list[Running], room: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the control buffer has room for the credentials only, so the kernel closes passed
    # fds that do not fit; were it larger, the listener must close those it receives
    if room == "fds too":
        import stepscope.ingest.listener as listener_module

        space = listener_module._CRED_SPACE + socket.CMSG_SPACE(8 * array.array("i").itemsize)
        monkeypatch.setattr(listener_module, "_CRED_SPACE", space)
    path = base / "ingest.sock"
    r = listen(running, f"unix://{path}")
    assert r.start()

    def open_devnulls() -> int:
        # counted by what they point at: the listener's thread opens and closes files of
        # its own meanwhile (/proc), which a plain count of open fds would catch
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # closed since the listing
                count += os.readlink(f"/proc/self/fd/{fd}") == os.devnull
        return count

    before = open_devnulls()
    data = json.dumps(step("fds", 0, 0, time.time(), None)).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender, open(os.devnull) as f:
        fds = array.array("i", [f.fileno()] * 8)
        # five at a time (the queue may hold as few as 10), each five read as one batch
        for i in range(5, 51, 5):
            for _ in range(5):
                sender.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], 0,
                               str(path))  # fmt: skip
            r.pump_until(lambda v, n=i: v.accepted == n)
        assert open_devnulls() == before + 1  # f itself: the 400 passed copies are closed


def send_steps(
    path: Path, job: str, count: int, burst: int = 0, between: Callable[[], Any] = lambda: None
) -> None:
    """``count`` step datagrams of ``job``'s rank 0, steps 0 to count - 1, to ``path``;
    with ``burst``, ``between()`` after each ``burst`` of them (to pace the sender)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.connect(str(path))
        for s in range(count):
            sender.send(json.dumps(step(job, 0, s, time.time(), None)).encode())
            if burst and (s + 1) % burst == 0:
                between()


def sent_then_closed(
    r: Running, path: Path, job: str, count: int, burst: int = 0,
    between: Callable[[], Any] = lambda: None,
) -> TrainingView:
    """Send ``count`` steps (see :func:`send_steps`), close the listener at once, and
    the aggregate it leaves: what was queued or batched must be in it."""
    send_steps(path, job, count, burst, between)
    r.listener.close()
    return r.aggregator.view()


def test_what_was_sent_before_close_is_aggregated_and_the_thread_ends(
    base: Path, running: list[Running]
) -> None:
    # the receiving thread keeps a batch up to BATCH_SECONDS before aggregating it, and
    # the kernel may still queue some: close() takes both, it drops neither
    path = base / "ingest.sock"
    r = listen(running, f"unix://{path}")
    assert r.start()
    view = sent_then_closed(r, path, "closing", 8)  # under the kernel's default queue of 10
    assert view.accepted == 8, view
    assert not r.listener.up and not path.exists()
    assert [t for t in threading.enumerate() if t.name == "stepscope-ingest"] == []


def test_a_failure_while_aggregating_is_counted_and_the_ingest_keeps_going(
    base: Path, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    path = base / "ingest.sock"
    r = listen(running, f"unix://{path}")
    real_add = r.aggregator.add
    calls = 0

    def add_failing_once(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the aggregator")
        real_add(*args, **kwargs)

    r.aggregator.add = add_failing_once  # type: ignore[method-assign]
    assert r.start()
    send_steps(path, "buggy", 3)
    view = r.pump_until(lambda v: v.accepted == 2)
    assert view.rejected.get("internal") == 1, view.rejected
    (line,) = [rec for rec in caplog.records if "ingest datagram failed" in rec.getMessage()]
    assert line.exc_info is not None  # the traceback is in the log, once


def test_pause_is_none_below_the_busy_rate_then_half_a_queue_capped() -> None:
    assert pause(BUSY_RATE - 1, 5) == 0.0  # a wake-up per datagram: cheap at this rate
    assert pause(500.0, 5) == pytest.approx(0.01)  # 5 datagrams' time: half of 10 queued
    assert pause(BUSY_RATE, 500) == MAX_PAUSE  # a large queue still waits at most this


def test_a_busy_ingest_drains_on_a_timer_and_loses_nothing(
    base: Path, running: list[Running]
) -> None:
    # above BUSY_RATE datagrams a second the thread stops waking for each datagram and
    # drains the queue every pause: a sender may meet a full queue (this blocking one
    # waits, as the SDK keeps its steps), nothing is dropped, close() included
    path = base / "ingest.sock"
    r = listen(running, f"unix://{path}")
    assert r.start()
    sent = 4000
    paces: list[float] = []

    def look_and_wait() -> None:
        paces.append(r.listener.pace)
        time.sleep(0.005)

    view = sent_then_closed(r, path, "busy", sent, 8, look_and_wait)  # ~1,600 a second
    assert view.accepted == sent, (view.accepted, sent)
    assert max(paces) > 0, "the listener never left the wake-per-datagram mode"
    assert max(paces) <= MAX_PAUSE
