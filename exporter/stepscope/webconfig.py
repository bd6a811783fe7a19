"""``--web-config``: TLS, basic auth and response headers in the exporter-toolkit format.

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

Every key either takes effect or stops the start with a ConfigError naming it: a
setting Python's ``ssl`` cannot express (several curves in preference order, a
client certificate accepted unverified, HTTP/2) is refused, never ignored. A
configuration with which some allowed TLS version could never complete a handshake
is refused too (an in-memory handshake per version proves it at start).
docs/web-config.md has the key-by-key table.

Two things run while serving. Certificate, key and client CA files are re-read when
they change (cert-manager rotation): the first handshake after a change, checked at
most once per ``CERT_CHECK_INTERVAL_S``, swaps in a new SSLContext from the SNI
callback. Basic auth checks bcrypt off the event loop in a small dedicated pool; an
unknown user costs a check against a dummy hash of the same cost, so timing does not
tell which users exist; recent results are cached, as exporter-toolkit does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from stepscope.core.errors import ConfigError
from stepscope.core.yamltext import strict_load

log = logging.getLogger(__name__)

# A changed certificate is noticed on the first handshake after this many seconds:
# one clock read per handshake, at most one stat() of each file per interval.
CERT_CHECK_INTERVAL_S = 1.0
# bcrypt at cost 10 is ~60 ms of CPU; exporter-toolkit runs one check at a time. One
# thread keeps a wrong-password flood to one core of a training node.
BCRYPT_WORKERS = 1
# Distinct checks queued or running before further unknown credentials get 429:
# a flood cannot build an unbounded queue of requests waiting for bcrypt.
MAX_PENDING_CHECKS = 8
# Results remembered (each way), as exporter-toolkit's cache of 100.
AUTH_CACHE_SIZE = 100

# client_auth_type -> verify mode; None: refused with _CLIENT_AUTH_REFUSED's reason.
_CLIENT_AUTH: dict[str, ssl.VerifyMode | None] = {
    "NoClientCert": ssl.CERT_NONE,
    # exporter-toolkit asks for a certificate, never verifies it and never looks at
    # it: the same clients get in whether or not it is requested.
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": None,
    "RequireClientCert": None,  # exporter-toolkit's old name for RequireAnyClientCert
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CLIENT_AUTH_REFUSED = (
    "cannot be applied: Python's ssl module verifies every client certificate it "
    "accepts, so it cannot admit an unverified one (exporter-toolkit admits any "
    "certificate here, even a self-signed one). Use RequireAndVerifyClientCert with "
    "client_ca_file, the CA that signs your scrapers' certificates"
)
_VERIFYING = ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go's tls.CipherSuites() (the list exporter-toolkit accepts) for TLS <= 1.2, by the
# OpenSSL name of the same IANA suite (`openssl ciphers -stdname` pairs them).
GO_CIPHER_SUITES: dict[str, str] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# In Go's list too, but neither Go nor Python's ssl lets a server choose TLS 1.3 suites.
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")

# exporter-toolkit's curve names -> OpenSSL group names.
_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}

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
_BCRYPT_MAX_PASSWORD = 72  # bcrypt reads no further; Go and htpasswd truncate here too

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
class TlsSettings:
    """``tls_server_config``, validated. A certificate, key or client CA comes from a
    file (re-read when it changes) or inline PEM; exactly one of each pair is set."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_ca_pem: str | None = field(default=None, repr=False)
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()  # Go names, in preference order
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()

    def watched_files(self) -> tuple[Path, ...]:
        """The files whose change means the SSLContext must be rebuilt."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


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

    def middlewares(self) -> tuple[Middleware, ...]:
        """aiohttp middlewares, outermost first, in exporter-toolkit's order: rate
        limit, response headers (so a 401 carries them too), client SANs, basic auth."""
        out: list[Middleware] = []
        if self.rate_limit is not None:
            out.append(_rate_limit(TokenBucket(self.rate_limit.interval, self.rate_limit.burst)))
        if self.headers:
            out.append(_response_headers(self.headers))
        if self.tls is not None and self.tls.client_allowed_sans:
            out.append(_client_sans(self.tls.client_allowed_sans))
        if self.users:
            out.append(BasicAuth(self.users).middleware)
        return tuple(out)


# --- TLS -------------------------------------------------------------------------


def build_ssl_context(tls: TlsSettings, *, verify_clients: bool = True) -> ssl.SSLContext:
    """A server SSLContext for ``tls`` as the files read now; ConfigError names the
    key whose value cannot be applied. ``verify_clients=False`` leaves client
    certificates out (the start-up handshake probe has none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        # TLS10/TLS11 warn as deprecated; the handshake probe decides whether they work
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = _TLS_VERSIONS[tls.min_version]
        ctx.maximum_version = _TLS_VERSIONS[tls.max_version]
    if tls.cipher_suites:
        wanted = [GO_CIPHER_SUITES[name] for name in tls.cipher_suites]
        try:
            ctx.set_ciphers(":".join(wanted))
        except ssl.SSLError:
            wanted_names: set[str] = set()
        else:
            wanted_names = {c["name"] for c in ctx.get_ciphers()}
        # OpenSSL drops the names it lacks without a word while one remains
        for go_name, name in zip(tls.cipher_suites, wanted, strict=True):
            if name not in wanted_names:
                raise ConfigError(
                    f"web_config: tls_server_config.cipher_suites: {go_name} is not "
                    f"available in this system's OpenSSL ({ssl.OPENSSL_VERSION})"
                )
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        curve = tls.curve_preferences[0]
        try:
            ctx.set_ecdh_curve(_CURVES[curve])
        except (ValueError, ssl.SSLError) as exc:
            raise ConfigError(
                f"web_config: tls_server_config.curve_preferences: {curve} is not "
                f"available in this system's OpenSSL: {exc}"
            ) from None
    _load_chain(ctx, tls)
    mode = _CLIENT_AUTH[tls.client_auth_type]
    if verify_clients and mode is not None and mode != ssl.CERT_NONE:
        try:
            if tls.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            else:
                ctx.load_verify_locations(cadata=tls.client_ca_pem)
        except (OSError, ssl.SSLError) as exc:
            key = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise ConfigError(
                f"web_config: tls_server_config.{key}: cannot load the client CA: {_why(exc)}"
            ) from None
        ctx.verify_mode = mode
    return ctx


def _why(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)


class _KeyIsEncrypted(Exception):
    """Raised by the password callback: the daemon has no one to ask."""


def _no_password() -> bytes:
    # without a callback OpenSSL would prompt on the terminal, hanging a reload
    raise _KeyIsEncrypted


def _load_chain(ctx: ssl.SSLContext, tls: TlsSettings) -> None:
    with contextlib.ExitStack() as stack:
        cert = (
            str(tls.cert_file)
            if tls.cert_file
            else stack.enter_context(_memory_file(tls.cert_pem or "", "cert"))
        )
        key = (
            str(tls.key_file)
            if tls.key_file
            else stack.enter_context(_memory_file(tls.key_pem or "", "key"))
        )
        for name, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(
                    f"web_config: tls_server_config.{name}: cannot load certificate/key: "
                    f"cannot read {path}"
                )
        try:
            ctx.load_cert_chain(cert, key, password=_no_password)
        except _KeyIsEncrypted:
            raise ConfigError(
                "web_config: tls_server_config.key_file: the key is encrypted; "
                "exporter-toolkit has no passphrase setting either: store it unencrypted "
                "(readable by the exporter only)"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "web_config: tls_server_config: cannot load certificate/key "
                f"({tls.cert_file or 'cert'}, {tls.key_file or 'key'}): {_why(exc)}"
            ) from None


@contextlib.contextmanager
def _memory_file(pem: str, key: str) -> Iterator[str]:
    """Inline PEM as a path OpenSSL can open, never written to disk."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        raise ConfigError(
            f"web_config: tls_server_config.{key}: inline PEM needs Linux (memfd); "
            f"use {key}_file"
        )
    fd = memfd_create(f"stepscope-{key}", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem.encode())
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _handshake_failure(server: ssl.SSLContext, version: ssl.TLSVersion) -> str | None:
    """Why a client speaking only ``version`` cannot finish a handshake with ``server``
    (OpenSSL's reason), or None when it can. In memory, no socket; ~1 ms."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client.minimum_version = client.maximum_version = version
    # the most permissive client: a failure is the server settings' doing
    client.set_ciphers("ALL:@SECLEVEL=0")
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    ends = (
        (client.wrap_bio(c_in, c_out), c_out, s_in),
        (server.wrap_bio(s_in, s_out, server_side=True), s_out, c_in),
    )
    done: set[int] = set()
    for _ in range(10):
        for i, (end, out, peer) in enumerate(ends):
            if i not in done:
                try:
                    end.do_handshake()
                    done.add(i)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as exc:
                    return exc.reason or str(exc)
            if data := out.read():
                peer.write(data)
        if len(done) == 2:
            return None
    return "the handshake did not finish"


def check_handshakes(tls: TlsSettings) -> None:
    """Refuse settings with which a client of some allowed TLS version could never
    connect (a TLS 1.0 minimum this OpenSSL refuses, ECDSA-only cipher_suites with an
    RSA key, a curve no version can use): Go would start and fail those handshakes."""
    versions = [
        name
        for name, v in _TLS_VERSIONS.items()
        if _TLS_VERSIONS[tls.min_version] <= v <= _TLS_VERSIONS[tls.max_version]
    ]
    server = build_ssl_context(tls, verify_clients=False)
    for name in versions:
        reason = _handshake_failure(server, _TLS_VERSIONS[name])
        if reason is None:
            continue
        if _TLS_VERSIONS[name] < ssl.TLSVersion.TLSv1_2:
            key, hint = "min_version", f"this system's OpenSSL refuses {name}; use TLS12"
        elif "CIPHER" in reason and tls.cipher_suites and name != "TLS13":
            key, hint = "cipher_suites", (
                "none of them can be used with this key (an ECDSA suite needs an EC "
                "key, an RSA suite an RSA key)"
            )
        elif ("SHARE" in reason or "GROUP" in reason or "CURVE" in reason) and (
            tls.curve_preferences
        ):
            key, hint = "curve_preferences", "this curve cannot be used here"
        else:
            key, hint = "min_version/max_version", "narrow the versions or fix the settings"
        raise ConfigError(
            f"web_config: tls_server_config.{key}: a {name} client could never complete "
            f"a handshake (OpenSSL: {reason}): {hint}"
        )


class CertificateReloader:
    """The server's SSLContext, following its certificate, key and client CA files.

    ``context`` is handed to the server once. Its SNI callback (called on every
    handshake, SNI sent or not) reads the clock; at most once per ``check_interval``
    it stats the files, and when one changed (mtime, size or inode: cert-manager swaps
    a symlink) it builds a new context and moves this and later handshakes onto it.
    Files that fail to load (half-written) keep the previous certificate, logged once
    per change. Runs on the event loop thread, like the handshakes.
    """

    def __init__(
        self,
        tls: TlsSettings,
        check_interval: float = CERT_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tls = tls
        self._paths = tls.watched_files()
        self._interval = check_interval
        self._clock = clock
        # stat before reading, so a change during the read is seen at the next check
        self._signature = _file_signature(self._paths)
        check_handshakes(tls)
        self.context = build_ssl_context(tls)
        self.current = self.context
        self._next_check = clock() + check_interval
        self.reloads = 0
        if self._paths:
            self.context.sni_callback = self._on_client_hello

    def _on_client_hello(
        self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext
    ) -> None:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._interval
            try:
                self._reload_if_changed()
            except Exception:  # an exception here would fail this client's handshake
                log.exception("TLS: checking the certificate files failed")
        if self.current is not ctx:
            conn.context = self.current

    def _reload_if_changed(self) -> None:
        signature = _file_signature(self._paths)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            check_handshakes(self._tls)
            self.current = build_ssl_context(self._tls)
        except ConfigError as exc:
            log.error("TLS: files changed but cannot be used, keeping the previous ones: %s", exc)
            return
        self.reloads += 1
        log.info("TLS: certificate reloaded from %s", ", ".join(map(str, self._paths)))


def _file_signature(paths: tuple[Path, ...]) -> tuple[tuple[int, ...] | None, ...]:
    out: list[tuple[int, ...] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def _client_sans(allowed: tuple[str, ...]) -> Middleware:
    """exporter-toolkit ends the handshake of a client whose certificate has none of
    ``client_allowed_sans``; here its requests get 403 and the connection is closed."""
    wanted = {_san_key(value) for value in allowed}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        sans = cert.get("subjectAltName", ()) if cert else ()
        if any(_san_key(value) in wanted for _, value in sans):
            return await handler(request)
        response = web.Response(status=403, text="client certificate not allowed\n")
        response.force_close()
        return response

    return middleware


def _san_key(value: str) -> str:
    # Python writes IPv6 SANs in full ("0:0:0:0:0:0:0:1"), Go compressed ("::1")
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value


# --- basic auth ---------------------------------------------------------------------


class BasicAuth:
    """HTTP basic auth against bcrypt hashes, never on the event loop.

    Checks run in a pool of ``workers`` threads of its own (bcrypt releases the GIL),
    so a wrong-password flood costs those threads, not scrapes; with
    ``max_pending`` distinct checks queued or running, further new credentials get 429
    at once. An unknown user is checked against a dummy hash of the configured cost,
    so it takes as long as a known one. The last ``cache_size`` accepted and rejected
    credentials are remembered under a keyed hash (no passwords kept), so a scraper's
    repeated scrape costs no bcrypt and a flood of rejects cannot evict it. ``verify``
    is ``bcrypt.checkpw``'s signature (tests pass a recording one).
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        workers: int = BCRYPT_WORKERS,
        max_pending: int = MAX_PENDING_CHECKS,
        cache_size: int = AUTH_CACHE_SIZE,
        verify: Callable[[bytes, bytes], bool] | None = None,
    ) -> None:
        import bcrypt

        self._users = {name.encode(): hashed for name, hashed in users.items()}
        cost = max(int(h[4:6]) for h in users.values())
        # a well-formed hash of that cost for no password: checking against it costs
        # what checking a real one does (a random salt, no hashing spent on it)
        self.dummy_hash = bcrypt.gensalt(rounds=cost) + b"." * 31
        self._verify = verify or bcrypt.checkpw
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="stepscope-auth")
        self._max_pending = max_pending
        self._cache_size = cache_size
        self._secret = os.urandom(32)
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._rejected: OrderedDict[bytes, None] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[bool]] = {}
        self._busy_logged = 0.0

    async def check(self, authorization: str | None) -> bool | None:
        """Whether an ``Authorization`` header names a user and their password; None
        when too many checks are pending to start another."""
        parsed = _parse_basic(authorization)
        if parsed is None:
            return False
        user, password = parsed
        hashed = self._users.get(user)
        target = hashed if hashed is not None else self.dummy_hash
        key = self._cache_key(user, target, password)
        if key in self._accepted:
            self._accepted.move_to_end(key)
            return True
        if key in self._rejected:
            return False
        future = self._inflight.get(key)
        if future is None:
            if len(self._inflight) >= self._max_pending:
                self._log_busy()
                return None
            future = asyncio.get_running_loop().run_in_executor(
                self._executor, self._check, password, target
            )
            self._inflight[key] = future
            future.add_done_callback(partial(self._settle, key, hashed is not None))
        # shielded: a client hanging up must not cancel a check others wait on
        return await asyncio.shield(future) and hashed is not None

    def _check(self, password: bytes, hashed: bytes) -> bool:
        try:
            return self._verify(password[:_BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            return False

    def _settle(self, key: bytes, known: bool, future: asyncio.Future[bool]) -> None:
        del self._inflight[key]
        if future.cancelled() or future.exception() is not None:
            return
        cache = self._accepted if future.result() and known else self._rejected
        cache[key] = None
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    def _cache_key(self, user: bytes, hashed: bytes, password: bytes) -> bytes:
        h = hashlib.blake2b(key=self._secret, digest_size=32)
        for part in (user, hashed, password):
            h.update(len(part).to_bytes(4, "big") + part)
        return h.digest()

    def _log_busy(self) -> None:
        now = time.monotonic()
        if now - self._busy_logged >= 60.0:
            self._busy_logged = now
            log.warning(
                "basic auth: %d password checks pending, answering 429 to new "
                "credentials (a wrong-password flood?); scrapes with cached credentials "
                "are unaffected",
                len(self._inflight),
            )

    @property
    def middleware(self) -> Middleware:
        """The aiohttp middleware: 401 with a challenge, 429 when checks are saturated."""

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            ok = await self.check(request.headers.get("Authorization"))
            if ok:
                return await handler(request)
            if ok is None:
                return web.Response(
                    status=429,
                    text="Too many authentication attempts in progress\n",
                    headers={"Retry-After": "1"},
                )
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="stepscope"'},
            )

        return middleware


def _parse_basic(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) bytes from ``Basic <base64>``, as Go's Request.BasicAuth."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = raw.partition(b":")
    return (user, password) if colon else None


# --- other middlewares ----------------------------------------------------------------


class TokenBucket:
    """Go's rate.Limiter.Allow: ``burst`` tokens, one more every ``interval`` s."""

    def __init__(
        self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        """Take a token if one is there."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _rate_limit(bucket: TokenBucket) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if bucket.allow():
            return await handler(request)
        return web.Response(status=429, text="Too Many Requests\n")

    return middleware


def _response_headers(headers: Mapping[str, str]) -> Middleware:
    """Add the configured headers to every response, errors included; as in
    exporter-toolkit (which sets them before the handler runs) a header the handler
    set itself wins."""

    def add(target: Any) -> None:
        for name, value in headers.items():
            if name not in target:
                target[name] = value

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            add(exc.headers)
            raise
        if not response.prepared:  # a streamed response has sent its headers already
            add(response.headers)
        return response

    return middleware


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
    if auth not in _CLIENT_AUTH:
        raise ConfigError(
            f"web_config: {where}.client_auth_type: unknown value {auth!r} "
            f"(known: {', '.join(_CLIENT_AUTH)})"
        )
    if _CLIENT_AUTH[auth] is None:
        raise ConfigError(f"web_config: {where}.client_auth_type: {auth} {_CLIENT_AUTH_REFUSED}")
    has_ca = bool(ca_pem or ca_file)
    if auth in _VERIFYING and not has_ca:
        raise ConfigError(
            f"web_config: {where}.client_ca_file: required with client_auth_type {auth} "
            "(exporter-toolkit would fall back to the system's public CAs, admitting any "
            "publicly issued certificate)"
        )
    if has_ca and auth not in _VERIFYING:
        raise ConfigError(
            f"web_config: {where}.client_ca_file: has no effect with client_auth_type "
            f"{auth}: client certificates are only checked with "
            f"{' or '.join(_VERIFYING)}"
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
        if not isinstance(v, str) or v not in _TLS_VERSIONS:
            raise ConfigError(
                f"web_config: {where}.{key}: unknown value {v!r} "
                f"(known: {', '.join(_TLS_VERSIONS)})"
            )
        versions[key] = str(v)
    if _TLS_VERSIONS[versions["min_version"]] > _TLS_VERSIONS[versions["max_version"]]:
        raise ConfigError(
            f"web_config: {where}.min_version: {versions['min_version']} is above "
            f"max_version {versions['max_version']}: no handshake could succeed"
        )

    suites = _strings(raw, "cipher_suites", where)
    if suites and versions["min_version"] == "TLS13":
        raise ConfigError(
            f"web_config: {where}.cipher_suites: has no effect with min_version TLS13 "
            "(TLS 1.3 suites cannot be chosen); remove it or allow TLS12"
        )
    for name in suites:
        if name in _TLS13_SUITES:
            raise ConfigError(
                f"web_config: {where}.cipher_suites: {name} is a TLS 1.3 suite, and "
                "TLS 1.3 suites cannot be chosen (exporter-toolkit ignores them too); "
                "cipher_suites applies to TLS 1.2 and below: remove it"
            )
        if name not in GO_CIPHER_SUITES:
            raise ConfigError(
                f"web_config: {where}.cipher_suites: unknown cipher {name!r} (known: "
                f"{', '.join(GO_CIPHER_SUITES)})"
            )
    curves = _strings(raw, "curve_preferences", where)
    for name in curves:
        if name not in _CURVES:
            raise ConfigError(
                f"web_config: {where}.curve_preferences: unknown curve {name!r} "
                f"(known: {', '.join(_CURVES)})"
            )
    if len(curves) > 1:
        raise ConfigError(
            f"web_config: {where}.curve_preferences: Python's ssl module can restrict "
            "key exchange to one curve but cannot order several: list one, or leave "
            "curve_preferences out for OpenSSL's default order (X25519 first)"
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
        raise ConfigError(
            "web_config: rate_limit.burst: must be at least 1 with an interval "
            "(0 would refuse every request)"
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
    if _boolean(http_raw, "http2", "http_server_config", False):
        raise ConfigError(
            "web_config: http_server_config.http2: the exporter serves HTTP/1.1 only "
            "(aiohttp has no HTTP/2 server); remove http2 or set it to false"
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
