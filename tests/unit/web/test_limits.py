"""The configured response headers (on every response, errors included) and the rate
limit, against an in-process aiohttp server running the exporter's middlewares."""

from __future__ import annotations

from stepscope.web.config import parse_web_config
from tests.support import REPO
from tests.support.web import bcrypt_hash, get, serving


def test_only_exporter_toolkit_headers_are_sent_on_every_response() -> None:
    cfg = parse_web_config({
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff",
                                           "Content-Security-Policy": ""}},
        "basic_auth_users": {"prometheus": bcrypt_hash()},
    }, REPO)
    assert dict(cfg.headers) == {"X-Content-Type-Options": "nosniff"}  # blank: unset
    with serving(cfg.middlewares()) as address:
        for path in ("/metrics", "/missing"):  # 401 from auth, before routing
            status, headers, _ = get(address, path)
            assert status == 401 and headers["X-Content-Type-Options"] == "nosniff"
            assert "Content-Security-Policy" not in headers


def test_rate_limit_answers_429_past_the_burst() -> None:
    cfg = parse_web_config({"rate_limit": {"interval": "1h", "burst": 2}}, REPO)
    with serving(cfg.middlewares()) as address:
        assert [get(address)[0] for _ in range(3)] == [200, 200, 429]
