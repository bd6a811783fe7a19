#!/usr/bin/env python3
"""Build the chart archive for a chart repository or an OCI registry.

    python helm/package.py                    # dist/stepscope-<version>.tgz
    python helm/package.py --destination out

Refuses when the chart's copies of the rules and dashboards differ from their sources
(run helm/generate.py) or when `helm lint --strict` finds anything; then packages with
the real Helm engine in-process (PyPI helm-python-sdk, in the test extra). Push the
result with `helm push dist/stepscope-<version>.tgz oci://REGISTRY/charts`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import generate  # noqa: E402  (the generator beside this file, not an installed module)

KUBE_VERSION = "v1.34.0"


def lint_problems(chart: Path | str) -> list[str]:
    """`helm lint --strict` findings of warning level or worse, one line each."""
    import helm_python

    report = helm_python.lint(chart, None, strict=True, kube_version=KUBE_VERSION)
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return found + [str(e) for e in report["errors"]]


def package(destination: Path, chart: Path = generate.CHART) -> Path:
    """The archive's path; raises SystemExit naming what stops the build."""
    import helm_python

    drift = generate.drift(chart)
    if drift:
        raise SystemExit("chart copies are stale (run python helm/generate.py):\n  "
                         + "\n  ".join(drift))
    problems = lint_problems(chart)
    if problems:
        raise SystemExit("helm lint --strict:\n  " + "\n  ".join(problems))
    destination.mkdir(parents=True, exist_ok=True)
    return Path(helm_python.package(chart, destination=destination))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destination", type=Path, default=HERE.parent / "dist")
    args = parser.parse_args(argv)
    print(package(args.destination))
    return 0


if __name__ == "__main__":
    sys.exit(main())
