"""``--web-config`` parsed and validated: every key of exporter-toolkit's table is
applied or refused by name (finding 5 of issue 15: keys accepted and ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.core.errors import ConfigError
from stepscope.web.config import ALLOWED_HEADERS, load_web_config, parse_web_config
from tests.support import REPO
from tests.support.web import bcrypt_hash, tls_yml, write_web_yml


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "a"}}, "tls_server_config.key_file: required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "x"}},
         "client_auth_type: unknown value 'x'"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}},
         "client_ca_file: set without a client_auth_type"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "max_version": "TLS12",
                                "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"]}},
         "cipher_suites: lacks the AES_128_GCM_SHA256 suite HTTP/2 requires"),
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
        ({"basic_auth_users": {"a:b": bcrypt_hash()}}, "cannot contain ':'"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow-from x"}}},
         "X-Frame-Options: expected one of deny, sameorigin"),
        ({"http_server_config": {"headers": {"X-Content-Type-Options": "sniff"}}},
         "X-Content-Type-Options: expected one of nosniff"),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "headers.Server: this header"),
        ({"http_server_config": {"headers": {"X-XSS-Protection": "1\r\nSet-Cookie: a"}}},
         "line break"),
        ({"rate_limit": {"interval": 5, "burst": 1}}, "rate_limit.interval: expected a duration"),
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
        "basic_auth_users": {"prometheus": bcrypt_hash()},
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


def test_require_any_client_cert_is_refused_at_start_not_on_every_handshake(
    certs: Path,
) -> None:
    """Finding 5: RequireAnyClientCert mapped to verifying without a CA: every client
    was rejected at the handshake. Python's ssl cannot admit an unverified
    certificate, so the mode is refused at start with what to use instead."""
    web_yml = write_web_yml(certs, tls_yml("  client_auth_type: RequireAnyClientCert\n"))
    with pytest.raises(ConfigError, match="RequireAndVerifyClientCert with client_ca_file"):
        load_web_config(web_yml)
