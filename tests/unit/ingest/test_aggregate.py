"""Aggregation per (job, rank): counters, histogram, warm-up, MFU window, caps, expiry,
who owns a job or rank, fixed identity labels and per-uid job shares."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stepscope.ingest.aggregate import STEP_BUCKETS, Aggregator, Sender, TrainingSettings
from stepscope.shared.datagram import Limits, StepRecord
from tests.support.clocks import ManualClock


def record(**changes: Any) -> StepRecord:
    fields: dict[str, Any] = dict(
        job="job",
        rank=0,
        local_rank=0,
        step=0,
        t=1000.0,
        dur=1.0,
        data_wait=0.2,
        compute=0.5,
        comm=0.2,
        other=0.1,
        warmup=False,
        tokens=100,
        flops=1e12,
        precision="bf16",
        world_size=2,
        pid=7,
        uuid="GPU-a",
        dropped=0,
    )
    fields.update(changes)
    return StepRecord(**fields)


def make(**settings: Any) -> tuple[Aggregator, ManualClock]:
    """An aggregator on a manual clock; its wall clock reads 1010.0 at first, so steps
    ending at t = 1000-1010 were received a few seconds after they ended."""
    clock = ManualClock(5000.0)
    agg = Aggregator(TrainingSettings(**settings), clock=clock,
                     wall_clock=lambda: clock.t - 3990.0)  # fmt: skip
    return agg, clock


def test_counters_sum_phases_tokens_and_flops_of_measured_steps() -> None:
    agg, _ = make()
    for i in range(3):
        agg.add(record(step=i, t=1000.0 + i))
    agg.add(record(step=3, t=1003.0, dur=0.5, data_wait=0.5, compute=0.0, comm=0.0, other=0.0))
    (r,) = agg.view().ranks
    assert (r.steps, r.warmup_steps, r.measured_steps) == (4, 0, 4)
    assert r.step_seconds_sum == pytest.approx(3.5)
    assert r.phase_seconds == pytest.approx((1.1, 1.5, 0.6, 0.3))
    assert sum(r.phase_seconds) == pytest.approx(r.step_seconds_sum)
    assert r.tokens == 400 and r.flops == pytest.approx(4e12)
    assert r.last_step_timestamp == 1003.0


def test_warmup_steps_count_as_steps_but_not_in_time_phases_tokens_flops_or_mfu() -> None:
    agg, _ = make()
    agg.add(
        record(
            step=0, warmup=True, dur=30.0, data_wait=0.0, compute=30.0, comm=0.0, other=0.0, t=990.0
        )
    )
    (r,) = agg.view().ranks
    assert (r.steps, r.warmup_steps) == (1, 1)
    assert r.step_seconds_sum == 0 and sum(r.bucket_counts) == 0
    assert r.tokens == 0 and r.flops == 0 and r.phase_seconds == (0, 0, 0, 0)
    assert r.achieved_flops_per_second is None  # no measured step yet: no MFU
    assert r.last_step_timestamp == 990.0  # a warm-up step still shows the job is alive
    agg.add(record(step=1, t=1000.0))
    (r,) = agg.view().ranks
    assert (r.steps, r.warmup_steps, r.measured_steps) == (2, 1, 1)
    assert r.achieved_flops_per_second == pytest.approx(1e12)


def test_histogram_buckets_are_upper_inclusive_with_overflow_in_inf() -> None:
    agg, clock = make()
    for dur in (0.005, 0.01, 0.011, 1.0, 119.0, 500.0):
        clock.t += dur  # each received as it ends
        agg.add(
            record(t=clock.t - 3990.0, dur=dur, data_wait=0.0, compute=0.0, comm=0.0, other=dur)
        )
    (r,) = agg.view().ranks
    counts = dict(zip([*STEP_BUCKETS, float("inf")], r.bucket_counts, strict=True))
    assert counts[0.01] == 2  # 0.005 and exactly 0.01 (le is inclusive)
    assert counts[0.025] == 1 and counts[1.0] == 1 and counts[120.0] == 1
    assert counts[float("inf")] == 1
    assert sum(r.bucket_counts) == 6


def test_a_jobs_histogram_sums_its_ranks_and_keeps_counting_when_one_expires() -> None:
    agg, clock = make(rank_expiry=60.0)
    agg.add(record(job="llama", rank=0, dur=0.3, warmup=True))  # warm-up: not counted
    for rank, dur in ((0, 0.3), (1, 0.3), (1, 0.9), (0, 0.4)):
        agg.add(record(job="llama", rank=rank, dur=dur))
    agg.add(record(job="gpt", rank=0, dur=2.0))
    gpt, llama = agg.view().jobs
    assert (llama.job, gpt.job) == ("llama", "gpt")
    ranks = [r for r in agg.view().ranks if r.job == "llama"]
    assert llama.bucket_counts == tuple(map(sum, zip(*(r.bucket_counts for r in ranks),
                                                     strict=True)))  # fmt: skip
    assert llama.measured_steps == 4 and llama.step_seconds_sum == pytest.approx(1.9)
    # rank 1 falls silent and expires; rank 0 keeps stepping: the job's counts never drop
    # (a sum over live ranks would fall, and rate() would read that as a counter reset)
    clock.t += 61.0
    agg.add(record(job="llama", rank=0, dur=0.3))
    (llama,) = agg.view().jobs
    assert [r.rank for r in agg.view().ranks] == [0]
    assert llama.measured_steps == 5 and llama.step_seconds_sum == pytest.approx(2.2)
    # every rank gone: the job and its histogram go with them
    clock.t += 61.0
    assert agg.view().jobs == ()


def test_mfu_window_rate_is_flops_over_the_steps_span_and_zero_once_steps_leave() -> None:
    agg, clock = make(mfu_window=30.0)
    # 10 steps of 0.5 s back to back, each 5e11 FLOPs: 1e12 FLOP/s
    for i in range(10):
        agg.add(record(step=i, t=1000.0 + 0.5 * (i + 1), dur=0.5, flops=5e11))
        clock.t += 0.5
    (r,) = agg.view().ranks
    assert r.achieved_flops_per_second == pytest.approx(1e12)
    # a checkpoint pause of 5 s between steps lowers the rate: it counts in the span
    clock.t += 5.0
    agg.add(record(step=10, t=1010.5, dur=0.5, flops=5e11))
    (r,) = agg.view().ranks
    assert r.achieved_flops_per_second == pytest.approx(5.5e12 / 10.5)
    # the job stops: once its steps are older than the window, the rate is 0 (not stale)
    clock.t += 32.0
    (r,) = agg.view().ranks
    assert r.achieved_flops_per_second == 0.0
    assert r.flops == pytest.approx(5.5e12)  # totals stay


def test_window_keeps_only_recent_steps() -> None:
    agg, clock = make(mfu_window=10.0)
    agg.add(record(t=1000.0, dur=1.0, flops=100e12))  # a fast old step
    clock.t += 20.0
    for i in range(5):
        agg.add(record(t=1020.0 + i, dur=1.0, flops=1e12))
        clock.t += 1.0
    (r,) = agg.view().ranks
    assert r.achieved_flops_per_second == pytest.approx(1e12)


def test_caps_reject_new_jobs_and_ranks_but_keep_existing_ones() -> None:
    agg, _ = make(limits=Limits(max_jobs=2, max_ranks_per_job=3))
    for job in ("a", "b"):
        for rank in range(3):
            assert agg.add(record(job=job, rank=rank)) is None
    assert agg.add(record(job="c", rank=0)) == "cap_jobs"
    assert agg.add(record(job="a", rank=3)) == "cap_ranks"
    assert agg.add(record(job="a", rank=2)) is None  # known ranks keep reporting
    view = agg.view()
    assert len(view.ranks) == 6 and view.accepted == 7
    assert view.rejected["cap_jobs"] == 1 and view.rejected["cap_ranks"] == 1


def test_silent_ranks_expire_and_free_their_cap_slot() -> None:
    agg, clock = make(rank_expiry=60.0, limits=Limits(max_jobs=1))
    agg.add(record(job="old", rank=0))
    agg.add(record(job="old", rank=1))
    clock.t += 30.0
    agg.add(record(job="old", rank=1))
    assert agg.add(record(job="new")) == "cap_jobs"
    clock.t += 45.0  # rank 0 silent 75 s, rank 1 silent 45 s
    assert [(r.job, r.rank) for r in agg.view().ranks] == [("old", 1)]
    clock.t += 20.0
    assert agg.view().ranks == ()
    assert agg.add(record(job="new")) is None  # the job's slot is free again
    (r,) = agg.view().ranks
    assert r.job == "new" and r.steps == 1


def test_a_cap_hit_expires_stale_ranks_before_rejecting() -> None:
    agg, clock = make(rank_expiry=10.0, limits=Limits(max_ranks_per_job=1))
    agg.add(record(rank=0))
    clock.t += 11.0
    assert agg.add(record(rank=1)) is None  # rank 0 expired on the cap hit
    assert [r.rank for r in agg.view().ranks] == [1]


def test_identity_labels_are_fixed_by_the_first_datagram_and_changes_are_rejected() -> None:
    agg, _ = make()
    agg.add(record(local_rank=0, pid=1, dropped=3, precision="bf16"))
    changes: list[dict[str, Any]] = [
        {"local_rank": 1},
        {"pid": 2},
        {"world_size": 4},
        {"uuid": "GPU-b"},
        {"uuid": None},
        {"precision": "fp8"},
    ]
    for change in changes:
        assert agg.add(record(**{"pid": 1, **change})) == "identity_changed", change
    agg.add(record(pid=1, dropped=5))  # the SDK's dropped count is not identity: latest wins
    view = agg.view()
    (r,) = view.ranks
    assert (r.local_rank, r.pid, r.world_size, r.precision, r.uuid) == (0, 1, 2, "bf16", "GPU-a")
    assert r.sdk_dropped == 5 and r.steps == 2
    assert view.rejected["identity_changed"] == len(changes)


def test_label_churn_from_one_sender_keeps_one_series_set() -> None:
    """Issue 15: local_rank/pid/world_size rewritten by every datagram made 81k series."""
    agg, _ = make()
    root = Sender(0, 0, 100)
    for i in range(1000):
        agg.add(record(local_rank=i % 8, pid=1000 + i, world_size=2 + i % 5), root)
    view = agg.view()
    assert len(view.ranks) == 1 and view.accepted == 1
    assert view.rejected["identity_changed"] == 999


def test_a_job_belongs_to_the_uid_of_its_first_rank() -> None:
    agg, _ = make()
    root, nobody = Sender(0, 0, 100), Sender(65534, 65534, 200)
    assert agg.add(record(rank=0, t=1000.0, dur=1.0), root) is None
    # forged steps for the owner's rank, and a forged extra rank of its job
    assert (
        agg.add(
            record(rank=0, dur=80000.0, data_wait=80000.0, compute=0.0, comm=0.0, other=0.0, pid=7),
            nobody,
        )
        == "not_owner"
    )
    assert agg.add(record(rank=1), nobody) == "not_owner"
    view = agg.view()
    (r,) = view.ranks
    assert r.step_seconds_sum == 1.0 and r.phase_seconds.data_wait == pytest.approx(0.2)
    assert view.rejected["not_owner"] == 2


def test_a_rank_belongs_to_its_first_process_when_the_kernel_names_it() -> None:
    agg, _ = make()
    assert agg.add(record(rank=0), Sender(1000, 1000, 100)) is None
    # the same user, another process (its pid visible to the exporter): not this rank's
    assert agg.add(record(rank=0), Sender(1000, 1000, 101)) == "not_owner"
    # its own rank of the same job is fine
    assert agg.add(record(rank=1, local_rank=1), Sender(1000, 1000, 101)) is None
    # kernel pid 0 (another PID namespace): only the uid can be checked
    assert agg.add(record(job="pod", rank=0), Sender(1000, 1000, 0)) is None
    assert agg.add(record(job="pod", rank=0), Sender(1000, 1000, 0)) is None
    assert agg.add(record(job="pod", rank=0), Sender(2000, 2000, 0)) == "not_owner"


def test_udp_senders_are_one_principal_apart_from_unix_ones() -> None:
    agg, _ = make()
    assert agg.add(record(job="u")) is None  # sender None: UDP
    assert agg.add(record(job="u")) is None
    assert agg.add(record(job="u"), Sender(0, 0, 5)) == "not_owner"


def test_one_uid_cannot_squat_every_job_slot() -> None:
    """Issue 15: 8 datagrams from one user filled max_jobs and kept a real job out."""
    agg, clock = make(limits=Limits(max_jobs=8))
    nobody, alice, bob = Sender(65534, 65534, 9), Sender(1000, 1000, 10), Sender(1001, 1001, 11)
    for j in range(8):  # alone on the node, a uid may use every slot
        assert agg.add(record(job=f"squat-{j}"), nobody) is None
        clock.t += 1.0
    clock.t += 1.0
    # another uid arrives: the squatter's least recently active job gives its slot back
    assert agg.add(record(job="real"), alice) is None
    jobs = {r.job for r in agg.view().ranks}
    assert "real" in jobs and "squat-0" not in jobs and len(jobs) == 8
    # the squatter is now held to its share (half of max_jobs) ...
    assert agg.add(record(job="squat-0"), nobody) == "cap_uid"
    # ... and gives back slots until it is at its share
    for j in range(3):
        assert agg.add(record(job=f"alice-{j}"), alice) is None
    assert sum(r.job.startswith("squat") for r in agg.view().ranks) == 4
    # every uid at or under its share and the node full: a third uid waits
    assert agg.add(record(job="bob"), bob) == "cap_jobs"
    assert agg.add(record(job="alice-3"), alice) == "cap_uid"
    # the real job's ranks keep reporting
    assert agg.add(record(job="real"), alice) is None
    assert agg.view().rejected["cap_uid"] == 2


def test_a_job_slot_freed_by_expiry_goes_to_whoever_asks() -> None:
    agg, clock = make(limits=Limits(max_jobs=2), rank_expiry=10.0)
    a, b = Sender(1, 1, 1), Sender(2, 2, 2)
    assert agg.add(record(job="a0"), a) is None
    assert agg.add(record(job="b0"), b) is None
    assert agg.add(record(job="a1"), a) == "cap_uid"
    clock.t += 11.0
    assert agg.add(record(job="a1"), a) is None  # b0 expired: a is alone again


def test_settings_reload_applies_to_the_next_view() -> None:
    agg, clock = make(rank_expiry=300.0)
    agg.add(record())
    clock.t += 100.0
    assert len(agg.view().ranks) == 1
    agg.update(TrainingSettings(rank_expiry=50.0))
    assert agg.view().ranks == ()


def test_views_are_immutable_snapshots_while_ingest_continues() -> None:
    agg, _ = make()
    agg.add(record())
    before = agg.view()
    agg.add(record())
    assert before.ranks[0].steps == 1 and agg.view().ranks[0].steps == 2
    with pytest.raises(AttributeError):
        before.ranks[0].steps = 5  # type: ignore[misc]


def test_concurrent_ingest_and_views_lose_nothing() -> None:
    agg = Aggregator()
    n = 20_000
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            view = agg.view()
            assert all(r.steps >= r.warmup_steps for r in view.ranks)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rec = record()
        for _ in range(n):
            agg.add(rec)
    finally:
        done.set()
        sampler.join()
    assert agg.view().accepted == n and agg.view().ranks[0].steps == n


def test_a_job_that_reports_zero_flops_has_no_flops_rather_than_zero_mfu() -> None:
    agg, _ = make()
    agg.add(record(flops=0.0))  # the SDK sends 0 when the job gave no FLOPs count
    (r,) = agg.view().ranks
    assert not r.has_flops
    agg.add(record(flops=1e12))
    (r,) = agg.view().ranks
    assert r.has_flops


@pytest.mark.parametrize("seed", range(6))
def test_achieved_flops_kept_incrementally_equal_the_window_recounted(seed: int) -> None:
    """Achieved FLOP/s is kept as a running sum with a sliding minimum of step starts and
    maximum of step ends; over random traffic (bursts, silences longer than the window,
    steps whose start goes back before an earlier one's, warm-up steps) it equals the
    window recounted from every step received in it, at every view."""
    import random

    rng = random.Random(seed)
    window = 7.0
    clock = ManualClock(5000.0)
    t = 1000.0
    # the steps end as the exporter's wall clock says (this test is not about clocks)
    agg = Aggregator(TrainingSettings(mfu_window=window, rank_expiry=1e6), clock=clock,
                     wall_clock=lambda: t)  # fmt: skip
    agg.add(record(t=t, warmup=True))  # first seen 10 s before: no step is longer than that
    clock.t += 10.0
    received: list[tuple[float, float, float, float]] = []  # (second, flops, start, end)
    for _ in range(1500):
        clock.t += rng.choice([0.01, 0.2, 0.7, 1.0, 3.0]) if rng.random() < 0.97 else 12.0
        t += rng.uniform(0.0, 0.5)
        dur = rng.choice([0.05, 0.3, 1.5, 4.0])  # a long step starts before earlier ones
        flops = rng.choice([0.0, 1e9, 3.7e12, 1e15])
        warm = rng.random() < 0.05
        agg.add(record(t=t, dur=dur, flops=flops, warmup=warm, data_wait=0.0, compute=0.0,
                       comm=0.0, other=0.0))  # fmt: skip
        if not warm:
            received.append((float(int(clock.t)), flops, t - dur, t))
        if rng.random() < 0.3:
            clock.t += rng.choice([0.0, 0.5, 2.0])
            cutoff = clock.t - window - 1.0
            live = [r for r in received if r[0] >= cutoff]
            (rank,) = agg.view().ranks
            got = rank.achieved_flops_per_second
            if not live:
                assert got == 0.0
                continue
            span = max(r[3] for r in live) - min(r[2] for r in live)
            want = sum(r[1] for r in live) / span
            assert got == pytest.approx(want, rel=1e-9, abs=1e-6), (clock.t, len(live))


@pytest.mark.parametrize(
    ("sender", "proc"),
    [
        (Sender(1000, 1000, 7), 7),  # same PID namespace: the pid it reports
        (Sender(1000, 1000, 54321), 54321),  # another pod, exporter with hostPID
        (Sender(1000, 1000, 0), None),  # another pod, no hostPID: not visible here
        (None, 7),  # UDP: no credentials, the reported pid as before
    ],
)
def test_the_process_read_for_a_rank_is_the_one_the_kernel_names(
    sender: Sender | None, proc: int | None
) -> None:
    """The pid a rank reports is its own namespace's (the ``pid`` label, often 1 in a
    container); its CPU, workers, exit and start are read from the process the kernel
    names in the exporter's namespace, never from /proc/<reported> of another one."""
    agg, _ = make()
    assert agg.add(record(pid=7), sender) is None
    (r,) = agg.view().ranks
    assert r.pid == 7 and r.identity.pid == 7
    assert r.proc_pid == proc and r.identity.proc == proc
