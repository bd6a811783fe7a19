"""Authenticated ingest (issue 15, finding 1): the kernel says who sent each datagram.

As `nobody`, 20 datagrams into a root-run job's rank 0 used to move its step time from
25 s to 1,728,025 s; 8 datagrams filled `max_jobs`; rewriting `local_rank`/`pid`/
`world_size` made 81k series in 30 s. Each of those is reproduced here with a real
exporter, real sockets, and a sender that really runs as another uid (a forked child
that drops to `nobody`; the tests skip where they cannot change uid).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import Exporter, start_exporter, wait_for
from tests.support.exporter import served_address
from tests.support.ingest import Samples, scrape, step, value

NOBODY = 65534  # uid and gid (nobody / nogroup)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("sending as another uid needs root to fork a child that drops to nobody")


def serve(started: list[Exporter], url: str, **env: str) -> Exporter:
    exp = start_exporter(["--simulate", "1", "--interval", "0.2", "--ingest", url],
                         env={f"STEPSCOPE_{k.upper()}": v for k, v in env.items()})
    started.append(exp)
    return exp


def as_user(uid: int, gid: int, send: Callable[[], None]) -> int:
    """Run ``send`` in a forked child that has dropped to ``uid``/``gid``; its exit code:
    0 done, 13 PermissionError, 1 anything else. The kernel stamps its datagrams with
    that uid and the child's pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            send()
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def send_to(path: str, *datagrams: dict[str, Any]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for d in datagrams:
            sock.sendto(json.dumps(d).encode(), path)


def scrape_when(exp: Exporter, name: str, **labels: str) -> Samples:
    """The first scrape in which ``name{labels}`` has a non-zero value."""

    def ready() -> Samples | None:
        fams = scrape(exp)
        return fams if value(fams, name, **labels) else None

    result: Samples = wait_for(ready)
    return result


def rejected(exp: Exporter) -> dict[str, float]:
    return {lbl["reason"]: v for lbl, v in scrape(exp)["stepscope_ingest_rejected_total"] if v}


def test_by_default_another_user_cannot_even_reach_the_socket(
    base: Path, exporters: list[Exporter]
) -> None:
    needs_root()
    path = base / "ingest.sock"
    serve(exporters, f"unix://{path}")
    st = path.stat()
    assert (oct(st.st_mode & 0o777), st.st_gid) == (oct(0o660), os.getegid())
    code = as_user(NOBODY, NOBODY, lambda: send_to(str(path), step("llama", 0, 0, 1.0, None)))
    assert code == 13  # EACCES: nobody is neither the owner nor in the group


def test_a_shared_group_grants_ranks_of_other_users_access(
    base: Path, exporters: list[Exporter]
) -> None:
    needs_root()
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}", ingest_group="nogroup")
    assert path.stat().st_gid == NOBODY and path.stat().st_mode & 0o777 == 0o660

    def report() -> None:
        send_to(str(path), step("theirs", 0, 0, time.time(), None, pid=os.getpid()))

    assert as_user(NOBODY, NOBODY, report) == 0
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="theirs") == 1)


def test_another_user_cannot_forge_a_ranks_steps(
    base: Path, exporters: list[Exporter]
) -> None:
    needs_root()
    path = base / "ingest.sock"
    # an operator who opened the socket to every local user (ingest_mode 0666)
    exp = serve(exporters, f"unix://{path}", ingest_mode="0666")
    t0 = time.time() - 100
    send_to(str(path), *(step("llama", 0, i, t0 + i, None) for i in range(25)))
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="llama") == 25)

    victim = os.getpid()

    def forge() -> None:
        big = {"dur": 86400.0, "data": 86000.0, "compute": 100.0, "comm": 0.0}
        # claiming the victim's pid, then its own; for rank 0, and as a new rank 1
        send_to(str(path), *(step("llama", 0, 100 + i, time.time(), None, pid=victim, **big)
                             for i in range(10)))
        me = os.getpid()
        send_to(str(path), *(step("llama", r, 200 + i, time.time(), None, pid=me, **big)
                             for i in range(5) for r in (0, 1)))

    assert as_user(NOBODY, NOBODY, forge) == 0
    wait_for(lambda: rejected(exp) == {"bad_pid": 10, "not_owner": 10})
    fams = scrape(exp)
    assert value(fams, "stepscope_step_duration_seconds_sum", training_job="llama") == 25.0
    assert value(fams, "stepscope_step_phase_seconds_total", training_job="llama",
                 phase="data_wait") == 25 * 0.25
    assert value(fams, "stepscope_training_ranks") == 1
    # the owner keeps reporting
    send_to(str(path), step("llama", 0, 25, t0 + 25, None))
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="llama") == 26)


def test_one_user_cannot_squat_every_job_slot(
    base: Path, exporters: list[Exporter]
) -> None:
    needs_root()
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}", ingest_mode="0666", max_jobs="8")

    def squat() -> None:  # 8 jobs, one datagram each, before the real job starts
        me = os.getpid()
        send_to(str(path), *(step(f"squat-{j}", 0, 0, time.time(), None, pid=me)
                             for j in range(8)))

    assert as_user(NOBODY, NOBODY, squat) == 0
    wait_for(lambda: value(scrape(exp), "stepscope_training_ranks") == 8)
    send_to(str(path), step("real", 0, 0, time.time(), None))
    fams = scrape_when(exp, "stepscope_steps_total", training_job="real")
    assert value(fams, "stepscope_training_ranks") == 8
    assert not any(v for _, v in fams["stepscope_ingest_rejected_total"])

    def squat_more() -> None:  # held to half of max_jobs now that another uid reports
        send_to(str(path), step("squat-0", 0, 1, time.time(), None, pid=os.getpid()))

    assert as_user(NOBODY, NOBODY, squat_more) == 0
    wait_for(lambda: rejected(exp) == {"cap_uid": 1})


def test_identity_label_churn_no_longer_multiplies_series(
    base: Path, exporters: list[Exporter]
) -> None:
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}")
    me = os.getpid()
    send_to(str(path), step("churn", 0, 0, time.time(), None, pid=me, local_rank=0))
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="churn") == 1)
    before = len(exp.metrics().splitlines())
    n = 1000
    send_to(str(path), *(step("churn", 0, i, time.time(), None, local_rank=i % 8,
                              world_size=2 + i % 7, pid=me if i % 2 else me + 1 + i)
                         for i in range(1, n)))
    # odd steps claim this process (labels changed), even ones another pid
    wait_for(lambda: rejected(exp) == {"identity_changed": 500, "bad_pid": 499})
    assert len(exp.metrics().splitlines()) == before
    fams = scrape(exp)
    assert [lbl["local_rank"] for lbl, _ in fams["stepscope_steps_total"]] == ["0"]


def test_the_reported_pid_must_be_the_senders(
    base: Path, exporters: list[Exporter]
) -> None:
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}")
    send_to(str(path), step("p", 0, 0, time.time(), None, pid=1))  # not this process
    wait_for(lambda: rejected(exp) == {"bad_pid": 1})
    send_to(str(path), {k: v for k, v in step("p", 0, 1, time.time(), None).items()
                        if k != "pid"})  # no pid: nothing to check, accepted
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="p") == 1)


def unshare_pid() -> list[str]:
    """``unshare --pid --fork`` if this machine allows new PID namespaces, else skip."""
    # --kill-child: killing unshare (the Popen the test holds) ends what runs inside too
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run([*cmd, "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.decode().strip()}")
    return cmd


# A rank in its own PID namespace: sends one step, then lives on (as a rank does) until
# the test closes its stdin, so the exporter can read its NSpid.
SEND_OWN_PID = """
import json, os, socket, sys
d = json.loads(sys.argv[2]); d["pid"] = os.getpid() if sys.argv[3] == "own" else 4242
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(json.dumps(d).encode(), sys.argv[1])
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def contained_rank(cmd: list[str], path: Path, datagram: str, pid: str) -> subprocess.Popen[str]:
    """Start a rank below our PID namespace that sends ``datagram``; close its stdin to end it."""
    return subprocess.Popen([*cmd, sys.executable, "-c", SEND_OWN_PID, str(path), datagram, pid],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def end(rank: subprocess.Popen[str]) -> None:
    assert rank.stdin is not None
    rank.stdin.close()
    assert rank.wait(timeout=60) == 0


def test_a_rank_in_a_container_below_the_exporter_reports_its_own_pid(
    base: Path, exporters: list[Exporter]
) -> None:
    """The exporter on the host's PID namespace (systemd, or a pod with hostPID) sees
    a containerised rank's host pid; the rank reports its pid inside the container.
    The exporter accepts exactly that pair (NSpid), and no other claim."""
    cmd = unshare_pid()
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}")
    d = json.dumps(step("ctr", 0, 0, time.time(), None))
    own = contained_rank(cmd, path, d, "own")
    try:
        assert own.stdout is not None
        inner = own.stdout.readline().strip()
        fams = scrape_when(exp, "stepscope_steps_total", training_job="ctr")
        (info,) = [lbl for lbl, _ in fams["stepscope_training_rank_info"]]
        assert info["pid"] == inner != ""
    finally:
        end(own)
    d2 = json.dumps(step("ctr2", 0, 0, time.time(), None))
    liar = contained_rank(cmd, path, d2, "lie")
    try:
        wait_for(lambda: rejected(exp) == {"bad_pid": 1})
    finally:
        end(liar)


def test_an_exporter_in_its_own_pid_namespace_relies_on_the_uid(
    base: Path, exporters: list[Exporter]
) -> None:
    """Kubernetes' default: the exporter's pod and the ranks' pods are sibling PID
    namespaces, so the kernel gives pid 0. Ranks keep working; the uid still decides."""
    needs_root()
    cmd = unshare_pid()
    path = base / "ingest.sock"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STEPSCOPE_INGEST_MODE": "0666"}
    env.pop("STEPSCOPE_CONFIG", None)
    proc = subprocess.Popen(
        [*cmd, sys.executable, "-m", "stepscope", "serve", "--listen", "127.0.0.1:0",
         "--simulate", "1", "--interval", "0.2", "--ingest", f"unix://{path}"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    address = None
    while address is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        address = served_address(line) or address
    assert address is not None, "".join(lines)
    exp = Exporter(proc, address, lines)
    exporters.append(exp)
    # this process's pid means nothing in the exporter's namespace: it is taken as given
    send_to(str(path), step("pod", 0, 0, time.time(), None, pid=4242))
    fams = scrape_when(exp, "stepscope_steps_total", training_job="pod")
    (info,) = [lbl for lbl, _ in fams["stepscope_training_rank_info"]]
    assert info["pid"] == "4242"

    def forge() -> None:
        send_to(str(path), step("pod", 0, 1, time.time(), None, pid=4242))

    assert as_user(NOBODY, NOBODY, forge) == 0
    wait_for(lambda: rejected(exp) == {"not_owner": 1})


def test_an_allow_list_keeps_other_users_out_before_parsing(
    base: Path, exporters: list[Exporter]
) -> None:
    needs_root()
    path = base / "ingest.sock"
    exp = serve(exporters, f"unix://{path}", ingest_mode="0666", ingest_allow_uids="root",
                ingest_allow_gids="1234")

    def send() -> None:
        send_to(str(path), step("x", 0, 0, time.time(), None, pid=os.getpid()))
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"not even json", str(path))

    assert as_user(NOBODY, NOBODY, send) == 0
    assert as_user(NOBODY, 1234, send) == 0  # a listed group lets a datagram through
    wait_for(lambda: rejected(exp) == {"not_allowed": 2, "not_json": 1})
    send_to(str(path), step("mine", 0, 0, time.time(), None))
    wait_for(lambda: value(scrape(exp), "stepscope_steps_total", training_job="mine") == 1)


def test_a_gone_senders_pid_is_not_remembered_for_the_next_process_to_get_it(
    tmp_path: Path,
) -> None:
    """A container's process that ended before its datagram was read cannot be checked
    (refused); its host pid, reused by the next containerised process, is read afresh."""
    from stepscope.ingest.listener import PidCheck

    check = PidCheck(proc=tmp_path)
    assert not check.matches(4100, 7)  # /proc/4100 gone: cannot vouch for 7
    (tmp_path / "4100").mkdir()
    (tmp_path / "4100" / "status").write_bytes(b"Name:\tpython\nNSpid:\t4100\t7\n")
    assert check.matches(4100, 7) and not check.matches(4100, 8)
    assert check.matches(0, 12345) and check.matches(99, 99)  # unnamed, or same namespace
