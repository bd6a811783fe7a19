"""The live status page at ``/``: one card per training rank and per GPU. Pure.

Rendered on the server from the latest Snapshot (no JavaScript, no external assets);
the browser reloads it every couple of sampling intervals. Each card shows SM active
vs GPU utilization vs occupancy, tensor vs FP32 pipes, step time with its phases as a
small stacked chart over the diagnosis window, and the verdict with its advice.
A hardware fault cannot be missed: a red banner under the header names every faulted
GPU and what to do, the page title starts with "FAULT", and faulted cards come first.
A GPU that is down shows no readings at all (never its last ones), and says so.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from stepscope import __version__
from stepscope.core.snapshot import Published
from stepscope.diagnose.analysis import DIAGNOSIS
from stepscope.diagnose.model import Diagnosis, Verdict
from stepscope.gpu.model import GPU_PART

_PHASES = (("data_wait", "#e8a33d"), ("compute", "#3b7dd8"), ("comm", "#c2452d"),
           ("other", "#9aa3ad"))  # fmt: skip

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1d2125}
header{background:#1d2125;color:#fff;padding:10px 18px}
header h1{font-size:18px;margin:0 0 4px}header p{margin:0;color:#c7ccd1}
header a{color:#9cc3ff}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:12px;
padding:14px}
.card{background:#fff;border-radius:8px;padding:12px;border-top:5px solid #5aa469;
box-shadow:0 1px 2px rgba(0,0,0,.12)}
.card.bottleneck{border-top-color:#c2452d}.card.unknown,.card.idle{border-top-color:#9aa3ad}
.card h2{font-size:15px;margin:0}.card .model{color:#66707a;font-size:12px}
.verdict{display:inline-block;margin:6px 0;padding:2px 8px;border-radius:10px;
background:#e4f2e7;font-weight:600}
.bottleneck .verdict{background:#f8e1dc}.unknown .verdict,.idle .verdict{background:#eceef0}
.meter{display:grid;grid-template-columns:90px 1fr 44px;align-items:center;gap:6px;
font-size:12px;margin:2px 0}
.bar{background:#eceef0;height:9px;border-radius:5px;overflow:hidden}
.bar span{display:block;height:100%;background:#3b7dd8}
.advice{margin:8px 0 4px}.evidence{color:#4a525a;font-size:12px;margin:0;padding-left:16px}
.legend span{display:inline-block;width:9px;height:9px;margin:0 3px 0 8px}
.empty{padding:20px}
.faults{background:#8f1d12;color:#fff;padding:12px 18px;font-size:15px}
.faults h2{margin:0 0 6px;font-size:18px}.faults ul{margin:0;padding-left:18px}
.card.fault{border:3px solid #8f1d12;border-top-width:8px;background:#fff5f3}
.fault .verdict{background:#8f1d12;color:#fff}
.down{color:#8f1d12;font-weight:600;margin:4px 0}
"""


def _meter(label: str, value: float | None, scale: float = 1.0, unit: str = "%") -> str:
    if value is None:
        shown, width = "n/a", 0.0
    else:
        ratio = max(0.0, min(1.0, value / scale))
        shown, width = f"{100 * ratio:.0f}{unit}", 100 * ratio
    return (
        f'<div class="meter" data-signal="{html.escape(label)}"><span>{html.escape(label)}'
        f'</span><div class="bar"><span style="width:{width:.1f}%"></span></div>'
        f"<span>{shown}</span></div>"
    )


def _chart(v: Verdict, width: int = 300, height: int = 60) -> str:
    """Step phases per sample as stacked bars (height = share of the step), SVG."""
    steps = v.history.get("step_seconds", ())
    if not any(s is not None for s in steps):
        return ""
    n = len(steps)
    bar = width / max(n, 1)
    rects: list[str] = []
    shares = [(tuple(v.history.get(name, ())), colour) for name, colour in _PHASES]
    for i in range(n):
        y = float(height)
        for series, colour in shares:
            share = series[i] if i < len(series) else None
            if share is None or share <= 0:
                continue
            h = share * height
            y -= h
            rects.append(
                f'<rect x="{i * bar:.1f}" y="{y:.1f}" width="{max(bar - 1, 1):.1f}" '
                f'height="{h:.1f}" fill="{colour}"/>'
            )
    mean = v.signals.get("step_seconds")
    head = f"step {mean:.3f} s" if mean is not None else "step"
    legend = "".join(f'<span style="background:{c}"></span>{n}' for n, c in _PHASES)
    return (
        f'<div class="chart"><div>{head}<span class="legend">{legend}</span></div>'
        f'<svg role="img" aria-label="step phases" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{"".join(rects)}</svg></div>'
    )


def _card(v: Verdict) -> str:
    s = v.signals
    cls = "fault" if v.fault else "bottleneck" if v.bottleneck else v.kind
    kind = v.kind + "".join(f" + {m}" for m in v.modifiers)
    if s.get("gpu_up") == 0.0:
        # a down GPU has no current reading: say so instead of drawing stale bars
        rows = ['<p class="down">GPU down: no current reading</p>']
    else:
        rows = [
            _meter("SM active", s.get("sm_active")),
            _meter("GPU util", s.get("gpu_util"), 100.0),
            _meter("occupancy", s.get("sm_occupancy")),
            _meter("tensor", s.get("tensor_active")),
            _meter("FP32", s.get("fp32_active")),
            _meter("DRAM", s.get("dram_active")),
        ]
    if s.get("mfu") is not None:
        rows.append(_meter("MFU", s.get("mfu")))
    evidence = "".join(f"<li>{html.escape(e)}</li>" for e in v.evidence)
    model = html.escape(v.subject.model or ("no GPU" if v.subject.rank is not None else ""))
    return (
        f'<section class="card {cls}" data-kind="{html.escape(v.kind)}" '
        f'data-modifiers="{html.escape(",".join(v.modifiers))}" '
        f'data-subject="{html.escape(v.subject.name)}">'
        f"<h2>{html.escape(v.subject.name)}</h2><div class=\"model\">{model}</div>"
        f'<div class="verdict">{html.escape(kind)}</div>'
        + "".join(rows)
        + _chart(v)
        + f'<p class="advice">{html.escape(v.advice)}</p>'
        f'<ul class="evidence">{evidence}</ul></section>'
    )


def _fault_banner(faults: Sequence[Verdict]) -> str:
    if not faults:
        return ""
    items = "".join(
        f"<li><b>{html.escape(v.subject.name)}</b> "
        f"({html.escape(', '.join(v.modifiers))}): {html.escape(v.advice)}</li>"
        for v in faults
    )
    n = len(faults)
    return (
        f'<section id="faults" class="faults" role="alert"><h2>Hardware fault on {n} '
        f"subject{'s' if n > 1 else ''}: drain before it runs jobs</h2><ul>{items}</ul>"
        "</section>"
    )


def render_status_page(published: Published | None, readiness: str) -> str:
    """The whole page for the latest published snapshot (None before the first pass)."""
    refresh = 2
    verdicts: Sequence[Verdict] = ()
    failing = ""
    if published is None:
        summary = "Waiting for the first sampling pass."
    else:
        snapshot = published.snapshot
        refresh = max(2, round(2 * snapshot.interval))
        diag = published.result(DIAGNOSIS, Diagnosis)
        gpu = snapshot.part(GPU_PART)
        verdicts = diag.verdicts if diag else ()
        status = diag.status if diag else "unknown"
        window = f", verdicts over {diag.window_seconds:.0f} s" if diag else ""
        if diag and diag.timestamp and snapshot.timestamp - diag.timestamp >= 0.5:
            # above 64 ranks verdicts are made on the passes a scraper reads
            window += f" (made {snapshot.timestamp - diag.timestamp:.0f} s before this pass)"
        summary = (
            f"Host <b>{html.escape(snapshot.hostname)}</b>, backend "
            f"<b>{html.escape(gpu.backend if gpu else 'none')}</b>, "
            f"{len(gpu.gpus) if gpu else 0} GPU(s), "
            f"sampled every {snapshot.interval:g} s{window}: "
            f'<b id="status">{html.escape(status)}</b>'
        )
        down = [f"{name} ({h.last_error or 'pending'})" for name, h in snapshot.health.items()
                if not h.success]  # fmt: skip
        if down:
            failing = f"<p>Sources not reading: {html.escape(', '.join(down))}</p>"
    faults = [v for v in verdicts if v.fault]
    ordered = [*faults, *(v for v in verdicts if not v.fault)]
    cards = "".join(_card(v) for v in ordered) or (
        '<p class="empty">No GPUs and no training ranks to show yet.</p>'
    )
    title = f"FAULT ({len(faults)}) - stepscope" if faults else "stepscope"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{refresh}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>stepscope {html.escape(__version__)}</h1><p>{summary}</p>{failing}"
        f"<p>Readiness: {html.escape(readiness)} · "
        '<a href="metrics">/metrics</a> · <a href="api/v1/diagnosis">/api/v1/diagnosis</a> · '
        '<a href="healthz">/healthz</a> · <a href="readyz">/readyz</a></p></header>'
        f"{_fault_banner(faults)}<main>{cards}</main></body></html>\n"
    )


def status_page_html(published: Published | None, readiness: str) -> bytes:
    """The page as bytes (a :class:`~stepscope.web.app.Page` renderer)."""
    return render_status_page(published, readiness).encode()
