"""The training SDK as a training script sees it: real sockets, real datagrams."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from stepscope.shared import datagram as schema
from stepscope.train import StepReporter, transformer_flops_per_token
from stepscope.train._timeline import PREWARM_EVENTS
from tests.support import REPO

REQUIRED = ("v", "type", "job", "rank", "local_rank", "step", "t", "dur")
LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    schema.INGEST_ENV,
)


class Receiver:
    """A Unix datagram socket standing in for the exporter's ingest."""

    def __init__(self, path: str, rcvbuf: int | None = None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(path)

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def take(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The next ``n`` datagrams, parsed; waits for each up to the deadline."""
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"got {len(out)} of {n} datagrams: {out}"
            self.sock.settimeout(left)
            raw = self.sock.recv(schema.MAX_DATAGRAM_BYTES + 1)
            assert len(raw) <= schema.MAX_DATAGRAM_BYTES
            out.append(json.loads(raw.decode("utf-8")))
        return out

    def pending(self) -> int:
        """How many datagrams sit in the queue now (reads them)."""
        self.sock.setblocking(False)
        n = 0
        try:
            while True:
                self.sock.recv(schema.MAX_DATAGRAM_BYTES)
                n += 1
        except BlockingIOError:
            return n


@pytest.fixture
def receiver(short_dir: str) -> Iterator[Receiver]:
    rec = Receiver(os.path.join(short_dir, "ingest.sock"))
    yield rec
    rec.sock.close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def run_steps(rep: StepReporter, n: int, tokens: Any = 0) -> None:
    for _ in rep.timed(range(n)):
        with rep.step(tokens=tokens):
            pass


def test_each_step_is_one_schema_datagram(receiver: Receiver) -> None:
    rep = StepReporter("llama-8b", flops_per_token=6e9, ingest=receiver.url)
    run_steps(rep, 5, tokens=4096)
    got = receiver.take(5)
    rep.close()
    for i, d in enumerate(got):
        assert all(key in d for key in REQUIRED), d
        assert d["v"] == schema.SCHEMA_VERSION and d["type"] == "step"
        assert d["job"] == "llama-8b"
        assert (d["rank"], d["local_rank"], d["world_size"]) == (0, 0, 1)
        assert d["pid"] == os.getpid()
        assert d["step"] == i
        assert d["precision"] == "bf16"
        assert d["tokens"] == 4096 and d["flops"] == 6e9 * 4096
        assert d["dropped"] == 0
        assert "uuid" not in d  # no CUDA here
        assert 0 < d["dur"] <= schema.MAX_STEP_SECONDS
        assert d["comm"] == 0.0
        assert abs(d["t"] - time.time()) < 60
    assert [d["warmup"] for d in got] == [True, True, True, False, False]
    assert rep.steps == 5 and rep.dropped == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}, (5, 1, 16)),
        ({"SLURM_PROCID": "9", "SLURM_LOCALID": "3", "SLURM_NTASKS": "32"}, (9, 3, 32)),
        (
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                "OMPI_COMM_WORLD_SIZE": "4",
            },
            (2, 2, 4),
        ),
        # torchrun inside a Slurm allocation: torchrun's variables describe the rank
        ({"RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "1"}, (7, 3, 8)),
        ({}, (0, 0, 1)),
    ],
    ids=["torchrun", "slurm", "openmpi", "torchrun-under-slurm", "none"],
)
def test_rank_comes_from_the_launcher_environment(
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    expected: tuple[int, int, int],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rep = StepReporter("j", ingest=receiver.url)
    assert (rep.rank, rep.local_rank, rep.world_size) == expected
    run_steps(rep, 1)
    (d,) = receiver.take(1)
    rep.close()
    assert (d["rank"], d["local_rank"], d["world_size"]) == expected


def test_explicit_rank_arguments_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "16")
    rep = StepReporter("j", rank=3, local_rank=0, world_size=4, ingest="unix:///nonexistent/s")
    assert (rep.rank, rep.local_rank, rep.world_size) == (3, 0, 4)
    rep.close()


def test_warmup_flags_follow_warmup_steps(receiver: Receiver) -> None:
    rep = StepReporter("j", warmup_steps=2, start_step=100, ingest=receiver.url)
    run_steps(rep, 4)
    got = receiver.take(4)
    rep.close()
    assert [(d["step"], d["warmup"]) for d in got] == [
        (100, True),
        (101, True),
        (102, False),
        (103, False),
    ]


def test_resume_from_numbers_the_next_step_and_ignores_a_bad_number(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    rep = StepReporter("j", ingest=receiver.url)
    run_steps(rep, 1)
    rep.resume_from(500)  # the checkpoint restored after the reporter was made
    run_steps(rep, 1)
    rep.resume_from(-1)
    rep.resume_from("7")  # type: ignore[arg-type]
    run_steps(rep, 1)
    got = receiver.take(3)
    rep.close()
    assert [d["step"] for d in got] == [0, 500, 501]
    assert sum("resume_from" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_a_slow_loader_shows_as_data_wait(receiver: Receiver) -> None:
    def slow_loader() -> Iterator[int]:
        for i in range(4):
            time.sleep(0.05)  # the workload: a starved DataLoader
            yield i

    rep = StepReporter("j", ingest=receiver.url)
    for _ in rep.timed(slow_loader()):
        with rep.step(tokens=1):
            time.sleep(0.01)  # the workload: compute
    got = receiver.take(4)
    rep.close()
    for d in got:
        assert d["data"] >= 0.045, d
        assert d["compute"] >= 0.009, d
        assert d["data"] / d["dur"] > 0.7, d
        assert d["data"] + d["compute"] + d["comm"] <= d["dur"] + 1e-8, d


def test_time_between_steps_is_other_and_phases_never_exceed_the_step(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", ingest=receiver.url)
    for i in rep.timed(range(3)):
        with rep.step():
            pass
        if i == 1:
            time.sleep(0.05)  # the workload: logging/eval between steps
    got = receiver.take(3)
    rep.close()
    for d in got:
        assert d["data"] + d["compute"] + d["comm"] <= d["dur"] + 1e-8, d
    other = got[2]["dur"] - got[2]["data"] - got[2]["compute"] - got[2]["comm"]
    assert other >= 0.045, got[2]
    # consecutive steps tile the run: no time is lost between them
    assert got[2]["t"] - got[0]["t"] == pytest.approx(got[1]["dur"] + got[2]["dur"], abs=5e-3)


def test_tokens_and_flops_arithmetic(receiver: Receiver) -> None:
    per_token = StepReporter("j", flops_per_token=3.0, ingest=receiver.url)
    run_steps(per_token, 1, tokens=10)
    per_step = StepReporter("j", flops_per_step=1e15, ingest=receiver.url)
    run_steps(per_step, 1, tokens=10)
    none = StepReporter("j", ingest=receiver.url)
    run_steps(none, 1, tokens=10)
    with per_token.step(tokens=10, flops=7.5):
        pass
    got = receiver.take(4)
    for rep in (per_token, per_step, none):
        rep.close()
    assert sorted((d["tokens"], d["flops"]) for d in got) == [
        (10, 0.0),
        (10, 7.5),
        (10, 30.0),
        (10, 1e15),
    ]


@pytest.mark.parametrize(
    ("tokens", "sent", "invalid"),
    [(None, 0, 1), (-5, 0, 1), ("many", 0, 1), (7.0, 7, 0), (7.5, 0, 1), (True, 0, 1)],
)
def test_bad_per_step_values_are_zeroed_and_counted_not_raised(
    receiver: Receiver, tokens: Any, sent: int, invalid: int
) -> None:
    rep = StepReporter("j", flops_per_token=2.0, ingest=receiver.url)
    run_steps(rep, 1, tokens=tokens)
    with rep.step(tokens=1, flops=float("nan")):
        pass
    first, second = receiver.take(2)
    rep.close()
    assert (first["tokens"], first["flops"]) == (sent, 2.0 * sent)
    assert (second["tokens"], second["flops"]) == (1, 0.0)
    assert rep.invalid == invalid + 1
    assert rep.steps == 2


def test_no_exporter_nothing_raises_and_every_step_is_counted(short_dir: str) -> None:
    rep = StepReporter("j", ingest=f"unix://{short_dir}/absent.sock")
    run_steps(rep, 100, tokens=1)
    rep.close()
    assert rep.steps == 100
    assert rep.dropped == 100


def test_a_late_exporter_is_picked_up_and_told_what_was_dropped(short_dir: str) -> None:
    path = os.path.join(short_dir, "late.sock")
    rep = StepReporter("j", ingest=f"unix://{path}", retry_interval=0.05)
    run_steps(rep, 3)
    deadline = time.monotonic() + 10
    while rep.dropped < 3:  # the sender thread found no exporter
        assert time.monotonic() < deadline
        with rep.step():
            pass
        time.sleep(0.01)
    late = Receiver(path)
    late.sock.settimeout(0.05)
    got: list[dict[str, Any]] = []
    while not got:  # keep training until a step reaches the new exporter
        assert time.monotonic() < deadline, "the late exporter was never reached"
        with rep.step():
            pass
        with contextlib.suppress(TimeoutError):
            got.append(json.loads(late.sock.recv(schema.MAX_DATAGRAM_BYTES)))
    rep.close()
    late.sock.close()
    assert got[0]["dropped"] >= 3


def test_a_full_exporter_queue_drops_and_counts_without_blocking(short_dir: str) -> None:
    stuck = Receiver(os.path.join(short_dir, "stuck.sock"), rcvbuf=1024)  # never read
    rep = StepReporter("j", ingest=stuck.url)
    run_steps(rep, 10_000, tokens=1)
    rep.close(timeout=0.1)
    queued = stuck.pending()
    stuck.sock.close()
    assert rep.steps == 10_000
    assert rep.dropped > 9_000
    assert rep.dropped + queued == 10_000  # every step is either delivered or counted


def test_udp_ingest() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)
    port = sock.getsockname()[1]
    rep = StepReporter("j", ingest=f"udp://127.0.0.1:{port}")
    run_steps(rep, 1, tokens=3)
    d = json.loads(sock.recv(schema.MAX_DATAGRAM_BYTES))
    rep.close()
    sock.close()
    assert (d["job"], d["tokens"]) == ("j", 3)


def test_ingest_from_environment_and_argument_wins(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, short_dir: str
) -> None:
    monkeypatch.setenv(schema.INGEST_ENV, receiver.url)
    assert StepReporter("j").ingest.address == receiver.path
    assert StepReporter("j", ingest="udp://127.0.0.1:9401").ingest.address == (
        "127.0.0.1",
        9401,
    )
    monkeypatch.delenv(schema.INGEST_ENV)
    assert StepReporter("j").ingest.url == schema.DEFAULT_INGEST


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"job": 5}, TypeError, "job must be a str"),
        ({"job": "my job"}, ValueError, "label-safe"),
        ({"job": ""}, ValueError, "label-safe"),
        ({"job": "x" * 129}, ValueError, "label-safe"),
        ({"flops_per_token": -1}, ValueError, "flops_per_token"),
        ({"flops_per_token": "6e9"}, TypeError, "flops_per_token"),
        ({"flops_per_step": float("inf")}, ValueError, "flops_per_step"),
        ({"flops_per_token": 1, "flops_per_step": 1}, ValueError, "not both"),
        ({"precision": "fp64"}, ValueError, "precision"),
        ({"warmup_steps": -1}, ValueError, "warmup_steps"),
        ({"rank": "0"}, TypeError, "rank"),
        ({"world_size": 0}, ValueError, "world_size"),
        ({"ingest": "http://localhost:9401"}, ValueError, "unix:// or udp://"),
        ({"ingest": "udp://localhost"}, ValueError, "udp://HOST:PORT"),
        ({"cuda": "yes"}, TypeError, "cuda"),
    ],
)
def test_bad_constructor_arguments_say_what_is_wrong(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    args = {"job": "j", "ingest": "unix:///nonexistent/s", **kwargs}
    with pytest.raises(error, match=words):
        StepReporter(**args)


def test_an_exception_in_a_step_propagates_unchanged_and_is_not_reported(
    receiver: Receiver,
) -> None:
    rep = StepReporter("j", ingest=receiver.url)
    boom = RuntimeError("CUDA out of memory")
    with pytest.raises(RuntimeError) as caught, rep.step(tokens=5):
        raise boom
    assert caught.value is boom
    with rep.step(tokens=6):
        pass
    (d,) = receiver.take(1)
    rep.close()
    assert (d["step"], d["tokens"]) == (0, 6)
    assert (rep.failed, rep.steps) == (1, 1)


def test_timed_passes_items_through_and_stops_cleanly() -> None:
    rep = StepReporter("j", ingest="unix:///nonexistent/s")
    items = [object(), object(), object()]
    assert [x for x in rep.timed(items)] == items
    assert list(rep.timed([])) == []

    def broken() -> Iterator[int]:
        yield 1
        raise KeyError("corrupt record")

    with pytest.raises(KeyError, match="corrupt record"):
        list(rep.timed(broken()))
    rep.close()


def test_watch_ddp_on_something_else_warns_and_does_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rep = StepReporter("j", ingest="unix:///nonexistent/s")
    assert rep.watch_ddp(object()) is False
    assert rep.watch_ddp(object()) is False
    assert len([r for r in caplog.records if "watch_ddp" in r.getMessage()]) == 1
    rep.close()


def test_importing_the_sdk_imports_no_heavy_dependency() -> None:
    code = (
        "import sys, stepscope.train; "
        "print([m for m in ('torch', 'aiohttp', 'prometheus_client', 'pynvml', 'yaml', "
        "'numpy') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_transformer_flops_per_token_is_palm_appendix_b() -> None:
    # GPT-2 small-like: 85M non-embedding params, 12 layers, 12 heads of 64, T = 1024
    got = transformer_flops_per_token(85_000_000, 12, 12, 64, 1024)
    assert got == 6 * 85_000_000 + 12 * 12 * 12 * 64 * 1024 == 623_246_208
    with pytest.raises(ValueError, match="n_params"):
        transformer_flops_per_token(0, 12, 12, 64, 1024)
    with pytest.raises(TypeError, match="seq_len"):
        transformer_flops_per_token(1, 12, 12, 64, 1024.0)  # type: ignore[arg-type]


class FakeGpu:
    """torch's CUDA surface as the reporter uses it, on a clock the test drives.

    CI has no GPU: this twin checks the CUDA-event arithmetic and the lazy, never
    blocking read. Each recorded event takes the next time from ``times`` (ms on the
    GPU's clock); an event has completed once ``done_until`` reaches its time.
    """

    def __init__(self, times: list[float]) -> None:
        # the reporter records its pool's events once when CUDA timing starts
        self.times = [-1.0] * PREWARM_EVENTS + list(times)
        self.done_until = -1.0
        self.synchronized = 0
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self) -> None:
                self.t = gpu.times.pop(0)

            def query(self) -> bool:
                return self.t is not None and self.t <= gpu.done_until

            def elapsed_time(self, end: Event) -> float:
                assert self.query() and end.query(), "read before completion"
                assert self.t is not None and end.t is not None
                return end.t - self.t

        class CUuuid:  # torch._C._CUuuid: 16 raw bytes, prints without "GPU-"
            bytes = uuid.UUID("2f5a1c3e-0000-1111-2222-333344445555").bytes

            def __str__(self) -> str:
                return "2f5a1c3e-0000-1111-2222-333344445555"

        class Props:
            uuid = CUuuid()

        class Cuda:
            Event = None

            @staticmethod
            def is_available() -> bool:
                return True

            @staticmethod
            def is_initialized() -> bool:
                return True

            @staticmethod
            def current_device() -> int:
                return 0

            @staticmethod
            def get_device_properties(device: int) -> Props:
                return Props()

            @staticmethod
            def synchronize() -> None:
                gpu.synchronized += 1

        Cuda.Event = Event  # type: ignore[assignment,misc]
        self.module = type(sys)("torch")
        self.module.cuda = Cuda  # type: ignore[attr-defined]


def test_cuda_steps_are_gpu_time_read_a_step_later_without_blocking(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU clock (ms): step 0 runs 0-40; the GPU then idles 10 ms waiting for the
    # host (slow loader); step 1 runs 50-90; step 2 90-130, its loader hidden.
    gpu = FakeGpu([0, 40, 50, 90, 90, 130])
    monkeypatch.setitem(sys.modules, "torch", gpu.module)

    def loader() -> Iterator[int]:
        yield 0
        time.sleep(0.02)  # the workload: 20 ms host wait, of which the GPU saw 10
        yield 1
        yield 2

    rep = StepReporter("j", ingest=receiver.url, warmup_steps=0)
    receiver.sock.settimeout(0.3)
    for i in rep.timed(loader()):
        with rep.step(tokens=1):
            pass
        if i == 0:
            with pytest.raises(TimeoutError):  # step 0's events have not completed
                receiver.sock.recv(4096)
        gpu.done_until = 40 if i == 0 else 90  # the GPU catches up
    s0, s1 = receiver.take(2)  # each read when the next step ended
    rep.close()  # step 2's events never completed: dropped, not waited for
    assert gpu.synchronized == 0  # nothing blocked
    assert rep.dropped == 1
    assert s0["uuid"] == s1["uuid"] == "GPU-2f5a1c3e-0000-1111-2222-333344445555"
    assert s0["step"] == 0 and s0["compute"] == pytest.approx(0.040)
    assert s1["step"] == 1
    assert s1["dur"] == pytest.approx(0.050)
    assert s1["data"] == pytest.approx(0.010)  # what the GPU waited, not the host's 20 ms
    assert s1["compute"] == pytest.approx(0.040)


def test_cuda_sync_mode_synchronizes_and_sends_each_step_at_once(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = FakeGpu([])
    monkeypatch.setitem(sys.modules, "torch", gpu.module)
    rep = StepReporter("j", ingest=receiver.url, sync=True)
    run_steps(rep, 2)
    got = receiver.take(2)
    rep.close()
    assert gpu.synchronized == 4  # entering and leaving each step
    assert [d["step"] for d in got] == [0, 1]
    assert all(d["uuid"].startswith("GPU-") for d in got)


def test_a_queue_full_for_a_moment_waits_quietly_and_loses_nothing(
    short_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a busy exporter drains its queue every few milliseconds, so senders meet a full
    # one now and then: the steps wait (retried a millisecond later), nothing is logged
    slow = Receiver(os.path.join(short_dir, "slow.sock"))
    rep = StepReporter("j", ingest=slow.url)
    got: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: (time.sleep(0.3), got.extend(slow.take(200))))
    reader.start()
    with caplog.at_level(logging.WARNING, logger="stepscope.train"):
        run_steps(rep, 200)  # far more than the kernel queues (10 by default)
        reader.join(15)
        rep.close()
    slow.sock.close()
    assert [d["step"] for d in got] == list(range(200))
    assert rep.dropped == 0
    assert "full" not in caplog.text


def test_a_queue_that_stays_full_is_logged_once(
    short_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = Receiver(os.path.join(short_dir, "stuck.sock"))  # never read
    rep = StepReporter("j", ingest=stuck.url)
    with caplog.at_level(logging.WARNING, logger="stepscope.train"):
        run_steps(rep, 50)
        deadline = time.monotonic() + 10
        while "has been full" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        rep.close(timeout=0.1)
    stuck.sock.close()
    assert caplog.text.count("has been full") == 1, caplog.text
