"""A healthy training job on a real GPU, watched live by a real Prometheus with the shipped
rules: no alert may fire, or even go pending (issue 25's live check).

    python -m validation.gpu_healthy_alerts --out DIR [--seconds 420]
    python -m validation.gpu_healthy_alerts --out DIR --cpu --seconds 60   # rehearsal

Starts a ``stepscope serve`` on the real GPU (detached, with its ingest socket), a
Prometheus (the ``prometheus`` on PATH) that scrapes it every 15 s and evaluates the
shipped rule files of ``deploy/prometheus/rules`` unchanged, every 15 s, and trains a
GPT-style transformer in bf16 (fused AdamW) on GPU 0 reporting every step through
``StepReporter`` (tokens, FLOPs per token: MFU). A busy H200 sits at its 700 W power cap
the whole time (the software power-cap clock event active in every sample), which is what
the old ``StepscopeGpuPowerCapped`` fired on.

Every 15 s it reads Prometheus's ``ALERTS`` (pending and firing) and the rank's and GPU's
verdicts from ``/api/v1/diagnosis``; at the end, every alert series seen over the run
(``ALERTS`` over the whole run), each rule's health and last error, which recording
rules returned data, and the series the node served. An alert in any state is a FAIL:
``pending`` means its expression was true on a healthy GPU, whatever its ``for:``; so is a
rank verdict other than ``compute`` once the diagnosis window holds the run's steps
(issue 34: a healthy bf16 run must stay ``compute`` under the largest-loss policy).
Writes ``healthy_alerts.md`` (printed too), ``healthy_alerts.json``, the last scrape,
the exporter's and Prometheus's logs to ``--out`` (default ``$OUT``). Exit 0 on PASS.
``--cpu`` rehearses the harness: a small model on the CPU, one simulated H200.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._local import free_port, get, scrape, wait_ready
from tests.support import REPO
from validation._classes import (
    ExporterDidNotStart,
    class_gpu_uuid,
    pick_device,
    start_class_exporter,
)
from validation._gpt import gpt, non_embedding_params

RULES = REPO / "deploy" / "prometheus" / "rules"
JOB = "healthy"
RANK = "rank 0"
WINDOW = 30.0  # the exporter's diagnosis window (s)
CLUSTER = "h200-validation"


def start_prometheus(
    tmp: Path, port: int, log: Path, scrape_s: int
) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus scraping the exporter at ``port`` with the shipped rules unchanged."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is not on PATH")
    config = {
        "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": f"{scrape_s}s",
                   "scrape_timeout": "10s"},
        "rule_files": [str(p) for p in sorted(RULES.glob("*.yml"))],
        "scrape_configs": [{
            "job_name": "stepscope", "honor_labels": False,
            "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                "labels": {"cluster": CLUSTER}}],
        }],
    }  # fmt: skip
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address={url.removeprefix('http://')}", "--log.level=warn"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    wait_ready(url, proc, log)
    return proc, url


def query(url: str, expr: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


# StepscopeWatchdog (severity none) fires always, by design: the dead man's switch that
# proves the alerting path works. It is reported on its own line, not as an alert.
PAGING_ALERTS = 'ALERTS{severity!="none"}'


def alert_names(result: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{r['metric'].get('alertname')} ({r['metric'].get('alertstate')})"
                  for r in result)  # fmt: skip


class Watch:
    """Every ``every`` s: Prometheus's ALERTS and the job's and GPU's verdicts."""

    def __init__(self, prom: str, exporter: Any, every: float) -> None:
        self.prom, self.exporter, self.every = prom, exporter, every
        self.ticks: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(self.every):
            tick: dict[str, Any] = {"t": round(time.monotonic() - t0, 1)}
            try:
                tick["alerts"] = alert_names(query(self.prom, PAGING_ALERTS))
            except OSError as e:
                tick["alerts_error"] = str(e)
            doc = self.exporter.diagnosis()
            for v in (doc or {}).get("verdicts", []):
                s = v["subject"]
                who = f"rank {s['rank']}" if s.get("job") == JOB else (
                    f"gpu {s['gpu']}" if s.get("job") is None else None)
                if who is not None:
                    tick[who] = v["kind"] + "".join(f"+{m}" for m in v["modifiers"])
            self.ticks.append(tick)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--seconds", type=float, default=420.0, help="training time")
    ap.add_argument("--scrape", type=int, default=15, help="scrape and evaluation interval (s)")
    ap.add_argument("--cpu", action="store_true", help="rehearse: small model, simulated GPU")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.nn.functional as F

    from stepscope.train import StepReporter, transformer_flops_per_token

    picked = pick_device(a.cpu, "gpu_healthy_alerts")
    if picked is None:
        return 2
    device, device_name = picked
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-healthy-"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    try:
        exp, doc = start_class_exporter(JOB, device, tmp, a.out / "exporter.log", env, WINDOW, {})
    except ExporterDidNotStart as e:
        print(f"gpu_healthy_alerts: the exporter did not start:\n{e}", file=sys.stderr)
        return 1
    prom, prom_url = start_prometheus(tmp, exp.port, a.out / "prometheus.log", a.scrape)

    d_model, n_layers, n_heads, seq, batch, vocab = 2048, 12, 16, 2048, 8, 32768
    if device == "cpu":
        d_model, n_layers, n_heads, seq, batch, vocab = 128, 2, 4, 64, 4, 512
    head_dim = d_model // n_heads

    torch.manual_seed(0)
    model = gpt(d_model, n_layers, n_heads, vocab).to(device, torch.bfloat16)
    n_params = non_embedding_params(model)
    fpt = transformer_flops_per_token(n_params, n_layers, n_heads, head_dim, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    data = torch.randint(0, vocab, (4, batch, seq + 1), device=device)
    uuid = class_gpu_uuid(device, torch, doc)
    rep = StepReporter(job=JOB, flops_per_token=fpt, precision="bf16", ingest=exp.ingest,
                       warmup_steps=5, gpu_uuid=uuid or None)  # fmt: skip
    watch = Watch(prom_url, exp, float(a.scrape))
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()
    start = time.monotonic()
    steps = 0
    try:
        while time.monotonic() - start < a.seconds:
            ids = data[steps % 4]
            with rep.step(tokens=batch * seq):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            steps += 1
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.monotonic() - start
        time.sleep(a.scrape + 2)  # one more scrape and evaluation of the last steps
        watch.stop.set()
        watcher.join()
        last = scrape(exp.port)
        (a.out / "metrics_last.txt").write_text(last)
        span = int(time.monotonic() - start) + 60
        ever = alert_names(query(prom_url, f"count_over_time({PAGING_ALERTS}[{span}s])"))
        heartbeat = alert_names(query(prom_url, 'ALERTS{severity="none"}'))
        rules = json.loads(get(f"{prom_url}/api/v1/rules"))["data"]["groups"]
        unhealthy = [f"{g['name']}/{r['name']}: {r.get('lastError', '')}"
                     for g in rules for r in g["rules"] if r.get("health") != "ok"]  # fmt: skip
        records = sorted({r["name"] for g in rules for r in g["rules"] if r["type"] == "recording"})
        with_data = [n for n in records if query(prom_url, f"count({n})")]
        mfu = query(prom_url, f'stepscope_mfu_ratio{{training_job="{JOB}"}}')
        served = len([ln for ln in last.splitlines() if ln and not ln.startswith("#")])
    finally:
        rep.close()
        exp.stop()
        prom.terminate()
        prom.wait(timeout=30)
    subjects = sorted({k for t in watch.ticks for k in t if k.startswith(("rank", "gpu"))})
    kinds = {who: Counter(t[who] for t in watch.ticks if who in t) for who in subjects}
    pending_or_firing = sorted({x for t in watch.ticks for x in t.get("alerts", [])} | set(ever))
    # once the window holds measured steps the rank must read compute (its modifiers are
    # advice: power_cap at full bf16 load), never a bottleneck (issue 34)
    judged = [t[RANK] for t in watch.ticks if RANK in t and t["t"] >= WINDOW + a.scrape]
    not_compute = sorted({k for k in judged if k.split("+")[0] != "compute"})
    ok = not pending_or_firing and not unhealthy and bool(judged) and not not_compute
    result = {
        "device": device_name, "seconds": round(elapsed, 1), "steps": steps,
        "scrape_s": a.scrape, "alerts_seen": pending_or_firing, "heartbeat": heartbeat,
        "rule_errors": unhealthy,
        "recording_rules": len(records), "recording_rules_with_data": with_data,
        "served_series": served, "mfu": [float(r["value"][1]) for r in mfu],
        "verdicts": {k: dict(v) for k, v in kinds.items()}, "ticks": watch.ticks,
        "rank_not_compute": not_compute, "rank_judged": len(judged),
        "pass": ok,
    }  # fmt: skip
    (a.out / "healthy_alerts.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# A healthy training job on {result['device']}, watched by Prometheus "
        "with the shipped rules",
        "",
        f"{steps} bf16 steps of a GPT-style model ({n_params / 1e6:.0f} M non-embedding "
        f"parameters, seq {seq}, batch {batch}) in {elapsed:.0f} s; the exporter scraped and "
        f"the rules evaluated every {a.scrape} s ({len(watch.ticks)} checks).",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| alerts pending or firing at any check, or in `ALERTS` over the run | "
        f"{', '.join(pending_or_firing) or 'none'} |",
        f"| the heartbeat (severity none, always firing by design) | "
        f"{', '.join(heartbeat) or 'not firing'} |",
        f"| rules with an evaluation error | {len(unhealthy)} |",
        f"| recording rules returning data | {len(with_data)} of {len(records)} |",
        f"| series the node served (last scrape) | {served} |",
        f"| served MFU | {', '.join(f'{v:.3f}' for v in result['mfu']) or 'none'} |",
    ]
    for who, c in kinds.items():
        lines.append(f"| {who} verdicts | {dict(c)} |")
    lines.append(f"| rank verdicts other than `compute` once the {WINDOW:g} s window filled "
                 f"({len(judged)} checks) | {', '.join(not_compute) or 'none'} |")  # fmt: skip
    lines += ["", f"Result: {'PASS' if ok else 'FAIL'}"]
    lines += [f"- rule error: {u}" for u in unhealthy]
    report = "\n".join(lines) + "\n"
    (a.out / "healthy_alerts.md").write_text(report)
    print(report)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
