"""What the multi-GPU validation reads and writes: samples of an exposition, the check
table (PASS / FAIL / SKIP) and the Markdown sections of its report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition text as (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def rank_values(smp: list[Sample], name: str, job: str, **match: str) -> dict[int, float]:
    return {
        int(lbl["rank"]): v
        for n, lbl, v in smp
        if n == name and lbl.get("training_job") == job
        and all(lbl.get(k) == w for k, w in match.items())
    }


def gpu_values(smp: list[Sample], name: str) -> dict[str, float]:
    """UUID -> value of a per-GPU family."""
    return {lbl["UUID"]: v for n, lbl, v in smp if n == name and "UUID" in lbl}


def selector(name: str, labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"


@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.checks.append(Check(name, status, detail))
        print(f"[{status}] {name}: {detail}", flush=True)

    def add(self, *lines: str) -> None:
        self.sections.extend(lines)


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def fmt(v: float | None, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def add_verdicts(rep: Report, title: str, doc: dict[str, Any] | None, job: str) -> None:
    """A table of ``job``'s verdicts in a diagnosis document."""
    vs = [v for v in (doc or {}).get("verdicts", []) if v["subject"]["job"] == job]
    rep.add(f"{title}:", "")
    rep.add(
        *table(
            ["subject", "verdict", "evidence"],
            [
                [
                    v["subject"]["name"],
                    "`" + v["kind"] + "".join(f"+{m}" for m in v["modifiers"]) + "`",
                    "; ".join(v["evidence"]).replace("|", "/"),
                ]
                for v in vs
            ],
        ),
        "",
    )

