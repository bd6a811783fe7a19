"""/metrics picks its format from the Accept header as client_golang's
``expfmt.Negotiate`` does: protobuf only for a scraper that prefers it, text for
everyone else, byte for byte what it was."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from stepscope.core.exposition import CONTENT_TYPE
from stepscope.core.exposition_proto import CONTENT_TYPE as PROTOBUF_TYPE
from stepscope.core.snapshot import PROTOBUF, Published
from stepscope.gpu.scenario import default_scenario
from stepscope.gpu.simulated import SimulatedBackend
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.source import IngestSource
from stepscope.shared.datagram import StepRecord
from stepscope.web.app import make_app, wants_protobuf
from tests.support import make_sampler
from tests.support.clocks import ManualClock
from tests.support.metrics_proto import decode_delimited, family_type

# what Prometheus 2.42 sends with native histograms on, and without
PROMETHEUS_NATIVE = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
    "application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,"
    "*/*;q=0.1"
)
PROMETHEUS_CLASSIC = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROTO = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily"


@pytest.mark.parametrize(
    ("accept", "protobuf"),
    [
        (PROMETHEUS_NATIVE, True),
        (PROMETHEUS_CLASSIC, False),  # OpenMetrics is not served: text 0.0.4 wins
        ("", False),
        ("*/*", False),
        ("text/plain", False),
        (f"{PROTO};encoding=delimited", True),
        (f"{PROTO}; encoding=delimited; q=0.9", True),
        # q-values order the ranges, not their place in the header
        (f"text/plain;version=0.0.4;q=0.5,{PROTO};encoding=delimited;q=0.6", True),
        (f"{PROTO};encoding=delimited;q=0.4,text/plain;version=0.0.4;q=0.5", False),
        # q=0 refuses a type
        (f"{PROTO};encoding=delimited;q=0,*/*", False),
        # the protobuf text encodings and another message are not served here
        (f"{PROTO};encoding=text,{PROTO};encoding=delimited;q=0.2", True),
        (f"{PROTO};encoding=compact-text", False),
        ("application/vnd.google.protobuf;proto=other.Message;encoding=delimited", False),
        # a text version we do not write does not win; a wildcard never picks protobuf
        (f"text/plain;version=9.9.9,{PROTO};encoding=delimited;q=0.5", True),
        ("application/*", False),
        ("APPLICATION/VND.GOOGLE.PROTOBUF;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited", True),
        (f"{PROTO};encoding=delimited;q=junk,text/plain;q=0.1", False),
    ],
)
def test_the_format_follows_the_accept_header(accept: str, protobuf: bool) -> None:
    assert wants_protobuf(accept) is protobuf


class Latest:
    def __init__(self, published: Published) -> None:
        self.latest = published


def node() -> Published:
    """One pass of a simulated node with two ranks of one job reporting."""
    agg = Aggregator()
    backend = SimulatedBackend(default_scenario(2), hostname="node-1", clock=ManualClock(1000.0))
    uuids = [g.uuid for g in backend.devices()]
    for rank in range(2):
        for i, dur in enumerate((0.5, 0.52, 0.55, 2.0)):
            agg.add(
                StepRecord(
                    job="llm", rank=rank, local_rank=rank, step=i, t=100.0 + i, dur=dur,
                    data_wait=0.0, compute=dur, comm=0.0, other=0.0, warmup=False, tokens=1,
                    flops=0.0, precision="bf16", world_size=2, pid=None, uuid=uuids[rank],
                    dropped=0,
                )
            )
    return make_sampler(backend, sources=[IngestSource(agg)]).sample_once()  # type: ignore[no-any-return]


def get(published: Published, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    async def run() -> tuple[dict[str, str], bytes]:
        client: TestClient[Any, Any] = TestClient(TestServer(make_app(Latest(published))))
        await client.start_server()
        try:
            resp = await client.get("/metrics", headers=headers, auto_decompress=False)
            assert resp.status == 200
            return dict(resp.headers), await resp.read()
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_prometheus_with_native_histograms_gets_protobuf_with_one_series_a_rank() -> None:
    published = node()
    headers, body = get(published, {"Accept": PROMETHEUS_NATIVE, "Accept-Encoding": "identity"})
    assert headers["Content-Type"] == PROTOBUF_TYPE
    assert headers["Vary"] == "Accept, Accept-Encoding"
    fams = {mf.name: mf for mf in decode_delimited(body)}
    step = fams["stepscope_step_duration_seconds"]
    assert family_type(step) == "HISTOGRAM" and len(step.metric) == 2
    h = step.metric[0].histogram
    assert (h.sample_count, h.schema) == (4, 3)
    assert family_type(fams["DCGM_FI_DEV_POWER_VIOLATION"]) == "COUNTER"
    assert published.has(PROTOBUF) and published.protobuf_requested


def test_everyone_else_gets_the_text_exposition_unchanged() -> None:
    published = node()
    for accept in (PROMETHEUS_CLASSIC, "*/*", None):
        asked = {"Accept-Encoding": "identity", **({"Accept": accept} if accept else {})}
        headers, body = get(published, asked)
        assert headers["Content-Type"] == CONTENT_TYPE
        assert body == published.render(), "the same bytes as before negotiation"
        assert "Content-Encoding" not in headers
    assert not published.has(PROTOBUF) and not published.protobuf_requested


def test_both_formats_are_gzipped_when_asked() -> None:
    published = node()
    headers, body = get(published, {"Accept": PROMETHEUS_NATIVE, "Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == published.render_protobuf()
    headers, body = get(published, {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == CONTENT_TYPE
    assert gzip.decompress(body) == published.render()
