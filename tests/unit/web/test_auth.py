"""Basic auth against an in-process aiohttp server running the exporter's middleware:
bcrypt off the event loop and no user names leaking by timing (finding 4 of issue 15),
a bounded queue of checks, a cache a flood cannot evict."""

from __future__ import annotations

import base64
import threading
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
    auth = BasicAuth({"prometheus": hashed}, verify=verify)
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
            first = [pool.submit(get, address, headers=basic("prometheus", f"wrong{i}"))
                     for i in range(2)]
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
