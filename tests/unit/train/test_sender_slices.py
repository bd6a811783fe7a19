"""The training thread's share of a step is a ring entry; the sender thread does the rest
in slices, between steps, several datagrams to a system call: real sockets throughout."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from stepscope.train import StepReporter
from stepscope.train._env import IngestAddress
from stepscope.train._mmsg import batch_sender
from stepscope.train._sender import DatagramSender
from stepscope.train._steps import RING_SIZE, SLICE
from tests.unit.train.test_reporter import Receiver, run_steps


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_a_sender_thread_far_behind_never_blocks_a_step_and_every_step_is_counted(
    short_dir: str,
) -> None:
    receiver = Receiver(os.path.join(short_dir, "behind.sock"))
    rep = StepReporter("j", ingest=receiver.url)
    got: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        receiver.sock.settimeout(0.05)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                got.append(receiver.sock.recv(4096))

    reader = threading.Thread(target=read)
    reader.start()
    steps = RING_SIZE + 1000
    with rep._sender._lock:  # the sender thread cannot take a slice meanwhile
        loop = threading.Thread(target=run_steps, args=(rep, steps))
        loop.start()
        loop.join(60)
        assert not loop.is_alive(), "a step waited for the sender thread"
    rep.close()
    done.set()
    reader.join()
    delivered = len(got) + receiver.pending()
    receiver.sock.close()
    assert rep.steps == steps
    assert rep.dropped >= steps - RING_SIZE  # the ring's overflow, counted
    assert delivered + rep.dropped == steps  # every step delivered or counted


class _Slices:
    """A poll handing over ``total`` items ``SLICE`` at a time."""

    def __init__(self, total: int) -> None:
        self.left = list(range(total))
        self.calls = 0

    def __call__(self, final: bool) -> tuple[list[Any], bool]:
        self.calls += 1
        n = len(self.left) if final else SLICE
        items, self.left = self.left[:n], self.left[n:]
        return items, bool(self.left)


@pytest.mark.parametrize(("busy_for", "looks"), [(0, 4), (2, 6), (1000, 12)])
def test_the_sender_works_in_slices_and_waits_for_the_step_to_end_a_few_times_at_most(
    busy_for: int, looks: int
) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no 10-datagram queue
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    receiver.bind(("127.0.0.1", 0))
    port = receiver.getsockname()[1]
    address = IngestAddress(socket.AF_INET, ("127.0.0.1", port), f"udp://127.0.0.1:{port}")
    sender = DatagramSender(address, lambda item, dropped: str(item).encode())
    total = 3 * SLICE + 5
    poll = sender.poll = _Slices(total)
    asked: list[bool] = []

    def busy() -> bool:  # inside a step for the first ``busy_for`` looks
        asked.append(len(asked) < busy_for)
        return asked[-1]

    sender.busy = busy
    assert sender._tick()  # one wake-up of the sending thread
    slices = poll.calls
    receiver.settimeout(10)
    got = [int(receiver.recv(4096)) for _ in range(total)]
    sender.close()
    receiver.close()
    assert got == list(range(total))  # in order, all of them
    assert slices == 4
    # a slice waits while the training thread is inside a step, 3 times at most: a
    # training thread that never leaves one does not starve the sender
    assert len(asked) == looks


def test_sendmmsg_sends_a_batch_in_one_call_and_says_how_many_fit(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    batch = batch_sender(8)
    if batch is None:
        pytest.skip("no sendmmsg here")
    datagrams = [f"datagram {i}".encode() * (i + 1) for i in range(10)]
    assert batch.send(a, datagrams) == 8  # its capacity
    assert [b.recv(4096) for _ in range(8)] == datagrams[:8]
    # a receiver that never reads: some fit, then none (EAGAIN), nothing blocks
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sent = 0
    with pytest.raises(OSError) as full:
        for _ in range(10_000):
            sent += batch.send(a, [b"x" * 200] * 8)
    assert full.value.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
    assert sent > 0
