"""RDMA port counters from ``/sys/class/infiniband/<device>/ports/<port>/``.

Two directories per port hold counters, one value per file:

- ``hw_counters/``: the driver's own statistics. EFA (``efa`` driver) puts all of its
  counters here: ``tx_bytes``, ``rx_bytes``, ``tx_pkts``, ``rx_pkts``, ``rx_drops``,
  ``rdma_read_bytes``, ``rdma_write_bytes``, ``retrans_pkts``, ``retrans_bytes``,
  ``retrans_timeout_events``, ``unresponsive_remote_events``,
  ``impaired_remote_conn_events``, ... ``lifespan`` is not a counter: it is how many
  milliseconds the kernel caches these values before asking the device again.
- ``counters/``: the InfiniBand PMA port counters (mlx5 and other HCAs):
  ``port_xmit_data`` and ``port_rcv_data`` count 4-byte words, not bytes.

Each served counter has one row in :data:`RDMA_COUNTERS`; the first file of its
``sources`` that exists on a port is read (EFA's and IB's names differ). A file that
is absent or unreadable leaves that counter absent for that port, never zero.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.core.source import PartKey

SYSFS_INFINIBAND = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class RdmaCounter:
    """One served counter: its name, help, and the sysfs files it is read from.

    ``sources`` are ``(directory/file, scale)``: the value is multiplied by scale
    (4 for the IB data counters, which count 4-byte words).
    """

    key: str
    name: str
    help: str
    sources: tuple[tuple[str, float], ...]


RDMA_COUNTERS: tuple[RdmaCounter, ...] = (
    RdmaCounter(
        "tx_bytes",
        "stepscope_rdma_transmitted_bytes_total",
        "Bytes sent by the port.",
        (("hw_counters/tx_bytes", 1.0), ("counters/port_xmit_data", 4.0)),
    ),
    RdmaCounter(
        "rx_bytes",
        "stepscope_rdma_received_bytes_total",
        "Bytes received by the port.",
        (("hw_counters/rx_bytes", 1.0), ("counters/port_rcv_data", 4.0)),
    ),
    RdmaCounter(
        "tx_packets",
        "stepscope_rdma_transmitted_packets_total",
        "Packets sent by the port.",
        (("hw_counters/tx_pkts", 1.0), ("counters/port_xmit_packets", 1.0)),
    ),
    RdmaCounter(
        "rx_packets",
        "stepscope_rdma_received_packets_total",
        "Packets received by the port.",
        (("hw_counters/rx_pkts", 1.0), ("counters/port_rcv_packets", 1.0)),
    ),
    RdmaCounter(
        "rx_drops",
        "stepscope_rdma_received_dropped_packets_total",
        "Received packets dropped (EFA rx_drops) or received with errors (IB port_rcv_errors).",
        (("hw_counters/rx_drops", 1.0), ("counters/port_rcv_errors", 1.0)),
    ),
    RdmaCounter(
        "rdma_read_bytes",
        "stepscope_rdma_read_bytes_total",
        "Bytes read by one-sided RDMA read requests (EFA).",
        (("hw_counters/rdma_read_bytes", 1.0),),
    ),
    RdmaCounter(
        "rdma_write_bytes",
        "stepscope_rdma_write_bytes_total",
        "Bytes written by one-sided RDMA write requests (EFA).",
        (("hw_counters/rdma_write_bytes", 1.0),),
    ),
    RdmaCounter(
        "retrans_packets",
        "stepscope_rdma_retransmitted_packets_total",
        "Packets retransmitted (EFA SRD: path loss recovered).",
        (("hw_counters/retrans_pkts", 1.0),),
    ),
    RdmaCounter(
        "retrans_bytes",
        "stepscope_rdma_retransmitted_bytes_total",
        "Bytes retransmitted (EFA SRD).",
        (("hw_counters/retrans_bytes", 1.0),),
    ),
    RdmaCounter(
        "retrans_timeout_events",
        "stepscope_rdma_retransmit_timeout_events_total",
        "Retransmissions that timed out and moved traffic to another network path (EFA).",
        (("hw_counters/retrans_timeout_events", 1.0),),
    ),
    RdmaCounter(
        "unresponsive_remote_events",
        "stepscope_rdma_unresponsive_remote_events_total",
        "Times a remote peer stopped answering (EFA).",
        (("hw_counters/unresponsive_remote_events", 1.0),),
    ),
    RdmaCounter(
        "impaired_remote_conn_events",
        "stepscope_rdma_impaired_remote_connection_events_total",
        "Times a connection entered the impaired state, with a reduced rate limit (EFA).",
        (("hw_counters/impaired_remote_conn_events", 1.0),),
    ),
)


@dataclass(frozen=True)
class RdmaPort:
    """One RDMA port: counters by :class:`RdmaCounter` key, and its settings.

    ``lifespan_seconds`` is how long the kernel caches ``hw_counters`` values
    (None where the file is absent).
    """

    device: str
    port: str
    counters: Mapping[str, float] = field(default_factory=dict)
    lifespan_seconds: float | None = None

    @property
    def bytes_total(self) -> float:
        """Bytes sent plus received (RDMA read/write included in them)."""
        return self.counters.get("tx_bytes", 0.0) + self.counters.get("rx_bytes", 0.0)


def _read_number(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:  # absent, or the device refused (EINVAL on some counters)
        return None
    try:
        return float(int(text.split()[0]))
    except (ValueError, IndexError):
        return None


def read_rdma_ports(root: Path = SYSFS_INFINIBAND) -> tuple[RdmaPort, ...]:
    """Every port of every RDMA device under ``root``, sorted; () when there is none."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return ()
    ports: list[RdmaPort] = []
    for device in devices:
        try:
            port_names = sorted(os.listdir(root / device / "ports"), key=_port_order)
        except OSError:
            continue
        for port in port_names:
            base = root / device / "ports" / port
            counters: dict[str, float] = {}
            for spec in RDMA_COUNTERS:
                for rel, scale in spec.sources:
                    value = _read_number(base / rel)
                    if value is not None:
                        counters[spec.key] = value * scale
                        break
            lifespan = _read_number(base / "hw_counters" / "lifespan")
            ports.append(
                RdmaPort(
                    device,
                    port,
                    counters,
                    lifespan / 1000.0 if lifespan is not None else None,
                )
            )
    return tuple(ports)


def _port_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


# The RDMA source's part: every port of the node (() where there is none).
RDMA_PART: PartKey[tuple[RdmaPort, ...]] = PartKey("rdma")
