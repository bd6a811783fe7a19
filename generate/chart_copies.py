"""Copy the Prometheus rules and Grafana dashboards into the Helm chart as real files.

The sources stay where Prometheus and Grafana users load them (deploy/prometheus/rules,
dashboards/json); the chart carries byte-for-byte copies because a chart is fetched as a
directory or an archive by tools that drop symbolic links (Flux's source-controller,
`helm package` of a copied tree), and a chart without its rules renders no
PrometheusRule and no dashboards, silently. tests/deploy/test_helm_package.py fails when
a copy drifts from its source; ``python -m generate`` rewrites them after their sources.

Each entry of FILE_SETS is one source directory and one directory in the chart; a
variant of the rules (another label set, say) is one more entry with its own chart
directory, read by its own template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from generate.constants import CHART, DASHBOARDS_DIR, PROMETHEUS_DIR, REPO
from generate.files import sync


@dataclass(frozen=True)
class FileSet:
    """Files matching ``pattern`` in ``source`` (relative to the checkout) are copied to
    ``chart_dir`` in the chart."""

    source: Path
    pattern: str
    chart_dir: str


FILE_SETS = (
    FileSet(PROMETHEUS_DIR / "rules", "*.yml", "rules"),
    FileSet(DASHBOARDS_DIR / "json", "*.json", "dashboards"),
    # the same for dcgm-exporter's newer `hostname` label (values: hostLabel: hostname),
    # themselves generated from the two above by generate.rules and generate.dashboards
    FileSet(PROMETHEUS_DIR / "rules-hostname", "*.yml", "rules-hostname"),
    FileSet(DASHBOARDS_DIR / "json-hostname", "*.json", "dashboards-hostname"),
)


def expected(chart: Path = CHART, sources: Path = REPO) -> dict[Path, bytes]:
    """Chart path -> the bytes it must hold, copied from the checkout ``sources``."""
    files: dict[Path, bytes] = {}
    for fs in FILE_SETS:
        for src in sorted((sources / fs.source).glob(fs.pattern)):
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


def drift(chart: Path = CHART, sources: Path = REPO) -> list[str]:
    """What differs, one line each; empty when the chart is up to date."""
    want, have = expected(chart, sources), present(chart)
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


def write(chart: Path = CHART, sources: Path = REPO) -> list[str]:
    """Make the chart's copies equal to their sources; returns what changed, one line
    each, paths relative to the chart."""
    changed = []
    for fs in FILE_SETS:
        directory = chart / fs.chart_dir
        if directory.is_symlink():
            directory.unlink()
            changed.append(f"{fs.chart_dir}: symbolic link replaced by a directory")
        directory.mkdir(parents=True, exist_ok=True)
    want = expected(chart, sources)
    for path in present(chart):
        if path not in want:
            path.unlink()
            changed.append(f"{path.relative_to(chart)}: removed")
    return changed + sync(chart, {path.relative_to(chart): data for path, data in want.items()})

