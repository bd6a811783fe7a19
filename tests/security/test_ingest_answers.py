"""Answers to refused senders, attacked as the issue measured them (docs/security.md).

A root-run exporter with a 0666 Unix ingest used to deliver its answer, with root's
credentials, to whatever address the sender's socket had: a relative path resolved in
the exporter's working directory, a path swapped for a symlink, an abstract name bound in
another network namespace (delivered to whichever process of the host holds that name);
and aliases used up the budget real SDKs need. Each attack runs here as ``nobody`` (and a
second uid as the honest SDK) against a real ``stepscope serve``; the victims are sockets
only root can reach, and they must receive nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from stepscope.shared.datagram import Refusal, parse_refusal
from tests.support import Exporter, wait_for
from tests.support.attacker import NOBODY, SECOND_UID, needs_setpriv, run_as, serve_0666, spawn_as
from tests.support.ingest import scrape, step, value

# The attacks, as the attacker's process runs them. argv: ingest path, then per attack.
PREAMBLE = """
import json, os, socket, sys, time
ingest = sys.argv[1]
def datagram(rank=0, job="held"):
    return json.dumps({"v": 1, "type": "step", "job": job, "rank": rank, "local_rank": 0,
        "pid": os.getpid(), "step": 1, "t": time.time(), "dur": 1.0}).encode()
"""

RELATIVE_AND_SYMLINK = PREAMBLE + """
root_only = sys.argv[2]
# 1. a relative name: resolved in the exporter's working directory, it would be
#    secret/v.sock there (a root-only directory)
os.makedirs("secret", exist_ok=True)
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.bind("secret/v.sock")
    for rank in range(5):
        s.sendto(datagram(rank), ingest)
# 2. a path swapped for a symlink to a root-only socket right after each send
for i in range(20):
    name = f"swap{i}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(name)
        s.sendto(datagram(i), ingest)
        os.unlink(name)
        os.symlink(root_only, name)
print("sent")
"""

OTHER_NAMESPACE = PREAMBLE + """
# an abstract name that a root process of the host holds in the host's namespace,
# bound here in a network namespace of our own (another pod's)
name = bytes.fromhex(sys.argv[2])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.bind(name)
    for rank in range(10):
        s.sendto(datagram(rank), ingest)
print("sent")
"""

ALIASES = PREAMBLE + """
# aliases: a new abstract name per datagram, for as long as asked
until = time.monotonic() + float(sys.argv[2])
socks = []
n = 0
while time.monotonic() < until:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\\0alias-%d-%d" % (os.getpid(), n))
    s.sendto(datagram(n % 64), ingest)
    socks.append(s)
    n += 1
    if len(socks) > 200:
        socks.pop(0).close()
print(n)
"""

HONEST_SDK = PREAMBLE + """
# what the SDK does: an abstract name the kernel picks; three processes' worth of sends,
# each answered or not by its first datagram
for attempt in range(3):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("")
        s.settimeout(3.0)
        s.sendto(datagram(0), ingest)  # rank 0 of job "held": root's, refused not_owner
        try:
            print(s.recv(1024).decode())
        except socket.timeout:
            print("no answer")
    time.sleep(0.5)
"""


def victim(path: Path | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path) if isinstance(path, Path) else path)
    sock.setblocking(False)
    return sock


def received(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


def serve_held(box: Path, cwd: Path) -> Exporter:
    """A 0666 exporter holding root's own job "held": every step the attacker sends for
    it is refused not_owner."""
    exp = serve_0666(box, cwd)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps(step("held", 0, 0, time.time(), None)).encode(),
                    str(box / "ingest.sock"))  # fmt: skip
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="held") == 1)
    return exp


def not_owner(exp: Exporter) -> float:
    return value(scrape(exp), "stepscope_ingest_rejected_total", reason="not_owner") or 0.0


def test_no_answer_reaches_a_socket_the_sender_named_by_path_or_in_another_namespace(
    box: Path,
) -> None:
    needs_setpriv()
    # the exporter's working directory holds a root-only directory with a socket in it
    exporter_cwd = box / "exporter-cwd"
    (exporter_cwd / "secret").mkdir(parents=True)
    (exporter_cwd / "secret").chmod(0o700)
    root_only = box / "root-only"
    root_only.mkdir(mode=0o700)
    attacker_dir = box / "attacker"
    attacker_dir.mkdir()
    os.chown(attacker_dir, NOBODY, NOBODY)
    host_name = b"\0stepscope-victim-%d" % os.getpid()
    exp = serve_held(box, exporter_cwd)
    victims = {
        "relative path in the exporter's cwd": victim(exporter_cwd / "secret" / "v.sock"),
        "symlink target": victim(root_only / "v.sock"),
        "abstract name held in the host namespace": victim(host_name),
    }
    try:
        run_as(NOBODY, RELATIVE_AND_SYMLINK, str(box / "ingest.sock"),
               str(root_only / "v.sock"), cwd=attacker_dir)  # fmt: skip
        run_as(NOBODY, OTHER_NAMESPACE, str(box / "ingest.sock"), host_name.hex(),
               netns=True, cwd=attacker_dir)  # fmt: skip
        try:
            wait_for(lambda: not_owner(exp) >= 5 + 20 + 10, timeout=60)
        except AssertionError as exc:
            counted = scrape(exp).get("stepscope_ingest_rejected_total")
            raise AssertionError(f"{exc}: {counted}") from exc
        # the listener answers right after counting a refusal, and the count is served
        # from a later pass: every answer the exporter would send has been sent
        got = {what: received(sock) for what, sock in victims.items()}
    finally:
        for sock in victims.values():
            sock.close()
        exp.stop()
    assert got == {what: [] for what in victims}


def test_a_flood_of_aliases_does_not_spend_another_users_answers(box: Path) -> None:
    needs_setpriv()
    exp = serve_held(box, box)
    try:
        flood = spawn_as(NOBODY, ALIASES, str(box / "ingest.sock"), "6")
        wait_for(lambda: not_owner(exp) >= 500, timeout=30)  # the flood is on
        honest = run_as(SECOND_UID, HONEST_SDK, str(box / "ingest.sock"), timeout=60)
        out, err = flood.communicate(timeout=60)
        assert flood.returncode == 0, err
    finally:
        exp.stop()
    answers = [parse_refusal(line.encode()) for line in honest.stdout.splitlines()]
    assert answers == [Refusal("not_owner", "held", 0)] * 3, honest.stdout
    assert int(out) >= 500  # the flood really sent its aliases
