"""Check 5: the straggler phase's scraped step counters as a promtool unit test of the
recording rules: the slowed rank's straggler score is the job's unique maximum."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support import REPO
from validation.multi_gpu.report import samples, selector, table
from validation.multi_gpu.run import JOB_SLOW, RULES, Run


def check_rules(run: Run, ph: dict[str, Any]) -> None:
    """The straggler phase's scraped counters as promtool input series, 1 s apart."""
    a, job = run.args, JOB_SLOW
    wanted = (
        "stepscope_step_duration_seconds_sum",
        "stepscope_step_duration_seconds_count",
        "stepscope_step_phase_seconds_total",
    )
    series: dict[str, dict[int, float]] = {}
    last = 0
    for i, text in ph["scrapes"]:
        last = max(last, i)
        for n, lbl, v in samples(text):
            if n in wanted and lbl.get("training_job") == job:
                series.setdefault(selector(n, lbl), {})[i] = v
    inputs = [{"series": s, "values": " ".join(
        repr(vals[i]) if i in vals else "_" for i in range(last + 1))}
        for s, vals in sorted(series.items())]  # fmt: skip
    score = f'training_job_rank:stepscope_straggler_score:ratio{{training_job="{job}"}}'
    top = f'training_job:stepscope_straggler_score:max{{training_job="{job}"}}'
    test: dict[str, Any] = {
        "rule_files": [RULES.name],
        "evaluation_interval": "1s",
        "tests": [
            {
                "name": f"{job}: the slowed rank {a.slow_rank} has the job's highest score",
                "interval": "1s",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": f'count({score[:-1]},rank="{a.slow_rank}"}} == on (job) '
                        f"group_left () {top})",
                        "eval_time": f"{last}s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                    {
                        "expr": f"count({score} == on (job) group_left () {top})",
                        "eval_time": f"{last}s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                    {
                        "expr": f"count({score})",
                        "eval_time": f"{last}s",
                        "exp_samples": [{"labels": "{}", "value": a.ranks}],
                    },
                ],
            }
        ],
    }
    # The same input, asserting nothing is recorded: promtool fails and prints what it
    # evaluated, which is how the scores themselves are read from promtool.
    show: dict[str, Any] = {
        **test,
        "tests": [
            {
                **dict(test["tests"][0]),
                "name": "show the scores",
                "promql_expr_test": [
                    {"expr": score, "eval_time": f"{last}s", "exp_samples": []}
                ],
            }
        ],
    }
    shutil.copy(RULES, run.out / RULES.name)
    (run.out / "straggler_rules_test.yml").write_text(json.dumps(test, indent=1) + "\n")
    (run.tmp / RULES.name).write_text(RULES.read_text())
    (run.tmp / "show_scores_test.yml").write_text(json.dumps(show, indent=1) + "\n")
    promtool = str(Path(a.promtool).resolve()) if a.promtool else shutil.which("promtool")
    if promtool and Path(promtool).is_file() and not os.access(promtool, os.X_OK):
        promtool = str(shutil.copy(promtool, run.tmp / "promtool"))  # carried without +x
        os.chmod(promtool, 0o755)
    if not promtool:
        run.rep.check(
            "rules",
            False,
            "promtool not found (give --promtool PATH); the test "
            "file is in the output: cd OUT && promtool test rules "
            "straggler_rules_test.yml",
        )
        return
    tested = subprocess.run(
        [promtool, "test", "rules", "straggler_rules_test.yml"],
        cwd=run.out,
        capture_output=True,
        text=True,
        timeout=120,
    )
    shown = subprocess.run(
        [promtool, "test", "rules", "show_scores_test.yml"],
        cwd=run.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (run.raw / "promtool-test.txt").write_text(tested.stdout + tested.stderr)
    (run.raw / "promtool-show-scores.txt").write_text(shown.stdout + shown.stderr)
    scores = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(
            r'rank="(\d+)"[^}]*\} (?:=> )?([-+0-9.eE]+|NaN)', shown.stdout + shown.stderr
        )
    }
    ok = tested.returncode == 0
    run.rep.check(
        "rules",
        ok,
        (
            f"promtool test rules: rank {a.slow_rank}'s "
            "training_job_rank:stepscope_straggler_score:ratio is the job's unique maximum "
            f"({len(inputs)} input series, {last + 1} s at 1 s)"
        )
        if ok
        else f"promtool exit {tested.returncode}: {(tested.stdout + tested.stderr)[-600:]}",
    )
    run.rep.data["straggler_scores"] = scores
    run.rep.add(
        "## 4. The recording rule's straggler score, evaluated by promtool",
        "",
        f"The straggler phase's scraped `stepscope_step_duration_seconds_sum/_count` and "
        f"`stepscope_step_phase_seconds_total` of job `{job}` ({len(inputs)} series, one "
        f"value per second, `_` before a series existed) are the input series of "
        f"`straggler_rules_test.yml` over `{RULES.relative_to(REPO)}` (copied beside it), "
        f"evaluated at {last} s; it asserts the slowed rank's score equals "
        f"`job:stepscope_straggler_score:max` and that one rank holds the maximum. "
        f"`{Path(promtool).name} test rules` exit {tested.returncode}. The scores promtool "
        "computed (read from a second run that expects none):",
        "",
    )
    run.rep.add(
        *table(
            ["rank", "training_job_rank:stepscope_straggler_score:ratio"],
            [
                [r, f"{s:.3f}" + (" (slowed)" if r == a.slow_rank else "")]
                for r, s in sorted(scores.items())
            ],
        ),
        "",
    )

