"""Time lost between steps and to host-to-device copies, on a GPU (issue 26, items 1-2).

    python -m validation.gpu_lost_time --out DIR            # on a CUDA GPU (the H200)
    python -m validation.gpu_lost_time --out DIR --cpu      # rehearsal, simulated GPU
    python -m validation.gpu_lost_time --out DIR --final-save   # the final save alone

Each class is a small training loop made to lose its GPU one way, reporting every step
through the SDK (``StepReporter``: CUDA event timing on a GPU) to a ``stepscope serve``
started for the class (detached: the exporter must not be the training process's
child). After the diagnosis window has filled, the rank's verdict is read from
``/api/v1/diagnosis`` once a second for ``--seconds``; the counts make the table.

- ``compute``: bf16 matmuls of 8192 x 8192, nothing else: the healthy baseline,
  expected ``compute`` with no ``between_steps`` share to speak of.
- ``checkpoint_named``: the same steps (fewer matmuls) and every ``--every`` steps a
  synchronous ``torch.save`` of ``--checkpoint-mb`` MB of GPU tensors, fsynced, inside
  ``reporter.phase("checkpoint")``: expected ``between_steps`` + ``checkpoint``.
- ``checkpoint_unnamed``: the same save without ``phase()``: ``between_steps``, no
  modifier (it read ``unknown`` before issue 26).
- ``evaluation_unnamed``: the ``checkpoint`` classes' steps and every ``--every`` steps
  an evaluation pass outside any step, not named: ``--eval-batches`` forward passes of
  the same matmuls without gradients, ending in ``.item()`` (a metric, as evaluation
  code reads one), about 40% of the wall time while the step bodies are the rest
  (issue 34: it read ``compute``, "the GPU is the limit"). Expected ``between_steps`` +
  ``unnamed_gpu_work``: the GPU works between steps.
- ``evaluation_named``: the same pass inside ``reporter.phase("evaluation")``:
  ``between_steps`` + ``evaluation``.
- ``pageable_copy``: each step copies a ``--batch-mb`` MB batch from pageable host
  memory (``.to("cuda")``, blocking) and runs one bf16 matmul: PCIe receive busy, SMs
  idle; expected ``transfer_bound`` (it read ``host_bound``, advice CUDA graphs).
- ``resident``: the fix, the same batch kept on the GPU: expected ``compute``.
- ``final_save``: the ``compute`` steps, then after the last one a synchronous save of
  ``--checkpoint-mb`` MB inside ``reporter.phase("checkpoint")`` and ``close()``
  (issue 34 item 3): expected ``compute`` while it steps, and the save, timed by the
  loop's own clock, booked as ``unproductive_checkpoint_save_time``, not ``idle``.
  ``--final-save`` runs this class alone.

``--cpu`` runs the loops on the CPU against an exporter with one simulated H200 whose
scenario plays what the GPU would show (``pageable_copy``: ``wait: copy``, PCIe receive
6.9 GB/s in the gaps): the host side (the SDK's timing and spans, the process's CPU) is
real, the GPU side scripted. Each class's goodput books (``/api/v1/diagnosis``: goodput
and badput by cause, issue 26 item 4) are read after its loop and tabled too. Writes
``lost_time.md``, ``lost_time.json`` and each
class's exporter log to ``--out`` (default ``$OUT``). About 30 s a class; ``--budget``
(default 290 s) skips the classes that would start after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import REPO
from validation._classes import (
    ExporterDidNotStart,
    VerdictPolls,
    class_gpu_uuid,
    pick_device,
    start_class_exporter,
    tally,
)

# class -> (expected kind, expected modifier or None)
EXPECTED: dict[str, tuple[str, str | None]] = {
    "compute": ("compute", None),
    "checkpoint_named": ("between_steps", "checkpoint"),
    "checkpoint_unnamed": ("between_steps", None),
    "evaluation_unnamed": ("between_steps", "unnamed_gpu_work"),
    "evaluation_named": ("between_steps", "evaluation"),
    "pageable_copy": ("transfer_bound", None),
    "resident": ("compute", None),
    "final_save": ("compute", None),
}
# --cpu: what the simulated GPU shows for each class (docs/scenarios.md)
# (a save idles the GPU: kernels run in the step bodies only, ~10% of the time; an
# evaluation pass keeps it busy between steps too)
SAVING_GPU = {"activity": "sawtooth", "period": 0.05, "duty": 0.1}
CPU_SCENARIOS: dict[str, dict[str, Any]] = {
    "compute": {},
    "checkpoint_named": SAVING_GPU,
    "checkpoint_unnamed": SAVING_GPU,
    "evaluation_unnamed": {},
    "evaluation_named": {},
    "pageable_copy": {"activity": "sawtooth", "period": 0.01, "duty": 0.1, "level": 0.9,
                      "wait": "copy"},
    "resident": {},
    "final_save": {},
}
WINDOW = 10.0  # diagnosis window (s): holds several checkpoints at the default --every
SIGNALS = ("sm_active", "gpu_util", "pcie_rx_bytes_per_second", "main_cpu_cores",
           "compute_share", "between_steps_share", "between_steps_gpu_busy",
           "step_seconds")  # fmt: skip


Step = Callable[[int], None]


def _nothing(i: int) -> None:
    pass


def _loop(name: str, device: str, a: argparse.Namespace, tmp: Path,
          phase: Callable[[str], Any]) -> tuple[Step, Step]:  # fmt: skip
    """The class's training step and what the loop does after it (both given the step's
    number); the reporter's spans used there."""
    import contextlib

    import torch

    cuda = device == "cuda"
    n = 8192 if cuda else 512
    w = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    if name in ("compute", "final_save"):

        def matmuls(i: int) -> None:
            for _ in range(4):
                w @ w

        return matmuls, _nothing
    if name.startswith("checkpoint"):
        elems = a.checkpoint_mb * (1 << 20) // 2
        state = {"weights": torch.randn(elems, device=device, dtype=torch.bfloat16)}
        path = tmp / "checkpoint.pt"
        named = name == "checkpoint_named"

        def matmuls2(i: int) -> None:
            for _ in range(2):
                w @ w

        def save_every(i: int) -> None:
            if i % a.every == a.every - 1:
                if cuda:
                    torch.cuda.synchronize()  # the step's work is done: the save blocks
                span = phase("checkpoint") if named else contextlib.nullcontext()
                with span, open(path, "wb") as f:
                    torch.save(state, f)  # device to host, then to disk
                    f.flush()
                    os.fsync(f.fileno())

        return matmuls2, save_every
    if name.startswith("evaluation"):
        named_eval = name == "evaluation_named"

        def matmuls3(i: int) -> None:
            for _ in range(2):
                w @ w

        def evaluate_every(i: int) -> None:
            if i % a.every == a.every - 1:
                span = phase("evaluation") if named_eval else contextlib.nullcontext()
                with span, torch.no_grad():
                    for _ in range(a.eval_batches):
                        (w @ w)[0, 0].item()  # a metric read on the host ends each batch

        return matmuls3, evaluate_every
    rows = a.batch_mb * (1 << 20) // 4 // n
    host = torch.randn(rows, n)  # pageable host memory
    resident = host.to(device)

    # on the CPU a copy of the same bytes (.to("cpu") would copy nothing)
    copy: Callable[[], Any] = (lambda: host.to(device)) if cuda else host.clone

    def step(i: int) -> None:
        x = copy() if name == "pageable_copy" else resident
        (x[:n].to(torch.bfloat16) @ w).sum()

    return step, _nothing


def run_class(name: str, device: str, a: argparse.Namespace, tmp: Path,
              env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """Start an exporter for the class, run its loop, poll its verdict; the row."""
    import torch

    from stepscope.train import StepReporter

    try:
        exporter, doc = start_class_exporter(name, device, tmp, a.out / f"exporter-{name}.log",
                                             env, WINDOW, CPU_SCENARIOS[name])  # fmt: skip
    except ExporterDidNotStart as err:
        return {"class": name, "error": "exporter did not start", "log": str(err)}
    try:
        rep = StepReporter(name, ingest=exporter.ingest,
                           gpu_uuid=class_gpu_uuid(device, torch, doc), warmup_steps=3)
        step, between = _loop(name, device, a, tmp, rep.phase)
        polls = VerdictPolls(exporter, WINDOW, a.seconds)
        poller = polls.start()
        t0 = time.perf_counter()
        steps = 0
        while not polls.stop.is_set() and time.perf_counter() - t0 < a.seconds + WINDOW + 30:
            with rep.step():
                step(steps)
            between(steps)  # a checkpoint, between this step and the next
            steps += 1
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        polls.stop.set()
        poller.join(timeout=5)
        saved = _final_save(a, device, tmp, rep.phase) if name == "final_save" else None
        rep.close()
        time.sleep(1.5)  # the last steps booked (a pass or two)
        books = _goodput(exporter.diagnosis(), name)
        del step, between
        if device == "cuda":
            torch.cuda.empty_cache()
    finally:
        exporter.stop()
    kind, modifier = EXPECTED[name]

    def right(v: dict[str, Any]) -> bool:
        # an unnamed save must read between_steps with no modifier (the GPU idles while it
        # saves: no unnamed_gpu_work); an unnamed evaluation with that modifier alone
        return (v["kind"] == kind and (modifier is None or modifier in v["modifiers"])
                and (kind != "between_steps" or v["modifiers"] == ([modifier] if modifier
                                                                   else [])))

    return {**tally(name, EXPECTED[name], polls.polls, steps, elapsed, SIGNALS, right),
            "goodput": books, "final_save_seconds": saved}


def _final_save(a: argparse.Namespace, device: str, tmp: Path,
                phase: Callable[[str], Any]) -> float:  # fmt: skip
    """The save after the last step (fsynced, inside ``phase("checkpoint")``); its
    seconds by the loop's own clock."""
    import torch

    state = {"weights": torch.randn(a.checkpoint_mb * (1 << 19), device=device,
                                    dtype=torch.bfloat16)}  # fmt: skip
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    with phase("checkpoint"), open(tmp / "final.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def render_final_save(rows: list[dict[str, Any]]) -> list[str]:
    """The final save against what the books say of it."""
    out = []
    for r in rows:
        saved, books = r.get("final_save_seconds"), r.get("goodput")
        if saved is None or not books:
            continue
        causes = books["badput_gpu_seconds"]
        booked = causes.get("unproductive_checkpoint_save_time") or 0.0
        out += ["", f"Final save after the last step ({r['class']}): {saved:.3f} s by the "
                f"loop's clock; booked as checkpoint {booked:.3f} s "
                f"({100 * (booked - saved) / saved:+.1f}%), idle "
                f"{causes.get('idle') or 0.0:.3f} s, pending "
                f"{books['pending_gpu_seconds']:.3f} s."]  # fmt: skip
    return out


def _goodput(doc: dict[str, Any] | None, job: str) -> dict[str, Any] | None:
    """The class's goodput books from ``/api/v1/diagnosis`` (GPU-seconds), or None."""
    for j in (doc or {}).get("goodput", []):
        if j["job"] == job:
            return j  # type: ignore[no-any-return]
    return None


def render_goodput(rows: list[dict[str, Any]]) -> list[str]:
    """Where each class's GPU time went: goodput and the causes of badput, as shares of
    the time its rank held the GPU (booked; pending: since its last reported step)."""
    books = [(r["class"], r["goodput"]) for r in rows if r.get("goodput")]
    if not books:
        return []
    causes = [c for c in books[0][1]["badput_gpu_seconds"]
              if any((b["badput_gpu_seconds"].get(c) or 0) > 0 for _, b in books)]
    out = ["", "Goodput: where each class's GPU time went, as shares of the time its rank "
           "held the GPU (`/api/v1/diagnosis`, after the loop).", "",
           "| class | held GPU-s | goodput | " + " | ".join(causes) + " | pending |",
           "|---|---|---|" + "---|" * (len(causes) + 1)]  # fmt: skip
    for name, b in books:
        held = b["held_gpu_seconds"] or 0.0

        def share(v: float | None, held: float = held) -> str:
            return "-" if not held or v is None else f"{100 * v / held:.1f}%"

        out.append(f"| {name} | {held:.1f} | {share(b['goodput_gpu_seconds'])} | "
                   + " | ".join(share(b["badput_gpu_seconds"].get(c)) for c in causes)
                   + f" | {share(b['pending_gpu_seconds'])} |")  # fmt: skip
    return out


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def render(rows: list[dict[str, Any]], device_name: str) -> str:
    """The table: rows are classes, columns the verdict kinds seen and the signals."""
    from stepscope.diagnose.model import KINDS

    seen = [k for k in KINDS if any(k in r.get("counts", {}) for r in rows)]
    out = [f"# Time lost between steps and to copies on {device_name}", "",
           "Polls of the rank's verdict, one a second after the diagnosis window "
           f"({WINDOW:g} s) filled. **right**: the expected kind with its modifier.", "",
           "| class | expected | " + " | ".join(seen) + " | right | steps/s | SM | "
           "PCIe RX GB/s | between steps | main CPU |",
           "|---|---|" + "---|" * (len(seen) + 6)]  # fmt: skip
    for r in rows:
        if "error" in r:
            out.append(f"| {r['class']} | {r.get('expected', '')} | error: {r['error']} |")
            continue
        s = r["signals"]
        rx, main = s.get("pcie_rx_bytes_per_second"), s.get("main_cpu_cores")
        out.append(
            f"| {r['class']} | `{r['expected']}` | "
            + " | ".join(str(r["counts"].get(k, "")) for k in seen)
            + f" | **{r['right']}/{r['polls']}** | {r['steps_per_s']:.1f} | "
            f"{_pct(s.get('sm_active'))} | {'-' if rx is None else f'{rx / 1e9:.2f}'} | "
            f"{_pct(s.get('between_steps_share'))} | "
            f"{'-' if main is None else f'{main:.2f}'} |"
        )
    out += render_goodput(rows)
    out += render_final_save(rows)
    out += ["", "Verdicts with modifiers, advice and evidence (last poll):", ""]
    for r in rows:
        if "error" not in r:
            out.append(f"- **{r['class']}**: {r['verdicts']}; advice: {r['advice']}")
            out += [f"  - {e}" for e in r["evidence"]]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cpu", action="store_true", help="rehearse on the CPU, simulated GPU")
    ap.add_argument("--seconds", type=float, default=12.0, help="verdict polls per class")
    ap.add_argument("--classes", nargs="*", choices=list(EXPECTED),
                    default=[c for c in EXPECTED if c != "final_save"])  # fmt: skip
    ap.add_argument("--every", type=int, default=5, help="steps between checkpoints")
    ap.add_argument("--checkpoint-mb", type=int, default=None,
                    help="MB saved per checkpoint (default 1024 on a GPU, 128 on the CPU)")
    ap.add_argument("--eval-batches", type=int, default=7,
                    help="forward passes per evaluation (2 matmuls a step: 7 every 5 "
                    "steps is ~40%% of the wall time)")  # fmt: skip
    ap.add_argument("--batch-mb", type=int, default=None,
                    help="MB copied per step, pageable_copy (default 512 on a GPU, 32 CPU)")
    ap.add_argument("--budget", type=float, default=290.0,
                    help="seconds after which no further class starts")
    ap.add_argument("--final-save", action="store_true",
                    help="run the final_save class alone (a save after the last step)")
    a = ap.parse_args()
    if a.final_save:
        a.classes = ["final_save"]
    a.out.mkdir(parents=True, exist_ok=True)
    picked = pick_device(a.cpu, "gpu_lost_time")
    if picked is None:
        return 2
    device, device_name = picked
    cuda = device == "cuda"
    # 1024 on the H200: its disk took ~10 s for a 4096 MB save (fsynced), longer than the
    # window, so each window held one save: "now and then", not a recurring loss
    a.checkpoint_mb = a.checkpoint_mb or (1024 if cuda else 128)
    a.batch_mb = a.batch_mb or (512 if cuda else 32)
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    text = render(rows, device_name)
    with tempfile.TemporaryDirectory(prefix="stepscope-lost-") as tmp:
        for name in a.classes:
            if time.monotonic() - started > a.budget:
                rows.append({"class": name, "expected": "", "error": "skipped: over --budget"})
                continue
            try:
                row = run_class(name, device, a, Path(tmp), env)
            except Exception as exc:  # one broken class must not lose the others
                row = {"class": name, "expected": "", "error": repr(exc)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("evidence", "log")}),
                  flush=True)  # fmt: skip
            text = render(rows, device_name)  # written after every class
            (a.out / "lost_time.md").write_text(text)
            (a.out / "lost_time.json").write_text(json.dumps(
                {"device": device_name, "window": WINDOW, "every": a.every,
                 "checkpoint_mb": a.checkpoint_mb, "batch_mb": a.batch_mb, "rows": rows},
                indent=2))  # fmt: skip
    print(text)
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
