"""Prove the training path on a real GPU: the MFU the exporter serves vs. an independent count.

Trains a small GPT-style transformer in bf16 on GPU 0 with ``StepReporter`` reporting to
a ``stepscope serve`` started here, and while it trains scrapes ``/metrics``. The script
also counts, on its own, tokens per second between two ``torch.cuda.synchronize()``
calls after warm-up; MFU_independent = tokens/s × FLOPs per token ÷ peak (989.4 TFLOP/s,
dense bf16, H100 SXM / H200 datasheet). The two must agree within 2%.

Writes ``train_validation.md`` and the last scrape to ``--out`` (default ``$OUT``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks._local import free_port, scrape, wait_for_exporter
from tests.support import REPO
from validation._gpt import gpt, non_embedding_params

PEAK_BF16 = 989.4e12


def series(text: str, name: str, match: str = "") -> list[float]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") and match in line:
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--seconds", type=float, default=45.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.nn.functional as F

    from stepscope.train import StepReporter, transformer_flops_per_token

    if not torch.cuda.is_available():
        print("gpu_train_validation: CUDA not available", file=sys.stderr)
        return 2

    port = free_port()
    sock_dir = Path("/tmp/stepscope-val")
    sock_dir.mkdir(exist_ok=True)
    ingest = f"unix://{sock_dir}/ingest.sock"
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    log = open(args.out / "train_exporter.log", "w")  # noqa: SIM115
    exporter = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "serve", "--listen", f"127.0.0.1:{port}",
         "--ingest", ingest, "--mfu-window", "20"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    if not wait_for_exporter(port, exporter, args.out / "train_exporter.log"):
        return 1

    d_model, n_layers, n_heads, seq, batch, vocab = 2048, 12, 16, 2048, 8, 32768
    head_dim = d_model // n_heads

    torch.manual_seed(0)
    model = gpt(d_model, n_layers, n_heads, vocab).cuda().to(torch.bfloat16)
    n_params = non_embedding_params(model)
    fpt = transformer_flops_per_token(n_params, n_layers, n_heads, head_dim, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens_per_step = batch * seq
    data = torch.randint(0, vocab, (4, batch, seq + 1), device="cuda")

    rep = StepReporter(job="h200-validation", flops_per_token=fpt, precision="bf16",
                       ingest=ingest, warmup_steps=5)
    scrapes: list[str] = []

    def scraper(at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        for _ in range(3):
            scrapes.append(scrape(port))
            time.sleep(1.0)

    start = time.monotonic()
    warm = 8
    t0 = 0.0
    steps = 0
    counted_tokens = 0
    thread = threading.Thread(target=scraper, args=(start + args.seconds - 4,))
    thread.start()
    while True:
        now = time.monotonic()
        if steps == warm:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if now - start > args.seconds:
            break
        batch_ids = data[steps % 4]
        with rep.step(tokens=tokens_per_step):
            logits = model(batch_ids[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), batch_ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps += 1
        if steps > warm:
            counted_tokens += tokens_per_step
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    thread.join()
    rep.close()
    exporter.terminate()
    exporter.wait(timeout=15)

    tok_s = counted_tokens / (t1 - t0)
    mfu_indep = tok_s * fpt / PEAK_BF16
    text = scrapes[-1]
    (args.out / "train_metrics.txt").write_text(text)
    served = [series(t, "stepscope_mfu_ratio", 'training_job="h200-validation"') for t in scrapes]
    served_vals = [v[0] for v in served if v]
    mfu_served = served_vals[-1] if served_vals else math.nan
    diff = (mfu_served - mfu_indep) / mfu_indep * 100
    hsum = series(text, "stepscope_step_duration_seconds_sum")
    hcount = series(text, "stepscope_step_duration_seconds_count")
    phases = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'stepscope_step_phase_seconds_total\{[^}]*phase="(\w+)"[^}]*\} (\S+)', text)}
    peak = series(text, "stepscope_gpu_peak_flops", 'precision="bf16"')
    info = re.search(r"^stepscope_training_rank_info\{.*$", text, re.M)
    sm = series(text, "DCGM_FI_PROF_SM_ACTIVE")
    tensor = series(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
    lines = [
        "# Training SDK + exporter on a real GPU: MFU",
        "",
        f"Model: GPT-style, d_model {d_model}, {n_layers} layers, {n_heads} heads, seq {seq}, "
        f"batch {batch}, vocab {vocab}, bf16 weights, fused AdamW. N (non-embedding) = "
        f"{n_params / 1e6:.1f} M; FLOPs/token (6N + 12·L·H·Q·T) = {fpt / 1e9:.3f} GFLOP.",
        f"Steps: {steps} in {args.seconds:.0f} s ({warm} warm-up excluded from the independent "
        f"count; the SDK flags 5 as warm-up).",
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| independent tokens/s (synchronized wall clock) | {tok_s:,.0f} |",
        f"| independent MFU = tokens/s × FLOPs/token ÷ {PEAK_BF16 / 1e12:.1f} TFLOP/s | "
        f"{mfu_indep:.4f} |",
        f"| served `stepscope_mfu_ratio` (20 s window), last 3 scrapes | "
        f"{', '.join(f'{v:.4f}' for v in served_vals)} |",
        f"| difference (served − independent) / independent | {diff:+.2f}% |",
        f"| served `stepscope_gpu_peak_flops{{precision=\"bf16\"}}` | "
        f"{peak[0] if peak else 'absent'} |",
        f"| served mean step time (histogram sum/count) | "
        f"{(hsum[0] / hcount[0]) if hcount and hcount[0] else 'absent'} s |",
        f"| independent mean step time | {(t1 - t0) / max(1, steps - warm):.4f} s |",
        f"| served phases (s) | {phases} |",
        f"| served SM active / tensor active | {sm[:1]} / {tensor[:1]} |",
        "",
        f"Rank info: `{info.group(0) if info else 'missing'}`",
        "",
        f"Verdict: {'PASS' if abs(diff) <= 2 else 'FAIL'} (|difference| <= 2%)",
    ]
    report = "\n".join(lines) + "\n"
    (args.out / "train_validation.md").write_text(report)
    print(report)
    return 0 if abs(diff) <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
