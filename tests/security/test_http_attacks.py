"""Attack repros, HTTP channel (issue 33, items 4 and 5): a stranger on the host, run as
``nobody``, against a real ``stepscope serve`` with basic auth run by the test's user
(root in CI). Each attack is in place before the scraper's first request, so its
credentials are not cached yet (the exporter was just started); the pass criterion is
the answers the scraper gets and the server's own counters, never a time.

- a flood of wrong credentials from 16 threads, guessing user names, or knowing the
  configured one: every scrape is answered 200 (was 429 on 22 of 22);
- hundreds of silent connections, reopened as fast as they are closed, past
  ``max_connections``: every scrape is answered 200 (was reset at the cap).
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from stepscope.web.peers import peer_key
from tests.support import Exporter, parse_samples, start_exporter, wait_for
from tests.support.attacker import NOBODY, needs_setpriv, spawn_as
from tests.support.http_attacks import RUN
from tests.support.web import basic, get

PASSWORD = "pager-s3cret"
SCRAPES = 20


@pytest.fixture(scope="module")
def web_yml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("web") / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    path.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    return path


@pytest.fixture
def exporter(web_yml: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Exporter]:
    needs_setpriv()
    extra = getattr(request, "param", [])
    exp = start_exporter(["--simulate", "1", "--web-config", str(web_yml),
                          "--ingest", f"unix://{tmp_path}/ingest.sock", *extra])  # fmt: skip
    try:
        yield exp
    finally:
        exp.stop()


def _attack(exp: Exporter, *args: str) -> subprocess.Popen[str]:
    """Start an attack as nobody and wait (with a deadline) until it is in place."""
    attacker = spawn_as(NOBODY, RUN, args[0], exp.address, "60", *args[1:], cwd="/")
    assert attacker.stdout is not None
    ready, _, _ = select.select([attacker.stdout], [], [], 30)
    line = attacker.stdout.readline() if ready else ""
    assert line.strip() == "started", f"the attack did not start: {line!r}"
    return attacker


def _stop(attacker: subprocess.Popen[str]) -> dict[str, int]:
    """End an attack that must still be running; its report (what it was answered)."""
    assert attacker.poll() is None, "the attack ended before the scrapes did"
    attacker.terminate()
    out, err = attacker.communicate(timeout=30)
    assert out.splitlines(), err
    return dict(json.loads(out.splitlines()[-1]))


def _counters(exp: Exporter) -> dict[str, float]:
    status, _, body = get(exp.address, headers=basic("prom", PASSWORD))
    assert status == 200
    return {
        name + ",".join(labels.values()): value
        for name, series in parse_samples(body.decode()).items()
        if name.startswith("stepscope_http_")
        for labels, value in series
    }


@pytest.mark.parametrize("user", [None, "prom"], ids=["guessing names", "knowing the name"])
def test_a_flood_of_wrong_credentials_right_after_a_restart_never_locks_the_scraper_out(
    exporter: Exporter, user: str | None
) -> None:
    attacker = _attack(exporter, "flood", "16", *([user] if user else []))
    try:
        answers = [get(exporter.address, headers=basic("prom", PASSWORD))[0]
                   for _ in range(SCRAPES)]  # fmt: skip
    finally:
        report = _stop(attacker)
    assert answers == [200] * SCRAPES
    assert report.get("401", 0) >= 1  # the flood was answered, while the scrapes were
    # the counters are served as of the last sampling pass: wait for the one after
    counters = wait_for(
        lambda: (
            (c := _counters(exporter))["stepscope_http_basic_auth_requests_totalaccepted"]
            >= SCRAPES
            and c
        )
    )
    assert counters["stepscope_http_basic_auth_checks_totalcheap"] >= 1  # the scraper's
    if user is None:  # the guesses cost dummy checks in their own lane, not the scraper's
        assert counters["stepscope_http_basic_auth_checks_totalunknown"] >= 1
        assert counters["stepscope_http_basic_auth_checks_totalcheap"] == 1
    else:  # nobody spent its own budget of pending checks and got 429 past it
        assert counters["stepscope_http_basic_auth_requests_totalthrottled"] >= 1
    assert counters["stepscope_http_basic_auth_requests_totalrejected"] >= 1
    assert counters["stepscope_http_basic_auth_requests_totalaccepted"] >= SCRAPES


@pytest.mark.parametrize(
    "exporter", [["--max-connections", "32", "--http-request-timeout", "1"]], indirect=True
)
def test_a_peer_holding_ten_times_max_connections_idle_never_blocks_a_scrape(
    exporter: Exporter,
) -> None:
    attacker = _attack(exporter, "idle", "320")
    answers: list[int] = []

    def scraped_past_the_cap() -> dict[str, float] | None:
        # the kernel hands the silent connections over after the 1 s request timeout
        # (TCP_DEFER_ACCEPT); scrape on until nobody's reconnects are refused at the cap
        answers.append(get(exporter.address, headers=basic("prom", PASSWORD))[0])
        counters = _counters(exporter)
        refused = counters["stepscope_http_connections_rejected_total"]
        return counters if refused and len(answers) >= SCRAPES else None

    try:
        counters = wait_for(scraped_past_the_cap, timeout=30, interval=0.1)
    finally:
        report = _stop(attacker)
    assert set(answers) == {200}  # every scrape, on a new connection each
    assert counters["stepscope_http_max_connections"] == 32
    assert report["opened"] >= 320 and report["closed_by_server"] >= 1


def _connect_from_127_0_0_7(then: str) -> str:
    """Code for an attacker that connects to argv[1] from 127.0.0.7, then runs ``then``."""
    return (
        "import socket, sys, time; host, port = sys.argv[1].rsplit(':', 1); "
        "s = socket.create_connection((host, int(port)), source_address=('127.0.0.7', 0)); "
        + then
    )


def test_a_peer_on_this_host_is_the_uid_that_owns_its_socket() -> None:
    """Budgets are per peer; on this host a peer is the uid the kernel names for the
    connecting socket (whatever loopback address it binds), so nobody's connections
    never share the scraper's budget."""
    needs_setpriv()
    code = _connect_from_127_0_0_7("time.sleep(120)")  # held open until killed
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        theirs = spawn_as(NOBODY, code, f"127.0.0.1:{server.getsockname()[1]}", cwd="/")
        try:
            conn, _ = server.accept()
            with conn:
                assert peer_key(_Transport(conn)) == f"uid:{NOBODY}"
            mine = socket.create_connection(server.getsockname())
            conn, _ = server.accept()
            with conn, mine:
                assert peer_key(_Transport(conn)) == "uid:0"
        finally:
            theirs.kill()
            theirs.wait()


def test_a_local_client_that_already_closed_its_end_is_not_counted_as_root() -> None:
    """A client's process that connects and exits before its connection is looked at
    leaves an orphaned socket, which the kernel reports as uid 0 (no inode): nobody's
    connections must not land in root's budget that way, so such a peer is ``local``."""
    needs_setpriv()
    code = _connect_from_127_0_0_7("s.close()")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        theirs = spawn_as(NOBODY, code, f"127.0.0.1:{server.getsockname()[1]}", cwd="/")
        _, err = theirs.communicate(timeout=60)
        assert theirs.returncode == 0, err
        conn, _ = server.accept()
        with conn:
            assert peer_key(_Transport(conn)) == "local"


class _Transport:
    """What :func:`peer_key` reads of an asyncio transport, for a plain socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def get_extra_info(self, name: str) -> object:
        return {"peername": self._sock.getpeername(), "sockname": self._sock.getsockname()}[name]
