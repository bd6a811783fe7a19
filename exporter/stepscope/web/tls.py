"""TLS for ``--web-config``: the server's SSLContext, a handshake self-test, and
certificates that follow rotation.

``build_ssl_context`` applies ``tls_server_config`` (validated by
:mod:`stepscope.web.config`); a setting with which some allowed TLS version could never
complete a handshake is refused at start (an in-memory handshake per version proves it,
:func:`check_handshakes`). Certificate, key and client CA files are re-read when they
change (cert-manager rotation): the first handshake after a change, checked at most once
per ``CERT_CHECK_INTERVAL_S``, swaps in a new SSLContext from the SNI callback
(:class:`CertificateReloader`). ``client_allowed_sans`` is checked by a middleware that
reads the verified client certificate.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import ssl
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from stepscope.core.errors import ConfigError

log = logging.getLogger(__name__)

# A changed certificate is noticed on the first handshake after this many seconds:
# one clock read per handshake, at most one stat() of each file per interval.
CERT_CHECK_INTERVAL_S = 1.0

# client_auth_type -> verify mode; None: refused (stepscope.web.config says why).
CLIENT_AUTH: dict[str, ssl.VerifyMode | None] = {
    "NoClientCert": ssl.CERT_NONE,
    # exporter-toolkit asks for a certificate, never verifies it and never looks at
    # it: the same clients get in whether or not it is requested.
    "RequestClientCert": ssl.CERT_NONE,
    # without client_ca_file both verify against the system's CAs, as Go does
    "RequireAnyClientCert": None,
    "RequireClientCert": None,  # exporter-toolkit's old name for RequireAnyClientCert
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

TLS_VERSIONS = {
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

# exporter-toolkit's curve names -> OpenSSL group names.
CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}


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


def build_ssl_context(tls: TlsSettings, *, verify_clients: bool = True) -> ssl.SSLContext:
    """A server SSLContext for ``tls`` as the files read now; ConfigError names the
    key whose value cannot be applied. ``verify_clients=False`` leaves client
    certificates out (the start-up handshake probe has none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        # TLS10/TLS11 warn as deprecated; the handshake probe decides whether they work
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
        ctx.maximum_version = TLS_VERSIONS[tls.max_version]
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
    # one curve: key exchange uses only it. Every curve (web/config.py refuses two or
    # three): OpenSSL's default groups offer them all (check_handshakes proves it)
    if len(set(tls.curve_preferences)) == 1:
        curve = tls.curve_preferences[0]
        try:
            ctx.set_ecdh_curve(CURVES[curve])
        except (ValueError, ssl.SSLError) as exc:
            raise ConfigError(
                f"web_config: tls_server_config.curve_preferences: {curve} is not "
                f"available in this system's OpenSSL: {exc}"
            ) from None
    _load_chain(ctx, tls)
    mode = CLIENT_AUTH[tls.client_auth_type]
    if verify_clients and mode is not None and mode != ssl.CERT_NONE:
        try:
            if tls.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            elif tls.client_ca_pem:
                ctx.load_verify_locations(cadata=tls.client_ca_pem)
            else:  # as Go's crypto/tls with no ClientCAs: the system's roots
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
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
        _check_pem(tls)
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


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN (TRUSTED )?CERTIFICATE-----")
_PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9]+ )?PRIVATE KEY-----")
# what to run for a file in DER (binary) form, the usual non-PEM certificate or key
_TO_PEM = {"cert": "openssl x509 -inform DER -in FILE -out FILE.pem",
           "key": "openssl pkey -inform DER -in FILE -out FILE.pem"}


def _check_pem(tls: TlsSettings) -> None:
    """ConfigError naming the certificate or key that is not PEM (or holds the other
    kind): OpenSSL says only "PEM lib" and names neither."""
    for key, path, inline, pattern, what in (
        ("cert", tls.cert_file, tls.cert_pem, _PEM_CERTIFICATE, "certificate"),
        ("key", tls.key_file, tls.key_pem, _PEM_PRIVATE_KEY, "private key"),
    ):
        name = f"{key}_file" if path is not None else key
        try:
            data = path.read_bytes() if path is not None else (inline or "").encode()
        except OSError:
            continue  # unreadable: OpenSSL's own error says so
        shown = f" {path}" if path is not None else ""
        if b"-----BEGIN " not in data:
            raise ConfigError(
                f"web_config: tls_server_config.{name}:{shown} is not PEM (text between "
                f"-----BEGIN and -----END lines); a DER file converts with "
                f"`{_TO_PEM[key]}`"
            )
        if not pattern.search(data):
            raise ConfigError(
                f"web_config: tls_server_config.{name}:{shown} holds no PEM {what} "
                f"(-----BEGIN {what.upper()}-----)"
            )


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


def _handshake_failure(
    server: ssl.SSLContext, version: ssl.TLSVersion, curve: str | None = None
) -> str | None:
    """Why a client speaking only ``version`` (and offering only ``curve``, when given)
    cannot finish a handshake with ``server`` (OpenSSL's reason), or None when it can.
    In memory, no socket; ~1 ms."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client.minimum_version = client.maximum_version = version
    # the most permissive client: a failure is the server settings' doing
    client.set_ciphers("ALL:@SECLEVEL=0")
    if curve is not None:
        client.set_ecdh_curve(CURVES[curve])
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
        for name, v in TLS_VERSIONS.items()
        if TLS_VERSIONS[tls.min_version] <= v <= TLS_VERSIONS[tls.max_version]
    ]
    server = build_ssl_context(tls, verify_clients=False)
    for name in versions:
        reason = _handshake_failure(server, TLS_VERSIONS[name])
        if reason is None:
            continue
        if TLS_VERSIONS[name] < ssl.TLSVersion.TLSv1_2:
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
    # each curve listed must be one a client can use (with all four listed, that
    # OpenSSL's default groups, which this system's configuration may narrow, offer it)
    for curve in dict.fromkeys(tls.curve_preferences):
        reason = _handshake_failure(server, TLS_VERSIONS[tls.max_version], curve)
        if reason is not None:
            raise ConfigError(
                f"web_config: tls_server_config.curve_preferences: {curve}: a client "
                f"offering only it could never complete a handshake (OpenSSL: {reason}): "
                "this system's OpenSSL does not offer it"
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


def client_sans_middleware(allowed: tuple[str, ...]) -> Middleware:
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
