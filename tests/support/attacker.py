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
