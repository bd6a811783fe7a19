"""Training ingest end to end: a real exporter, real sockets, real HTTP scrapes.

Datagrams are sent with a plain socket, as any SDK would; the SDK's own end-to-end
test (torch DDP) lives with the SDK.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, Exporter, start_exporter, wait_for
from tests.support.exporter import refused_start
from tests.support.ingest import H100_BF16, Samples, scrape, step, value


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # short path: a Unix socket path must fit in 108 bytes, pytest's tmp_path may not
    path = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def serve(started: list[Exporter], *args: str) -> Exporter:
    exp = start_exporter(["--simulate", "2", "--interval", "0.2", *args])
    started.append(exp)
    return exp


class Sender:
    """A training process's side: one datagram socket, fire and forget."""

    def __init__(self, url: str) -> None:
        if url.startswith("unix://"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.addr: Any = url.removeprefix("unix://")
        else:
            host, port = url.removeprefix("udp://").rsplit(":", 1)
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.addr = (host, int(port))

    def send(self, data: bytes | dict[str, Any]) -> None:
        payload = data if isinstance(data, bytes) else json.dumps(data).encode()
        self.sock.sendto(payload, self.addr)

    def close(self) -> None:
        self.sock.close()


def gpu_uuids(fams: Samples) -> dict[str, str]:
    return {lbl["gpu"]: lbl["UUID"] for lbl, _ in fams["stepscope_gpu_up"]}


def test_ranks_report_steps_phases_tokens_flops_and_mfu_joined_with_their_gpus(
    sock_dir: Path, exporters: list[Exporter]
) -> None:
    url = f"unix://{sock_dir}/ingest.sock"
    exp = serve(exporters, "--ingest", url, "--hostname", "node-3")
    uuids = gpu_uuids(scrape(exp))
    sender = Sender(url)
    t0 = time.time() - 60
    for rank in (0, 1):
        for i in range(8):  # 2 warm-up steps (slow: compilation), then 6 measured ones
            warm = i < 2
            sender.send(step("llama", rank, i, t0 + i + 1, uuids[str(rank)], warmup=warm,
                             **({"dur": 1.0, "data": 0.0, "compute": 1.0, "comm": 0.0,
                                 "flops": 50 * H100_BF16} if warm else {})))
    sender.close()

    def done() -> Samples | None:
        fams = scrape(exp)
        ok = all(value(fams, "stepscope_steps_total", rank=r) == 8 for r in ("0", "1"))
        return fams if ok else None

    fams = wait_for(done)
    for rank in ("0", "1"):
        lbl = {"training_job": "llama", "rank": rank}
        assert value(fams, "stepscope_warmup_steps_total", **lbl) == 2
        assert value(fams, "stepscope_step_duration_seconds_count", **lbl) == 6
        assert value(fams, "stepscope_step_duration_seconds_sum", **lbl) == 6.0
        phases = {p: value(fams, "stepscope_step_phase_seconds_total", phase=p, **lbl)
                  for p in ("data_wait", "compute", "comm", "other")}
        assert phases == {"data_wait": 1.5, "compute": 3.0, "comm": 0.75, "other": 0.75}
        assert value(fams, "stepscope_tokens_total", **lbl) == 6 * 4096
        flops = value(fams, "stepscope_model_flops_total", **lbl)
        assert flops == pytest.approx(6 * 0.4 * H100_BF16)
        # warm-up excluded: 6 steps of 0.4 x peak over 6 s on the simulated H100
        assert value(fams, "stepscope_mfu_ratio", **lbl) == pytest.approx(0.4)
        assert value(fams, "stepscope_last_step_timestamp_seconds", **lbl) == pytest.approx(
            t0 + 8)
        assert value(fams, "stepscope_sdk_dropped_datagrams_total", **lbl) == 0
    # the distribution: one histogram for the job's ranks on this node (12 measured steps)
    job = {"training_job": "llama", "Hostname": "node-3"}
    assert value(fams, "stepscope_job_step_duration_seconds_bucket", le="0.75", **job) == 0
    assert value(fams, "stepscope_job_step_duration_seconds_bucket", le="1.0", **job) == 12
    assert value(fams, "stepscope_job_step_duration_seconds_count", **job) == 12
    assert "stepscope_step_duration_seconds_bucket" not in fams
    labels = next(lbl for lbl, _ in fams["stepscope_steps_total"] if lbl["rank"] == "1")
    assert labels == {"training_job": "llama", "rank": "1", "local_rank": "1", "gpu": "1",
                      "UUID": uuids["1"], "modelName": "NVIDIA H100 80GB HBM3",
                      "Hostname": "node-3"}
    info = {lbl["rank"]: lbl for lbl, _ in fams["stepscope_training_rank_info"]}
    assert info["0"]["mfu_status"] == "ok" and info["0"]["pid"] == str(os.getpid())
    assert info["0"]["precision"] == "bf16" and info["0"]["world_size"] == "2"
    assert value(fams, "stepscope_gpu_peak_flops", gpu="0", precision="bf16") == H100_BF16
    assert value(fams, "stepscope_ingest_up") == 1
    assert value(fams, "stepscope_ingest_datagrams_total") == 16
    assert value(fams, "stepscope_training_ranks") == 2
    # the socket is not world-writable: the exporter's group reaches it (docs/ingest.md)
    st = os.stat(sock_dir / "ingest.sock")
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getegid()
    # every family a training node serves is documented
    doc = (REPO / "docs" / "metrics.md").read_text()
    missing = [n for n in sorted(fams) if f"`{n}`" not in doc and not n.startswith("process_")
               and not any(n == f"{h}{s}" and f"`{h}`" in doc
                           for h in ("stepscope_step_duration_seconds",
                                     "stepscope_job_step_duration_seconds")
                           for s in ("_bucket", "_sum", "_count"))]
    assert missing == []
    assert exp.stop() == 0
    assert not (sock_dir / "ingest.sock").exists()  # removed on a clean stop


def test_bad_datagrams_are_counted_by_reason_and_the_exporter_keeps_serving(
    sock_dir: Path, exporters: list[Exporter]
) -> None:
    url = f"unix://{sock_dir}/ingest.sock"
    exp = serve(exporters, "--ingest", url, "--max-jobs", "1", "--max-ranks-per-job", "2")
    sender = Sender(url)
    t = time.time()
    bad: list[tuple[bytes | dict[str, Any], str]] = [
        (b"x" * 5000, "oversize"),
        (b"\xff\xfe{}", "not_utf8"),
        (b"{nope", "not_json"),
        (b"[]", "not_object"),
        ({**step("a", 0, 0, t, None), "v": 2}, "version"),
        ({**step("a", 0, 0, t, None), "type": "hello"}, "type"),
        ({k: v for k, v in step("a", 0, 0, t, None).items() if k != "dur"}, "missing_field"),
        ({**step("a", 0, 0, t, None), "rank": "0"}, "wrong_type"),
        (step("a", 0, 0, t, None, dur=-1.0), "out_of_range"),
        (step('a"} 1\nevil{x="', 0, 0, t, None), "bad_label"),
    ]
    for data, _ in bad:
        sender.send(data)
    for rank in range(3):
        sender.send(step("first", rank, 0, t, None, world_size=4))
    sender.send(step("second", 0, 0, t, None))
    sender.close()
    expected = {reason: 1.0 for _, reason in bad} | {"cap_ranks": 1.0, "cap_jobs": 1.0}

    def rejected() -> dict[str, float]:
        return {lbl["reason"]: v for lbl, v in scrape(exp)["stepscope_ingest_rejected_total"]
                if v}

    wait_for(lambda: rejected() == expected)
    fams = scrape(exp)
    assert value(fams, "stepscope_ingest_datagrams_total") == 2
    assert value(fams, "stepscope_training_ranks") == 2
    assert "evil" not in exp.metrics()
    assert value(fams, "DCGM_FI_DEV_GPU_UTIL", gpu="0") is not None


def test_a_rank_that_stops_reporting_expires_and_its_series_disappear(
    sock_dir: Path, exporters: list[Exporter]
) -> None:
    url = f"unix://{sock_dir}/ingest.sock"
    exp = serve(exporters, "--ingest", url, "--rank-expiry", "1")
    sender = Sender(url)
    sender.send(step("short", 0, 0, time.time(), None))
    sender.close()
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="short") == 1)

    def expired() -> Samples | None:
        fams = scrape(exp)
        return fams if value(fams, "stepscope_training_ranks") == 0 else None

    fams = wait_for(expired)
    assert not any(name.startswith(("stepscope_step", "stepscope_mfu", "stepscope_tokens"))
                   for name in fams)
    assert value(fams, "stepscope_ingest_datagrams_total") == 1  # the ingest counters stay


def test_an_ingest_configured_where_it_cannot_be_bound_stops_the_start() -> None:
    """Issue 36: an explicit --ingest under /proc warned and served on, while every other
    impossible setting exits 2. A configured feature that cannot start is an error."""
    code, stderr = refused_start(["--simulate", "1",
                                  "--ingest", "unix:///proc/stepscope/ingest.sock"])
    assert code == 2
    assert stderr.startswith("stepscope: error: ingest: cannot listen on "
                             "unix:///proc/stepscope/ingest.sock: cannot create /proc/stepscope")
    assert stderr.count("\n") == 1, stderr


def test_udp_on_loopback_is_an_alternative(exporters: list[Exporter]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"udp://127.0.0.1:{port}"
    exp = serve(exporters, "--ingest", url)
    sender = Sender(url)
    sender.send(step("udp-job", 0, 0, time.time(), None))
    sender.close()
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="udp-job") == 1)


def test_a_stale_socket_is_replaced_but_a_live_one_is_not_stolen(
    sock_dir: Path, exporters: list[Exporter]
) -> None:
    url = f"unix://{sock_dir}/ingest.sock"
    first = serve(exporters, "--ingest", url)
    code, stderr = refused_start(["--simulate", "1", "--ingest", url])
    assert code == 2 and "in use by another process" in stderr, stderr
    assert value(scrape(first), "stepscope_ingest_up") == 1
    first.proc.send_signal(signal.SIGKILL)  # dies without removing its socket file
    first.proc.wait()
    assert (sock_dir / "ingest.sock").exists()
    third = serve(exporters, "--ingest", url)
    assert value(scrape(third), "stepscope_ingest_up") == 1
    sender = Sender(url)
    sender.send(step("after-restart", 0, 0, time.time(), None))
    sender.close()
    wait_for(
        lambda: value(scrape(third), "stepscope_steps_total", training_job="after-restart") == 1
    )


def test_sighup_applies_new_training_limits(sock_dir: Path, exporters: list[Exporter]) -> None:
    cfg = sock_dir / "stepscope.yaml"
    url = f"unix://{sock_dir}/ingest.sock"
    cfg.write_text(f"simulate: 1\ninterval: 0.2\ningest: {url}\nmax_ranks_per_job: 1\n")
    exp = start_exporter(["--config", str(cfg)])
    exporters.append(exp)
    sender = Sender(url)
    uuid = scrape(exp)["stepscope_gpu_up"][0][0]["UUID"]
    sender.send(step("j", 0, 0, time.time(), uuid))
    sender.send(step("j", 1, 0, time.time(), None))
    wait_for(lambda: value(scrape(exp), "stepscope_ingest_rejected_total", reason="cap_ranks")
             == 1)
    cfg.write_text(f"simulate: 1\ninterval: 0.2\ningest: {url}\nmax_ranks_per_job: 4\n"
                   "peak_flops: {'NVIDIA H100 80GB HBM3': {bf16: 1.0e+15}}\n")
    exp.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: value(scrape(exp), "stepscope_gpu_peak_flops", precision="bf16") == 1e15)
    sender.send(step("j", 1, 0, time.time(), None))
    sender.close()
    wait_for(lambda: value(scrape(exp), "stepscope_training_ranks") == 2)
