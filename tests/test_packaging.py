"""The distribution as a user or a packager builds it: a wheel built with the lowest
setuptools that pyproject.toml declares, its metadata validated by ``packaging`` (PEP 639
license expression, the license file inside, classifiers, project URLs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.metadata import Metadata
from packaging.requirements import Requirement

from tests.support import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _setuptools_floor() -> str:
    (req,) = [
        Requirement(r) for r in PYPROJECT["build-system"]["requires"]
        if Requirement(r).name == "setuptools"
    ]
    (spec,) = list(req.specifier)
    assert spec.operator == ">=", "a floor, so that the test below builds with it"
    return spec.version


def _source_tree(dest: Path) -> Path:
    """What a build reads: the project files, copied so the build leaves no trace here."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(
        REPO / "exporter", dest / "exporter",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    return dest


@pytest.fixture(scope="module")
def floor_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("floor")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    floor = _setuptools_floor()
    got = subprocess.run(
        [*pip, "install", "-q", f"setuptools=={floor}"], capture_output=True, text=True
    )
    if got.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot install setuptools=={floor}: {got.stderr[-2000:]}")
        pytest.skip(f"setuptools=={floor} cannot be installed here (no package index)")
    src = _source_tree(root / "src")
    out = root / "dist"
    build = subprocess.run(
        [*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", str(src), "-w", str(out)],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = out.glob("stepscope-*.whl")
    return wheel


def _metadata(wheel: Path) -> tuple[Metadata, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        raw = zf.read(meta_name)
    return Metadata.from_email(raw, validate=True), names


def test_the_lowest_declared_setuptools_builds_a_wheel_with_valid_metadata(
    floor_wheel: Path,
) -> None:
    meta, names = _metadata(floor_wheel)  # validate=True raises on invalid metadata
    assert str(meta.license_expression) == "Apache-2.0"
    assert meta.license_files == ["LICENSE"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "stepscope/py.typed" in names


def test_metadata_names_the_project_for_an_index(floor_wheel: Path) -> None:
    meta, _ = _metadata(floor_wheel)
    assert meta.classifiers
    # PEP 639: a license classifier beside a license expression is an error on upload
    assert not [c for c in meta.classifiers if c.startswith("License ::")]
    assert "Operating System :: POSIX :: Linux" in meta.classifiers
    assert meta.project_urls and {"Homepage", "Source", "Issues"} <= meta.project_urls.keys()
    assert meta.requires_python is not None and str(meta.requires_python) == ">=3.10"


def test_an_older_setuptools_than_the_floor_would_have_failed() -> None:
    # Why the floor is what it is: 68 (the previous floor) rejects the SPDX string.
    assert tuple(int(x) for x in _setuptools_floor().split(".")[:2]) >= (77, 0)
    assert isinstance(PYPROJECT["project"]["license"], str)


def test_the_license_file_is_the_apache_2_0_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert re.search(r"Apache License\s+Version 2\.0, January 2004", text)
    assert "END OF TERMS AND CONDITIONS" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
