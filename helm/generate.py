#!/usr/bin/env python3
"""Copy the Prometheus rules and Grafana dashboards into the Helm chart as real files.

    python helm/generate.py           # rewrite helm/stepscope/rules/ and dashboards/
    python helm/generate.py --check   # exit 1 when they differ from their sources

The sources stay where Prometheus and Grafana users load them (deploy/prometheus/rules,
dashboards/json); the chart carries byte-for-byte copies because a chart is fetched as a
directory or an archive by tools that drop symbolic links (Flux's source-controller,
`helm package` of a copied tree), and a chart without its rules renders no
PrometheusRule and no dashboards, silently. tests/test_helm_package.py fails when a copy
drifts from its source.

Each entry of FILE_SETS is one source directory and one directory in the chart; a
variant of the rules (another label set, say) is one more entry with its own chart
directory, read by its own template.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "stepscope"


@dataclass(frozen=True)
class FileSet:
    """Files matching ``pattern`` in ``source`` are copied to ``chart_dir`` in the chart."""

    source: Path
    pattern: str
    chart_dir: str


FILE_SETS = (
    FileSet(REPO / "deploy" / "prometheus" / "rules", "*.yml", "rules"),
    FileSet(REPO / "dashboards" / "json", "*.json", "dashboards"),
    # the same for dcgm-exporter's newer `hostname` label (values: hostLabel: hostname),
    # themselves generated from the two above by deploy/prometheus/generate.py and
    # dashboards/generate.py
    FileSet(REPO / "deploy" / "prometheus" / "rules-hostname", "*.yml", "rules-hostname"),
    FileSet(REPO / "dashboards" / "json-hostname", "*.json", "dashboards-hostname"),
)


def expected(chart: Path = CHART) -> dict[Path, bytes]:
    """Chart path -> the bytes it must hold."""
    files: dict[Path, bytes] = {}
    for fs in FILE_SETS:
        for src in sorted(fs.source.glob(fs.pattern)):
            files[chart / fs.chart_dir / src.name] = src.read_bytes()
    return files


def present(chart: Path = CHART) -> dict[Path, bytes]:
    """Chart path -> bytes of what the chart directories hold now (any file, so a copy
    whose source was deleted shows up as drift)."""
    files: dict[Path, bytes] = {}
    for fs in FILE_SETS:
        directory = chart / fs.chart_dir
        if directory.is_dir() and not directory.is_symlink():
            for path in sorted(directory.iterdir()):
                if path.is_file() or path.is_symlink():
                    files[path] = path.read_bytes() if path.is_file() else b""
    return files


def drift(chart: Path = CHART) -> list[str]:
    """What differs, one line each; empty when the chart is up to date."""
    want, have = expected(chart), present(chart)
    problems = []
    for fs in FILE_SETS:
        directory = chart / fs.chart_dir
        if directory.is_symlink() or not directory.is_dir():
            problems.append(f"{directory.relative_to(chart)}: not a directory of real files")
    for path in sorted(want.keys() | have.keys()):
        rel = path.relative_to(chart)
        if path not in have:
            problems.append(f"{rel}: missing")
        elif path not in want:
            problems.append(f"{rel}: no longer in its source")
        elif path.is_symlink():
            problems.append(f"{rel}: a symbolic link")
        elif have[path] != want[path]:
            problems.append(f"{rel}: differs from its source")
    return problems


def write(chart: Path = CHART) -> list[str]:
    """Make the chart's copies equal to their sources; returns what changed."""
    changed = []
    for fs in FILE_SETS:
        directory = chart / fs.chart_dir
        if directory.is_symlink():
            directory.unlink()
            changed.append(f"{fs.chart_dir}: symbolic link replaced by a directory")
        directory.mkdir(parents=True, exist_ok=True)
    want = expected(chart)
    for path in present(chart):
        if path not in want:
            path.unlink()
            changed.append(f"{path.relative_to(chart)}: removed")
    for path, data in want.items():
        if path.is_symlink():
            path.unlink()
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            changed.append(f"{path.relative_to(chart)}: written")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the copies drifted")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift()
        for line in problems:
            print(f"helm/stepscope/{line}", file=sys.stderr)
        if problems:
            print("run: python helm/generate.py", file=sys.stderr)
        return 1 if problems else 0
    for line in write():
        print(f"helm/stepscope/{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
