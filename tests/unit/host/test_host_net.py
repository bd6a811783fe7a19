"""Host and RDMA sources: real /proc via psutil, and a fixture tree of sysfs files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepscope.core.exposition import render
from stepscope.host.model import Pressure, parse_pressure
from stepscope.host.source import HostSource, ProcessParents, process_started
from stepscope.net.metrics import rdma_families
from stepscope.net.rdma import read_rdma_ports
from tests.support import REPO, parse_samples

SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "class" / "infiniband"


def test_pressure_lines_parse_to_shares_and_a_kernel_without_psi_reads_none() -> None:
    text = (
        "some avg10=12.50 avg60=0.78 avg300=0.60 total=21685014\n"
        "full avg10=3.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert parse_pressure(text) == Pressure(0.125)
    assert parse_pressure("some avg10=1.00 avg60=0 avg300=0 total=1\n") == Pressure(0.01)
    assert parse_pressure("") is None


def test_efa_and_infiniband_ports_read_from_sysfs_with_ib_words_as_bytes() -> None:
    ports = {(p.device, p.port): p for p in read_rdma_ports(SYSFS)}
    assert sorted(ports) == [("broken_0", "1"), ("mlx5_0", "1"), ("rdmap16s27", "1")]
    efa = ports[("rdmap16s27", "1")]
    assert efa.counters["tx_bytes"] == 987654321012
    assert efa.counters["rx_bytes"] == 876543210987
    assert efa.counters["rdma_read_bytes"] == 555555555
    assert efa.counters["rdma_write_bytes"] == 666666666
    assert efa.counters["retrans_packets"] == 12
    assert efa.counters["impaired_remote_conn_events"] == 5
    assert efa.counters["unresponsive_remote_events"] == 2
    assert "lifespan" not in efa.counters and efa.lifespan_seconds == 0.012
    ib = ports[("mlx5_0", "1")]
    assert ib.counters["tx_bytes"] == 4 * 250000000  # port_xmit_data counts 4-byte words
    assert ib.counters["rx_bytes"] == 4 * 125000000
    assert ib.counters["rx_packets"] == 900000 and ib.counters["rx_drops"] == 7
    assert "rdma_read_bytes" not in ib.counters  # absent, never zero
    broken = ports[("broken_0", "1")]
    assert broken.counters == {"rx_bytes": 42}  # an unreadable value leaves it absent
    assert read_rdma_ports(SYSFS / "nonexistent") == ()


def test_rdma_counters_are_served_with_device_and_port_labels_and_lifespan_as_a_gauge() -> None:
    text = render(rdma_families(read_rdma_ports(SYSFS))).decode()
    samples = parse_samples(text)
    tx = {lbl["device"]: v for lbl, v in samples["stepscope_rdma_transmitted_bytes_total"]}
    assert tx == {"rdmap16s27": 987654321012, "mlx5_0": 1e9}
    assert "# TYPE stepscope_rdma_transmitted_bytes_total counter" in text
    assert "# TYPE stepscope_rdma_counter_lifespan_seconds gauge" in text
    life = {lbl["device"]: v for lbl, v in samples["stepscope_rdma_counter_lifespan_seconds"]}
    assert life == {"rdmap16s27": 0.012, "mlx5_0": 0.01}
    assert all(lbl["port"] == "1" for lbl, _ in samples["stepscope_rdma_received_bytes_total"])
    assert not any("lifespan" in name and name.endswith("_total") for name in samples)
    assert render(rdma_families(())) == b""


def test_a_rank_process_reads_its_dataloader_workers_and_their_cpu() -> None:
    """The test process plays the rank: one busy child (a worker) and one idle child."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        source = HostSource()
        first = source.read_pids([os.getpid(), 999_999_999])
        assert 999_999_999 not in first.processes  # a pid that is not there is absent
        deadline = time.monotonic() + 15
        reading = first
        while time.monotonic() < deadline:
            # half a second between two readings: CPU time moves in 10 ms ticks, so a
            # reading a few ms after the last one can read 1 tick as a whole core
            time.sleep(0.5)
            reading = source.read_pids([os.getpid()])
            proc = reading.processes[os.getpid()]
            if proc.workers == 2 and proc.workers_cpu_cores > 0.5:
                break
        proc = reading.processes[os.getpid()]
        assert proc.workers == 2
        assert 0.5 < proc.workers_cpu_cores < 1.3  # one spinning worker, one sleeping
        # each reading says how long it spans: the weight of its rates in a window's mean
        assert 0.5 <= reading.seconds < 5.0 and proc.seconds == reading.seconds
        assert reading.cpu_count == len(reading.cpu_busy) == (os.cpu_count() or 0)
        assert 0.0 < reading.busy <= 1.0
        if Path("/proc/pressure/cpu").exists():
            assert reading.cpu_pressure is not None
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()


def test_a_process_start_is_read_to_a_clock_tick() -> None:
    """When a rank's process started (goodput holds its GPU from then): within a tick or
    two of the moment it was launched, not psutil's create_time (boot time's second)."""
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    after = time.time()
    try:
        started = process_started(child.pid)
        assert started is not None
        assert before - 0.03 <= started <= after + 0.03
        reading = HostSource().read_pids([child.pid]).processes[child.pid]
        assert reading.started == pytest.approx(started, abs=0.03)
    finally:
        child.kill()
        child.wait()
    assert process_started(child.pid) is None  # gone: unknown, never a guess
    assert process_started(os.getpid(), Path("/nonexistent")) is None


def test_children_are_found_in_one_pass_over_proc_whatever_the_command_is_called(
    tmp_path: Path,
) -> None:
    """/proc/<pid>/stat's comm may hold spaces and parentheses; entries that are not
    processes, or vanish mid-read, are skipped."""
    proc = tmp_path / "proc"
    stats = {
        "10": "10 (python) S 1 10 10 0",
        "11": "11 (pt_data_worker) R 10 10 10 0",
        "12": "12 (a) b (c) S 10 10 10 0",  # a command named "a) b (c"
        "13": "13 (other) S 2 13 13 0",
        "14": "14 (garbled",  # no ppid: skipped
    }
    for pid, text in stats.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "stat").write_text(text)
    (proc / "15").mkdir()  # ended between the listing and the read: no stat file
    (proc / "self").mkdir()
    (proc / "٣").mkdir()  # a non-ASCII digit is no pid
    assert {k: sorted(v) for k, v in ProcessParents(proc).children().items()} == {
        1: [10], 10: [11, 12], 2: [13]}
    only = ProcessParents(proc).children(frozenset({10}))
    assert list(only) == [10] and sorted(only[10]) == [11, 12]
    assert ProcessParents(tmp_path / "absent").children() == {}
    # the real /proc: this process's children, as psutil finds them
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = ProcessParents().children(frozenset({os.getpid()}))
        assert child.pid in found[os.getpid()]
    finally:
        child.kill()
        child.wait()


def test_process_parents_read_only_new_processes_and_follow_reused_pids_and_reparenting(
    tmp_path: Path,
) -> None:
    """Each pass re-reads only processes it has not seen (by pid and /proc inode), and
    the children of the parents asked for; a pid reused by a new process, or a child
    re-parented when its parent ended, is seen as it is now."""
    proc = tmp_path / "proc"

    def process(pid: int, ppid: int) -> None:
        """A new process: a new directory (made aside first, so it gets an inode of its
        own as procfs gives, not the one a file system may reuse), then in place."""
        new = proc / f"new-{pid}"
        new.mkdir(parents=True)
        (new / "stat").write_text(f"{pid} (p{pid}) S {ppid} {pid} {pid} 0")
        shutil.rmtree(proc / str(pid), ignore_errors=True)
        new.rename(proc / str(pid))

    process(10, 1)  # a rank
    process(11, 10)  # its loader worker
    process(20, 1)  # another rank
    process(30, 1)  # unrelated
    parents = ProcessParents(proc)
    assert parents.children(frozenset({10, 20})) == {10: [11]}
    # an unrelated process's stat changes in place: it is not read again (remembered)
    (proc / "30" / "stat").write_text("30 (p30) S 20 30 30 0")
    assert parents.children(frozenset({10, 20})) == {10: [11]}
    # pid 30 ends and a new process gets the pid (a new /proc directory): read afresh
    process(30, 20)
    assert sorted(parents.children(frozenset({10, 20})).items()) == [(10, [11]), (20, [30])]
    # the rank 10 ends and its worker is re-parented (in place: same process)
    shutil.rmtree(proc / "10")
    (proc / "11" / "stat").write_text("11 (p11) S 1 11 11 0")
    assert parents.children(frozenset({10, 20})) == {20: [30]}
