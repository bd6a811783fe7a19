"""Who is on the other end of an HTTP connection, as far as the kernel vouches for it.

Budgets per peer (basic auth's pending checks) need a peer a client cannot multiply at
will. A remote client's address is the kernel's word (a TCP handshake completed with
it); an IPv6 client is counted by its /64, which one host usually holds whole. A client
on this host can bind any of 127.0.0.0/8 (and any of the host's addresses), so for it the
peer is the uid that owns the connecting socket, asked of the kernel by the connection's
four addresses (``NETLINK_SOCK_DIAG``, as ``ss -e`` does: ~8 µs), never read from a
request. Where the kernel cannot say (no ``inet_diag``), every local client is one peer;
so is a client whose process has closed its end already: an orphaned socket (FIN-WAIT-2,
TIME-WAIT) has no inode and reads as uid 0, which would otherwise put such a client in
root's budget.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
# struct inet_diag_msg: 4 bytes, inet_diag_sockid (48), expires, rqueue, wqueue, then uid
# and inode
_UID_OFFSET = 16 + 4 + 48 + 12
_INODE_OFFSET = _UID_OFFSET + 4

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(host: str) -> Address:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d
    return address


def socket_owner_uid(src: Address, sport: int, dst: Address, dport: int) -> int | None:
    """The uid owning the TCP socket bound to ``src:sport`` and connected to
    ``dst:dport`` in this network namespace; None where the kernel has no such socket
    (a remote peer), no process holds it any more (no inode: its owner closed it) or the
    kernel cannot be asked."""
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    sockid = (
        struct.pack("!HH", sport, dport)
        + src.packed.ljust(16, b"\0")
        + dst.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
    )
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(0.2)
            nl.send(header + request)
            reply = nl.recv(1024)
    except OSError:
        return None
    if len(reply) < _INODE_OFFSET + 4:
        return None
    if struct.unpack_from("=H", reply, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket here
    if struct.unpack_from("=I", reply, _INODE_OFFSET)[0] == 0:
        return None  # orphaned: its uid reads 0 whoever opened it
    return int(struct.unpack_from("=I", reply, _UID_OFFSET)[0])


def peer_key(transport: Any) -> str:
    """A connection's peer for per-peer budgets: ``uid:N`` for a client on this host
    (``local`` where its uid cannot be read), the /64 of an IPv6 client, else the
    client's address."""
    peername = transport.get_extra_info("peername") if transport is not None else None
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if not peername or not isinstance(peername, tuple):
        return "unknown"
    try:
        peer = _ip(str(peername[0]))
        ours = _ip(str(sockname[0])) if sockname else None
    except ValueError:
        return "unknown"
    if peer.is_loopback or peer == ours:
        uid = None
        if sockname and ours is not None and ours.version == peer.version:
            uid = socket_owner_uid(peer, int(peername[1]), ours, int(sockname[1]))
        return f"uid:{uid}" if uid is not None else "local"
    if peer.version == 6:
        return str(ipaddress.IPv6Network((peer, 64), strict=False))
    return str(peer)
