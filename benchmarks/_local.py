"""Helpers the benchmark and acceptance scripts share: free loopback ports, plain HTTP
GETs, a detached exporter, a process's CPU and memory from /proc, and SDK-like training
jobs (``from benchmarks._local import free_port``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.paths import EXPORTER
from tests.support.ports import free_port

__all__ = ["free_port"]  # re-exported: the scripts import it from here


def get(url: str, timeout: float = 10.0) -> bytes:
    """The body of a GET; raises OSError (URLError) when nothing answers."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def scrape(port: int, path: str = "/metrics") -> str:
    """``/metrics`` (or ``path``) of an exporter on 127.0.0.1:``port`` as text."""
    return get(f"http://127.0.0.1:{port}{path}").decode()


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    """Wait until the Prometheus (server or agent) at ``url`` answers ``/-/ready``;
    RuntimeError with the end of its ``log`` if it exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url + "/-/ready")
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log.read_text()[-2000:]) from None
            time.sleep(0.5)


def wait_for_exporter(port: int, proc: subprocess.Popen[bytes], log: Path,
                      timeout: float = 60.0) -> bool:
    """Poll ``/metrics`` until it answers; False (and the log printed) if the exporter
    exited or the deadline passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            scrape(port)
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log.read_text())
                return False
            time.sleep(0.2)


def start_detached(argv: list[str], log: Path, env: dict[str, str]) -> int:
    """Start ``argv`` detached from this process (its output to ``log``); its pid.

    A training script must not be the parent of a process that is not its own worker:
    stepscope counts a rank's child processes as its DataLoader workers (an idle child
    read as a blocked loader on the H200). ``sh`` starts it in the background and exits,
    so it is re-parented.
    """
    launcher = subprocess.run(
        ["sh", "-c", 'exec "$@" >"$LOG" 2>&1 </dev/null & echo $!', "sh", *argv],
        env={**env, "LOG": str(log)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(launcher.stdout.strip())


def start_detached_exporter(args: list[str], log: Path, env: dict[str, str]) -> int:
    """Start ``python -m stepscope serve ARGS`` detached from this process; its pid."""
    return start_detached([sys.executable, "-m", "stepscope", "serve", *args], log, env)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM ``pid`` and wait (polling) until it is gone or ``timeout`` passes."""
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


# ---------------------------------------------------------------- a process, from /proc


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def proc_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (``/proc/PID/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_average() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages (others' work shows here)."""
    return os.getloadavg()


def gpu_uuids(port: int) -> list[str]:
    """The UUIDs of the GPUs an exporter on 127.0.0.1:``port`` serves, by GPU index."""
    found: dict[int, str] = {}
    for line in scrape(port).splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            labels = dict(
                part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")]
                .replace('"', "").split(",")
            )  # fmt: skip
            found[int(labels["gpu"])] = labels["UUID"]
    return [found[i] for i in sorted(found)]


# ---------------------------------------------------------------- SDK-like training ranks


def _job_ranks(path: str, job: str, ranks: int, world: int, uuids: list[str],
               seconds: float, counts: Any) -> None:  # fmt: skip
    """One training job's process: ``ranks`` ranks, each sending one step a second for
    ``seconds`` with the SDK's own encoder, spread evenly over each second."""
    from stepscope.shared.datagram import StepEncoder

    encoders = [StepEncoder(job, r, r % 8, world, "bf16", uuids[r % len(uuids)] if uuids else None)
                for r in range(ranks)]  # fmt: skip
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(path)
    sock.setblocking(False)
    start = time.monotonic()
    gap = 1.0 / ranks
    sent = blocked = step = 0
    while time.monotonic() - start < seconds:
        for i, enc in enumerate(encoders):
            due = start + step + i * gap
            ahead = due - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            data = enc.encode((step, step < 2, time.time(), 0.8, 0.1, 0.5, 0.15, 4096, 1e14, ()), 0)
            try:
                sock.send(data)
            except BlockingIOError:
                # the SDK keeps it and retries a millisecond later; a benchmark waits,
                # so the load stays what it says
                blocked += 1
                sock.setblocking(True)
                sock.send(data)
                sock.setblocking(False)
            sent += 1
        step += 1
        with counts.get_lock():
            counts[0] += sent
            counts[1] += blocked
        sent = blocked = 0


class TrainingJobs:
    """SDK-like training jobs, each a process of its own (as a real job is): its ranks
    send step datagrams over the Unix ingest socket, one step per rank per second, the
    pid in each datagram the sender's own (the exporter checks it against the kernel's).

    ``sent`` and ``blocked`` count datagrams, ``blocked`` those that found the socket's
    queue full (the SDK retries those a millisecond later; here the sender waits).
    """

    def __init__(self, path: str, uuids: list[str]) -> None:
        import multiprocessing

        self._mp = multiprocessing.get_context("fork")
        self.path = path
        self.uuids = uuids
        self.counts = self._mp.Array("q", 2)
        self.live: dict[str, Any] = {}
        self.started = 0

    def start(self, job: str, ranks: int, seconds: float = 1e9, world: int | None = None
              ) -> None:  # fmt: skip
        proc = self._mp.Process(
            target=_job_ranks, daemon=True,
            args=(self.path, job, ranks, world or ranks, self.uuids, seconds, self.counts),
        )  # fmt: skip
        proc.start()
        self.live[job] = proc
        self.started += 1

    def finish(self, job: str) -> None:
        """The job's process ends (SIGTERM), as a finished or killed job's would."""
        proc = self.live.pop(job)
        proc.terminate()
        proc.join(5)

    def reap(self) -> list[str]:
        """Forget jobs whose process ended on its own; their names."""
        done = [job for job, p in self.live.items() if not p.is_alive()]
        for job in done:
            self.live.pop(job).join(1)
        return done

    @property
    def sent(self) -> int:
        return int(self.counts[0])

    @property
    def blocked(self) -> int:
        return int(self.counts[1])

    def stop(self) -> None:
        for job in list(self.live):
            self.finish(job)


class ServedExporter:
    """``stepscope serve --simulate GPUS`` started detached, listening on a free loopback
    port, ingesting on a Unix socket in a fresh private directory; waits until
    ``/metrics`` answers. ``extra``: more serve flags; ``env``: more environment."""

    def __init__(self, gpus: int = 8, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        import shutil
        import tempfile

        self._rmtree = shutil.rmtree
        self.dir = Path(tempfile.mkdtemp(prefix="stepscope-bench-", dir="/tmp"))
        self.socket = str(self.dir / "ingest.sock")
        self.port = free_port()
        self.log = self.dir / "exporter.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
        environ["PYTHONPATH"] = str(EXPORTER)
        self.pid = start_detached_exporter(
            ["--simulate", str(gpus), "--listen", f"127.0.0.1:{self.port}",
             "--ingest", f"unix://{self.socket}", "--log-level", "warning", *(extra or [])],
            self.log, {**environ, **(env or {})},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(self.port)
                break
            except OSError:
                if not pid_alive(self.pid) or time.monotonic() > deadline:
                    print(self.log.read_text())
                    self.stop()
                    raise RuntimeError("the exporter did not start") from None
                time.sleep(0.2)

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)
        self._rmtree(self.dir, ignore_errors=True)
