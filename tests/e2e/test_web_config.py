"""``stepscope serve --web-config`` end to end: TLS and basic auth protect /metrics, a
bad web config exits 2 naming the key, a rotated certificate is served without a
restart. Real TLS over real sockets, certificates made by ``openssl``."""

from __future__ import annotations

import http.client
import shutil
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
        # accepted and ignored before the fix
        (tls_yml("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"), "cipher_suites"),
        (tls_yml("  curve_preferences: [CurveP256, X25519]\n"), "curve_preferences"),
        ("http_server_config:\n  http2: true\n", "http_server_config.http2"),
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
    ids=["tls13-suite", "two-curves", "http2", "require-any", "min-above-max", "bad-hash",
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
