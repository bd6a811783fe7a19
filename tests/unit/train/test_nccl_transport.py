"""NCCL's transport, live: a rank that opts in reports the network NCCL chose, the
exporter serves ``stepscope_nccl_transport_info{transport}`` per rank, the shipped
``StepscopeNcclSocketTransport`` alert fires on it and the diagnosis takes it as a direct
``tcp_suspected`` signal. NCCL cannot run on CPU: its debug file is the real format
(tests/fixtures/nccl/rank-*.nccl.log), written where the SDK told NCCL to write it."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from stepscope.ingest.aggregate import Aggregator
from stepscope.shared.datagram import (
    NCCL_TRANSPORTS,
    Limits,
    Rejection,
    StepEncoder,
    parse_datagram,
)
from stepscope.shared.nccl_log import parse_nccl_log, process_transport
from stepscope.train import _nccl
from tests.support import REPO
from tests.support.clocks import ManualClock

FIXTURES = REPO / "tests" / "fixtures" / "nccl"
SOCKET_LOG = FIXTURES / "rank-socket.nccl.log"
EFA_LOG = FIXTURES / "rank-efa.nccl.log"


# ------------------------------------------------------------------ the parser


def test_one_parser_reads_a_ranks_debug_file_for_the_sdk_and_nccl_check() -> None:
    lines = SOCKET_LOG.read_text().splitlines()
    assert process_transport(lines) == "socket"
    (proc,) = parse_nccl_log(lines)  # what `stepscope nccl-check` prints from
    assert (proc.host, proc.pid, proc.rank, proc.nnodes) == ("trn-node-7", 41822, 0, 2)
    assert proc.verdict == "slow"
    assert "network plugin (aws-ofi-nccl) not loaded" in proc.explain()
    assert process_transport(EFA_LOG.read_text().splitlines()) == "efa"


def test_a_log_that_has_not_named_its_network_yet_reports_nothing() -> None:
    head = SOCKET_LOG.read_text().splitlines()[:8]  # plugin and IB lines, no "Using network"
    assert process_transport(head) is None
    assert process_transport([]) is None


def test_a_shared_file_is_read_for_the_asking_process() -> None:
    lines = SOCKET_LOG.read_text().splitlines() + EFA_LOG.read_text().splitlines()
    assert process_transport(lines, pid=9120) == "efa"
    assert process_transport(lines, pid=41822) == "socket"


# ------------------------------------------------------------ the SDK's opt-in


def test_opt_in_from_the_argument_or_the_environment() -> None:
    assert _nccl.wanted(True, {}) and not _nccl.wanted(False, {_nccl.ENV: "1"})
    assert _nccl.wanted(None, {_nccl.ENV: "true"}) and _nccl.wanted(None, {_nccl.ENV: "1"})
    assert not _nccl.wanted(None, {}) and not _nccl.wanted(None, {_nccl.ENV: "0"})


def test_with_nccl_debug_unset_only_the_debug_output_is_pointed_at_a_private_file(
    tmp_path: Path,
) -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    path = _nccl.configure(env, make_dir=lambda: str(tmp_path))
    assert path == f"{tmp_path}/nccl.%h.%p.log"
    assert env == {
        "NCCL_SOCKET_IFNAME": "eth0",  # the user's NCCL settings untouched, none added
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": path,
    }
    assert _nccl.expand(path, 4242, "ip-10-0-0-1.ec2.internal") == (
        f"{tmp_path}/nccl.ip-10-0-0-1.4242.log"  # %h: up to the first dot, as NCCL does
    )


def test_the_default_directory_is_private_to_the_user() -> None:
    env: dict[str, str] = {}
    path = _nccl.configure(env)
    assert path is not None
    directory = os.path.dirname(path)
    try:
        st = os.stat(directory)
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    finally:
        os.rmdir(directory)


def test_a_users_own_nccl_debug_is_never_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/scratch/nccl.%h.%p"}
    env = dict(theirs)
    assert _nccl.configure(env) == "/scratch/nccl.%h.%p"  # their file is read
    assert env == theirs
    with caplog.at_level(logging.WARNING, "stepscope.train"):
        for mine in ({"NCCL_DEBUG": "INFO"}, {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/x"}):
            env = dict(mine)
            assert _nccl.configure(env) is None
            assert env == mine
    said = caplog.text
    assert "NCCL writes it to stdout" in said and "set NCCL_DEBUG_FILE" in said
    assert "NCCL_DEBUG=WARN logs no network choice" in said


def test_the_watcher_follows_the_file_as_nccl_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "nccl.log"
    clock = ManualClock()
    w = _nccl.TransportWatcher(str(path), 41822, interval=1.0, clock=clock)
    assert w.poll() is None  # NCCL has not started: no file yet
    text = SOCKET_LOG.read_text()
    cut = text.index("Using network Socket") + 8
    path.write_text(text[:cut])  # NCCL is mid-line
    clock.t = 1.0
    assert w.poll() is None
    with path.open("a") as f:
        f.write(text[cut:])
    clock.t = 1.5
    assert w.poll() is None  # looked at most once a second
    clock.t = 2.0
    assert w.poll() == "socket" and not w.done


def test_the_watcher_reads_a_bounded_amount_and_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    noise = "trn-node-7:41822:41868 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
    path.write_text(noise * 2000 + SOCKET_LOG.read_text())
    w = _nccl.TransportWatcher(str(path), 41822, max_bytes=64 * 1024, clock=ManualClock())
    assert w.poll() is None and w.done  # the network line is past the bound: not read
    assert w._offset == 64 * 1024
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: an open without O_NONBLOCK would hang here
    w = _nccl.TransportWatcher(str(fifo), 1, clock=ManualClock())
    assert w.poll() is None and w.done


# ------------------------------------------------------ the datagram and ingest


def datagram(transport: object = None, **extra: object) -> bytes:
    enc = StepEncoder("j", 0, 0, 2, "bf16", None, transport if isinstance(transport, str)
                      else None)  # fmt: skip
    raw = json.loads(enc.encode((1, False, 1.7e9, 0.5, 0.0, 0.5, 0.0, 8, 0.0, ()), 0))
    raw.update(extra)
    return json.dumps(raw).encode()


def test_the_transport_is_an_optional_field_of_a_closed_vocabulary() -> None:
    limits = Limits()
    rec = parse_datagram(datagram("socket"), limits)
    assert not isinstance(rec, Rejection) and rec.nccl_transport == "socket"
    old_sdk = parse_datagram(datagram(), limits)
    assert not isinstance(old_sdk, Rejection) and old_sdk.nccl_transport is None
    for bad, reason in (("tcp", "bad_label"), ('socket"}', "bad_label"), (1, "wrong_type"),
                        (None, "wrong_type")):  # fmt: skip
        rej = parse_datagram(datagram(nccl_transport=bad), limits)
        assert isinstance(rej, Rejection) and rej.reason == reason, bad
    assert set(NCCL_TRANSPORTS) == {"efa", "ib", "libfabric", "socket"}


def test_an_exporter_that_predates_the_field_accepts_the_datagram() -> None:
    # what an older exporter does with any key it does not know: ignore it
    rec = parse_datagram(datagram("efa", some_future_key=[1, 2]), Limits())
    assert not isinstance(rec, Rejection) and rec.dropped == 0


def test_a_rank_keeps_one_transport_series_its_latest() -> None:
    agg = Aggregator()
    limits = Limits()
    for transport in (None, "socket", None, "efa", "efa"):
        rec = parse_datagram(datagram(transport), limits)
        assert not isinstance(rec, Rejection)
        assert agg.add(rec._replace(step=rec.step)) is None  # not an identity label
    (rank,) = agg.view().ranks
    assert rank.nccl_transport == "efa"  # a datagram without it says nothing new


# ------------------------------------------------------- end to end, for real


# ------------------------------------------------------------- the diagnosis


def test_a_reported_transport_is_the_diagnosis_direct_tcp_signal() -> None:
    from stepscope.net.rdma import RdmaPort
    from tests.support.diagnosis import PID, Node, by_rank

    def verdict(transport: str | None, rdma_bytes: float) -> tuple[str, tuple[str, ...]]:
        node = Node({"gpus": 1})
        node.fake_rdma.ports = (
            RdmaPort("rdmap0", "1", {"tx_bytes": rdma_bytes, "rx_bytes": rdma_bytes}),
        )

        def step() -> None:
            n = node.steps[0] = node.steps.get(0, -1) + 1
            rec = parse_datagram(datagram(transport), Limits())
            assert not isinstance(rec, Rejection)
            node.agg.add(rec._replace(
                world_size=16, step=n, t=1.7e9 + node.clock.t, dur=1.0, compute=0.5,
                comm=0.5, other=0.0, pid=PID, uuid=node.uuids[0],
            ))  # fmt: skip
            node.fake_rdma.ports = (
                RdmaPort("rdmap0", "1", {"tx_bytes": rdma_bytes * node.clock.t,
                                         "rx_bytes": rdma_bytes * node.clock.t}),
            )  # fmt: skip

        v = by_rank(node.run(20, step))[0]
        return v.kind, v.modifiers

    # NCCL says sockets although RDMA bytes flow (another job's traffic): TCP, directly
    assert verdict("socket", 5e9) == ("communication", ("tcp_suspected",))
    # NCCL says EFA: flat counters (a missing or idle counter) no longer mean TCP
    assert verdict("efa", 0.0) == ("communication", ())
    # nothing reported: the inference from flat RDMA counters, as before
    assert verdict(None, 0.0) == ("communication", ("tcp_suspected",))
