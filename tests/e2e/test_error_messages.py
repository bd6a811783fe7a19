"""Issue 27's error messages from a real ``stepscope serve``: a port in use ends the
start in one line (no "GPU metrics are served as usual" before it), a SIGHUP that
changes ``listen`` says it needs a restart, ``diagnose`` reads ``HOST:PORT``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import start_exporter
from tests.support.exporter import STARTED, served_address
from tests.support.ports import free_port


def test_a_port_in_use_is_one_line_and_nothing_claims_to_serve(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "stepscope", "serve", "--simulate", "1",
             "--listen", f"127.0.0.1:{port}", "--ingest", f"unix://{tmp_path}/no/ingest.sock"],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr == (
        f"stepscope: error: cannot serve on 127.0.0.1:{port}: Address already in use: "
        f"another process listens there (a second stepscope, or dcgm-exporter on {port}?); "
        "stop it or choose another port with --listen HOST:PORT\n"
    )


def test_a_reload_that_changes_listen_says_it_needs_a_restart(tmp_path: Path) -> None:
    """It logged "configuration reloaded" as though the new port were served."""
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\ninterval: 1\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STEPSCOPE_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "serve", "--simulate", "1", "--config", str(config),
         "--ingest", f"udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )
    STARTED.append(proc)
    assert proc.stderr is not None
    try:
        while (line := proc.stderr.readline()) and served_address(line) is None:
            pass
        assert served_address(line) == f"127.0.0.1:{port}"
        config.write_text(f"listen: 127.0.0.1:{port + 1}\ninterval: 2\n")
        proc.send_signal(signal.SIGHUP)
        reload_line = proc.stderr.readline()
        assert "configuration reloaded except listen: changed, but applied only by a restart" in (
            reload_line
        )
        assert f"still running with listen 127.0.0.1:{port} (interval 2 s" in reload_line
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_diagnose_reads_an_exporter_given_as_host_port() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "stepscope", "diagnose", "--exporter", exp.address],
            capture_output=True, text=True, timeout=60,
        )
        assert result.stderr == ""
        assert result.returncode in (0, 1, 2) and result.stdout.strip()
    finally:
        assert exp.stop() == 0
