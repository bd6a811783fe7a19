"""Native histograms against real Prometheus servers scraping one `stepscope serve`.

Two ranks of one job report known step times over UDP. One Prometheus (Debian's 2.42)
runs with ``--enable-feature=native-histograms`` and so asks for the protobuf exposition
first; another, without the flag, scrapes the same exporter in text. The native one
stores each rank's step time as one native histogram series (no ``_bucket`` series at
all); ``histogram_quantile`` over it reads the true p50 and p90 within a schema-3 bucket
(~9%), and agrees with the classic buckets the other server stores within their bucket
width. Every other series is the same in both servers, under the same names (the
dcgm-exporter counters keep theirs).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Exporter, parse_samples, start_exporter, wait_for
from tests.support.exporter import kill_all
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus

JOB = "native-e2e"
STEPS = 120
# rank -> its step times (seconds): spread over a few classic buckets each
DURATIONS = {
    0: [0.30 + 0.0025 * i for i in range(STEPS)],  # 0.30 .. 0.60
    1: [0.45 + 0.005 * i for i in range(STEPS)],  # 0.45 .. 1.05
}
SCHEMA_3_WIDTH = 2 ** (1 / 8) - 1  # ~0.0905


def true_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def send_steps(port: int, uuid: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for rank, durs in DURATIONS.items():
            for i, dur in enumerate(durs):
                sock.sendto(json.dumps({
                    "v": 1, "type": "step", "job": JOB, "rank": rank, "local_rank": rank,
                    "world_size": 2, "pid": os.getpid(), "uuid": uuid, "step": i,
                    "t": time.time(), "dur": dur, "data": 0.0, "compute": dur / 2,
                    "comm": 0.0, "tokens": 1, "flops": 0, "precision": "bf16",
                    "warmup": False,
                }).encode(), ("127.0.0.1", port))
                if i % 20 == 19:
                    time.sleep(0.01)  # never outrun the socket's buffer
    finally:
        sock.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, Prometheus]]:
    tmp = tmp_path_factory.mktemp("native")
    port = free_port(socket.SOCK_DGRAM)
    exporters: list[Exporter] = []
    proms: list[Prometheus] = []
    try:
        exp = start_exporter(["--simulate", "1", "--interval", "0.5", "--hostname", "node-n",
                              "--ingest", f"udp://127.0.0.1:{port}"])
        exporters.append(exp)
        (gpu, _), = parse_samples(exp.metrics())["stepscope_gpu_up"]
        send_steps(port, gpu["UUID"])

        def counted() -> bool:
            counts = parse_samples(exp.metrics()).get("stepscope_step_duration_seconds_count")
            return sorted(v for _, v in counts or []) == [STEPS, STEPS]

        wait_for(counted, timeout=20, interval=0.2)
        rules = tmp / "no-rules"
        rules.mkdir()
        for name, flags in (("native", ["--enable-feature=native-histograms"]), ("classic", [])):
            (tmp / name).mkdir()
            proms.append(Prometheus(tmp / name, [exp.address], rules, flags))
        yield proms[0], proms[1]
    finally:
        for prom in proms:
            prom.stop()
        kill_all(exporters)


def query(prom: Prometheus, expr: str) -> list[dict[str, Any]]:
    """The instant query's result once the server has stored what it needs."""
    result: list[dict[str, Any]] = wait_for(
        lambda: prom.api("query", query=expr)["result"] or None, timeout=30, interval=0.5
    )
    return result


def by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"].get("rank", ""): float(r["value"][1]) for r in result}


def classic_bucket_width(prom: Prometheus, name: str, value: float) -> float:
    """The width of the classic bucket that holds ``value``."""
    bounds = sorted(
        float(r["metric"]["le"]) for r in query(prom, f'{name}_bucket{{le!="+Inf"}}')
    )
    lower = max((b for b in bounds if b < value), default=0.0)
    upper = min(b for b in bounds if b >= value)
    return upper - lower


def test_each_rank_is_one_native_series_where_text_scrapes_store_several(
    servers: tuple[Prometheus, Prometheus],
) -> None:
    native, classic = servers
    match = '{__name__=~"stepscope_step_duration_seconds.*"}'
    query(native, "stepscope_step_duration_seconds")
    stored = native.api("series", **{"match[]": match})
    assert sorted((s["__name__"], s["rank"]) for s in stored) == [
        ("stepscope_step_duration_seconds", "0"),
        ("stepscope_step_duration_seconds", "1"),
    ]
    query(classic, "stepscope_step_duration_seconds_count")
    text_series = classic.api("series", **{"match[]": match})
    assert len(text_series) > len(stored), "the text scrape stores _sum, _count (and buckets)"
    # count and sum travel inside the native series
    counts = by_rank(query(native, "histogram_count(stepscope_step_duration_seconds)"))
    sums = by_rank(query(native, "histogram_sum(stepscope_step_duration_seconds)"))
    assert counts == {"0": STEPS, "1": STEPS}
    assert sums == pytest.approx({str(r): sum(d) for r, d in DURATIONS.items()})


@pytest.mark.parametrize("q", [0.5, 0.9])
def test_native_quantiles_read_the_true_step_time_and_agree_with_the_classic_ones(
    servers: tuple[Prometheus, Prometheus], q: float
) -> None:
    native, classic = servers
    per_rank = by_rank(query(native, f"histogram_quantile({q}, stepscope_step_duration_seconds)"))
    for rank, durs in DURATIONS.items():
        truth = true_quantile(durs, q)
        assert abs(per_rank[str(rank)] - truth) <= SCHEMA_3_WIDTH * truth, (rank, truth)
    # the job's distribution: the ranks' native histograms summed, against the classic
    # buckets of the same steps (the job's histogram, or the ranks' summed by le)
    names = {s["__name__"] for s in classic.api("series", **{"match[]": '{__name__=~".*_bucket"}'})}
    if "stepscope_job_step_duration_seconds_bucket" in names:
        name = "stepscope_job_step_duration_seconds"
    else:
        name = "stepscope_step_duration_seconds"
    (job_native,) = query(
        native, f"histogram_quantile({q}, sum by (training_job) (stepscope_step_duration_seconds))"
    )
    (job_classic,) = query(
        classic, f"histogram_quantile({q}, sum by (training_job, le) ({name}_bucket))"
    )
    truth = true_quantile([d for durs in DURATIONS.values() for d in durs], q)
    got, classic_value = float(job_native["value"][1]), float(job_classic["value"][1])
    assert abs(got - truth) <= SCHEMA_3_WIDTH * truth
    width = classic_bucket_width(classic, name, truth)
    assert abs(got - classic_value) <= width, (got, classic_value, width)
    # and the native estimate is the closer one: ~9% buckets against 25-50% ones
    assert abs(got - truth) <= abs(classic_value - truth) + 0.01


def test_every_other_series_is_stored_alike_under_the_same_names(
    servers: tuple[Prometheus, Prometheus],
) -> None:
    native, classic = servers
    for prom in (native, classic):
        query(prom, "DCGM_FI_DEV_POWER_VIOLATION")

    def names(prom: Prometheus) -> set[str]:
        stored = prom.api("label/__name__/values")
        return {n for n in stored if not n.startswith(("scrape_", "stepscope_step_duration"))}

    assert names(native) == names(classic)
    assert "DCGM_FI_DEV_POWER_VIOLATION" in names(native)
    assert "DCGM_FI_DEV_POWER_VIOLATION_total" not in names(native)
    for expr in ('stepscope_gpu_up{gpu="0"}', f'stepscope_steps_total{{training_job="{JOB}"}}'):
        got = {json.dumps(r["metric"], sort_keys=True) for r in query(native, expr)}
        assert got == {json.dumps(r["metric"], sort_keys=True) for r in query(classic, expr)}


def test_a_rule_written_for_both_forms_reads_the_same_on_both_servers(
    servers: tuple[Prometheus, Prometheus],
) -> None:
    """`x_count or histogram_count(x)` (and `_sum`) read a rank's steps from whichever form
    the server stored: the way the shipped rules are written for Prometheus with or
    without native histograms (test_native_histogram_rules.py runs them; docs/metrics.md)."""
    native, classic = servers
    for part in ("count", "sum"):
        name = "stepscope_step_duration_seconds"
        expr = f"{name}_{part} or histogram_{part}({name})"
        got = by_rank(query(native, expr))
        assert got == pytest.approx(by_rank(query(classic, expr)))
        assert got == pytest.approx(
            {str(r): (STEPS if part == "count" else sum(d)) for r, d in DURATIONS.items()}
        )
