"""Attacks run as another user: a Python snippet under ``setpriv`` (util-linux) as
``nobody`` or a second uid, optionally in a network namespace of its own (``unshare``),
against a real ``stepscope serve`` run by the test's user (root in CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.exporter import Exporter, start_exporter

NOBODY = 65534  # uid and gid of nobody / nogroup
SECOND_UID = 4321  # a second unprivileged user: no passwd entry needed


def needs_setpriv() -> None:
    """Skip where the test cannot run a process as another uid (not root, no setpriv)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("attacks as another uid need root and setpriv (util-linux)")


def as_uid_command(uid: int, code: str, *args: str, netns: bool = False) -> list[str]:
    """The command line that runs ``code`` (``python -c``) as ``uid`` (gid the same,
    no supplementary groups), in a new network namespace if ``netns``."""
    prefix = ["unshare", "--net"] if netns else []
    return [
        *prefix, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        sys.executable, "-c", code, *args,
    ]  # fmt: skip


def attacker_env() -> dict[str, str]:
    """The environment an attack runs in: this tree's package and test support."""
    path = os.pathsep.join([str(REPO / "exporter"), str(REPO)])
    return {**os.environ, "PYTHONPATH": path}


def run_as(
    uid: int, code: str, *args: str, netns: bool = False, cwd: str | Path | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run an attack to its end; its stdout is its report. Fails on a non-zero exit."""
    done = subprocess.run(
        as_uid_command(uid, code, *args, netns=netns), capture_output=True, text=True,
        env=attacker_env(), cwd=cwd, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def spawn_as(
    uid: int, code: str, *args: str, netns: bool = False, cwd: str | Path | None = None
) -> subprocess.Popen[str]:
    """Start an attack in the background (the caller waits for it)."""
    return subprocess.Popen(
        as_uid_command(uid, code, *args, netns=netns), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=attacker_env(), cwd=cwd,
    )  # fmt: skip


def shared_dir(owner: int = 0, mode: int = 0o755) -> Path:
    """A fresh directory under /tmp that other users can reach (pytest's tmp_path is
    0700): owned by ``owner``. The caller removes it (``shutil.rmtree``)."""
    path = Path(tempfile.mkdtemp(prefix="stepscope-sec-"))
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def serve_0666(box: Path, cwd: Path | None = None) -> Exporter:
    """A real ``stepscope serve`` (run by the test's user: root in CI) whose Unix ingest
    at ``box/ingest.sock`` any local user may reach (``ingest_mode`` 0666)."""
    return start_exporter(
        ["--simulate", "1", "--interval", "0.2", "--ingest", f"unix://{box}/ingest.sock"],
        env={"STEPSCOPE_INGEST_MODE": "0666"}, cwd=str(cwd) if cwd is not None else None,
    )  # fmt: skip


# A flood of refused datagrams (argv: ingest path, count), run as another uid: half for
# another user's job "held" with a new rank each, half for new jobs of its own past every
# cap, from a new abstract name every 100 (aliases), blocking sends (the kernel drops
# none). Prints {"sent", "seconds", "answers"} (the answers its names received).
REFUSED_FLOOD = """
import json, os, socket, sys, time
ingest, count = sys.argv[1], int(sys.argv[2])
pid = os.getpid()
answers = 0
sock = None
start = time.monotonic()
for i in range(count):
    if i % 100 == 0:  # a new alias every 100 datagrams; count the answers the old one got
        if sock is not None:
            sock.setblocking(False)
            try:
                while sock.recv(1024):
                    answers += 1
            except BlockingIOError:
                pass
            sock.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(b"\\0flood-%d-%d" % (pid, i))
    job = "held" if i % 2 else f"mine-{i}"
    d = {"v": 1, "type": "step", "job": job, "rank": i % 100_000, "local_rank": 0,
         "pid": pid, "step": i, "t": time.time(), "dur": 0.5}
    sock.sendto(json.dumps(d).encode(), ingest)
print(json.dumps({"sent": count, "seconds": time.monotonic() - start, "answers": answers}))
"""
