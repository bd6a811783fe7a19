"""The one version number: ``stepscope.__version__`` (``exporter/stepscope/__init__.py``)
is the package's version (setuptools reads it), and this step writes it into the chart's
``version`` and ``appVersion`` (the default image tag) and the Dockerfile's ``VERSION``
build argument (the image's OCI version label). Bump it there, then run
``python -m generate``; ``--check`` names whichever copy drifted."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from generate.constants import CHART_DIR, DOCKERFILE, REPO, VERSION_FILE
from generate.files import sync

# SemVer's MAJOR.MINOR.PATCH: Helm refuses a chart version that is not SemVer, and the
# same string must be a PEP 440 version and an image tag, which this is all three.
_RELEASE = re.compile(r"\d+\.\d+\.\d+\Z")


class VersionError(ValueError):
    """``__version__`` is missing or not a MAJOR.MINOR.PATCH string."""


def read(repo: Path = REPO) -> str:
    """``__version__`` from the package's ``__init__.py``, read without importing it."""
    path = repo / VERSION_FILE
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__version__"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            version = node.value.value
            if not _RELEASE.match(version):
                raise VersionError(
                    f"{VERSION_FILE}: __version__ = {version!r} is not MAJOR.MINOR.PATCH "
                    "(the chart's version must be SemVer and the image tag the same string)"
                )
            return version
    raise VersionError(f"{VERSION_FILE}: no __version__ = '...' string assignment")


def _replace(text: str, pattern: str, line: str, where: Path) -> str:
    new, count = re.subn(pattern, line, text, flags=re.MULTILINE)
    if count != 1:
        raise VersionError(f"{where}: expected one line matching {pattern!r}, found {count}")
    return new


def render(repo: Path = REPO) -> dict[Path, str]:
    """Chart.yaml and the Dockerfile with the version fields set to ``__version__``."""
    version = read(repo)
    chart_yaml = CHART_DIR / "Chart.yaml"
    chart = (repo / chart_yaml).read_text(encoding="utf-8")
    chart = _replace(chart, r"^version: .*$", f"version: {version}", chart_yaml)
    chart = _replace(chart, r"^appVersion: .*$", f'appVersion: "{version}"', chart_yaml)
    dockerfile = (repo / DOCKERFILE).read_text(encoding="utf-8")
    dockerfile = _replace(dockerfile, r"^ARG VERSION=.*$", f"ARG VERSION={version}", DOCKERFILE)
    return {chart_yaml: chart, DOCKERFILE: dockerfile}


def write(repo: Path = REPO) -> list[str]:
    """Make the chart's and the Dockerfile's version fields current; one line per file
    written."""
    return sync(repo, render(repo))
