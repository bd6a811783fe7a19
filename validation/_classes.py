"""What the class-by-class acceptance runs share (``gpu_diagnose_wave2``, ``gpu_lost_time``):
an exporter started for one class (detached: it must not be the training process's
child), its first verdicts awaited, the class's GPU UUID, the rank's verdict polled once a
second after the diagnosis window filled, and the row that tallies the polls."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._local import free_port, get, pid_alive, start_detached_exporter, stop_pid


def pick_device(cpu: bool, script: str) -> tuple[str, str] | None:
    """("cpu" or "cuda", a name for the report); None (after one line on stderr) when a
    GPU run finds no CUDA. On CUDA, device 0 is initialised and made current."""
    import torch

    if cpu:
        return "cpu", "CPU (simulated H200 for the GPU side)"
    if not torch.cuda.is_available():
        print(f"{script}: CUDA not available (use --cpu to rehearse)", file=sys.stderr)
        return None
    torch.cuda.init()
    torch.cuda.set_device(0)
    return "cuda", torch.cuda.get_device_name(0)


class ExporterDidNotStart(RuntimeError):
    """The class's exporter died or served no verdict within a minute; the log's tail."""


@dataclass
class ClassExporter:
    """A ``stepscope serve`` for one class: its port, ingest URL, pid and log."""

    name: str
    port: int
    ingest: str
    pid: int
    log: Path

    def diagnosis(self) -> dict[str, Any] | None:
        """The exporter's ``/api/v1/diagnosis``, or None while it does not answer."""
        try:
            doc: dict[str, Any] = json.loads(get(f"http://127.0.0.1:{self.port}/api/v1/diagnosis"))
        except OSError:
            return None
        return doc

    def stop(self) -> None:
        stop_pid(self.pid)


def start_class_exporter(
    name: str,
    device: str,
    tmp: Path,
    log: Path,
    env: dict[str, str],
    window: float,
    workload: Mapping[str, Any],
) -> tuple[ClassExporter, dict[str, Any]]:
    """Start the class's exporter (on the CPU: one simulated H200 playing ``workload``)
    and wait for its first verdicts; the exporter and that first diagnosis."""
    port = free_port()
    ingest = f"unix://{tmp}/{name}.sock"
    cfg = tmp / f"{name}.yaml"
    lines = ["interval: 1", "slow_interval: 2", f"ingest: {ingest}",
             f"diagnosis: {{window: {window}}}"]  # fmt: skip
    if device == "cpu":
        scenario = tmp / f"{name}-gpu.yaml"
        scenario.write_text(json.dumps({"gpus": 1, "model": "NVIDIA H200",
                                        "workload": dict(workload)}))  # fmt: skip
        lines.append(f"scenario: {scenario}")
    cfg.write_text("\n".join(lines) + "\n")
    pid = start_detached_exporter(["--listen", f"127.0.0.1:{port}", "--config", str(cfg)],
                                  log, env)  # fmt: skip
    exporter = ClassExporter(name, port, ingest, pid, log)
    deadline = time.monotonic() + 60
    while True:
        doc = exporter.diagnosis()
        if doc is not None and doc.get("verdicts"):
            return exporter, doc
        if not pid_alive(pid) or time.monotonic() > deadline:
            exporter.stop()
            raise ExporterDidNotStart(log.read_text()[-2000:])
        time.sleep(0.2)


def class_gpu_uuid(device: str, torch: Any, doc: Mapping[str, Any]) -> str:
    """The UUID the rank reports: the real GPU's, or the simulated GPU 0's."""
    if device == "cuda":
        from stepscope.train._env import cuda_device_uuid

        return cuda_device_uuid(torch, 0) or ""
    return str(next(v["subject"]["uuid"] for v in doc["verdicts"] if v["subject"]["gpu"] == 0))


@dataclass
class VerdictPolls:
    """Polls the job's verdict once a second after ``window`` + 3 s, until ``count``."""

    exporter: ClassExporter
    window: float
    count: float
    polls: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        time.sleep(self.window + 3)  # the window fills with this class's steps first
        while not self.stop.wait(1.0):
            doc = self.exporter.diagnosis()
            if doc is None:
                continue  # a busy exporter: the next poll
            job = self.exporter.name
            v = next((v for v in doc["verdicts"] if v["subject"]["job"] == job), None)
            if v is not None:
                self.polls.append(v)
            if len(self.polls) >= self.count:
                self.stop.set()


def tally(
    name: str,
    expected: tuple[str, str | None],
    polls: list[dict[str, Any]],
    steps: int,
    elapsed: float,
    signals: Iterable[str],
    right: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """The class's row: how many polls read the expected kind (and modifier), the kinds
    seen, the step rate and the last poll's signals, advice and evidence."""
    kind, modifier = expected

    def is_right(v: dict[str, Any]) -> bool:
        return v["kind"] == kind and (modifier is None or modifier in v["modifiers"])

    judge = right or is_right
    last = polls[-1] if polls else {}
    sig = last.get("signals", {})
    return {
        "class": name, "expected": kind + (f"+{modifier}" if modifier else ""),
        "polls": len(polls), "right": sum(1 for v in polls if judge(v)),
        "counts": dict(Counter(v["kind"] for v in polls)),
        "verdicts": dict(Counter(v["kind"] + "".join(f"+{m}" for m in v["modifiers"])
                                 for v in polls)),
        "steps_per_s": steps / elapsed if elapsed else 0.0,
        "signals": {k: sig.get(k) for k in signals},
        "advice": last.get("advice", ""), "evidence": last.get("evidence", []),
    }  # fmt: skip
