"""The source registry: a source is one class and one registration line; the sampler
times it, isolates its failures, serves its health, merges its enrichment and shows its
evidence, with no edit anywhere else."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer

from stepscope.app.serve import PAGES
from stepscope.core.exposition import GAUGE, Family
from stepscope.core.labels import GpuIdentity, LabelSchema, Pairs
from stepscope.core.registry import Registry
from stepscope.core.sampler import RENDER_AHEAD_PASSES
from stepscope.core.snapshot import BODY, GZIP
from stepscope.core.source import PartKey, ReadContext, Source, Tier
from stepscope.diagnose.analysis import DiagnosisAnalysis
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from stepscope.web.app import make_app
from tests.support import make_sampler, parse_samples
from tests.support.clocks import ManualClock

# ------------------------------------------------------------------ a toy source


@dataclass(frozen=True)
class Fans:
    """The toy source's part: fan speed per GPU index."""

    rpm: Mapping[int, float]


FANS: PartKey[Fans] = PartKey("fans")


class FanSource(Source[Fans]):
    """A source a contributor might add: one file, one registration line."""

    key = FANS

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False

    def read(self, ctx: ReadContext) -> Fans:
        self.reads += 1
        if self.fail:
            raise OSError("fan controller not answering")
        return Fans({g.index: 1000.0 + g.index for g in ctx.gpus})

    def families(self, part: Fans, labels: LabelSchema) -> Iterable[Family]:
        fam = Family("stepscope_fan_rpm", GAUGE, "Fan speed.")
        for g in labels.gpus:
            fam.add(labels.gpu(g.uuid), part.rpm[g.index])
        return [fam]

    def gpu_labels(self, part: Fans, gpus: Sequence[GpuIdentity]) -> Mapping[str, Pairs]:
        # enrichment: a label of its own, and an attempt to overwrite a dcgm label
        return {g.uuid: (("cooling", "air"), ("gpu", "999")) for g in gpus}

    def evidence(self, part: Fans) -> Sequence[str]:
        return (f"fans spin at {min(part.rpm.values()):.0f} rpm or more",)


def node(*extra: Source[object], clock: ManualClock | None = None) -> tuple[object, ManualClock]:
    clock = clock or ManualClock(100.0)
    backend = SimulatedBackend(default_scenario(2), hostname="n", clock=clock)
    sampler = make_sampler(
        backend, clock=clock, sources=extra, analyses=[DiagnosisAnalysis()], hostname="n"
    )
    return sampler, clock


def test_a_toy_source_shows_in_metrics_health_labels_and_the_diagnosis_document() -> None:
    fans = FanSource()
    sampler, _ = node(fans)

    async def scrape() -> tuple[str, dict[str, object]]:
        sampler.sample_once()  # type: ignore[attr-defined]
        app = make_app(sampler, pages=PAGES)  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            text = await (await client.get("/metrics")).text()
            doc = json.loads(await (await client.get("/api/v1/diagnosis")).text())
            response = await client.get("/")
            page = await response.text()
            headers = response.headers
        assert "stepscope" in page
        # the status page cannot be framed, sniffed or made to load anything
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        return text, doc

    text, doc = asyncio.run(scrape())
    fams = parse_samples(text)
    rpm = {lbl["gpu"]: v for lbl, v in fams["stepscope_fan_rpm"]}
    assert rpm == {"0": 1000.0, "1": 1001.0}
    # its enrichment reaches every GPU series, and cannot overwrite dcgm's labels
    for lbl, _ in fams["DCGM_FI_DEV_GPU_UTIL"]:
        assert lbl["cooling"] == "air" and lbl["gpu"] in ("0", "1")
    success = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_success"]}
    assert success["fans"] == 1.0 and success["gpu"] == 1.0 and success["diagnosis"] == 1.0
    assert {lbl["collector"] for lbl, _ in fams["stepscope_collector_duration_seconds"]} >= {
        "fans",
        "gpu",
        "diagnosis",
    }
    sources = doc["sources"]
    assert isinstance(sources, dict)
    assert sources["fans"]["evidence"] == ["fans spin at 1000 rpm or more"]


def test_a_failing_source_costs_its_own_part_only_and_reads_again_when_it_recovers() -> None:
    fans = FanSource()
    sampler, clock = node(fans)
    sampler.sample_once()  # type: ignore[attr-defined]
    fans.fail = True
    for _ in range(3):
        clock.t += 1
        text = sampler.sample_once().body.decode()  # type: ignore[attr-defined]
    fams = parse_samples(text)
    assert "stepscope_fan_rpm" not in fams  # no stale readings of a failing source
    assert len(fams["DCGM_FI_DEV_GPU_UTIL"]) == 2  # everything else still served
    success = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_success"]}
    errors = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_errors_total"]}
    assert success["fans"] == 0.0 and errors["fans"] == 3.0
    assert success["gpu"] == 1.0 and errors["gpu"] == 0.0
    fans.fail = False
    clock.t += 1
    fams = parse_samples(sampler.sample_once().body.decode())  # type: ignore[attr-defined]
    assert "stepscope_fan_rpm" in fams
    success = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_success"]}
    assert success["fans"] == 1.0


class BrokenRenderer(FanSource):
    def families(self, part: Fans, labels: LabelSchema) -> Iterable[Family]:
        raise ValueError("renderer bug")


def test_a_renderer_bug_costs_that_sources_series_not_the_scrape() -> None:
    sampler, _ = node(BrokenRenderer())
    fams = parse_samples(sampler.sample_once().body.decode())  # type: ignore[attr-defined]
    assert "stepscope_fan_rpm" not in fams and "DCGM_FI_DEV_GPU_UTIL" in fams
    sampler.sample_once()  # type: ignore[attr-defined]
    fams = parse_samples(sampler.sample_once().body.decode())  # type: ignore[attr-defined]
    errors = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_errors_total"]}
    assert errors["fans"] >= 1.0


class Slow(FanSource):
    key = PartKey("slowfans")
    tier = Tier.SLOW


class Own(FanSource):
    key = PartKey("ownfans")
    tier = 5.0


class Once(FanSource):
    key = PartKey("oncefans")
    tier = math.inf


def test_tiers_read_every_pass_on_the_slow_cadence_on_their_own_interval_or_once() -> None:
    fast, slow, own, once = FanSource(), Slow(), Own(), Once()
    sampler, clock = node(fast, slow, own, once)
    for _ in range(21):
        sampler.sample_once()  # type: ignore[attr-defined]
        clock.t += 1
    assert (fast.reads, slow.reads, own.reads, once.reads) == (21, 3, 5, 1)
    # a part is carried between reads: the slow source's series never go missing
    fams = parse_samples(sampler.latest.body.decode())  # type: ignore[attr-defined]
    assert sum(1 for lbl, _ in fams["stepscope_fan_rpm"]) == 2 * 4


class Blocking(FanSource):
    """A background source whose first read hangs until released (a slow kubelet)."""

    key = PartKey("blocking")
    background = True
    tier = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def read(self, ctx: ReadContext) -> Fans:
        self.release.wait(10)
        return Fans({0: 1.0, 1: 2.0})


def test_a_background_source_never_delays_a_pass_and_reads_pending_until_it_answers() -> None:
    blocking = Blocking()
    sampler, clock = node(blocking)
    try:
        snap = sampler.sample_once().snapshot  # type: ignore[attr-defined]
        health = snap.health["blocking"]
        assert health.pending and not health.success
        assert "blocking" not in snap.parts
        blocking.release.set()
        deadline = 200
        while deadline and "blocking" not in snap.parts:
            clock.t += 0.1
            threading.Event().wait(0.05)
            snap = sampler.sample_once().snapshot  # type: ignore[attr-defined]
            deadline -= 1
        assert snap.health["blocking"].success
    finally:
        blocking.release.set()
        sampler.stop()  # type: ignore[attr-defined]


def test_source_names_are_unique_and_label_safe() -> None:
    registry = Registry()
    registry.register(FanSource())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(FanSource())

    class Bad(FanSource):
        key = PartKey("bad name")

    with pytest.raises(ValueError, match="letters, digits"):
        registry.register(Bad())


# ------------------------------------------------------------------ rendering on demand


class CountedFans(FanSource):
    key = PartKey("countedfans")

    def __init__(self) -> None:
        super().__init__()
        self.renders = 0

    def families(self, part: Fans, labels: LabelSchema) -> Iterable[Family]:
        self.renders += 1
        return super().families(part, labels)


def test_an_exposition_nobody_asks_for_is_never_rendered_and_an_asked_one_is_ready_next_pass(
) -> None:
    """A 1 s sampler scraped every 15 s renders a few times per scrape, not 15 times;
    a scraper reading every pass (even one drifting past a pass now and then) finds the
    bytes rendered ahead on the sampler thread."""
    ahead = RENDER_AHEAD_PASSES
    fans = CountedFans()
    sampler, clock = node(fans)
    first = sampler.sample_once()  # type: ignore[attr-defined]
    assert first.has(BODY) and fans.renders == 1, "the first pass is rendered ahead"
    passes = []
    for _ in range(14):  # passes nobody scrapes
        clock.t += 1.0
        passes.append(sampler.sample_once())  # type: ignore[attr-defined]
    assert [p.has(BODY) for p in passes] == [True] * ahead + [False] * (14 - ahead)
    assert fans.renders == 1 + ahead
    # a snapshot rendered late is still its own pass's, not the latest one's
    old = passes[ahead + 2]
    fams = parse_samples(old.body.decode())
    (_, stamp), = fams["stepscope_last_collect_timestamp_seconds"]
    assert stamp == old.snapshot.timestamp and fans.renders == 2 + ahead
    assert old.body is old.body and fans.renders == 2 + ahead, "rendered once"
    # the scrape of the latest pass renders it then; the next passes are rendered ahead
    # (with the gzip form when that was asked for), until nobody has asked for a while
    assert passes[-1].gzipped() and fans.renders == 3 + ahead
    after = []
    for _ in range(ahead + 3):
        clock.t += 1.0
        after.append(sampler.sample_once())  # type: ignore[attr-defined]
    assert [p.has(GZIP) for p in after] == [True] * (ahead + 1) + [False] * 2
    assert not any(p.requested for p in after) and fans.renders == 4 + 2 * ahead


def scrape_for(
    readers: Sequence[tuple[float, float]], seconds: int, gzip: bool = False
) -> tuple[list[bool], int]:
    """A 1 s sampler read by ``readers`` (period, offset s) for ``seconds``: whether
    each read found its bytes ready (in order), and how many renders were made."""
    fans = CountedFans()
    sampler, clock = node(fans)
    clock.t = 0.0
    latest = sampler.sample_once()  # type: ignore[attr-defined]
    due = sorted((offset, period) for period, offset in readers)
    ready: list[bool] = []
    for t in range(1, seconds + 1):
        while due[0][0] < t:  # the reads before the next pass, in time order
            at, period = due.pop(0)
            clock.t = at
            ready.append(latest.has(GZIP if gzip else BODY))
            assert latest.gzipped() if gzip else latest.body
            due = sorted([*due, (at + period, period)])
        clock.t = float(t)
        latest = sampler.sample_once()  # type: ignore[attr-defined]
    return ready, fans.renders


@pytest.mark.parametrize(
    ("readers", "gzip"),
    [
        ([(15.0, 7.37)], True),  # one Prometheus, every 15 s
        ([(15.0, 7.37), (15.0, 10.81)], False),  # an HA pair, 3.4 s apart
        ([(30.0, 2.5), (30.0, 9.2), (30.0, 21.93)], True),  # three servers
        ([(1.0, 0.5)], True),  # a reader of every pass
        ([(60.0, 0.999)], False),  # read just before a pass ends
    ],
)
def test_a_periodic_scraper_finds_its_bytes_ready_and_few_passes_are_rendered(
    readers: list[tuple[float, float]], gzip: bool
) -> None:
    """Once the reads' period shows (the third read of each reader), every read finds
    the exposition rendered ahead, and a slow scraper costs one or two renders a read,
    not the RENDER_AHEAD_PASSES + 1 of a reader whose period is unknown."""
    seconds = 600
    ready, renders = scrape_for(readers, seconds, gzip)
    settled = ready[3 * len(readers):]
    assert settled and all(settled), ready
    reads = len(ready)
    if readers[0][0] > 1:
        assert renders <= 2 * reads + 2 * len(readers) + 4, (renders, reads)
    else:
        assert renders >= seconds  # every pass is read: every pass is rendered


def test_reads_with_no_period_fall_back_to_rendering_the_passes_after_each() -> None:
    """Reads at irregular times (a person reloading the page) leave the sampler
    rendering the few passes after each read, and nothing once they stop."""
    fans = CountedFans()
    sampler, clock = node(fans)
    latest = sampler.sample_once()  # type: ignore[attr-defined]
    for at in (3.2, 10.7, 12.1, 30.4, 31.9):
        while clock.t + 1 < at:
            clock.t += 1.0
            latest = sampler.sample_once()  # type: ignore[attr-defined]
        clock.t = at
        assert latest.body
        clock.t = math.floor(at) + 1.0
        latest = sampler.sample_once()  # type: ignore[attr-defined]
    before = fans.renders
    passes = []
    for _ in range(10):
        clock.t += 1.0
        passes.append(sampler.sample_once())  # type: ignore[attr-defined]
    assert [p.has(BODY) for p in passes] == [True] * RENDER_AHEAD_PASSES + [False] * (
        10 - RENDER_AHEAD_PASSES
    )
    assert fans.renders == before + RENDER_AHEAD_PASSES


def test_concurrent_scrapes_of_an_unrendered_snapshot_render_it_once() -> None:
    fans = CountedFans()
    sampler, clock = node(fans)
    for _ in range(RENDER_AHEAD_PASSES + 2):
        clock.t += 1.0
        latest = sampler.sample_once()  # type: ignore[attr-defined]
    assert not latest.has(BODY)
    renders = fans.renders
    app = make_app(sampler, clock=clock)  # type: ignore[arg-type]

    async def scrape_many() -> set[bytes]:
        async with TestClient(TestServer(app)) as client:
            async def one(gz: bool) -> bytes:
                headers = {"Accept-Encoding": "gzip" if gz else "identity"}
                resp = await client.get("/metrics", headers=headers)
                assert resp.status == 200
                return await resp.read()  # aiohttp decompresses gzip

            return set(await asyncio.gather(*(one(i % 2 == 0) for i in range(8))))

    bodies = asyncio.run(scrape_many())
    assert bodies == {latest.body} and fans.renders == renders + 1
