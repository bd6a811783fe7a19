"""What a neighbour's flood of refused datagrams costs the exporter: log lines, CPU, and
whether every datagram is still counted; and whether answers reach anyone but the sender.

A real ``stepscope serve`` (run by this user: root, as on a node) with a 0666 Unix ingest;
the flood runs as ``nobody`` (``setpriv``): 150,000 datagrams, half for another user's job
with a new rank each, half for new jobs of its own past every cap, each from a new
abstract name every 100 datagrams (aliases). Reports the flood's wall time, the lines
the exporter wrote, its CPU, the datagrams counted, and the answers the flood's sockets
received.

Usage (from the repo root, as root)::

    python -m benchmarks.bench_ingest_flood
    python -m benchmarks.bench_ingest_flood --pythonpath /tmp/base/exporter   # another
        # tree's exporter (e.g. a worktree of an older commit), side by side

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._local import (
    free_port,
    proc_cpu_seconds,
    scrape,
    start_detached_exporter,
    stop_pid,
)
from tests.support.attacker import NOBODY, REFUSED_FLOOD, as_uid_command, attacker_env
from tests.support.paths import EXPORTER


def counted(port: int) -> float:
    total = 0.0
    for line in scrape(port).splitlines():
        if line.startswith(("stepscope_ingest_rejected_total{", "stepscope_ingest_datagrams_")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run(pythonpath: str, count: int) -> dict[str, float]:
    box = Path(tempfile.mkdtemp(prefix="stepscope-flood-"))
    box.chmod(0o755)
    log = box / "exporter.log"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": pythonpath, "STEPSCOPE_INGEST_MODE": "0666"}
    pid = start_detached_exporter(
        ["--simulate", "1", "--listen", f"127.0.0.1:{port}", "--ingest",
         f"unix://{box}/ingest.sock"], log, env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the exporter did not start:\n" + log.read_text()) from None
                time.sleep(0.2)
        ingest = str(box / "ingest.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:  # root's own job
            d = {"v": 1, "type": "step", "job": "held", "rank": 0, "local_rank": 0,
                 "pid": os.getpid(), "step": 0, "t": time.time(), "dur": 0.5}  # fmt: skip
            sock.sendto(json.dumps(d).encode(), ingest)
        lines_before = len(log.read_text().splitlines())
        cpu_before = proc_cpu_seconds(pid)
        done = subprocess.run(
            as_uid_command(NOBODY, REFUSED_FLOOD, ingest, str(count)), capture_output=True,
            text=True, env=attacker_env(), check=True,
        )  # fmt: skip
        flood = json.loads(done.stdout)
        deadline = time.monotonic() + 120
        while counted(port) < count + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        cpu = proc_cpu_seconds(pid) - cpu_before
        total = counted(port)
        time.sleep(61)  # the minute's summary lines
        lines = len(log.read_text().splitlines()) - lines_before
    finally:
        stop_pid(pid)
        shutil.rmtree(box, ignore_errors=True)
    return {"seconds": flood["seconds"], "lines": lines, "cpu": cpu, "counted": total - 1,
            "answers": flood["answers"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--count", type=int, default=150_000)
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="another tree's exporter package directory, measured too")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the flood runs as nobody against a root exporter")
    trees = [("this tree", str(EXPORTER)), *((p, p) for p in args.pythonpath)]
    print("| exporter | datagrams | flood s | log lines (incl. the minute after) | "
          "exporter CPU s | counted | answers to the flood |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, path in trees:
        r = run(path, args.count)
        print(f"| {name} | {args.count:,} | {r['seconds']:.1f} | {r['lines']:,} | "
              f"{r['cpu']:.1f} | {r['counted']:,.0f} | {r['answers']:,} |", flush=True)  # fmt: skip
    print(f"\n(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
