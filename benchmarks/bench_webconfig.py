"""What `--web-config` costs: scrapes under a wrong-password flood, user-name timing,
and the TLS handshake path that follows certificate rotation.

1. Flood: a real ``stepscope serve`` with basic auth (bcrypt cost 10 and 12), one
   scraper with good (cached) credentials scraping back to back over keep-alive,
   while N clients send wrong passwords (a new one each time, so no cache helps).
   Reports the scraper's p50/p99 and the flood's answers (401, or 429 once the
   bounded queue of checks is full) and the exporter's CPU.
2. Timing: median response time of a wrong password for a user that exists and for
   one that does not (new passwords each time). Equal medians: no user enumeration.
3. Handshake: in memory (no sockets), a full TLS 1.3 handshake with the rotation-aware
   SSLContext against a plain one, the SNI callback alone between checks, a check
   (stat of the files), and a reload (new context plus the start-up probes).

Usage (from the repo root)::

    python -m benchmarks.bench_webconfig
    python -m benchmarks.bench_webconfig --pythonpath /tmp/old   # another version's
        # exporter for the flood and timing parts (e.g. a copy of an older package)

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import secrets
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bcrypt
import psutil

from benchmarks._local import free_port


def _auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _start(port: int, web_yml: Path, pythonpath: str | None, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("STEPSCOPE_CONFIG", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "stepscope", "serve", "--simulate", "1",
             "--listen", f"127.0.0.1:{port}", "--web-config", str(web_yml)],
            stdout=subprocess.DEVNULL, stderr=out, env=env,
        )


def _request(conn: http.client.HTTPConnection, headers: dict[str, str]) -> int:
    conn.request("GET", "/metrics", headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, headers: dict[str, str],
                timeout: float = 60.0) -> bool:
    """Poll until /metrics answers 200 with these credentials (which caches them)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            if _request(conn, headers) == 200:
                return True
        except OSError:
            time.sleep(0.2)
        finally:
            conn.close()
    print(log.read_text())
    return False


def _flood(port: int, stop: threading.Event, answers: dict[int, int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        try:
            status = _request(conn, _auth("prometheus", secrets.token_hex(8)))
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            status = 0
        answers[status] = answers.get(status, 0) + 1
    conn.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def flood_and_timing(
    costs: list[int], clients: list[int], seconds: float, pythonpath: str | None
) -> None:
    print("### Scrapes with cached credentials while N clients send wrong passwords\n")
    print("| bcrypt cost | wrong-password clients | scrapes | scrape p50 ms | scrape p99 ms"
          " | flood answers | exporter CPU % of a core |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    timing_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for cost in costs:
            hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=cost)).decode()
            web_yml = Path(tmp) / "web.yml"
            web_yml.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
            port = free_port()
            log = Path(tmp) / "exporter.log"
            proc = _start(port, web_yml, pythonpath, log)
            try:
                if not _wait_ready(port, proc, log, _auth("prometheus", "s3cret")):
                    raise SystemExit("exporter did not start")
                ps = psutil.Process(proc.pid)
                for n in clients:
                    stop = threading.Event()
                    answers: dict[int, int] = {}
                    threads = [threading.Thread(target=_flood, args=(port, stop, answers))
                               for _ in range(n)]
                    for t in threads:
                        t.start()
                    time.sleep(1.0 if n else 0.0)  # let the flood build up
                    scraper = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    good = _auth("prometheus", "s3cret")
                    cpu0, t0 = ps.cpu_times(), time.monotonic()
                    latencies: list[float] = []
                    while time.monotonic() - t0 < seconds:
                        start = time.perf_counter()
                        assert _request(scraper, good) == 200
                        latencies.append((time.perf_counter() - start) * 1000)
                    cpu1, t1 = ps.cpu_times(), time.monotonic()
                    stop.set()
                    for t in threads:
                        t.join()
                    scraper.close()
                    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (t1 - t0)
                    flood = ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())) or "-"
                    print(f"| {cost} | {n} | {len(latencies)} | "
                          f"{statistics.median(latencies):.2f} | "
                          f"{_percentile(latencies, 0.99):.2f} | {flood} | {100 * cpu:.0f} |")
                timing_rows.append(_timing(port, cost))
            finally:
                proc.terminate()
                proc.wait(30)
    print("\n### A wrong password for a user that exists and for one that does not\n")
    print("| bcrypt cost | requests each | known user median ms | unknown user median ms |")
    print("| --- | --- | --- | --- |")
    for row in timing_rows:
        print(row)


def _timing(port: int, cost: int, rounds: int = 15) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    medians = []
    for user in ("prometheus", "mallory"):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            assert _request(conn, _auth(user, secrets.token_hex(8))) == 401
            times.append((time.perf_counter() - start) * 1000)
        medians.append(statistics.median(times))
    conn.close()
    return f"| {cost} | {rounds} | {medians[0]:.1f} | {medians[1]:.1f} |"


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    cli = client.wrap_bio(c_in, c_out)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    while not all(done):
        for i, (end, out, peer) in enumerate(((cli, c_out, s_in), (srv, s_out, c_in))):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
            if data := out.read():
                peer.write(data)


def _per_call_us(fn: object, n: int) -> float:
    assert callable(fn)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def handshakes(n: int) -> None:
    from stepscope.web.tls import CertificateReloader, TlsSettings, build_ssl_context

    if shutil.which("openssl") is None:
        print("(handshake part skipped: no openssl)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")],
            check=True, capture_output=True,
        )
        tls = TlsSettings(cert_file=d / "c.pem", key_file=d / "k.pem")
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        plain = build_ssl_context(tls)
        reloader = CertificateReloader(tls)
        rows = []
        times: dict[str, list[float]] = {"plain SSLContext": [], "rotation-aware": []}
        for _ in range(n):  # interleaved, so drift in the machine hits both alike
            for label, ctx in (("plain SSLContext", plain), ("rotation-aware", reloader.context)):
                start = time.perf_counter()
                _handshake(ctx, client)
                times[label].append((time.perf_counter() - start) * 1e6)
        for label, values in times.items():
            rows.append((f"full TLS 1.3 handshake, {label} (RSA 2048)",
                         statistics.median(values)))
        conn = reloader.context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_side=True)
        cb = reloader._on_client_hello
        rows.append(("SNI callback between checks",
                     _per_call_us(lambda: cb(conn, None, reloader.context), 100_000)))
        rows.append(("a check: stat of cert and key, unchanged",
                     _per_call_us(reloader._reload_if_changed, 10_000)))

        def reload() -> None:
            reloader._signature = ()
            reloader._reload_if_changed()

        rows.append(("a reload: new context and handshake probes", _per_call_us(reload, 50)))
    print(f"\n### TLS handshake path (in memory, median of {n} handshakes)\n")
    print("| what | µs |")
    print("| --- | --- |")
    for what, us in rows:
        print(f"| {what} | {us:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", type=int, action="append", help="bcrypt cost (10, 12)")
    parser.add_argument("--clients", type=int, action="append", help="flood sizes (0, 4, 8)")
    parser.add_argument("--seconds", type=float, default=5.0, help="scraping per row")
    parser.add_argument("--handshakes", type=int, default=300)
    parser.add_argument("--pythonpath", help="run the exporter with this PYTHONPATH")
    parser.add_argument("--skip-flood", action="store_true")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {ssl.OPENSSL_VERSION}\n")
    if not args.skip_flood:
        flood_and_timing(args.cost or [10, 12], args.clients or [0, 4, 8], args.seconds,
                         args.pythonpath)
    if not args.pythonpath:
        handshakes(args.handshakes)


if __name__ == "__main__":
    main()
