"""TLS over real sockets (certificates made by ``openssl``) against an in-process aiohttp
server with the exporter's SSLContext: client-auth modes, allowed SANs, cipher suites
and curves applied (finding 5 of issue 15), settings no handshake could meet refused at
start, inline PEM, and certificates and client CAs that follow rotation."""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stepscope.core.errors import ConfigError
from stepscope.web.config import load_web_config
from stepscope.web.tls import GO_CIPHER_SUITES, CertificateReloader, TlsSettings
from tests.support.web import (
    atomic_replace,
    client_context,
    get,
    openssl,
    same_cert,
    served_cert,
    serving,
    tls_yml,
    write_web_yml,
)


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
    cfg = load_web_config(write_web_yml(certs, tls_yml(f"  client_auth_type: {mode}\n{ca}")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        seen: list[int | str] = []
        for client in (None, "scraper", "rogue"):
            try:
                seen.append(get(address, context=client_context(certs, client))[0])
            except (ssl.SSLError, ConnectionError):
                seen.append("refused")
    assert tuple(seen) == outcomes


def test_client_allowed_sans_admit_only_certificates_naming_them(certs: Path) -> None:
    cfg = load_web_config(write_web_yml(certs, tls_yml(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca1.crt\n"
        "  client_allowed_sans: [scraper.example]\n")))
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200
        status, headers, _ = get(address, context=client_context(certs, "other"))
        assert status == 403 and headers["Connection"] == "close"
    # an IP SAN matches however it is written (Python spells ::1 in full)
    cfg = load_web_config(write_web_yml(certs, tls_yml(
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
    cfg = load_web_config(write_web_yml(certs, tls_yml(
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
    cfg = load_web_config(write_web_yml(certs, tls_yml("  curve_preferences: [CurveP384]\n")))
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
        load_web_config(write_web_yml(certs, tls_yml(extra)))


def test_inline_certificate_key_and_client_ca_are_applied(certs: Path) -> None:
    def block(name: str) -> str:
        return "|\n" + "".join(f"    {ln}\n" for ln in (certs / name).read_text().splitlines())

    text = (f"tls_server_config:\n  cert: {block('server.crt')}  key: {block('server.key')}"
            f"  client_ca: {block('ca1.crt')}  client_auth_type: RequireAndVerifyClientCert\n")
    cfg = load_web_config(write_web_yml(certs, text))
    assert "BEGIN" not in repr(cfg)  # the key never reaches a log line
    with serving(cfg.middlewares(), cfg.ssl_context()) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200


def test_an_encrypted_key_is_refused_instead_of_prompting(certs: Path, tmp_path: Path) -> None:
    openssl("pkey", "-in", str(certs / "server.key"), "-aes256", "-passout", "pass:x",
            "-out", str(tmp_path / "enc.key"))
    shutil.copy(certs / "server.crt", tmp_path / "server.crt")
    text = "tls_server_config:\n  cert_file: server.crt\n  key_file: enc.key\n"
    with pytest.raises(ConfigError, match="key_file: the key is encrypted"):
        load_web_config(write_web_yml(tmp_path, text))


def test_unreadable_certificate_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    with pytest.raises(ConfigError, match="cannot load certificate"):
        load_web_config(tmp_path / "web.yml")


def test_a_half_written_rotation_keeps_the_previous_certificate(
    certs: Path, tmp_path: Path
) -> None:
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    cfg = load_web_config(write_web_yml(tmp_path, tls_yml()))
    assert cfg.tls is not None
    reloader = CertificateReloader(cfg.tls, check_interval=0)  # check on every handshake
    with serving((), reloader.context) as address:
        atomic_replace(certs / "second.crt", tmp_path / "server.crt")  # the key not yet
        assert same_cert(served_cert(address), certs / "server.crt")
        assert reloader.reloads == 0
        atomic_replace(certs / "second.key", tmp_path / "server.key")
        assert same_cert(served_cert(address), certs / "second.crt")
        assert reloader.reloads == 1
        assert same_cert(served_cert(address), certs / "second.crt")
        assert reloader.reloads == 1  # unchanged files are not read again


def test_a_rotated_client_ca_is_used_for_new_connections(certs: Path, tmp_path: Path) -> None:
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, tmp_path / name)
    shutil.copy(certs / "ca1.crt", tmp_path / "ca.crt")
    cfg = load_web_config(write_web_yml(tmp_path, tls_yml(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")))
    assert cfg.tls is not None
    reloader = CertificateReloader(cfg.tls, check_interval=0)
    with serving((), reloader.context) as address:
        assert get(address, context=client_context(certs, "scraper"))[0] == 200
        atomic_replace(certs / "ca2.crt", tmp_path / "ca.crt")
        assert get(address, context=client_context(certs, "scraper2"))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(address, context=client_context(certs, "scraper"))


def test_the_check_for_changed_files_is_rate_limited(certs: Path) -> None:
    """Handshakes between checks read a clock, nothing else."""
    now = [0.0]
    stats: list[Path] = []
    cfg = load_web_config(write_web_yml(certs, tls_yml()))
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
