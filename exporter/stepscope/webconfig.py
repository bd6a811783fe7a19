"""``--web-config``: TLS and basic auth in the Prometheus exporter-toolkit format.

The same file that node_exporter and dcgm-exporter's peers accept::

    tls_server_config:
      cert_file: server.crt          # paths relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2y$10$...          # bcrypt hash (htpasswd -nBC 10)

Basic auth needs the ``bcrypt`` package (``pip install 'stepscope[auth]'``).
A successful check is cached (as exporter-toolkit does) so a 10 s scrape does
not pay a bcrypt hash each time.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from stepscope.config import ConfigError

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
}
_HTTP_KEYS = {"headers", "http2"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None


@dataclass(frozen=True)
class WebConfig:
    """Parsed web config; ``ssl_context()`` and ``middlewares()`` apply it."""

    tls: TlsSettings | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    users: Mapping[str, bytes] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server SSL context, or None without TLS. Raises ConfigError on bad files."""
        if self.tls is None:
            return None
        t = self.tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[t.min_version]
        if t.max_version:
            ctx.maximum_version = _TLS_VERSIONS[t.max_version]
        try:
            ctx.load_cert_chain(str(t.cert_file), str(t.key_file))
            if t.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(t.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"web_config: tls_server_config: cannot load certificate/key: {exc}"
            ) from None
        ctx.verify_mode = _CLIENT_AUTH[t.client_auth_type]
        return ctx

    def middlewares(self) -> tuple[Callable[..., Awaitable[web.StreamResponse]], ...]:
        """aiohttp middlewares for basic auth and extra response headers."""
        out: list[Callable[..., Awaitable[web.StreamResponse]]] = []
        if self.users:
            out.append(_basic_auth(self.users))
        if self.headers:
            out.append(_headers(self.headers))
        return tuple(out)


def _basic_auth(users: Mapping[str, bytes]) -> Callable[..., Awaitable[web.StreamResponse]]:
    import bcrypt

    verified: set[bytes] = set()

    @web.middleware
    async def middleware(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(token, validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, password = "", ""
            hashed = users.get(user)
            if hashed is not None:
                cache_key = hashlib.sha256(
                    user.encode() + b"\0" + password.encode() + b"\0" + hashed
                ).digest()
                if cache_key in verified or bcrypt.checkpw(password.encode(), hashed):
                    verified.add(cache_key)
                    return await handler(request)
        return web.Response(
            status=401,
            text="Unauthorized\n",
            headers={"WWW-Authenticate": 'Basic realm="stepscope"'},
        )

    return middleware


def _headers(headers: Mapping[str, str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        response = await handler(request)
        response.headers.update(headers)
        return response

    return middleware


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


def parse_web_config(data: Any, base: Path) -> WebConfig:
    """Validate a parsed web config document; relative paths resolve against ``base``."""
    top = _mapping(data, "top level")
    _check_keys(top, _TOP_KEYS, "top level")

    tls = None
    tls_raw = _mapping(top.get("tls_server_config"), "tls_server_config")
    _check_keys(tls_raw, _TLS_KEYS, "tls_server_config")
    if tls_raw:
        for req in ("cert_file", "key_file"):
            if not tls_raw.get(req):
                raise ConfigError(f"web_config: tls_server_config.{req}: required for TLS")
        auth = str(tls_raw.get("client_auth_type", "NoClientCert"))
        if auth not in _CLIENT_AUTH:
            raise ConfigError(
                f"web_config: tls_server_config.client_auth_type: unknown value "
                f"{auth!r} (known: {', '.join(_CLIENT_AUTH)})"
            )
        ca = tls_raw.get("client_ca_file")
        if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
            raise ConfigError(
                f"web_config: tls_server_config.client_ca_file: required with "
                f"client_auth_type {auth}"
            )
        for key in ("min_version", "max_version"):
            v = tls_raw.get(key)
            if v is not None and str(v) not in _TLS_VERSIONS:
                raise ConfigError(
                    f"web_config: tls_server_config.{key}: unknown value {v!r} "
                    f"(known: {', '.join(_TLS_VERSIONS)})"
                )
        tls = TlsSettings(
            cert_file=base / str(tls_raw["cert_file"]),
            key_file=base / str(tls_raw["key_file"]),
            client_auth_type=auth,
            client_ca_file=base / str(ca) if ca else None,
            min_version=str(tls_raw.get("min_version") or "TLS12"),
            max_version=str(tls_raw["max_version"]) if tls_raw.get("max_version") else None,
        )

    http_raw = _mapping(top.get("http_server_config"), "http_server_config")
    _check_keys(http_raw, _HTTP_KEYS, "http_server_config")
    headers = {
        str(k): str(v)
        for k, v in _mapping(http_raw.get("headers"), "http_server_config.headers").items()
    }

    users: dict[str, bytes] = {}
    for user, hashed in _mapping(top.get("basic_auth_users"), "basic_auth_users").items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(
                f"web_config: basic_auth_users.{user}: expected a bcrypt hash "
                f"($2y$...), e.g. from `htpasswd -nBC 10 {user}`"
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
    return WebConfig(tls=tls, headers=headers, users=users)


def load_web_config(path: Path) -> WebConfig:
    """Read and validate the web config file; ConfigError names what is wrong."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"web_config: cannot read {path}: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web_config: {path}: not valid YAML: {exc}") from None
    cfg = parse_web_config(data, path.parent)
    cfg.ssl_context()  # fail at start, not at the first TLS handshake
    return cfg
