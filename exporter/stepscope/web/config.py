"""``--web-config``: the exporter-toolkit web config file, validated into typed settings.

The file node_exporter and the other Prometheus exporters accept::

    tls_server_config:
      cert_file: server.crt          # paths relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2y$10$...          # bcrypt hash (htpasswd -nBC 10 "")
    rate_limit: {interval: 100ms, burst: 20}

A drop-in for exporter-toolkit: every file it accepts is accepted here and behaves the
same (a verifying client_auth_type without client_ca_file trusts the system's CAs, HTTP/2
offered is negotiated down to HTTP/1.1 by ALPN, TLS 1.3 cipher names are ignored as Go
ignores them), except what Python's ``ssl`` cannot do, which stops the start with a
ConfigError naming the key: admitting an unverified client certificate
(RequireAnyClientCert), reading the SANs of one (client_allowed_sans without a verifying
client_auth_type) and restricting key exchange to two or three curves (one curve is
applied; all four are OpenSSL's default groups, checked at start to be offered). A
configuration with which some allowed TLS version could never complete a handshake is
refused too (an in-memory handshake per version proves it at start); Go would start and
fail every such handshake.
docs/web-config.md has the key-by-key table.

Applying it is the other modules' work: :mod:`stepscope.web.tls` (the SSLContext, the
handshake self-test, certificate reload), :mod:`stepscope.web.auth` (basic auth),
:mod:`stepscope.web.limits` (rate limit, response headers); :class:`WebConfig` hands
their SSLContext and middlewares to the server.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp.typedefs import Middleware

from stepscope.core.errors import ConfigError
from stepscope.core.yamltext import strict_load
from stepscope.web.auth import BasicAuth
from stepscope.web.limits import TokenBucket, rate_limit_middleware, response_headers_middleware
from stepscope.web.tls import (
    CLIENT_AUTH,
    CURVES,
    GO_CIPHER_SUITES,
    TLS_VERSIONS,
    CertificateReloader,
    TlsSettings,
    client_sans_middleware,
)

log = logging.getLogger("stepscope.web")

_CLIENT_AUTH_REFUSED = (
    "cannot be applied: Python's ssl module verifies every client certificate it "
    "accepts, so it cannot admit an unverified one (exporter-toolkit admits any "
    "certificate here, even a self-signed one). Use RequireAndVerifyClientCert with "
    "client_ca_file, the CA that signs your scrapers' certificates"
)
_VERIFYING = ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

# In Go's tls.CipherSuites() too (GO_CIPHER_SUITES has the rest), but neither Go nor
# Python's ssl lets a server choose TLS 1.3 suites: both ignore these names.
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
# golang.org/x/net/http2's ConfigureServer refuses a TLS 1.2 cipher list without one of
# these while http2 is on (exporter-toolkit's default), so a drop-in refuses it too.
_HTTP2_REQUIRED = (
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
)

# exporter-toolkit's extraHTTPHeaders (web/handler.go): the only headers it lets a
# config add, with the values it accepts where they are an enumeration.
ALLOWED_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

_BCRYPT_HASH = re.compile(r"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}")

_TLS_KEYS = {
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
_HTTP_KEYS = {"headers", "http2"}
_RATE_KEYS = {"interval", "burst"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``rate_limit``: a token bucket over all requests, as Go's rate.Limiter."""

    interval: float  # seconds per token
    burst: int


@dataclass(frozen=True, slots=True)
class WebConfig:
    """Parsed web config; ``ssl_context()`` and ``middlewares()`` apply it."""

    tls: TlsSettings | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    users: Mapping[str, bytes] = field(default_factory=dict)
    rate_limit: RateLimit | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server SSL context that follows certificate rotation, or None without TLS.
        Raises ConfigError when the files cannot be loaded or no handshake could work."""
        if self.tls is None:
            return None
        return CertificateReloader(self.tls).context

    def basic_auth(self) -> BasicAuth | None:
        """Basic auth for ``users`` (None without users): one per server, it holds the
        checks' lanes, the cache and the counters."""
        return BasicAuth(self.users) if self.users else None

    def middlewares(self, auth: BasicAuth | None = None) -> tuple[Middleware, ...]:
        """aiohttp middlewares, outermost first, in exporter-toolkit's order: rate
        limit, response headers (so a 401 carries them too), client SANs, basic auth
        (``auth``, or a new :meth:`basic_auth`)."""
        out: list[Middleware] = []
        if self.rate_limit is not None:
            bucket = TokenBucket(self.rate_limit.interval, self.rate_limit.burst)
            out.append(rate_limit_middleware(bucket))
        if self.headers:
            out.append(response_headers_middleware(self.headers))
        if self.tls is not None and self.tls.client_allowed_sans:
            out.append(client_sans_middleware(self.tls.client_allowed_sans))
        auth = auth or self.basic_auth()
        if auth is not None:
            out.append(auth.middleware)
        return tuple(out)


# --- parsing --------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"web_config: {where}: expected a mapping, got {value!r}")
    return {str(k): v for k, v in value.items()}


def _check_keys(data: Mapping[str, Any], known: set[str], where: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(
                f"web_config: {where}: unknown key {key!r} (known: {', '.join(sorted(known))})"
            )


def _string(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None  # exporter-toolkit: an empty string is the same as no setting
    if not isinstance(value, str):
        raise ConfigError(f"web_config: {where}.{key}: expected a string, got {value!r}")
    return value


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"web_config: {where}.{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _boolean(raw: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"web_config: {where}.{key}: expected true or false, got {value!r}")
    return value


def _one_of(
    raw: Mapping[str, Any], inline: str, file: str, base: Path
) -> tuple[str | None, Path | None]:
    text = _string(raw, inline, "tls_server_config")
    path = _string(raw, file, "tls_server_config")
    if text and path:
        raise ConfigError(
            f"web_config: tls_server_config: set {inline} or {file}, not both "
            f"(exporter-toolkit would silently use {file})"
        )
    return text, (base / path if path else None)


def _parse_tls(raw: Mapping[str, Any], base: Path) -> TlsSettings:
    where = "tls_server_config"
    _check_keys(raw, _TLS_KEYS, where)
    cert_pem, cert_file = _one_of(raw, "cert", "cert_file", base)
    key_pem, key_file = _one_of(raw, "key", "key_file", base)
    ca_pem, ca_file = _one_of(raw, "client_ca", "client_ca_file", base)
    if not (cert_pem or cert_file):
        raise ConfigError(f"web_config: {where}.cert_file: required for TLS (or cert)")
    if not (key_pem or key_file):
        raise ConfigError(f"web_config: {where}.key_file: required for TLS (or key)")

    auth = _string(raw, "client_auth_type", where) or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise ConfigError(
            f"web_config: {where}.client_auth_type: unknown value {auth!r} "
            f"(known: {', '.join(CLIENT_AUTH)})"
        )
    if CLIENT_AUTH[auth] is None:
        raise ConfigError(f"web_config: {where}.client_auth_type: {auth} {_CLIENT_AUTH_REFUSED}")
    has_ca = bool(ca_pem or ca_file)
    if auth in _VERIFYING and not has_ca:
        # as Go's crypto/tls with no ClientCAs: verify against the system's roots
        log.warning(
            "web_config: %s.client_auth_type %s without client_ca_file: client "
            "certificates are verified against the system's CAs (as exporter-toolkit "
            "does); set client_ca_file to trust only your own CA",
            where,
            auth,
        )
    if has_ca and auth == "NoClientCert":
        raise ConfigError(
            f"web_config: {where}.client_ca_file: set without a client_auth_type "
            f"(exporter-toolkit refuses this too): add client_auth_type "
            f"{_VERIFYING[1]}, or remove client_ca_file"
        )
    if has_ca and auth not in _VERIFYING:
        log.warning(
            "web_config: %s.client_ca_file: has no effect with client_auth_type %s "
            "(certificates are not verified, as in exporter-toolkit); use %s to check them",
            where,
            auth,
            " or ".join(_VERIFYING),
        )
    sans = _strings(raw, "client_allowed_sans", where)
    if sans and auth not in _VERIFYING:
        raise ConfigError(
            f"web_config: {where}.client_allowed_sans: needs a verified client "
            f"certificate: client_auth_type {' or '.join(_VERIFYING)}"
        )

    versions: dict[str, str] = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = raw.get(key)
        v = default if v is None else v
        if not isinstance(v, str) or v not in TLS_VERSIONS:
            raise ConfigError(
                f"web_config: {where}.{key}: unknown value {v!r} "
                f"(known: {', '.join(TLS_VERSIONS)})"
            )
        versions[key] = str(v)
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise ConfigError(
            f"web_config: {where}.min_version: {versions['min_version']} is above "
            f"max_version {versions['max_version']}: no handshake could succeed"
        )

    listed = _strings(raw, "cipher_suites", where)
    for name in listed:
        if name not in GO_CIPHER_SUITES and name not in _TLS13_SUITES:
            raise ConfigError(
                f"web_config: {where}.cipher_suites: unknown cipher {name!r} (known: "
                f"{', '.join((*GO_CIPHER_SUITES, *_TLS13_SUITES))})"
            )
    # TLS 1.3 suites cannot be chosen by Go or by Python's ssl: both ignore them, and
    # the whole list with min_version TLS13
    suites = tuple(n for n in listed if n not in _TLS13_SUITES)
    if versions["min_version"] == "TLS13":
        suites = ()
    curves = _strings(raw, "curve_preferences", where)
    for name in curves:
        if name not in CURVES:
            raise ConfigError(
                f"web_config: {where}.curve_preferences: unknown curve {name!r} "
                f"(known: {', '.join(CURVES)})"
            )
    if 1 < len(set(curves)) < len(CURVES):
        raise ConfigError(
            f"web_config: {where}.curve_preferences: Python's ssl module can restrict "
            "key exchange to one curve, or leave OpenSSL's default groups, which offer all "
            f"of {', '.join(CURVES)}; it cannot restrict it to {', '.join(curves)}: list "
            "one curve, or all four, or leave curve_preferences out"
        )
    return TlsSettings(
        cert_file=cert_file,
        key_file=key_file,
        cert_pem=cert_pem,
        key_pem=key_pem,
        client_auth_type=auth,
        client_ca_file=ca_file,
        client_ca_pem=ca_pem,
        client_allowed_sans=sans,
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=suites,
        prefer_server_cipher_suites=_boolean(raw, "prefer_server_cipher_suites", where, True),
        curve_preferences=curves,
    )


def _parse_headers(raw: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw.items():
        where = f"web_config: http_server_config.headers.{name}"
        if name not in ALLOWED_HEADERS:
            raise ConfigError(
                f"{where}: this header cannot be configured (exporter-toolkit allows "
                f"{', '.join(ALLOWED_HEADERS)})"
            )
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)  # YAML's `X-XSS-Protection: 1`, as Go's yaml.v2 reads it
        elif value is None:
            value = ""
        elif not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        if any(c in value for c in "\r\n\0"):
            raise ConfigError(f"{where}: a header value cannot contain a line break or NUL")
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise ConfigError(f"{where}: expected one of {', '.join(allowed)}, got {value!r}")
        if value:  # "unset if blank"
            out[name] = value
    return out


def _parse_users(raw: Mapping[str, Any]) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, hashed in raw.items():
        where = f"web_config: basic_auth_users.{user}"
        if ":" in user:
            raise ConfigError(f"{where}: a user name cannot contain ':' (basic auth splits there)")
        m = _BCRYPT_HASH.fullmatch(hashed) if isinstance(hashed, str) else None
        if m is None or not 4 <= int(m.group(1)) <= 31:
            raise ConfigError(
                f"{where}: expected a bcrypt hash ($2y$10$ and 53 characters, cost 04-31), "
                f'e.g. from `htpasswd -nBC 10 "" | tr -d \':\\n\'`'
            )
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(
                "web_config: basic_auth_users needs the bcrypt package: "
                "pip install 'stepscope[auth]'"
            ) from None
    return users


_DURATION_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _go_duration(value: Any, where: str) -> float:
    """Seconds from a Go duration ("100ms", "1m30s"); 0 alone needs no unit."""
    if value == 0 or value == "0":
        return 0.0
    if isinstance(value, str):
        pos, total = 0, 0.0
        while pos < len(value) and (m := _DURATION_PART.match(value, pos)):
            total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos == len(value) and pos > 0:
            return total
    raise ConfigError(
        f"web_config: {where}: expected a duration such as 100ms or 1s, got {value!r} "
        "(a bare number would be nanoseconds to exporter-toolkit)"
    )


def _parse_rate_limit(raw: Mapping[str, Any]) -> RateLimit | None:
    _check_keys(raw, _RATE_KEYS, "rate_limit")
    interval = _go_duration(raw.get("interval", 0), "rate_limit.interval")
    burst = raw.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise ConfigError(f"web_config: rate_limit.burst: expected a whole number, got {burst!r}")
    if interval == 0:
        return None  # exporter-toolkit: interval 0 turns the limiter off
    if burst < 1:
        log.warning(
            "web_config: rate_limit.burst 0 with interval %s answers every request 429 "
            "(as exporter-toolkit does); set burst to at least 1 to admit requests",
            raw.get("interval"),
        )
    return RateLimit(interval=interval, burst=burst)


def parse_web_config(data: Any, base: Path) -> WebConfig:
    """Validate a parsed web config document; relative paths resolve against ``base``.
    Reads no file: ``load_web_config`` also proves the TLS settings can handshake."""
    top = _mapping(data, "top level")
    _check_keys(top, _TOP_KEYS, "top level")
    tls_raw = _mapping(top.get("tls_server_config"), "tls_server_config")
    tls = _parse_tls(tls_raw, base) if tls_raw else None

    http_raw = _mapping(top.get("http_server_config"), "http_server_config")
    _check_keys(http_raw, _HTTP_KEYS, "http_server_config")
    # exporter-toolkit's default is true; HTTP/2 is offered, never required (clients
    # negotiate it by ALPN), so serving HTTP/1.1 only answers every client it would
    http2 = _boolean(http_raw, "http2", "http_server_config", True)
    listed = _strings(tls_raw, "cipher_suites", "tls_server_config")
    tls12_list = tls is not None and listed and tls.min_version != "TLS13"
    if http2 and tls12_list and not any(name in _HTTP2_REQUIRED for name in listed):
        raise ConfigError(
            "web_config: tls_server_config.cipher_suites: lacks the AES_128_GCM_SHA256 "
            "suite HTTP/2 requires (exporter-toolkit refuses this while "
            "http_server_config.http2 is true, its default): add "
            f"{_HTTP2_REQUIRED[0]}, or set http_server_config.http2: false"
        )
    headers = _parse_headers(_mapping(http_raw.get("headers"), "http_server_config.headers"))
    users = _parse_users(_mapping(top.get("basic_auth_users"), "basic_auth_users"))
    rate_limit = _parse_rate_limit(_mapping(top.get("rate_limit"), "rate_limit"))
    return WebConfig(tls=tls, headers=headers, users=users, rate_limit=rate_limit)


def load_web_config(path: Path) -> WebConfig:
    """Read and validate the web config file, loading its certificates and proving a
    handshake works for each allowed TLS version; ConfigError names what is wrong."""
    try:
        data = strict_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"web_config: cannot read {path}: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web_config: {path}: not valid YAML: {exc}") from None
    cfg = parse_web_config(data, path.parent)
    cfg.ssl_context()  # fail at start, not at the first TLS handshake
    return cfg
