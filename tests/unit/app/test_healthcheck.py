"""The image's HEALTHCHECK (``python -m stepscope.app.healthcheck``): alive means the exporter
answers on its port at all, over HTTP or HTTPS, whatever the status (basic auth answers
401). Servers here are the standard library's, on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


class _Unauthorized(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="stepscope"')
        self.send_header("Content-Length", "0")
        self.end_headers()


def _server(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unauthorized)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _check(port: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    env["STEPSCOPE_LISTEN"] = f":{port}"
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.healthcheck"],
        env=env, capture_output=True, text=True, timeout=30,
    )


def test_a_401_from_basic_auth_still_means_alive() -> None:
    for port in _server():
        assert _check(port).returncode == 0


def test_an_https_only_exporter_is_alive(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    for port in _server(ctx):
        assert _check(port).returncode == 0


def test_nothing_listening_is_unhealthy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = _check(port)
    assert run.returncode == 1 and f"nothing answers on port {port}" in run.stderr
