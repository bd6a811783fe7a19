"""Who a connection's peer is, for the per-peer budgets: the kernel's word only."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from stepscope.web.peers import peer_key


class Transport:
    def __init__(self, peer: tuple[Any, ...] | None, ours: tuple[Any, ...] | None) -> None:
        self.info = {"peername": peer, "sockname": ours}

    def get_extra_info(self, name: str) -> Any:
        return self.info[name]


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.1.2.3", 51000), "10.1.2.3"),
        (("::ffff:10.1.2.3", 51000, 0, 0), "10.1.2.3"),  # a dual-stack listener's view
        (("2001:db8:1:2:aaaa::1", 51000, 0, 0), "2001:db8:1:2::/64"),  # one host's /64
        (("2001:db8:1:2:bbbb::9", 51000, 0, 0), "2001:db8:1:2::/64"),
        (None, "unknown"),
    ],
)
def test_a_remote_peer_is_its_address_and_an_ipv6_one_its_64(
    peer: tuple[Any, ...] | None, key: str
) -> None:
    assert peer_key(Transport(peer, ("10.9.9.9", 9400))) == key


def test_a_local_peer_is_the_uid_that_owns_the_connecting_socket() -> None:
    """Whatever loopback address the client binds: the uid, asked of the kernel (the
    attack as another uid is in tests/security/test_http_attacks.py)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        for source in ("127.0.0.1", "127.0.0.9"):
            client = socket.create_connection(server.getsockname(), source_address=(source, 0))
            conn, _ = server.accept()
            with conn, client:
                key = peer_key(Transport(conn.getpeername(), conn.getsockname()))
            assert key == f"uid:{os.geteuid()}"


def test_a_local_peer_whose_socket_the_kernel_does_not_know_is_one_local_peer() -> None:
    # a port nothing holds: sock_diag finds no such socket
    assert peer_key(Transport(("127.0.0.5", 1), ("127.0.0.1", 9400))) == "local"
