"""Build the chart archive for a chart repository or an OCI registry
(``python -m generate --package [DIR]``, dist/ by default).

Refuses when the chart's copies of the rules and dashboards differ from their sources or
when `helm lint --strict` finds anything; then packages with the real Helm engine
in-process (PyPI helm-python-sdk, in the test extra). Push the result with
`helm push dist/stepscope-<version>.tgz oci://REGISTRY/charts`.
"""

from __future__ import annotations

from pathlib import Path

from generate import chart_copies
from generate.constants import CHART, KUBE_VERSION


def lint_problems(chart: Path | str) -> list[str]:
    """`helm lint --strict` findings of warning level or worse, one line each."""
    import helm_python

    report = helm_python.lint(chart, None, strict=True, kube_version=f"v{KUBE_VERSION}")
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return found + [str(e) for e in report["errors"]]


def package(destination: Path, chart: Path = CHART) -> Path:
    """The archive's path; raises SystemExit naming what stops the build."""
    import helm_python

    drift = chart_copies.drift(chart)
    if drift:
        raise SystemExit("chart copies are stale (run python -m generate):\n  "
                         + "\n  ".join(drift))
    problems = lint_problems(chart)
    if problems:
        raise SystemExit("helm lint --strict:\n  " + "\n  ".join(problems))
    destination.mkdir(parents=True, exist_ok=True)
    return Path(helm_python.package(chart, destination=destination))
