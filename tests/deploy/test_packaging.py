"""The distribution as a user or a packager builds it: a wheel built with the lowest
setuptools that pyproject.toml declares, its metadata validated by ``packaging`` (PEP 639
license expression, the license file inside, classifiers, project URLs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
from packaging.metadata import Metadata
from packaging.requirements import Requirement

from tests.support import REPO
from tests.support.paths import source_tree

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _setuptools_floor() -> str:
    (req,) = [
        Requirement(r) for r in PYPROJECT["build-system"]["requires"]
        if Requirement(r).name == "setuptools"
    ]
    (spec,) = list(req.specifier)
    assert spec.operator == ">=", "a floor, so that the test below builds with it"
    return spec.version


# The last setuptools before PEP 639 metadata: it must refuse the project table.
PRE_PEP639_SETUPTOOLS = "76.1.0"


@pytest.fixture(scope="module")
def build_with(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Build]:
    """Build the wheel in a fresh venv with exactly the setuptools version given."""
    root = tmp_path_factory.mktemp("build")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    src = source_tree(root / "src")

    def build(version: str) -> Build:
        got = subprocess.run(
            [*pip, "install", "-q", f"setuptools=={version}"], capture_output=True, text=True
        )
        if got.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot install setuptools=={version}: {got.stderr[-2000:]}")
            pytest.skip(f"setuptools=={version} cannot be installed here (no package index)")
        out = root / f"dist-{version}"
        done = subprocess.run(
            [*pip, "wheel", "-q", "--no-build-isolation", "--no-deps", str(src), "-w", str(out)],
            capture_output=True, text=True,
        )
        return Build(done.returncode, done.stdout + done.stderr, sorted(out.glob("*.whl")))

    return build


@dataclass(frozen=True)
class Build:
    returncode: int
    output: str
    wheels: list[Path]


@pytest.fixture(scope="module")
def floor_wheel(build_with: Callable[[str], Build]) -> Path:
    built = build_with(_setuptools_floor())
    assert built.returncode == 0, built.output
    (wheel,) = built.wheels
    assert wheel.name.startswith("stepscope-")
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


def test_an_older_setuptools_than_the_floor_fails_on_the_license_metadata(
    build_with: Callable[[str], Build], floor_wheel: Path
) -> None:
    """Why the floor is what it is: the setuptools before it rejects the SPDX string."""
    floor = tuple(int(x) for x in _setuptools_floor().split("."))
    assert tuple(int(x) for x in PRE_PEP639_SETUPTOOLS.split(".")) < floor
    built = build_with(PRE_PEP639_SETUPTOOLS)
    assert built.returncode != 0 and not built.wheels
    assert "license" in built.output.lower(), built.output[-2000:]


def test_the_license_file_is_the_apache_2_0_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert re.search(r"Apache License\s+Version 2\.0, January 2004", text)
    assert "END OF TERMS AND CONDITIONS" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
