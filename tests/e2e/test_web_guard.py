"""Clients that hold connections without finishing requests cannot starve the scrapes: a
connection cap (the peer holding the most gets no more), silent and slow-header
connections closed after the request timeout, a keep-alive scraper never cut off, and
none of it flooding the log. The attack by another user is in tests/security/."""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Exporter, parse_samples, start_exporter, wait_for


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Exporter]:
    exp = start_exporter(["--simulate", "1", "--interval", "0.5", "--ingest",
                          f"unix://{tmp_path}/ingest.sock", "--max-connections", "20",
                          "--http-request-timeout", "1"])  # fmt: skip
    try:
        yield exp
    finally:
        exp.stop()


def _http(exp: Exporter) -> dict[str, float]:
    fams = parse_samples(exp.metrics())
    return {name: fams[name][0][1] for name in fams if name.startswith("stepscope_http_")}


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_silent_connections_past_the_cap_are_closed_and_the_rest_time_out(
    exporter: Exporter,
) -> None:
    host, port = exporter.address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port)), timeout=0.2) for _ in range(60)]
    try:
        # every one of them is closed: the kernel hands a silent connection over only
        # after the request timeout (TCP_DEFER_ACCEPT), then past the cap the peer
        # holding the most gets no more, and the admitted ones time out after 1 s
        wait_for(lambda: all(_closed_by_peer(s) for s in silent), timeout=20, interval=0.2)

        def all_counted() -> dict[str, float] | None:
            # the 20 admitted time out together, but are counted by as many callbacks:
            # a pass can publish between the first and the last of them
            counts = _http(exporter)
            closed = sum(counts[f"stepscope_http_connections_{how}_total"]
                         for how in ("rejected", "evicted", "timed_out"))  # fmt: skip
            return counts if closed >= 60 else None

        counts = wait_for(all_counted, timeout=10)
        assert counts["stepscope_http_connections_rejected_total"] >= 1
        assert counts["stepscope_http_connections_timed_out_total"] >= 1
        assert counts["stepscope_http_max_connections"] == 20
    finally:
        for s in silent:
            s.close()
    exporter.metrics()  # a real scrape goes through once they are gone


def test_a_slow_header_client_is_closed_while_a_keepalive_scraper_keeps_its_connection(
    exporter: Exporter,
) -> None:
    host, port = exporter.address.rsplit(":", 1)
    dripper = socket.create_connection((host, int(port)), timeout=0.2)
    dripper.sendall(b"GET /metrics HTTP/1.1\r\n")
    scraper = http.client.HTTPConnection(host, int(port), timeout=5)
    closed_at = None
    started = time.monotonic()
    try:
        while time.monotonic() - started < 4:  # four request timeouts
            with contextlib.suppress(OSError):
                dripper.sendall(b"X")  # one header byte at a time, forever
            if closed_at is None and _closed_by_peer(dripper):
                closed_at = time.monotonic() - started
            scraper.request("GET", "/metrics")  # the same connection every 0.3 s
            response = scraper.getresponse()
            assert response.status == 200
            response.read()
            time.sleep(0.3)
        assert closed_at is not None and closed_at < 3.5
    finally:
        dripper.close()
        scraper.close()
    assert exporter.stop() == 0
    log = "".join(exporter.stderr_lines)
    assert "Traceback" not in log
    assert log.count("closed") <= 2  # rate-limited: one line a minute
