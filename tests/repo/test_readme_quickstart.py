"""The README's quickstart, run as pasted: its commands read from README.md, run in a
fresh shell, as root and as a user who is not, print the SM activity of the simulated
GPUs (issue 27: the curl ran before the server listened and printed nothing, and a
non-root exporter disabled the ingest without the quickstart saying why).

The commands are the README's own, changed in one way only: port 9400 becomes a free
port, so the test runs beside anything else on this machine."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO, wait_for
from tests.support.ports import free_port

README = REPO / "README.md"


def quickstart() -> str:
    """The fenced block that starts the simulated exporter."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if "stepscope serve --simulate 4 &" in b]
    assert len(found) == 1, "the README's quickstart block is gone"
    return str(found[0])


def stop_block() -> str:
    """The fenced block that says how to stop the background exporter (issue 36)."""
    text = README.read_text()
    after = text.split(quickstart(), 1)[1]
    blocks = re.findall(r"```sh\n(.*?)```", after, re.S)
    assert blocks and "kill" in blocks[0], "the README does not say how to stop the exporter"
    return str(blocks[0])


def _run_as(argv_prefix: list[str], path: str, workdir: Path) -> tuple[str, str]:
    """Run the quickstart, then the README's way to stop it, in a fresh login-less shell;
    stdout and stderr (the exporter's too). Fails unless that stopped the exporter (no
    process of the shell's session is left); one left anyway is killed afterwards."""
    port = free_port()
    script = quickstart().replace("localhost:9400", f"localhost:{port}") + stop_block()
    out, err = workdir / "out", workdir / "err"
    env = {"PATH": path, "HOME": str(workdir), "STEPSCOPE_LISTEN": f":{port}", "LANG": "C.UTF-8"}
    with out.open("w") as o, err.open("w") as e:
        shell = subprocess.Popen(
            [*argv_prefix, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
             "bash", "--noprofile", "--norc", "-c", script],
            stdout=o, stderr=e, cwd=workdir, start_new_session=True,
        )
        try:
            shell.wait(timeout=60)
            # the README's stop command must end the exporter (polled: it stops cleanly)
            wait_for(lambda: not _session_alive(shell.pid), timeout=30)
        finally:
            # the background `stepscope serve &` is in the shell's session: stop it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
    return out.read_text(), err.read_text()


def _session_alive(sid: int) -> bool:
    """Whether a process of session ``sid`` still runs (a zombie waiting for whatever
    reaps orphans here does not count: it has stopped)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            return True
    return False


def _sm_active_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith("DCGM_FI_PROF_SM_ACTIVE{")]


def test_the_quickstart_waits_for_readiness_and_names_the_ingest_variable() -> None:
    block = quickstart()
    assert "/readyz" in block and "seq" in block  # a poll with a deadline, not a sleep
    assert "export STEPSCOPE_INGEST=" in block
    assert "STEPSCOPE_INGEST" in README.read_text().split(block)[1][:800]  # explained


def test_the_quickstart_pasted_prints_the_sm_active_series(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    bindir = str(Path(sys.executable).parent)
    stdout, stderr = _run_as([], f"{bindir}:/usr/bin:/bin", tmp_path)
    assert len(_sm_active_lines(stdout)) == 4, stdout + stderr
    assert "training ingest disabled" not in stderr
    assert "INFO stepscope: stopping" in stderr, stderr  # SIGTERM: a clean stop


def test_the_quickstart_works_for_a_user_who_is_not_root(tmp_path: Path) -> None:
    """As `nobody`: the default socket directory /run/stepscope is root's, so without
    the quickstart's STEPSCOPE_INGEST the ingest would be disabled."""
    runuser = shutil.which("runuser")
    curl = shutil.which("curl")
    if os.geteuid() != 0 or runuser is None or curl is None:
        pytest.skip("needs root, runuser and curl to run as another user")
    workdir = Path(tempfile.mkdtemp(prefix="stepscope-quickstart-"))
    try:
        workdir.chmod(0o777)
        bindir = _stepscope_for_nobody(runuser, workdir)
        stdout, stderr = _run_as([runuser, "-u", "nobody", "--"], f"{bindir}:/usr/bin:/bin",
                                 workdir)
        assert len(_sm_active_lines(stdout)) == 4, stdout + stderr
        assert "training ingest disabled" not in stderr, stderr
        assert "training ingest listening on unix:///tmp/stepscope-65534/" in stderr, stderr
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree("/tmp/stepscope-65534", ignore_errors=True)


def _stepscope_for_nobody(runuser: str, workdir: Path) -> Path:
    """A `stepscope` command `nobody` can run: this environment's, or (where its
    interpreter sits under a home only root can enter) the system Python of the same
    version with this checkout and the environment's packages on its path."""
    bindir = workdir / "bin"
    bindir.mkdir()
    python = sys.executable
    if subprocess.run([runuser, "-u", "nobody", "--", python, "-c", "1"],
                      capture_output=True).returncode != 0:
        python = shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}",
                              path="/usr/bin:/usr/local/bin") or ""
        if not python:
            pytest.skip("no Python of this version that `nobody` may run")
    paths = [str(REPO / "exporter"), *(p for p in sys.path if p.endswith("site-packages"))]
    wrapper = bindir / "stepscope"
    wrapper.write_text(
        f"#!/bin/sh\nPYTHONPATH={':'.join(paths)} exec {python} -m stepscope \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return bindir


def test_the_readme_names_every_debian_package_ci_installs() -> None:
    """Issue 36: the list omitted victoria-metrics and prometheus-alertmanager, which
    the scale-out tests use; a reader setting up a machine took the list at its word."""
    installed = set(re.findall(r"need\+=\(([a-z0-9.+-]+)\)", (REPO / ".ci" / "run").read_text()))
    text = README.read_text()
    paragraph = text[text.index("Run the whole test suite"):]
    paragraph = paragraph[:paragraph.index("```")]
    named = set(re.findall(r"`([a-z0-9.+-]+)`", paragraph))
    assert installed and sorted(installed - named) == []
