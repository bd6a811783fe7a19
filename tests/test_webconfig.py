"""--web-config: TLS, basic auth, headers and rate limit in the exporter-toolkit format.

Real TLS over real sockets (certificates made by `openssl`), real HTTP against a real
`stepscope serve` or an in-process aiohttp server running the same middlewares and
SSLContext. Each finding of issue 15 (4: bcrypt on the event loop and user names
leaking by timing; 5: keys accepted and ignored, client-auth modes, rotation, headers)
has a test below that fails on the code before the fix.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import os
import shutil
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from aiohttp import web

from stepscope.core.errors import ConfigError
from stepscope.webconfig import (
    ALLOWED_HEADERS,
    GO_CIPHER_SUITES,
    BasicAuth,
    CertificateReloader,
    TlsSettings,
    load_web_config,
    parse_web_config,
)
from tests.support import REPO, start_exporter, wait_for

# --- certificates -------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"),
    )


def _leaf(d: Path, name: str, ca: str, sans: str, usage: str) -> None:
    """A certificate for ``name`` signed by ``ca`` (EC key: quick to make)."""
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
    )
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{ca}.crt"),
        "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", "2",
        "-extfile", str(ext), "-out", str(d / f"{name}.crt"),
    )


def _server(d: Path, name: str) -> None:
    """A self-signed RSA server certificate for 127.0.0.1 (RSA: the ECDHE-RSA suites)."""
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"),
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """server/second: two server certificates (a rotation); ca1/ca2: client CAs;
    scraper (ca1, SANs scraper.example and ::1), other (ca1, SAN other.example),
    scraper2 (ca2), rogue (self-signed client)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("certs")
    _server(d, "server")
    _server(d, "second")
    _ca(d, "ca1")
    _ca(d, "ca2")
    _ca(d, "rogue")
    _leaf(d, "scraper", "ca1", "DNS:scraper.example,IP:::1", "clientAuth")
    _leaf(d, "other", "ca1", "DNS:other.example", "clientAuth")
    _leaf(d, "scraper2", "ca2", "DNS:scraper.example", "clientAuth")
    return d


def _web_yml(d: Path, text: str) -> Path:
    path = d / "web.yml"
    path.write_text(text)
    return path


def _tls_yml(extra: str = "", cert: str = "server") -> str:
    return f"tls_server_config:\n  cert_file: {cert}.crt\n  key_file: {cert}.key\n{extra}"


# --- an in-process server running the same middlewares and SSLContext ---------------


@contextlib.contextmanager
def serving(
    middlewares: tuple[Any, ...] = (), ssl_context: ssl.SSLContext | None = None
) -> Iterator[str]:
    """An aiohttp server on a loop thread of its own (as the exporter's), answering
    `ok` on /metrics; yields host:port."""
    loop = asyncio.new_event_loop()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def get(
    address: str,
    path: str = "/metrics",
    *,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection (https when ``context`` is given)."""
    host, port = address.rsplit(":", 1)
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, int(port), context=context, timeout=15)
        if context is not None
        else http.client.HTTPConnection(host, int(port), timeout=15)
    )
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


def client_context(certs: Path, cert: str | None = None) -> ssl.SSLContext:
    """A client trusting the `server` certificate, presenting ``cert`` if given."""
    ctx = ssl.create_default_context(cafile=str(certs / "server.crt"))
    if cert is not None:
        ctx.load_cert_chain(str(certs / f"{cert}.crt"), str(certs / f"{cert}.key"))
    return ctx


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def served_cert(address: str) -> str:
    """The certificate a new connection is shown, as PEM."""
    host, port = address.rsplit(":", 1)
    return ssl.get_server_certificate((host, int(port)))


def same_cert(pem: str, path: Path) -> bool:
    return ssl.PEM_cert_to_DER_cert(pem) == ssl.PEM_cert_to_DER_cert(path.read_text())


# --- end to end ---------------------------------------------------------------------


def test_tls_and_basic_auth_protect_metrics(certs: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web_yml = _web_yml(
        certs,
        _tls_yml()
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


# --- finding 4: bcrypt off the event loop, no user enumeration by timing -------------


class GatedVerify:
    """bcrypt.checkpw that records its calls and, for passwords starting with
    ``wrong``, blocks until ``release`` is set: a check as slow as the test wants."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bytes]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append((password, hashed))
        if password.startswith(b"wrong"):
            self.entered.release()
            self.release.wait(30)
        return bcrypt.checkpw(password, hashed)


@pytest.fixture(scope="module")
def hashed() -> bytes:
    return bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=5))


def test_a_scrape_completes_while_password_checks_are_in_flight(hashed: bytes) -> None:
    """Finding 4: bcrypt ran on the event loop, so wrong-password clients held every
    scrape back. Here the check blocks until released: before the fix the loop itself
    blocked and the scrape could not complete at all."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
    with serving((auth.middleware,)) as address, ThreadPoolExecutor(8) as pool:
        assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200  # now cached
        bad: list[Future[tuple[int, dict[str, str], bytes]]] = [
            pool.submit(get, address, headers=basic("prometheus", f"wrong{i}")) for i in range(4)
        ]
        try:
            assert verify.entered.acquire(timeout=15)  # a check is running, blocked
            status, _, body = get(address, headers=basic("prometheus", "s3cret"))
            assert (status, body) == (200, b"ok\n")
            assert not any(f.done() for f in bad)  # all four still waiting for bcrypt
        finally:
            verify.release.set()
        assert [f.result(timeout=15)[0] for f in bad] == [401] * 4


def test_more_pending_checks_than_the_limit_get_429_at_once(hashed: bytes) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, max_pending=2)
    with serving((auth.middleware,)) as address, ThreadPoolExecutor(4) as pool:
        try:
            first = [pool.submit(get, address, headers=basic("prometheus", f"wrong{i}"))
                     for i in range(2)]
            assert verify.entered.acquire(timeout=15)
            # two distinct checks are pending (one running, one queued)
            wait_for(lambda: len(auth._inflight) == 2)
            status, headers, _ = get(address, headers=basic("prometheus", "wrong-third"))
            assert status == 429 and headers["Retry-After"] == "1"
        finally:
            verify.release.set()
        assert [f.result(timeout=15)[0] for f in first] == [401, 401]


def test_an_unknown_user_costs_a_check_against_a_hash_of_the_same_cost(hashed: bytes) -> None:
    """Finding 4: an unknown user was answered without bcrypt (1.7 ms against 54.5 ms
    for a known one), telling which user names exist."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
    with serving((auth.middleware,)) as address:
        unknown = get(address, headers=basic("mallory", "guess"))
        known = get(address, headers=basic("prometheus", "guess"))
    assert unknown[0] == known[0] == 401
    assert unknown[2] == known[2]
    assert unknown[1]["WWW-Authenticate"] == known[1]["WWW-Authenticate"]
    assert [password for password, _ in verify.calls] == [b"guess", b"guess"]
    dummy, real = verify.calls[0][1], verify.calls[1][1]
    assert real == hashed
    assert dummy != hashed and dummy[4:7] == hashed[4:7] == b"05$"  # same cost
    assert len(dummy) == len(hashed) == 60


def test_credentials_are_checked_once_and_a_flood_cannot_evict_them(hashed: bytes) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, cache_size=2)
    with serving((auth.middleware,)) as address:
        for _ in range(3):
            assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200
        assert len(verify.calls) == 1
        # a rejected password is remembered too: repeating it costs nothing
        for _ in range(3):
            assert get(address, headers=basic("prometheus", "guess"))[0] == 401
        assert len(verify.calls) == 2
        for i in range(5):  # more distinct rejects than the cache holds
            assert get(address, headers=basic("prometheus", f"guess{i}"))[0] == 401
        assert len(verify.calls) == 7
        assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200
        assert len(verify.calls) == 7  # the accepted credentials were not evicted


def test_passwords_longer_than_72_bytes_compare_as_bcrypt_does() -> None:
    """bcrypt reads 72 bytes; pyca/bcrypt 5 raises past that instead of a 401."""
    long = b"p" * 72
    auth = BasicAuth({"prometheus": bcrypt.hashpw(long, bcrypt.gensalt(rounds=4))})
    with serving((auth.middleware,)) as address:
        assert get(address, headers=basic("prometheus", "p" * 80))[0] == 200
        assert get(address, headers=basic("prometheus", "q" * 80))[0] == 401


@pytest.mark.parametrize(
    "header",
    ["", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()],
)
def test_malformed_authorization_is_401_without_a_check(hashed: bytes, header: str) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
    with serving((auth.middleware,)) as address:
        assert get(address, headers={"Authorization": header} if header else {})[0] == 401
    assert verify.calls == []


# --- finding 5: exporter-toolkit parity ------------------------------------------------


def _hash(cost: int = 4) -> str:
    return bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=cost)).decode()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # accepted and ignored before the fix
        (_tls_yml("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"), "cipher_suites"),
        (_tls_yml("  curve_preferences: [CurveP256, X25519]\n"), "curve_preferences"),
        ("http_server_config:\n  http2: true\n", "http_server_config.http2"),
        # RequireAnyClientCert rejected every client
        (_tls_yml("  client_auth_type: RequireAnyClientCert\n"), "client_auth_type"),
        # started, then failed every handshake
        (_tls_yml("  min_version: TLS13\n  max_version: TLS12\n"), "min_version"),
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
    web_yml = _web_yml(certs, text)
    result = subprocess.run(
        [sys.executable, "-m", "stepscope", "serve", "--simulate", "1",
         "--listen", "127.0.0.1:0", "--web-config", str(web_yml)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert key in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "a"}}, "tls_server_config.key_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "x"}},
         "client_auth_type: unknown value 'x'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "RequireAndVerifyClientCert"}},
         "client_ca_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "VerifyClientCertIfGiven"}},
         "client_ca_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}},
         "client_ca_file: has no effect with client_auth_type NoClientCert"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "RequestClientCert", "client_ca_file": "c"}},
         "client_ca_file: has no effect"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_auth_type": "RequireClientCert"}},
         "client_auth_type: RequireClientCert cannot be applied"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "client_allowed_sans": ["x"]}},
         "client_allowed_sans: needs a verified client certificate"),
        ({"tls_server_config": {"cert_file": "a", "cert": "pem", "key_file": "b"}},
         "set cert or cert_file, not both"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}},
         "min_version: unknown value 'SSL3'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13",
                                "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]}},
         "cipher_suites: has no effect with min_version TLS13"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}},
         "cipher_suites: unknown cipher 'TLS_RSA_WITH_RC4_128_SHA'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "curve_preferences": ["CurveP224"]}},
         "curve_preferences: unknown curve 'CurveP224'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b",
                                "prefer_server_cipher_suites": "yes"}},
         "prefer_server_cipher_suites: expected true or false"),
        ({"basic_auth_users": {"bob": "plaintext"}}, "basic_auth_users.bob: expected a bcrypt"),
        ({"basic_auth_users": {"bob": "$2y$03$" + "a" * 53}}, "basic_auth_users.bob"),
        ({"basic_auth_users": {"bob": "$2$10$" + "a" * 53}}, "basic_auth_users.bob"),
        ({"basic_auth_users": {"a:b": _hash()}}, "cannot contain ':'"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow-from x"}}},
         "X-Frame-Options: expected one of deny, sameorigin"),
        ({"http_server_config": {"headers": {"X-Content-Type-Options": "sniff"}}},
         "X-Content-Type-Options: expected one of nosniff"),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "headers.Server: this header"),
        ({"http_server_config": {"headers": {"X-XSS-Protection": "1\r\nSet-Cookie: a"}}},
         "line break"),
        ({"rate_limit": {"interval": 5, "burst": 1}}, "rate_limit.interval: expected a duration"),
        ({"rate_limit": {"interval": "1s"}}, "rate_limit.burst: must be at least 1"),
        ({"rate_limit": {"interval": "1s", "burst": 1, "x": 1}}, "rate_limit: unknown key 'x'"),
        ({"tls_config": {}}, "unknown key 'tls_config'"),
        (["x"], "top level: expected a mapping"),
    ],
)
def test_bad_web_configs_name_the_key(doc: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_web_config(doc, REPO)
    assert message in str(err.value)


def test_every_key_of_the_exporter_toolkit_table_is_known(certs: Path) -> None:
    """docs/web-configuration.md's keys parse (the ones applied) or are refused by name."""
    ca = (certs / "ca1.crt").read_text()
    doc = {
        "tls_server_config": {
            "cert_file": "server.crt", "key_file": "server.key",
            "client_auth_type": "RequireAndVerifyClientCert", "client_ca": ca,
            "client_allowed_sans": ["scraper.example"], "min_version": "TLS12",
            "max_version": "TLS13", "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
            "prefer_server_cipher_suites": False, "curve_preferences": ["X25519"],
        },
        "http_server_config": {"http2": False, "headers": {
            "Content-Security-Policy": "default-src 'self'", "X-Frame-Options": "sameorigin",
            "X-Content-Type-Options": "nosniff", "X-XSS-Protection": 1,
            "Strict-Transport-Security": "max-age=31536000; includeSubDomains"}},
        "basic_auth_users": {"prometheus": _hash()},
        "rate_limit": {"interval": "1m30s", "burst": 3},
    }
    cfg = parse_web_config(doc, certs)
    assert cfg.tls is not None and cfg.tls.client_ca_pem == ca
    assert cfg.headers["X-XSS-Protection"] == "1"
    assert set(cfg.headers) == set(ALLOWED_HEADERS)
    assert cfg.rate_limit is not None and cfg.rate_limit.interval == 90.0
    assert cfg.ssl_context() is not None
    assert len(cfg.middlewares()) == 4  # rate limit, headers, SANs, basic auth
    assert parse_web_config({"rate_limit": {"interval": 0, "burst": 0}}, certs).rate_limit is None


def test_go_cipher_names_map_to_the_same_openssl_suites() -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    out = subprocess.run(["openssl", "ciphers", "-stdname", "ALL:@SECLEVEL=0"],
                         capture_output=True, text=True, check=True).stdout
    pairs = {tuple(line.split()[:3:2]) for line in out.splitlines()}
    for go_name, openssl_name in GO_CIPHER_SUITES.items():
        assert (go_name, openssl_name) in pairs


@pytest.mark.parametrize(
    ("mode", "outcomes"),
    [
        # exporter-toolkit's table: without a cert, with one from the CA, self-signed
        ("NoClientCert", (200, 200, 200)),
        ("RequestClientCert", (200, 200, 200)),
        ("VerifyClientCertIfGiven", (200, 200, "refused")),
        ("RequireAndVerifyClientCert", ("refused", 200, "refused")),
    ],
)
def test_client_auth_modes_admit_whom_exporter_toolkit_admits(
    certs: Path, mode: str, outcomes: tuple[int | str, ...]
) -> None:
    ca = "  client_ca_file: ca1.crt\n" if "Verify" in mode else ""
    cfg = load_web_config(_web_yml(certs, _tls_yml(f"  client_auth_type: {mode}\n{ca}")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        seen: list[int | str] = []
        for client in (None, "scraper", "rogue"):
            try:
                seen.append(get(address, context=client_context(certs, client))[0])
            except (ssl.SSLError, ConnectionError):
                seen.append("refused")
    assert tuple(seen) == outcomes


def test_require_any_client_cert_is_refused_at_start_not_on_every_handshake(
    certs: Path,
) -> None:
    """Finding 5: RequireAnyClientCert mapped to verifying without a CA: every client
    was rejected at the handshake. Python's ssl cannot admit an unverified
    certificate, so the mode is refused at start with what to use instead."""
    web_yml = _web_yml(certs, _tls_yml("  client_auth_type: RequireAnyClientCert\n"))
    with pytest.raises(ConfigError, match="RequireAndVerifyClientCert with client_ca_file"):
        load_web_config(web_yml)


def test_client_allowed_sans_admit_only_certificates_naming_them(certs: Path) -> None:
    cfg = load_web_config(_web_yml(certs, _tls_yml(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca1.crt\n"
        "  client_allowed_sans: [scraper.example]\n")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200
        status, headers, _ = get(address, context=client_context(certs, "other"))
        assert status == 403 and headers["Connection"] == "close"
    # an IP SAN matches however it is written (Python spells ::1 in full)
    cfg = load_web_config(_web_yml(certs, _tls_yml(
        "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca1.crt\n"
        "  client_allowed_sans: ['::1']\n")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200
        assert get(address, context=client_context(certs))[0] == 403  # no cert, no SAN


def _tls12_client(certs: Path, ciphers: str) -> ssl.SSLContext:
    ctx = client_context(certs)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    return ctx


def _negotiated(address: str, ctx: ssl.SSLContext) -> str:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=15)
    try:
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        cipher = conn.sock.cipher()
        assert cipher is not None
        return cipher[0]
    finally:
        conn.close()


@pytest.mark.parametrize(("prefer", "chosen"), [
    (True, "ECDHE-RSA-AES128-GCM-SHA256"),  # the server's first
    (False, "ECDHE-RSA-AES256-GCM-SHA384"),  # the client's first
])
def test_cipher_suites_and_their_order_are_applied(certs: Path, prefer: bool, chosen: str) -> None:
    """Finding 5: cipher_suites and prefer_server_cipher_suites were accepted and
    ignored: a client offering only a suite outside the list still connected."""
    cfg = load_web_config(_web_yml(certs, _tls_yml(
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,"
        " TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n"
        f"  prefer_server_cipher_suites: {str(prefer).lower()}\n")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        client_order = "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256"
        assert _negotiated(address, _tls12_client(certs, client_order)) == chosen
        with pytest.raises(ssl.SSLError):
            _negotiated(address, _tls12_client(certs, "ECDHE-RSA-CHACHA20-POLY1305"))
        # TLS 1.3 suites are not subject to cipher_suites, here as in Go
        assert _negotiated(address, client_context(certs)).startswith("TLS_")


def test_curve_preferences_are_applied(certs: Path) -> None:
    """Finding 5: curve_preferences was accepted and ignored."""
    cfg = load_web_config(_web_yml(certs, _tls_yml("  curve_preferences: [CurveP384]\n")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs))[0] == 200
        p256_only = client_context(certs)
        p256_only.set_ecdh_curve("prime256v1")
        with pytest.raises(ssl.SSLError):
            get(address, context=p256_only)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("  min_version: TLS13\n  max_version: TLS12\n", "min_version"),
        # a TLS 1.0 minimum this OpenSSL refuses: Go would start and fail those clients
        ("  min_version: TLS10\n", "min_version"),
        # ECDSA-only suites with an RSA key: no TLS 1.2 handshake could succeed
        ("  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n",
         "cipher_suites"),
    ],
)
def test_settings_no_handshake_could_meet_are_refused_at_start(
    certs: Path, extra: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=f"tls_server_config.{key}"):
        load_web_config(_web_yml(certs, _tls_yml(extra)))


def test_inline_certificate_key_and_client_ca_are_applied(certs: Path) -> None:
    def block(name: str) -> str:
        return "|\n" + "".join(f"    {ln}\n" for ln in (certs / name).read_text().splitlines())

    text = (f"tls_server_config:\n  cert: {block('server.crt')}  key: {block('server.key')}"
            f"  client_ca: {block('ca1.crt')}  client_auth_type: RequireAndVerifyClientCert\n")
    cfg = load_web_config(_web_yml(certs, text))
    assert "BEGIN" not in repr(cfg)  # the key never reaches a log line
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200


def test_an_encrypted_key_is_refused_instead_of_prompting(certs: Path, tmp_path: Path) -> None:
    _openssl("pkey", "-in", str(certs / "server.key"), "-aes256", "-passout", "pass:x",
             "-out", str(tmp_path / "enc.key"))
    shutil.copy(certs / "server.crt", tmp_path / "server.crt")
    text = "tls_server_config:\n  cert_file: server.crt\n  key_file: enc.key\n"
    with pytest.raises(ConfigError, match="key_file: the key is encrypted"):
        load_web_config(_web_yml(tmp_path, text))


def test_unreadable_certificate_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    with pytest.raises(ConfigError, match="cannot load certificate"):
        load_web_config(tmp_path / "web.yml")


def test_only_exporter_toolkit_headers_are_sent_on_every_response() -> None:
    cfg = parse_web_config({
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff",
                                           "Content-Security-Policy": ""}},
        "basic_auth_users": {"prometheus": _hash()},
    }, REPO)
    assert dict(cfg.headers) == {"X-Content-Type-Options": "nosniff"}  # blank: unset
    with serving(cfg.middlewares()) as address:
        for path in ("/metrics", "/missing"):  # 401 from auth, before routing
            status, headers, _ = get(address, path)
            assert status == 401 and headers["X-Content-Type-Options"] == "nosniff"
            assert "Content-Security-Policy" not in headers


def test_rate_limit_answers_429_past_the_burst() -> None:
    cfg = parse_web_config({"rate_limit": {"interval": "1h", "burst": 2}}, REPO)
    with serving(cfg.middlewares()) as address:
        assert [get(address)[0] for _ in range(3)] == [200, 200, 429]


# --- finding 5: a rotated certificate is served without a restart -----------------------


def _replace(src: Path, dst: Path) -> None:
    """Write like cert-manager's atomic update: a new file renamed over the old."""
    tmp = dst.with_suffix(".tmp")
    shutil.copy(src, tmp)
    os.replace(tmp, dst)


def test_a_rotated_certificate_is_served_without_a_restart(certs: Path, tmp_path: Path) -> None:
    """Finding 5 (and issue 12): the certificate was read once; a cert-manager rotation
    needed a restart. Here new connections get the new certificate within the check
    interval, against a real `stepscope serve`."""
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    web_yml = _web_yml(tmp_path, _tls_yml())
    exp = start_exporter(["--simulate", "1", "--web-config", str(web_yml)])
    try:
        assert same_cert(served_cert(exp.address), certs / "server.crt")
        _replace(certs / "second.key", tmp_path / "server.key")
        _replace(certs / "second.crt", tmp_path / "server.crt")
        wait_for(lambda: same_cert(served_cert(exp.address), certs / "second.crt"))
        ctx = ssl.create_default_context(cafile=str(certs / "second.crt"))
        assert get(exp.address, context=ctx)[0] == 200
        wait_for(lambda: any("certificate reloaded" in ln for ln in exp.stderr_lines))
    finally:
        assert exp.stop() == 0


def test_a_half_written_rotation_keeps_the_previous_certificate(
    certs: Path, tmp_path: Path
) -> None:
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    cfg = load_web_config(_web_yml(tmp_path, _tls_yml()))
    assert cfg.tls is not None
    reloader = CertificateReloader(cfg.tls, check_interval=0)  # check on every handshake
    with serving((), reloader.context) as address:
        _replace(certs / "second.crt", tmp_path / "server.crt")  # the key not yet
        assert same_cert(served_cert(address), certs / "server.crt")
        assert reloader.reloads == 0
        _replace(certs / "second.key", tmp_path / "server.key")
        assert same_cert(served_cert(address), certs / "second.crt")
        assert reloader.reloads == 1
        assert same_cert(served_cert(address), certs / "second.crt")
        assert reloader.reloads == 1  # unchanged files are not read again


def test_a_rotated_client_ca_is_used_for_new_connections(certs: Path, tmp_path: Path) -> None:
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    shutil.copy(certs / "ca1.crt", tmp_path / "ca.crt")
    cfg = load_web_config(_web_yml(tmp_path, _tls_yml(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")))
    assert cfg.tls is not None
    reloader = CertificateReloader(cfg.tls, check_interval=0)
    with serving((), reloader.context) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200
        _replace(certs / "ca2.crt", tmp_path / "ca.crt")
        assert get(address, context=client_context(certs, "scraper2"))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(address, context=client_context(certs, "scraper"))


def test_the_check_for_changed_files_is_rate_limited(certs: Path) -> None:
    """Handshakes between checks read a clock, nothing else."""
    now = [0.0]
    stats: list[Path] = []
    cfg = load_web_config(_web_yml(certs, _tls_yml()))
    assert cfg.tls is not None
    reloader = CertificateReloader(cfg.tls, check_interval=1.0, clock=lambda: now[0])
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stats.append(Path(path))
        return real_stat(path, *args, **kwargs)

    with serving((), reloader.context) as address:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "stat", counting_stat)
            for _ in range(3):
                served_cert(address)
            assert stats == []
            now[0] = 1.0
            served_cert(address)
            served_cert(address)
        assert stats == [certs / "server.crt", certs / "server.key"]


def test_tls_settings_name_the_files_they_watch(certs: Path) -> None:
    tls = TlsSettings(cert_file=certs / "a", key_file=certs / "b", client_ca_file=certs / "c")
    assert tls.watched_files() == (certs / "a", certs / "b", certs / "c")
    inline = TlsSettings(cert_pem="CERT-PEM", key_pem="KEY-PEM")
    assert inline.watched_files() == ()
    assert "CERT-PEM" not in repr(inline) and "KEY-PEM" not in repr(inline)
