"""--web-config: TLS and basic auth in the exporter-toolkit format, real HTTPS."""

from __future__ import annotations

import base64
import http.client
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from conftest import REPO, start_exporter
from stepscope.config import ConfigError
from stepscope.webconfig import load_web_config, parse_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(d / "server.key"), "-out", str(d / "server.crt")],
        check=True, capture_output=True,
    )
    return d


def test_tls_and_basic_auth_protect_metrics(certs: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    (certs / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    exp = start_exporter(["--simulate", "1", "--web-config", str(certs / "web.yml")])
    try:
        line = next(ln for ln in exp.stderr_lines if "/metrics" in ln)
        assert "https://" in line
        ctx = ssl.create_default_context(cafile=str(certs / "server.crt"))
        url = f"https://{exp.address}/metrics"

        def get(auth: str | None) -> tuple[int, dict[str, str], bytes]:
            headers = {"Authorization": auth} if auth else {}
            req = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                    return r.status, dict(r.headers), r.read()
            except urllib.error.HTTPError as e:
                return e.code, dict(e.headers), e.read()

        status, headers, _ = get(None)
        assert status == 401 and "Basic" in headers["WWW-Authenticate"]
        bad = "Basic " + base64.b64encode(b"prometheus:wrong").decode()
        assert get(bad)[0] == 401
        good = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
        status, headers, body = get(good)
        assert status == 200
        assert headers["X-Frame-Options"] == "deny"
        assert b"DCGM_FI_DEV_GPU_UTIL" in body
        # plain HTTP is not served
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{exp.address}/metrics", timeout=5)
    finally:
        assert exp.stop() == 0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "a"}}, "tls_server_config.key_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "x"}},
         "client_auth_type: unknown value 'x'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "RequireAndVerifyClientCert"}},
         "client_ca_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}},
         "min_version: unknown value 'SSL3'"),
        ({"basic_auth_users": {"bob": "plaintext"}}, "basic_auth_users.bob: expected a bcrypt"),
        ({"tls_config": {}}, "unknown key 'tls_config'"),
        (["x"], "top level: expected a mapping"),
    ],
)
def test_bad_web_configs_name_the_key(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_web_config(doc, REPO)


def test_unreadable_certificate_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    with pytest.raises(ConfigError, match="cannot load certificate"):
        load_web_config(tmp_path / "web.yml")
