"""The release artefacts as a user gets them: the sdist and the wheel that ``python -m
build`` makes install into a clean virtual environment and serve, and the package, the
chart and the image carry one version (``stepscope.__version__``; ``python -m generate``
writes it into the chart and the Dockerfile, tests/deploy/test_generate.py checks drift)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import BytesParser
from pathlib import Path

import pytest
import yaml

from stepscope import __version__
from tests.support import REPO, parse_samples, wait_for
from tests.support.exporter import start_exporter
from tests.support.paths import source_tree

# an isolated build and two venvs installing the dependencies from the package index
pytestmark = pytest.mark.timeout(600)

SCENARIOS = sorted(p.name for p in (REPO / "exporter/stepscope/gpu/scenarios").glob("*.yaml"))


@dataclass(frozen=True)
class Artefacts:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Artefacts:
    """``python -m build`` as a release runs it: the sdist, then the wheel built from the
    unpacked sdist (so a file the sdist forgets is missing from the wheel too)."""
    root = tmp_path_factory.mktemp("release")
    src, dist = source_tree(root / "src"), root / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return Artefacts(sdist, wheel)


def _wheel_metadata(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return dict(BytesParser().parsebytes(zf.read(name)).items())


def test_build_makes_an_sdist_and_a_wheel_named_for_the_package_version(
    artefacts: Artefacts,
) -> None:
    assert artefacts.sdist.name == f"stepscope-{__version__}.tar.gz"
    assert artefacts.wheel.name == f"stepscope-{__version__}-py3-none-any.whl"
    assert _wheel_metadata(artefacts.wheel)["Version"] == __version__
    with tarfile.open(artefacts.sdist) as tf:
        pkg_info = tf.extractfile(f"stepscope-{__version__}/PKG-INFO")
        assert pkg_info is not None
        assert BytesParser().parsebytes(pkg_info.read())["Version"] == __version__


def test_the_sdist_and_the_wheel_carry_the_license_types_and_scenarios(
    artefacts: Artefacts,
) -> None:
    top = f"stepscope-{__version__}"
    with tarfile.open(artefacts.sdist) as tf:
        in_sdist = set(tf.getnames())
    assert {f"{top}/{n}" for n in ("pyproject.toml", "README.md", "LICENSE")} <= in_sdist
    with zipfile.ZipFile(artefacts.wheel) as zf:
        in_wheel = set(zf.namelist())
    assert "stepscope/py.typed" in in_wheel
    assert f"stepscope-{__version__}.dist-info/licenses/LICENSE" in in_wheel
    # the simulated backend's scenarios are package data: serve --simulate reads them
    assert SCENARIOS and {f"stepscope/gpu/scenarios/{n}" for n in SCENARIOS} <= in_wheel
    assert not [n for n in in_wheel if "__pycache__" in n or n.startswith("tests/")]


KINDS = ["wheel", "sdist"]


def _install(artefact: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """A clean venv in ``tmp``, and ``pip install`` of the artefact into it."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(artefact)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(
    artefacts: Artefacts, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Each artefact installed into its own clean venv, both at once (two pip processes:
    each is mostly one core's work). Kind -> (its directory, pip's result)."""
    tmps = {kind: tmp_path_factory.mktemp(kind) for kind in KINDS}
    with ThreadPoolExecutor(len(KINDS)) as pool:
        pips = {kind: pool.submit(_install, getattr(artefacts, kind), tmps[kind])
                for kind in KINDS}  # fmt: skip
        return {kind: (tmps[kind], pip.result()) for kind, pip in pips.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_each_artefact_installs_into_a_clean_venv_and_serves(
    installed: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], kind: str
) -> None:
    tmp_path, pip = installed[kind]
    venv = tmp_path / "venv"
    assert pip.returncode == 0, pip.stderr[-3000:]

    stepscope = venv / "bin" / "stepscope"
    shown = subprocess.run([str(stepscope), "--version"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=60)
    assert shown.stdout.strip() == f"stepscope {__version__}", shown.stderr
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import stepscope; print(stepscope.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert where.stdout.startswith(str(venv)), "the venv's copy, not this checkout's"

    exporter = start_exporter(
        ["--simulate", "1", "--ingest", f"unix://{tmp_path}/ingest.sock"],
        command=[str(stepscope), "serve", "--listen", "127.0.0.1:0"],
    )
    try:
        wait_for(lambda: exporter.get("/readyz")[0] == 200, timeout=30)
        sm_active = parse_samples(exporter.metrics())["DCGM_FI_PROF_SM_ACTIVE"]
        assert [labels["gpu"] for labels, _ in sm_active] == ["0"]
        assert 0.0 <= sm_active[0][1] <= 1.0
    finally:
        assert exporter.stop() == 0, "".join(exporter.stderr_lines)


def test_the_package_the_chart_and_the_image_carry_one_version(artefacts: Artefacts) -> None:
    chart = yaml.safe_load((REPO / "helm/stepscope/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    # the image's tag defaults to the chart's appVersion
    assert yaml.safe_load((REPO / "helm/stepscope/values.yaml").read_text())["image"]["tag"] == ""
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE) == [__version__]
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    images = re.findall(r"image: (\S+)", (REPO / "deploy/kubernetes/stepscope.yaml").read_text())
    assert images and set(images) == {f"ghcr.io/stepscope/stepscope:{__version__}"}
    assert _wheel_metadata(artefacts.wheel)["Version"] == __version__
