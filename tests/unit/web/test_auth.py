"""Basic auth against an in-process aiohttp server running the exporter's middleware:
bcrypt off the event loop and no user names leaking by timing (finding 4 of issue 15),
a bounded queue of checks, a cache a flood cannot evict."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import bcrypt
import pytest

from stepscope.web.auth import DUMMY_HASH, BasicAuth
from tests.support import wait_for
from tests.support.web import basic, get, serving


class GatedVerify:
    """bcrypt.checkpw that records its calls and, for passwords starting with
    ``wrong``, blocks until ``release`` is set: a check as slow as the test wants."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bytes]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls.append((password, hashed))
        if password.startswith(b"wrong"):
            self.entered.release()
            self.release.wait(30)
        return bcrypt.checkpw(password, hashed)


@pytest.fixture(scope="module")
def hashed() -> bytes:
    return bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=5))


def test_a_scrape_completes_while_password_checks_are_in_flight(hashed: bytes) -> None:
    """Finding 4: bcrypt ran on the event loop, so wrong-password clients held every
    scrape back. Here the check blocks until released: before the fix the loop itself
    blocked and the scrape could not complete at all."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, peer_pending=4)
    with serving((auth.middleware,)) as address, ThreadPoolExecutor(8) as pool:
        assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200  # now cached
        bad: list[Future[tuple[int, dict[str, str], bytes]]] = [
            pool.submit(get, address, headers=basic("prometheus", f"wrong{i}")) for i in range(4)
        ]
        try:
            assert verify.entered.acquire(timeout=15)  # a check is running, blocked
            status, _, body = get(address, headers=basic("prometheus", "s3cret"))
            assert (status, body) == (200, b"ok\n")
            assert not any(f.done() for f in bad)  # all four still waiting for bcrypt
        finally:
            verify.release.set()
        assert [f.result(timeout=15)[0] for f in bad] == [401] * 4


def test_more_pending_checks_than_the_limit_get_429_at_once(hashed: bytes) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, max_pending=2)
    with serving((auth.middleware,)) as address, ThreadPoolExecutor(4) as pool:
        try:
            first = [
                pool.submit(get, address, headers=basic("prometheus", f"wrong{i}"))
                for i in range(2)
            ]
            assert verify.entered.acquire(timeout=15)
            # two distinct checks are pending (one running, one queued)
            wait_for(lambda: len(auth._inflight) == 2)
            status, headers, _ = get(address, headers=basic("prometheus", "wrong-third"))
            assert status == 429 and headers["Retry-After"] == "1"
        finally:
            verify.release.set()
        assert [f.result(timeout=15)[0] for f in first] == [401, 401]


def test_an_unknown_user_costs_one_check_against_exporter_toolkits_cost_10_dummy(
    hashed: bytes,
) -> None:
    """Finding 4: an unknown user was answered without bcrypt (1.7 ms against 54.5 ms
    for a known one), telling which user names exist. Issue 27: the dummy then took the
    table's highest cost (cost 18: ~15 s, cut by the request timeout); now it is
    exporter-toolkit's fixed cost-10 hash whatever the table holds."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
    with serving((auth.middleware,)) as address:
        unknown = get(address, headers=basic("mallory", "guess"))
        known = get(address, headers=basic("prometheus", "guess"))
    assert unknown[0] == known[0] == 401
    assert unknown[2] == known[2]
    assert unknown[1]["WWW-Authenticate"] == known[1]["WWW-Authenticate"]
    assert [password for password, _ in verify.calls] == [b"guess", b"guess"]
    dummy, real = verify.calls[0][1], verify.calls[1][1]
    assert real == hashed
    assert dummy == DUMMY_HASH and dummy[4:7] == b"10$"
    assert bcrypt.checkpw(b"fakepassword", dummy)  # exporter-toolkit's, byte for byte


def test_credentials_are_checked_once_and_a_flood_cannot_evict_them(hashed: bytes) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, cache_size=2)
    with serving((auth.middleware,)) as address:
        for _ in range(3):
            assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200
        assert len(verify.calls) == 1
        # a rejected password is remembered too: repeating it costs nothing
        for _ in range(3):
            assert get(address, headers=basic("prometheus", "guess"))[0] == 401
        assert len(verify.calls) == 2
        for i in range(5):  # more distinct rejects than the cache holds
            assert get(address, headers=basic("prometheus", f"guess{i}"))[0] == 401
        assert len(verify.calls) == 7
        assert get(address, headers=basic("prometheus", "s3cret"))[0] == 200
        assert len(verify.calls) == 7  # the accepted credentials were not evicted


def test_passwords_longer_than_72_bytes_compare_as_bcrypt_does() -> None:
    """bcrypt reads 72 bytes; pyca/bcrypt 5 raises past that instead of a 401."""
    long = b"p" * 72
    auth = BasicAuth({"prometheus": bcrypt.hashpw(long, bcrypt.gensalt(rounds=4))})
    with serving((auth.middleware,)) as address:
        assert get(address, headers=basic("prometheus", "p" * 80))[0] == 200
        assert get(address, headers=basic("prometheus", "q" * 80))[0] == 401


@pytest.mark.parametrize(
    "header",
    ["", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()],
)
def test_malformed_authorization_is_401_without_a_check(hashed: bytes, header: str) -> None:
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
    with serving((auth.middleware,)) as address:
        assert get(address, headers={"Authorization": header} if header else {})[0] == 401
    assert verify.calls == []


def test_a_slow_check_of_a_costly_hash_does_not_queue_unknown_users_or_cheap_hashes(
    hashed: bytes,
) -> None:
    """A wrong password for a cost-18 user holds its lane ~15 s; an unknown user (the
    cost-10 dummy) and a cost-10 user are checked meanwhile in the other lane."""
    costly = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=11))
    verify = GatedVerify()
    auth = BasicAuth({"bob": costly, "dave": hashed}, verify=verify)
    with serving((auth.middleware,)) as address, ThreadPoolExecutor(2) as pool:
        try:
            slow = pool.submit(get, address, headers=basic("bob", "wrong-slow"))
            assert verify.entered.acquire(timeout=15)  # the costly check is running
            assert get(address, headers=basic("nobody", "guess"))[0] == 401
            assert get(address, headers=basic("dave", "s3cret"))[0] == 200
            assert not slow.done()
        finally:
            verify.release.set()
        assert slow.result(timeout=15)[0] == 401


# ---- issue 33: the pager always gets in (lanes and budgets, driven without a server)


def _header(user: str, password: str) -> str:
    return basic(user, password)["Authorization"]


async def _until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Yield to the loop until ``predicate`` holds (a deadline, not a sleep)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.01)


def test_a_flood_of_unknown_users_never_queues_a_configured_users_first_check(
    hashed: bytes,
) -> None:
    """Issue 33: unknown users and configured users shared one lane of 8 pending checks,
    so 16 flooding threads right after a restart got the valid user 429 on 22 of 22
    scrapes. The dummy check now has a lane of its own: with it blocked and 40 unknown
    users waiting, the valid user's first check runs at once."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)

    async def run() -> tuple[list[bool | None], bool | None]:
        flood = [
            asyncio.ensure_future(auth.check(_header(f"user{i}", f"wrong{i}"), lambda: "mallory"))
            for i in range(40)
        ]
        await _until(lambda: auth.checks["unknown"] == 1)  # one dummy check, blocked
        valid = await auth.check(_header("prometheus", "s3cret"), lambda: "prometheus")
        verify.release.set()
        return list(await asyncio.gather(*flood)), valid

    flood, valid = asyncio.run(run())
    assert valid is True
    assert flood == [False] * 40  # every unknown user 401, none 429
    # one dummy check ran (the others waited as long, at no CPU), one real one
    assert dict(auth.checks) == {"unknown": 1, "cheap": 1}


def test_a_client_flooding_a_known_user_name_spends_its_own_budget_not_the_scrapers(
    hashed: bytes,
) -> None:
    """A stranger who knows the user name sends wrong passwords for it: past two pending
    checks it gets 429, for a configured name and an unknown one alike (the status does
    not tell which names exist), while the scraper's first check is admitted behind at
    most those two."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify)

    async def run() -> tuple[list[bool | None], bool | None, bool | None]:
        pending = [
            asyncio.ensure_future(
                auth.check(_header("prometheus", f"wrong{i}"), lambda: "10.0.0.9")
            )
            for i in range(2)
        ]
        await _until(lambda: auth.checks["cheap"] == 2)
        over = [
            await auth.check(_header("prometheus", "wrong-3"), lambda: "10.0.0.9"),
            await auth.check(_header("nosuchuser", "wrong-4"), lambda: "10.0.0.9"),
        ]
        scrape = asyncio.ensure_future(
            auth.check(_header("prometheus", "s3cret"), lambda: "10.0.0.2")
        )
        await _until(lambda: auth.checks["cheap"] == 3)  # admitted, queued behind two
        verify.release.set()
        return over, await scrape, (await asyncio.gather(*pending))[0]

    over, scrape, first = asyncio.run(run())
    assert over == [None, None]  # 429 for the configured name and the unknown one
    assert scrape is True and first is False
    assert auth._peer_pending == {}  # the budget is given back as checks end


def test_an_unknown_user_is_answered_when_a_cost_10_user_arriving_with_it_would_be(
    hashed: bytes,
) -> None:
    """While a configured user's check runs, an unknown user's 401 waits for it, as a
    configured user's check arriving then would: the delay does not tell the names
    apart. A full cost-10 lane answers both 429."""
    verify = GatedVerify()
    auth = BasicAuth({"prometheus": hashed}, verify=verify, max_pending=2)

    async def run() -> tuple[bool, bool | None, bool | None, bool | None]:
        known = [asyncio.ensure_future(auth.check(_header("prometheus", "wrong"), lambda: "a"))]
        await _until(lambda: auth.checks["cheap"] == 1)
        unknown = asyncio.ensure_future(auth.check(_header("mallory", "guess"), lambda: "b"))
        for _ in range(20):
            await asyncio.sleep(0)
        waited = not unknown.done()
        known.append(
            asyncio.ensure_future(auth.check(_header("prometheus", "wrong2"), lambda: "c"))
        )
        await _until(lambda: auth.checks["cheap"] == 2)  # the lane is full now
        lane_full = [
            await auth.check(_header("prometheus", "other"), lambda: "d"),
            await auth.check(_header("eve", "other"), lambda: "d"),
        ]
        verify.release.set()
        assert await asyncio.gather(*known) == [False, False]
        return waited, await unknown, lane_full[0], lane_full[1]

    waited, unknown, known_full, unknown_full = asyncio.run(run())
    assert waited and unknown is False
    assert known_full is None and unknown_full is None
