"""Which network NCCL chose, per rank, from ``NCCL_DEBUG=INFO`` logs. Pure parsing.

The one parser of NCCL's debug output: ``stepscope nccl-check`` reads log files with it
after the fact (``stepscope.shared.nccl_log`` re-exports it), and the training SDK reads
its own rank's debug file with it while the job runs (``nccl_transport=True``). Standard
library only, importing nothing of stepscope but the datagram schema (whose
:data:`~stepscope.shared.datagram.NCCL_TRANSPORTS` is the vocabulary a rank may report), so
the SDK stays light.

NCCL prefixes each line with ``host:pid:tid [cudaDev] NCCL INFO|WARN``; launchers may
add their own prefix (``[1,3]<stdout>:``, ``[rank3]:``, a timestamp). A process is
keyed by (host, pid); its rank comes from the communicator line
``comm 0x... rank R nRanks N ...`` (the largest communicator wins: the world), or
from a ``[rankR]:`` prefix.

What is read, from NCCL and the aws-ofi-nccl plugin:

- ``Using network Libfabric`` / ``AWS Libfabric`` / ``IB`` / ``Socket``: the chosen network;
- ``NET/OFI Selected provider is efa`` (older: ``Selected Provider is efa``): the
  libfabric provider (``tcp`` or ``sockets`` there means no EFA);
- ``NET/Plugin: No plugin found``, ``Plugin load returned ...``, ``dlerror``: the
  network plugin (aws-ofi-nccl) could not be loaded, NCCL fell back to its own
  transports;
- ``NET/Plugin: Loaded net plugin NAME``;
- ``NET/IB : No device found``: no InfiniBand/RoCE HCA;
- ``NET/IB : Using [0]mlx5_0:1/IB``, ``NET/Socket : Using [0]eth0:10.0.0.1<0>``;
- ``NCCL_NET set by environment to Socket``, ``NCCL_IB_DISABLE set by environment to 1``;
- aws-ofi-nccl WARN lines (``NET/OFI ... fi_getinfo ... failed``, ``No eligible
  providers``): why EFA could not be used;
- ``via NET/Socket/0`` in channel setup lines: the transport really used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from stepscope.shared.datagram import NCCL_TRANSPORTS

_LINE = re.compile(
    r"(?:\[rank(?P<prefix_rank>\d+)\]:\s*)?.*?(?P<host>[^\s:\[\]]+):(?P<pid>\d+):\d+ "
    r"\[\d+\] NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
_COMM = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks (\d+)(?: nNodes (\d+))?")
_NETWORK = re.compile(r"\bUsing network (.+?)\s*$")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([\w.-]+)(?:, fabric is ([\w.-]+))?")
_PLUGIN_LOADED = re.compile(r"NET/Plugin ?: ?Loaded (?:net|coll) plugin (.+?)(?: \(v\d+\))?\s*$")
_PLUGIN_MISSING = re.compile(
    r"NET/Plugin ?: ?(No plugin found.*|Plugin load returned.*|.*dlerror.*|"
    r"Could not find.*libnccl-net.*|Failed to find ncclNetPlugin.*)$"
)
_IB_NONE = re.compile(r"NET/IB ?: ?No device found")
_IB_USING = re.compile(r"NET/IB ?: ?Using (.+)$")
_SOCKET_USING = re.compile(r"NET/Socket ?: ?Using (.+)$")
_ENV = re.compile(r"\b(NCCL_NET|NCCL_IB_DISABLE|NCCL_NET_PLUGIN|FI_PROVIDER) set by "
                  r"environment to (\S+)")  # fmt: skip
_VIA = re.compile(r"via NET/([^/]+)/")
_OFI_FAIL = re.compile(
    r"NET/OFI .*(fi_getinfo|No eligible providers|Unable to find|[Ff]ailed|[Cc]ouldn't)"
)

FAST = ("efa", "ib")
UNKNOWN = "unknown"


@dataclass
class RankTransport:
    """What one process's log says about its network."""

    host: str
    pid: int
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    network: str | None = None  # as NCCL names it: "AWS Libfabric", "IB", "Socket"
    provider: str | None = None  # libfabric provider: "efa", "tcp", ...
    fabric: str | None = None
    plugin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    via: dict[str, int] = field(default_factory=dict)  # channel lines per NET transport
    reasons: list[str] = field(default_factory=list)

    @property
    def transport(self) -> str:
        """``efa``, ``ib``, ``libfabric`` (another provider), ``socket`` (one of
        :data:`~stepscope.shared.datagram.NCCL_TRANSPORTS`) or ``unknown``."""
        net = (self.network or "").lower()
        used = {k.lower() for k in self.via}
        if "socket" in net or (not net and used == {"socket"}):
            return "socket"
        if "libfabric" in net or "ofi" in net or self.provider:
            if self.provider is None or self.provider.startswith("efa"):
                return "efa"
            return "libfabric"
        if net == "ib" or (not net and used == {"ib"}):
            return "ib"
        return UNKNOWN

    @property
    def multi_node(self) -> bool | None:
        return None if self.nnodes is None else self.nnodes > 1

    @property
    def verdict(self) -> str:
        """``ok`` (fast transport or one node), ``slow`` (TCP in a multi-node job), ``unknown``."""
        t = self.transport
        if t in FAST:
            return "ok"
        if t == UNKNOWN:
            return UNKNOWN
        return "ok" if self.multi_node is False else "slow"

    def explain(self) -> str:
        """One line: why this transport (the socket fallback's cause when one is logged)."""
        t = self.transport
        if t == "efa":
            fabric = f" (fabric {self.fabric})" if self.fabric else ""
            return f"EFA through libfabric{fabric}" + (f", plugin {self.plugin}" if self.plugin
                                                        else "")  # fmt: skip
        if t == "ib":
            return "InfiniBand/RoCE verbs"
        if t == UNKNOWN:
            return "no 'Using network' line: NCCL_DEBUG=INFO not set, or the log is cut"
        why = list(self.reasons)
        if t == "libfabric":
            why.insert(0, f"libfabric provider {self.provider!r} is not EFA")
        if self.multi_node is False:
            why.insert(0, "single node: NVLink/P2P carry the traffic, the network is unused")
        return "; ".join(why) if why else "no reason logged"


def _rank(p: RankTransport, rank: int, nranks: int, nnodes: int | None) -> None:
    if p.nranks is None or nranks >= p.nranks:
        p.rank, p.nranks = rank, nranks
        if nnodes is not None:
            p.nnodes = nnodes


def parse_nccl_log(lines: Iterable[str]) -> list[RankTransport]:
    """One :class:`RankTransport` per process seen, sorted by rank (unknown last)."""
    procs: dict[tuple[str, int], RankTransport] = {}
    for line in lines:
        m = _LINE.search(line.rstrip("\n"))
        if m is None:
            continue
        key = (m["host"], int(m["pid"]))
        p = procs.get(key)
        if p is None:
            p = procs[key] = RankTransport(*key)
        if m["prefix_rank"] is not None and p.rank is None:
            p.rank = int(m["prefix_rank"])
        msg = m["msg"]
        if (c := _COMM.search(msg)) is not None:
            _rank(p, int(c[1]), int(c[2]), int(c[3]) if c[3] else None)
        elif (n := _NETWORK.search(msg)) is not None:
            p.network = n[1]
        elif (pr := _PROVIDER.search(msg)) is not None:
            p.provider, p.fabric = pr[1].lower(), pr[2]
        elif (pl := _PLUGIN_LOADED.search(msg)) is not None:
            p.plugin = pl[1]
        elif (miss := _PLUGIN_MISSING.search(msg)) is not None:
            _reason(p, f"network plugin (aws-ofi-nccl) not loaded: {miss[1].strip()}")
        elif _IB_NONE.search(msg):
            _reason(p, "no InfiniBand/RoCE device (NET/IB: No device found)")
        elif (ib := _IB_USING.search(msg)) is not None:
            p.env.setdefault("ib_devices", ib[1].split(";")[0].strip())
        elif (so := _SOCKET_USING.search(msg)) is not None:
            p.env.setdefault("socket_interfaces", so[1].split(";")[0].strip())
        elif (e := _ENV.search(msg)) is not None:
            p.env[e[1]] = e[2]
            if e[1] == "NCCL_NET" and e[2].lower() == "socket":
                _reason(p, "NCCL_NET=Socket set in the environment")
            if e[1] == "NCCL_IB_DISABLE" and e[2] == "1":
                _reason(p, "NCCL_IB_DISABLE=1 set in the environment")
        elif m["level"] == "WARN" and _OFI_FAIL.search(msg):
            _reason(p, "aws-ofi-nccl: " + msg.split("NET/OFI", 1)[1].strip())
        for v in _VIA.findall(msg):
            p.via[v] = p.via.get(v, 0) + 1
    return sorted(
        procs.values(), key=lambda p: (p.rank is None, p.rank or 0, p.host, p.pid)
    )


def _reason(p: RankTransport, text: str) -> None:
    if text not in p.reasons:
        p.reasons.append(text)


def process_transport(lines: Iterable[str], pid: int | None = None) -> str | None:
    """The transport one process's NCCL chose, from its own debug output (a per-process
    ``NCCL_DEBUG_FILE``): one of :data:`~stepscope.shared.datagram.NCCL_TRANSPORTS`, or None
    while the log does not say yet. ``pid``: the process to read when the file holds
    several (a shared file); by default the only (or first) one."""
    procs = parse_nccl_log(lines)
    if pid is not None:
        procs = [p for p in procs if p.pid == pid] or procs
    for p in procs:
        t = p.transport
        if t in NCCL_TRANSPORTS:
            return t
    return None
