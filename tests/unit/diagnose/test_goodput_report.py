"""A training job's goodput report: its queries, the breakdown made from their results,
the text, and the period's syntax."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.diagnose.goodput_report import (
    analyse_goodput,
    goodput_queries,
    render_goodput,
    since_seconds,
)


def _row(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1.7e9, str(value)]}


def test_the_breakdown_is_in_gpu_hours_most_lost_first_with_shares_of_the_time_held() -> None:
    # GPU-seconds over the period: 336 GPU-hours productive, 144 lost
    report = analyse_goodput("llama", "24h", {
        "goodput": [_row(336 * 3600)],
        "badput": [_row(12 * 3600, badput_type="unproductive_checkpoint_save_time"),
                   _row(72 * 3600, badput_type="data_loading_sync"),
                   _row(0, badput_type="program_startup"),  # nothing in the period
                   _row(36 * 3600, badput_type="exposed_communication"),
                   _row(24 * 3600, badput_type="idle")],
        "nodes": [_row(2, cluster="west"), _row(1, cluster="east")],
    })  # fmt: skip
    assert report["gpu_hours"] == {"held": 480, "goodput": 336, "badput": 144}
    assert report["goodput_ratio"] == pytest.approx(0.7)
    assert [(c["badput_type"], c["gpu_hours"], round(c["share"], 4)) for c in report["badput"]] == [
        ("data_loading_sync", 72, 0.15), ("exposed_communication", 36, 0.075),
        ("idle", 24, 0.05), ("unproductive_checkpoint_save_time", 12, 0.025)]  # fmt: skip
    assert report["clusters"] == [{"cluster": "east", "nodes": 1}, {"cluster": "west", "nodes": 2}]
    assert report["nodes"] == 3
    text = render_goodput(report, "http://prom:9090")
    lines = text.splitlines()
    assert lines[0] == ("training job llama, last 24h via http://prom:9090: 3 node(s) in "
                        "clusters east (1), west (2)")  # fmt: skip
    table = [line.split() for line in lines[3:10]]
    assert table == [
        ["held", "480.00", "100.0%"], ["goodput", "336.00", "70.0%"],
        ["badput", "144.00", "30.0%"], ["data_loading_sync", "72.00", "15.0%"],
        ["exposed_communication", "36.00", "7.5%"], ["idle", "24.00", "5.0%"],
        ["unproductive_checkpoint_save_time", "12.00", "2.5%"]]  # fmt: skip
    assert lines[-1] == "goodput ratio 70.0%"


def test_a_job_with_badput_only_reads_a_ratio_of_zero_and_says_why() -> None:
    report = analyse_goodput("gpt", "1h", {
        "goodput": [], "badput": [_row(8 * 3600, badput_type="program_startup")],
        "nodes": [_row(1)]})  # fmt: skip
    assert report["goodput_ratio"] == 0 and report["gpu_hours"]["goodput"] == 0
    text = render_goodput(report, "http://prom:9090")
    assert "1 node(s) in cluster (no cluster label) (1)" in text
    assert "program_startup" in text and text.endswith(
        "goodput ratio 0.0%: no productive step counted in the last 1h")


def test_a_job_whose_counters_did_not_grow_has_no_ratio() -> None:
    report = analyse_goodput("old", "24h", {"goodput": [_row(0)], "badput": [],
                                            "nodes": [_row(1, cluster="c")]})  # fmt: skip
    assert report["goodput_ratio"] is None and report["badput"] == []


def test_the_queries_select_the_job_by_its_exact_name_over_the_period() -> None:
    q = goodput_queries('we"ird\\job Hostname', "7d", "hostname")
    assert q["goodput"] == ('sum(increase(stepscope_job_goodput_gpu_seconds_total'
                            '{training_job="we\\"ird\\\\job Hostname"}[7d]))')  # fmt: skip
    assert q["badput"].startswith("sum by (badput_type) (increase(stepscope_job_badput_")
    # the nodes by the host label the exporters serve; the job's name is left as it is
    assert "group by (cluster, hostname)" in q["nodes"] and "job Hostname" in q["nodes"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("24h", 86400), ("7d", 604800), ("1h30m", 5400), ("90s", 90), ("1w", 604800),
    ("1y", 31536000), ("500ms", 0.5)])  # fmt: skip
def test_the_period_is_a_prometheus_duration(text: str, seconds: float) -> None:
    assert since_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "24", "24hours", "1.5h", "30m1h", "-1h", "1h 30m", "1H"])
def test_anything_else_is_refused_naming_the_flag_and_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^--since: expected a Prometheus duration such as "
                                         rf"24h, 7d or 1h30m, got '{text}'$"):  # fmt: skip
        since_seconds(text)


def test_a_zero_period_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^--since: the period must be longer than zero"):
        since_seconds("0h")
