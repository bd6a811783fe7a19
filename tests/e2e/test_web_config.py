"""``stepscope serve --web-config`` end to end: TLS and basic auth protect /metrics, a
bad web config exits 2 naming the key, a rotated certificate is served without a
restart. Real TLS over real sockets, certificates made by ``openssl``."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.support import start_exporter, wait_for
from tests.support.web import (
    atomic_replace,
    basic,
    client_context,
    get,
    same_cert,
    served_cert,
    tls_yml,
    write_web_yml,
)


def test_tls_and_basic_auth_protect_metrics(certs: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web_yml = write_web_yml(
        certs,
        tls_yml()
        + f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    )
    exp = start_exporter(["--simulate", "1", "--web-config", str(web_yml)])
    try:
        line = next(ln for ln in exp.stderr_lines if "/metrics" in ln)
        assert "https://" in line
        ctx = client_context(certs)
        status, headers, _ = get(exp.address, context=ctx)
        assert status == 401 and "Basic" in headers["WWW-Authenticate"]
        # exporter-toolkit sets the configured headers before auth: a 401 carries them
        assert headers["X-Frame-Options"] == "deny"
        assert get(exp.address, headers=basic("prometheus", "wrong"), context=ctx)[0] == 401
        assert get(exp.address, headers=basic("nobody", "s3cret"), context=ctx)[0] == 401
        status, headers, body = get(exp.address, headers=basic("prometheus", "s3cret"), context=ctx)
        assert status == 200
        assert headers["X-Frame-Options"] == "deny"
        assert b"DCGM_FI_DEV_GPU_UTIL" in body
        status, headers, _ = get(
            exp.address, "/no-such-page", headers=basic("prometheus", "s3cret"), context=ctx
        )
        assert status == 404 and headers["X-Frame-Options"] == "deny"
        # plain HTTP is not served
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{exp.address}/metrics", timeout=5)
    finally:
        assert exp.stop() == 0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # accepted and ignored before the fix (Python's ssl cannot order curves)
        (tls_yml("  curve_preferences: [CurveP256, X25519]\n"), "curve_preferences"),
        # exporter-toolkit refuses it too (HTTP/2, on by default, needs an AES-128 suite)
        (tls_yml("  max_version: TLS12\n  cipher_suites: [TLS_RSA_WITH_AES_256_GCM_SHA384]\n"),
         "cipher_suites"),
        # RequireAnyClientCert rejected every client
        (tls_yml("  client_auth_type: RequireAnyClientCert\n"), "client_auth_type"),
        # started, then failed every handshake
        (tls_yml("  min_version: TLS13\n  max_version: TLS12\n"), "min_version"),
        # started, then failed every request
        ("basic_auth_users:\n  prometheus: '$2y$10$tooshort'\n", "basic_auth_users.prometheus"),
        ('http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
         "headers.Content-Security-Policy"),
        # any header was allowed
        ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n", "headers.Set-Cookie"),
        ("tls_server_config: {}\ntls_server_config: {}\n", "duplicate key"),
    ],
    ids=["two-curves", "http2-cipher", "require-any", "min-above-max", "bad-hash",
         "header-newline", "set-cookie", "duplicate-key"],
)
def test_stepscope_serve_exits_2_naming_the_key(certs: Path, text: str, key: str) -> None:
    web_yml = write_web_yml(certs, text)
    result = subprocess.run(
        [sys.executable, "-m", "stepscope", "serve", "--simulate", "1",
         "--listen", "127.0.0.1:0", "--web-config", str(web_yml)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert key in result.stderr, result.stderr


def test_a_costly_hash_gets_its_401_not_a_cut_by_the_request_timeout(certs: Path) -> None:
    """Issue 27: with a cost-18 user, a wrong password (~15 s of bcrypt) was cut by the
    10 s request timeout, and so was every unknown user (its dummy took the table's
    highest cost). Here: a cost-15 hash (~2 s) under a 0.5 s request timeout; the wrong
    password gets its 401, an unknown user a 401 from the cost-10 dummy."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=15)).decode()
    web_yml = write_web_yml(certs, f"basic_auth_users:\n  bob: '{hashed}'\n")
    exp = start_exporter(
        ["--simulate", "1", "--web-config", str(web_yml), "--http-request-timeout", "0.5"]
    )
    try:
        assert get(exp.address, headers=basic("bob", "wrong"))[0] == 401
        assert get(exp.address, headers=basic("mallory", "guess"))[0] == 401
        assert get(exp.address, headers=basic("bob", "s3cret"))[0] == 200
        # a silent connection is still closed by the request timeout
        host, port = exp.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as silent:
            silent.settimeout(10)
            assert silent.recv(1) == b""
    finally:
        assert exp.stop() == 0


def test_a_rotated_certificate_is_served_without_a_restart(certs: Path, tmp_path: Path) -> None:
    """Finding 5 (and issue 12): the certificate was read once; a cert-manager rotation
    needed a restart. Here new connections get the new certificate within the check
    interval, against a real `stepscope serve`."""
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    web_yml = write_web_yml(tmp_path, tls_yml())
    exp = start_exporter(["--simulate", "1", "--web-config", str(web_yml)])
    try:
        assert same_cert(served_cert(exp.address), certs / "server.crt")
        atomic_replace(certs / "second.key", tmp_path / "server.key")
        atomic_replace(certs / "second.crt", tmp_path / "server.crt")
        wait_for(lambda: same_cert(served_cert(exp.address), certs / "second.crt"))
        ctx = ssl.create_default_context(cafile=str(certs / "second.crt"))
        assert get(exp.address, context=ctx)[0] == 200
        wait_for(lambda: any("certificate reloaded" in ln for ln in exp.stderr_lines))
    finally:
        assert exp.stop() == 0
