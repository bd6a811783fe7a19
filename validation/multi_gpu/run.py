"""The multi-GPU validation's moving parts: the exporter it starts, the DDP ranks of one
phase (scraped every second, the diagnosis read once its window lies inside the measured
steps) and ``stepscope diagnose`` against the exporter."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._local import free_port, get, scrape, wait_for_exporter
from tests.support import REPO
from validation.multi_gpu.report import Report

RULES = REPO / "deploy" / "prometheus" / "rules" / "stepscope-recording.yml"

# NVLink multicast can take a shared host's GPUs out of service: off in every child, always.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SIM_MODEL = "NVIDIA H100 80GB HBM3"  # what `stepscope serve --simulate` reports
SIM_PEAK = 1e12  # configured bf16 peak for the simulated model: CPU-sized, so MFU < 1
WARMUP = 5
JOB_DDP, JOB_SLOW = "mgv-ddp", "mgv-straggler"
PHASES = ("data_wait", "compute", "comm", "other")


class Run:
    """One validation run: its arguments, temp and raw-output folders, the exporter and
    the report the checks fill."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.raw = Path(tempfile.mkdtemp(prefix="mgv-raw-"))
        self.tmp = Path(tempfile.mkdtemp(prefix="mgv-"))
        self.ingest = f"unix://{self.tmp}/ingest.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            **MULTICAST_OFF,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO / "exporter"), os.environ.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
        if args.cpu:
            self.env["STEPSCOPE_PEAK_FLOPS"] = json.dumps({SIM_MODEL: {"bf16": SIM_PEAK}})
        self.exporter: subprocess.Popen[bytes] | None = None
        self.rep = Report()

    # exporter
    def start_exporter(self) -> bool:
        a = self.args
        (self.tmp / "stepscope.yaml").write_text(
            f"interval: 1\ningest: {self.ingest}\nmfu_window: 600\n"
            f"diagnosis: {{window: {a.window}}}\n"
        )
        cmd = [
            sys.executable,
            "-m",
            "stepscope",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--config",
            str(self.tmp / "stepscope.yaml"),
        ]
        if a.cpu:
            cmd += ["--simulate", str(a.ranks)]
        self.rep.data["exporter_cmd"] = " ".join(cmd[1:])
        log = self.raw / "exporter.log"
        self.exporter = subprocess.Popen(
            cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=self.env
        )
        if not wait_for_exporter(self.port, self.exporter, log):
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a full sampling pass with every GPU in it
            try:
                get(self.url + "/readyz")
                if "stepscope_gpu_info{" in scrape(self.port):
                    return True
            except OSError:
                pass
            time.sleep(0.5)
        return False

    def stop_exporter(self) -> None:
        if self.exporter and self.exporter.poll() is None:
            self.exporter.send_signal(signal.SIGTERM)
            try:
                self.exporter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.exporter.kill()

    # phase runner
    def run_phase(self, job: str, seconds: float, delay: float,
                  uuids: list[str]) -> dict[str, Any]:  # fmt: skip
        """Launch the ranks, scrape every second, read the diagnosis once the window
        lies inside the measured steps; return scrapes, results and documents."""
        a = self.args
        master = free_port()
        started = self.tmp / f"started-{job}"
        procs: list[subprocess.Popen[bytes]] = []
        for r in range(a.ranks):
            env = {
                **self.env,
                **MULTICAST_OFF,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master),
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(a.ranks),
                "LOCAL_WORLD_SIZE": str(a.ranks),
                "OMP_NUM_THREADS": "1",
            }
            if not a.cpu:
                env["NCCL_DEBUG"] = "INFO"
                env["NCCL_DEBUG_SUBSYS"] = "INIT,BOOTSTRAP,ENV,NET"
                env["NCCL_DEBUG_FILE"] = str(self.raw / f"nccl-{job}-rank{r}.log")
            cmd = [
                sys.executable,
                "-m",
                "validation.multi_gpu.rank",
                "--job",
                job,
                "--ingest",
                self.ingest,
                "--seconds",
                str(seconds),
                "--delay",
                str(delay),
                "--slow-rank",
                str(a.slow_rank),
                "--started",
                str(started),
                "--result",
                str(self.tmp / f"result-{job}-{r}.json"),
            ]
            if a.cpu:
                cmd += ["--cpu", "--uuid", uuids[r]]
            log = (self.raw / f"rank-{job}-{r}.log").open("wb")
            procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            )
        scrapes: list[tuple[int, str]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def scraper() -> None:
            i = 0
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    scrapes.append((i, scrape(self.port)))
                i = int(time.monotonic() - t0) + 1  # a late scrape skips its slot
                stop.wait(max(0.0, t0 + i - time.monotonic()))

        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        doc: dict[str, Any] | None = None
        cli: dict[str, Any] = {}
        limit = time.monotonic() + seconds + a.startup_timeout
        while time.monotonic() < limit and any(p.poll() is None for p in procs):
            if (
                doc is None
                and started.exists()
                and time.time() - float(started.read_text() or 0) >= a.window + 2
            ):
                doc = json.loads(get(self.url + "/api/v1/diagnosis"))
                cli = self.diagnose_cli()
            time.sleep(0.2)
        for p in procs:
            if p.poll() is None:  # a hung collective: stop our own ranks
                p.kill()
            p.wait()
        time.sleep(2.5)  # the last datagrams and one more sampling pass
        stop.set()
        th.join()
        scrapes.append((int(time.monotonic() - t0) + 1, scrape(self.port)))
        results = []
        for r in range(a.ranks):
            f = self.tmp / f"result-{job}-{r}.json"
            results.append(json.loads(f.read_text()) if f.exists() else None)
        return {
            "scrapes": scrapes,
            "results": results,
            "codes": [p.returncode for p in procs],
            "diagnosis": doc,
            "cli": cli,
        }

    def diagnose_cli(self) -> dict[str, Any]:
        base = [sys.executable, "-m", "stepscope", "diagnose", "--exporter", self.url]
        js = subprocess.run(
            [*base, "--json"], capture_output=True, text=True, env=self.env, timeout=60
        )
        tx = subprocess.run(base, capture_output=True, text=True, env=self.env, timeout=60)
        try:
            doc = json.loads(js.stdout)
        except ValueError:
            doc = None
        return {
            "rc": js.returncode,
            "doc": doc,
            "text": tx.stdout + tx.stderr,
            "text_rc": tx.returncode,
            "stderr": js.stderr,
        }

    # the checks
