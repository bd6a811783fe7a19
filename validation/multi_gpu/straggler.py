"""Check 4: one rank slowed; ``/api/v1/diagnosis`` and ``stepscope diagnose --json`` read
every other rank ``waiting_on_peer`` on it, and the slowed rank not waiting."""

from __future__ import annotations

import json
from typing import Any

from validation.multi_gpu.report import add_verdicts, fmt, rank_values, samples, table
from validation.multi_gpu.run import JOB_SLOW, PHASES, Run


def verdict_problems(run: Run, doc: dict[str, Any] | None, job: str) -> list[str]:
    """What is wrong with a diagnosis document's verdicts for the straggler job."""
    a = run.args
    if not doc:
        return ["no diagnosis document"]
    vs = {
        v["subject"]["rank"]: v for v in doc.get("verdicts", []) if v["subject"]["job"] == job
    }
    problems = []
    for r in range(a.ranks):
        v = vs.get(r)
        if v is None:
            problems.append(f"rank {r}: no verdict")
        elif r == a.slow_rank:
            if v["kind"] in ("waiting_on_peer", "communication"):
                problems.append(f"slowed rank {r} reads {v['kind']}")
        elif v["kind"] != "waiting_on_peer":
            problems.append(f"rank {r} reads {v['kind']}, not waiting_on_peer")
        elif not any(f"rank {a.slow_rank} computes" in e for e in v["evidence"]):
            problems.append(f"rank {r}: evidence does not name rank {a.slow_rank}")
    return problems

def check_straggler(run: Run, ph: dict[str, Any]) -> None:
    """Check 4: the API's and the CLI's verdicts, read while the slowed job ran."""
    a, job = run.args, JOB_SLOW
    doc, cli = ph["diagnosis"], ph["cli"]
    api_p = verdict_problems(run, doc, job)
    cli_p = verdict_problems(run, cli.get("doc"), job)
    if cli.get("rc") != 1:
        cli_p.append(f"exit status {cli.get('rc')} (1 = bottleneck expected)")
    if any(c != 0 for c in ph["codes"]):
        api_p.append(f"rank exit codes {ph['codes']}")
    slow_v = next(
        (
            v
            for v in (doc or {}).get("verdicts", [])
            if v["subject"]["job"] == job and v["subject"]["rank"] == a.slow_rank
        ),
        None,
    )
    named = (
        (
            f"rank {a.slow_rank} (gpu {slow_v['subject']['gpu']}, "
            f"{slow_v['subject']['uuid']}) reads `{slow_v['kind']}`"
        )
        if slow_v
        else ""
    )
    run.rep.check(
        "straggler-api",
        not api_p,
        (
            f"/api/v1/diagnosis: every other rank `waiting_on_peer` naming rank {a.slow_rank}; "
            + named
        )
        if not api_p
        else "; ".join(api_p),
    )
    run.rep.check(
        "straggler-cli",
        not cli_p,
        ("`stepscope diagnose --json` (exit 1): the same verdicts")
        if not cli_p
        else "; ".join(cli_p),
    )
    smp = samples(ph["scrapes"][-1][1])
    count = rank_values(smp, "stepscope_step_duration_seconds_count", job)
    total = rank_values(smp, "stepscope_step_duration_seconds_sum", job)
    phase = {
        p: rank_values(smp, "stepscope_step_phase_seconds_total", job, phase=p) for p in PHASES
    }
    bott = {
        int(lbl["rank"]): lbl["kind"]
        for n, lbl, v in smp
        if n == "stepscope_bottleneck" and lbl.get("training_job") == job and v == 1
    }
    rows = []
    for r in range(a.ranks):
        n = count.get(r, 0.0)
        rows.append(
            [
                r,
                "slowed" if r == a.slow_rank else "",
                int(n),
                fmt(total.get(r, 0) / n if n else None),
                *(fmt(phase[p].get(r, 0) / n if n else None) for p in PHASES),
                bott.get(r, "-"),
            ]
        )
    run.rep.add(
        f"## 3. The same job with rank {a.slow_rank} slowed",
        "",
        f"Rank {a.slow_rank} sleeps {a.delay} s before each backward. The diagnosis window "
        f"is {a.window} s; the verdicts were read {a.window + 2:.0f} s after the warm-up, "
        "while the job ran. Seconds per step from the last scrape, and the served "
        "`stepscope_bottleneck{kind=...} == 1`:",
        "",
    )
    run.rep.add(
        *table(
            [
                "rank",
                "",
                "measured",
                "step s",
                "data_wait s",
                "compute s",
                "comm s",
                "other s",
                "served kind",
            ],
            rows,
        ),
        "",
    )
    add_verdicts(run.rep, "`/api/v1/diagnosis`", doc, job)
    run.rep.add(
        "`stepscope diagnose --exporter URL` (text form, read at the same moment, "
        f"exit {cli.get('text_rc')}):",
        "",
        "```",
        cli.get("text", "").rstrip(),
        "```",
        "",
    )
    (run.raw / "straggler-diagnosis.json").write_text(json.dumps(doc, indent=2))
    (run.raw / "straggler-diagnose-cli.json").write_text(json.dumps(cli.get("doc"), indent=2))

