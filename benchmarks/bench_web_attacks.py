"""The pager always gets in: a valid scraper against a freshly restarted exporter under
attack (issue 33, items 4 and 5).

A real ``stepscope serve --simulate 2`` with a web config of basic auth (user ``prom``,
bcrypt cost 10) is started fresh for each row, so the scraper's credentials are not yet
cached. The attacker runs as ``nobody`` when this script runs as root (``setpriv``), as
a stranger on the host would, else as the same user (the table says which), and starts
first; then the scraper opens a new connection every ``--every`` seconds for
``--seconds`` and asks ``/metrics`` with the right password (10 s timeout, one try, as
one Prometheus scrape).

1. Flood: ``--threads`` threads send wrong credentials back to back over keep-alive,
   each with a new random password, and a new random user name (a stranger guessing)
   or the configured name ``prom`` (a stranger who knows it).
2. Idle connections: the attacker holds ``--idle`` connections open and silent,
   opening a new one for each the server closes.

Reports, per row, the scraper's answers and latency (p50, p99, max) and the attacker's
answers; with this tree's exporter also the server's own counters. Usage (from the
repository root)::

    python -m benchmarks.bench_web_attacks                      # this tree's exporter
    python -m benchmarks.bench_web_attacks --pythonpath OLD/exporter   # another's

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt

from benchmarks._local import free_port, proc_cpu_seconds
from tests.support import parse_samples
from tests.support.attacker import NOBODY, attacker_env, spawn_as
from tests.support.http_attacks import RUN

PASSWORD = "pager-s3cret"


def _auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


GOOD = _auth("prom", PASSWORD)


@dataclass
class Row:
    attack: str
    answers: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    attacker: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    cpu_percent: float = 0.0


def _get(port: int, headers: dict[str, str], path: str = "/metrics") -> tuple[str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return str(response.status), response.read()
    except TimeoutError:
        return "timeout", b""
    except (OSError, http.client.HTTPException):
        return "error", b""
    finally:
        conn.close()


class Exporter:
    """A fresh ``stepscope serve`` with basic auth on a free port."""

    def __init__(self, tmp: Path, web_yml: Path, pythonpath: str | None) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STEPSCOPE_CONFIG", None)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.log = tmp / f"exporter-{self.port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stepscope", "serve", "--simulate", "2",
                 "--listen", f"127.0.0.1:{self.port}", "--web-config", str(web_yml),
                 "--ingest", f"unix://{tmp}/ingest-{self.port}.sock"],
                stdout=subprocess.DEVNULL, stderr=out, env=env,
            )  # fmt: skip
        # up, without sending the valid credentials (they must not be cached yet)
        deadline = time.monotonic() + 60
        while _get(self.port, {}, "/healthz")[0] != "401":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"exporter did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def counters(self) -> dict[str, float]:
        status, body = _get(self.port, GOOD)
        if status != "200":
            return {}
        out: dict[str, float] = {}
        for name, series in parse_samples(body.decode()).items():
            if name.startswith("stepscope_http_"):
                for labels, value in series:
                    suffix = ",".join(f"{v}" for v in labels.values())
                    out[f"{name}{{{suffix}}}" if suffix else name] = value
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _attacker(port: int, attack: list[str], seconds: float) -> subprocess.Popen[str]:
    args = [attack[0], f"127.0.0.1:{port}", str(seconds), *attack[1:]]
    if os.geteuid() == 0:
        return spawn_as(NOBODY, RUN, *args, cwd="/")
    return subprocess.Popen([sys.executable, "-c", RUN, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=attacker_env())  # fmt: skip


def run_row(
    tmp: Path, web_yml: Path, pythonpath: str | None, label: str, attack: list[str],
    seconds: float, every: float,
) -> Row:  # fmt: skip
    row = Row(label)
    exporter = Exporter(tmp, web_yml, pythonpath)
    attacker = _attacker(exporter.port, attack, seconds + 1)
    try:
        assert attacker.stdout is not None
        line = attacker.stdout.readline()
        if line.strip() != "started":
            raise SystemExit(f"attack did not start: {line}{attacker.stderr.read()}")  # type: ignore[union-attr]
        cpu0, t0 = proc_cpu_seconds(exporter.proc.pid), time.monotonic()
        while time.monotonic() - t0 < seconds:
            start = time.perf_counter()
            status, _ = _get(exporter.port, GOOD)
            row.latencies_ms.append((time.perf_counter() - start) * 1000)
            row.answers[status] = row.answers.get(status, 0) + 1
            time.sleep(max(0.0, every - (time.perf_counter() - start)))
        row.cpu_percent = 100 * (proc_cpu_seconds(exporter.proc.pid) - cpu0) / (
            time.monotonic() - t0
        )
    finally:
        out, _ = attacker.communicate(timeout=60)
        for text in out.splitlines()[::-1]:
            if text.startswith("{"):
                row.attacker = json.loads(text)
                break
    row.counters = exporter.counters()
    exporter.stop()
    return row


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_rows(title: str, rows: list[Row]) -> None:
    print(f"### {title}\n")
    print("| attack | scrapes | answered 200 | other answers | p50 ms | p99 ms | max ms "
          "| exporter CPU % | attacker's answers | server's counters |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        total = sum(row.answers.values())
        ok = row.answers.get("200", 0)
        other = ", ".join(f"{k}: {v}" for k, v in sorted(row.answers.items()) if k != "200")
        attacker = ", ".join(f"{k}: {v}" for k, v in sorted(row.attacker.items()))
        counters = ", ".join(
            f"{k.removeprefix('stepscope_http_')} {v:g}" for k, v in sorted(row.counters.items())
            if "connections{" not in k and v and not k.endswith("max_connections")
        )  # fmt: skip
        print(f"| {row.attack} | {total} | {ok} ({100 * ok / max(total, 1):.0f}%) | "
              f"{other or '-'} | {_pct(row.latencies_ms, 0.5):.1f} | "
              f"{_pct(row.latencies_ms, 0.99):.1f} | {max(row.latencies_ms):.1f} | "
              f"{row.cpu_percent:.0f} | {attacker or '-'} | {counters or '-'} |")  # fmt: skip
    print()


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythonpath", help="run the exporter with this PYTHONPATH")
    parser.add_argument("--seconds", type=float, default=12.0, help="scraping per row")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between scrapes")
    parser.add_argument("--threads", type=int, default=16, help="flooding threads")
    parser.add_argument("--idle", type=int, default=2000, help="idle connections held")
    parser.add_argument("--only", choices=("flood", "idle"), help="one part only")
    args = parser.parse_args()
    who = "nobody" if os.geteuid() == 0 else "the same user"
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python "
          f"{sys.version.split()[0]}, attacker runs as {who}, exporter from "
          f"{args.pythonpath or 'this tree'}\n")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        web_yml = d / "web.yml"
        web_yml.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
        if args.only in (None, "flood"):
            rows = [
                run_row(d, web_yml, args.pythonpath, f"{args.threads} threads, random user names",
                        ["flood", str(args.threads)], args.seconds, args.every),
                run_row(d, web_yml, args.pythonpath, f"{args.threads} threads, user name prom",
                        ["flood", str(args.threads), "prom"], args.seconds, args.every),
            ]  # fmt: skip
            print_rows("A new scrape after a restart, under a wrong-credentials flood", rows)
        if args.only in (None, "idle"):
            rows = [
                run_row(d, web_yml, args.pythonpath, f"{args.idle} idle connections held",
                        ["idle", str(args.idle)], args.seconds, args.every),
            ]  # fmt: skip
            print_rows("A new scrape while a peer holds idle connections", rows)


if __name__ == "__main__":
    main()
