"""Run the generators in the order they read each other's output, or check that the
repository holds what they make.

Exit status: 0 when done (or, with ``--check``, when every generated file is current), 1
when ``--check`` finds a file that differs, ``stepscope.__version__`` is not
MAJOR.MINOR.PATCH or the chart archive cannot be built, 2 when the Helm engine or Grafana's
SDK is not installed or for a bad argument (one line naming it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from generate import (
    agents,
    chart_copies,
    chart_package,
    field_table,
    fleet,
    manifests,
    rules,
    values_schema,
    version,
)
from generate.constants import (
    CHART_DIR,
    DASHBOARDS_DIR,
    DOCKERFILE,
    MANIFESTS_DIR,
    METRICS_DOC,
    PROMETHEUS_DIR,
    REPO,
    VERSION_FILE,
)
from stepscope.app.args import ArgumentParser

# what the generators import beyond the exporter's own dependencies (module, distribution),
# each imported by the step that uses it
NEEDS = (("helm_python", "helm-python-sdk"), ("grafana_foundation_sdk", "grafana-foundation-sdk"))
MISSING = (
    "python -m generate renders the chart with the Helm engine in-process and builds the "
    "dashboards with Grafana's typed builders; not installed: {}. "
    "pip install -e '.[test]' brings both"
)


def _dashboards(repo: Path) -> list[str]:
    from generate import dashboards

    written: list[str] = dashboards.write(repo)  # typed at 3.11 only (pyproject.toml)
    return written


def _chart_copies(repo: Path) -> list[str]:
    return [f"{CHART_DIR}/{line}" for line in chart_copies.write(repo / CHART_DIR, repo)]


# Each step takes a checkout and returns one line per file it changed.
STEPS: tuple[Callable[[Path], list[str]], ...] = (
    # the chart's version fields, which the rendered manifests carry
    version.write,
    # the values schema's config keys, from stepscope.app.config
    values_schema.write,
    field_table.write,
    _dashboards,
    rules.write,
    # the agents' keep list reads the two above; their scrape configs prometheus-*.yml
    agents.write,
    # the tier's manifests embed the agent configuration, the rules for vmalert, the
    # Alertmanager and VictoriaMetrics files
    fleet.write,
    # copies the dashboards and rules into the chart, so after them
    _chart_copies,
    # renders the chart with its copies, so last
    manifests.write,
)
# every folder a step reads or writes: --check runs the steps on a copy of these
TREES = (DASHBOARDS_DIR, PROMETHEUS_DIR, CHART_DIR, MANIFESTS_DIR, METRICS_DOC.parent,
         fleet.ALERTMANAGER_DIR, fleet.VICTORIAMETRICS_DIR)
# and every single file outside them
FILES = (VERSION_FILE, DOCKERFILE)
_SKIP = "__pycache__"


def write(repo: Path = REPO) -> list[str]:
    """Run every step on the checkout ``repo``; one line per file changed."""
    return [line for step in STEPS for line in step(repo)]


def _entries(root: Path) -> set[Path]:
    """Files and symbolic links under TREES, relative to ``root`` (a linked directory is
    one entry, not followed)."""
    found = {rel for rel in FILES if (root / rel).exists()}
    for tree in TREES:
        for dirpath, dirnames, filenames in os.walk(root / tree):
            here = Path(dirpath)
            links = [d for d in dirnames if (here / d).is_symlink()]
            found.update((here / name).relative_to(root) for name in [*filenames, *links])
            dirnames[:] = [d for d in dirnames if d not in links and d != _SKIP]
    return found


def _same(shipped: Path, made: Path) -> bool:
    if shipped.is_symlink() or made.is_symlink():
        return (shipped.is_symlink() and made.is_symlink()
                and os.readlink(shipped) == os.readlink(made))
    return shipped.read_bytes() == made.read_bytes()


def check(repo: Path = REPO) -> list[str]:
    """Every file under TREES that differs from what the steps make, one line each
    (empty when the checkout is current). The steps run on a copy; ``repo`` is only read."""
    with tempfile.TemporaryDirectory(prefix="stepscope-generate-") as tmp:
        copy = Path(tmp)
        for tree in TREES:
            shutil.copytree(repo / tree, copy / tree, symlinks=True,
                            ignore=shutil.ignore_patterns(_SKIP))
        for rel in FILES:
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, copy / rel)
        write(copy)
        shipped, made = _entries(repo), _entries(copy)
        problems = []
        for rel in sorted(shipped | made):
            if rel not in made:
                problems.append(f"{rel}: a symbolic link where the generators make files"
                                if (repo / rel).is_symlink() else f"{rel}: not generated")
            elif rel not in shipped:
                problems.append(f"{rel}: missing")
            elif not _same(repo / rel, copy / rel):
                problems.append(f"{rel}: differs from what the generators make")
        return problems


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m generate",
        description="Rewrite the repository's generated files (the chart's and the image's "
        "version, dashboards, the alert and recording rules from their sources and the fleet "
        "thresholds, rules for the hostname label, the chart's copies, plain Kubernetes "
        "manifests) in order.",
    )
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming every file that is out of date")
    parser.add_argument("--package", nargs="?", type=Path, const=REPO / "dist",
                        metavar="DIR", help="then build the chart archive into DIR "
                        "(default: dist/); with --check, only when everything is current")
    args = parser.parse_args(argv)
    if args.package is not None:  # before the steps run: a typo costs no generation
        try:
            args.package.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"--package {args.package}: cannot make it: {exc.strerror or exc}")
        if not os.access(args.package, os.W_OK):
            parser.error(f"--package {args.package}: not writable")
    missing = [dist for module, dist in NEEDS if importlib.util.find_spec(module) is None]
    if missing:
        print(MISSING.format(", ".join(missing)), file=sys.stderr)
        return 2
    try:
        if args.check:
            problems = check()
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print("run: python -m generate", file=sys.stderr)
                return 1
        else:
            for line in write():
                print(line)
    except (version.VersionError, rules.RuleSourceError) as exc:
        print(f"python -m generate: {exc}", file=sys.stderr)
        return 1
    if args.package is not None:
        print(chart_package.package(args.package))
    return 0
