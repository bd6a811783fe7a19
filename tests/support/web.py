"""What the web layer's tests share: certificates made by ``openssl``, web config files,
an in-process aiohttp server running the exporter's middlewares and SSLContext, and a
client for it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
from aiohttp import web


def openssl(*args: str) -> None:
    """Run ``openssl`` with ``args``; raises when it fails."""
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"),
    )


def _leaf(d: Path, name: str, ca: str, sans: str, usage: str) -> None:
    """A certificate for ``name`` signed by ``ca`` (EC key: quick to make)."""
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
    )
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage={usage}\n")
    openssl(
        "x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{ca}.crt"),
        "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", "2",
        "-extfile", str(ext), "-out", str(d / f"{name}.crt"),
    )


def _server(d: Path, name: str) -> None:
    """A self-signed RSA server certificate for 127.0.0.1 (RSA: the ECDHE-RSA suites)."""
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"),
    )


def make_certs(d: Path) -> None:
    """server/second: two server certificates (a rotation); ca1/ca2: client CAs;
    scraper (ca1, SANs scraper.example and ::1), other (ca1, SAN other.example),
    scraper2 (ca2), rogue (self-signed client); all in ``d``."""
    _server(d, "server")
    _server(d, "second")
    _ca(d, "ca1")
    _ca(d, "ca2")
    _ca(d, "rogue")
    _leaf(d, "scraper", "ca1", "DNS:scraper.example,IP:::1", "clientAuth")
    _leaf(d, "other", "ca1", "DNS:other.example", "clientAuth")
    _leaf(d, "scraper2", "ca2", "DNS:scraper.example", "clientAuth")


def write_web_yml(d: Path, text: str) -> Path:
    """``text`` written as ``d``/web.yml."""
    path = d / "web.yml"
    path.write_text(text)
    return path


def tls_yml(extra: str = "", cert: str = "server") -> str:
    """A ``tls_server_config`` serving ``cert``, with ``extra`` lines under it."""
    return f"tls_server_config:\n  cert_file: {cert}.crt\n  key_file: {cert}.key\n{extra}"


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
    """The basic auth header for ``user`` and ``password``."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def served_cert(address: str) -> str:
    """The certificate a new connection is shown, as PEM."""
    host, port = address.rsplit(":", 1)
    return ssl.get_server_certificate((host, int(port)))


def same_cert(pem: str, path: Path) -> bool:
    """Whether ``pem`` is the certificate in ``path``."""
    return ssl.PEM_cert_to_DER_cert(pem) == ssl.PEM_cert_to_DER_cert(path.read_text())


def bcrypt_hash(cost: int = 4) -> str:
    """A bcrypt hash of ``x`` (cost 4: quick)."""
    return bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=cost)).decode()


def atomic_replace(src: Path, dst: Path) -> None:
    """Write like cert-manager's atomic update: a new file renamed over the old."""
    tmp = dst.with_suffix(".tmp")
    shutil.copy(src, tmp)
    os.replace(tmp, dst)
