"""One ingest URL grammar for the SDK and the exporter (issue 15, finding 8).

`unix://run/x/ingest.sock` used to bind `/x/ingest.sock` (creating `/x`) while the log
printed the URL and the SDK refused the same URL; `?` and `#` silently cut the path.
"""

from __future__ import annotations

import socket

import pytest

from stepscope.app.config import load
from stepscope.core.errors import ConfigError
from stepscope.shared.datagram import IngestURLError, parse_ingest_url
from stepscope.train import StepReporter

GOOD = [
    ("unix:///run/stepscope/ingest.sock", socket.AF_UNIX, "/run/stepscope/ingest.sock"),
    ("  unix:///tmp/a b/s.sock ", socket.AF_UNIX, "/tmp/a b/s.sock"),  # taken literally
    ("udp://127.0.0.1:9401", socket.AF_INET, ("127.0.0.1", 9401)),
    ("udp://[::1]:9401", socket.AF_INET6, ("::1", 9401)),
    ("udp://localhost:9401", socket.AF_INET, ("localhost", 9401)),
]

BAD = [
    ("unix://run/x/ingest.sock", "takes no host part ('run' would be dropped and "
                                 "/x/ingest.sock used); write the absolute path after three "
                                 "slashes: unix:///run/x/ingest.sock"),
    ("unix://localhost/run/s.sock", "takes no host part"),
    ("unix:///run/s.sock?mode=1", "no query or fragment"),
    ("unix:///run/s.sock#frag", "no query or fragment"),
    ("unix:///run/a#b/s.sock", "no query or fragment"),
    ("unix:///run/stepscope/", "must end in a file name"),
    ("unix:///" + "a" * 120, "at most 107"),
    ("unix://", "expected unix:///PATH"),
    ("unix:/run/s.sock", "(the scheme must be unix:// or udp://)"),
    ("tcp://x:1", "expected unix:///PATH or udp://HOST:PORT"),
    ("udp://127.0.0.1", "expected udp://HOST:PORT"),
    ("udp://127.0.0.1:0", "the port must be 1-65535"),
    ("udp://127.0.0.1:70000", "the port must be 1-65535"),
    ("udp://127.0.0.1:94o1", "the port must be 1-65535"),
    ("udp://::1:9401", "in brackets"),
    ("udp://u@127.0.0.1:9401", "HOST:PORT only"),
    ("udp://127.0.0.1:9401/x", "HOST:PORT only"),
    ("udp://127.0.0.1:9401?x", "no query or fragment"),
]


@pytest.mark.parametrize(("url", "family", "address"), GOOD)
def test_the_grammar_accepts_the_documented_forms(
    url: str, family: int, address: object
) -> None:
    parsed = parse_ingest_url(url)
    assert (parsed.family, parsed.address) == (family, address)
    assert parsed.url == url.strip()


@pytest.mark.parametrize(("url", "words"), BAD)
def test_the_grammar_refuses_with_a_message_that_says_what_is_wrong(url: str, words: str) -> None:
    with pytest.raises(IngestURLError) as err:
        parse_ingest_url(url)
    assert words in str(err.value)


@pytest.mark.parametrize(("url", "words"), BAD)
def test_the_sdk_and_the_exporter_refuse_the_same_urls_with_the_same_words(
    url: str, words: str
) -> None:
    with pytest.raises(ValueError) as sdk:
        StepReporter("j", ingest=url)
    assert words in str(sdk.value) and repr(url) in str(sdk.value)
    with pytest.raises(ConfigError) as exporter:
        load({"ingest": url}, env={})
    assert words in str(exporter.value) and str(exporter.value).startswith("ingest: ")


@pytest.mark.parametrize("url", [u for u, _, _ in GOOD])
def test_what_the_exporter_accepts_the_sdk_sends_to(url: str) -> None:
    assert load({"ingest": url}, env={}).ingest == url.strip()
    rep = StepReporter("j", ingest=url)
    assert rep.ingest == parse_ingest_url(url)
    rep.close()


@pytest.mark.parametrize("url", ["udp://10.0.0.5:9401", "udp://0.0.0.0:9401",
                                 "udp://[::]:9401", "udp://node-3.cluster:9401"])
def test_udp_is_refused_off_loopback_at_start_because_it_is_unauthenticated(url: str) -> None:
    with pytest.raises(ConfigError, match=r"unauthenticated.*loopback only"):
        load({"ingest": url}, env={})
