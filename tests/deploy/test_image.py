"""The container image, built from the Dockerfile as shipped by the offline route its
header documents, run as written (the base is a Debian bookworm root tests/support/image.py
makes: no registry is reachable here; the wheels come from build-wheelhouse.sh), and
run: ``stepscope serve --simulate 2`` answers as a user who is not root, the HEALTHCHECK
passes while it serves and fails once it stops, and nothing installs packages in it.

The first run on a machine makes the base (mmdebstrap, about 30 s); later runs build on
the cached one."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stepscope import __version__
from tests.deploy.test_dockerfile import image_extras
from tests.support import image as images
from tests.support import parse_samples, wait_for
from tests.support.exporter import Exporter, start_exporter
from tests.support.ports import free_port
from tests.support.tools import image_tools

# the Dockerfile's USER: numeric, so Kubernetes' runAsNonRoot can check it
USER = "10001:10001"
# a machine's first run makes the base (mmdebstrap downloads ~60 MB of packages)
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Image]:
    image_tools()
    name = f"localhost/stepscope-test:{os.getpid()}"
    built = images.build(name, tmp_path_factory.mktemp("image"))
    yield built
    images.remove_image(name)


@pytest.fixture(scope="module")
def ctr(image: images.Image) -> Iterator[str]:
    with images.container(image.name) as name:
        yield name


@pytest.fixture(scope="module")
def listen() -> dict[str, str]:
    # STEPSCOPE_LISTEN, not --listen: the HEALTHCHECK finds the port the same way
    return {"STEPSCOPE_LISTEN": f"127.0.0.1:{free_port()}"}


@pytest.fixture(scope="module")
def served(image: images.Image, ctr: str, listen: dict[str, str]) -> Iterator[Exporter]:
    """The image's ENTRYPOINT with ``serve --simulate 2``, as ``docker run IMAGE serve
    --simulate 2`` runs it."""
    exporter = start_exporter(
        ["serve", "--simulate", "2"], env=images.ENV,
        command=[*images.run_command(ctr, listen), *image.config["Entrypoint"]],
    )
    try:
        wait_for(lambda: exporter.get("/readyz")[0] == 200, timeout=30)
        yield exporter
    finally:
        exporter.stop()


def test_the_image_runs_the_exporter_as_its_entrypoint_with_the_chart_defaults(
    image: images.Image,
) -> None:
    assert image.config["Entrypoint"] == ["stepscope"]
    assert image.config["Cmd"] == ["serve"]
    assert image.config["User"] == USER
    assert "9400/tcp" in image.config["ExposedPorts"]
    labels = image.config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.base.name"] == image.base
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_serve_in_the_image_answers_with_the_simulated_gpus(
    served: Exporter, listen: dict[str, str]
) -> None:
    assert served.address == listen["STEPSCOPE_LISTEN"]
    assert served.get("/readyz")[0] == 200
    sm_active = parse_samples(served.metrics())["DCGM_FI_PROF_SM_ACTIVE"]
    assert sorted(labels["gpu"] for labels, _ in sm_active) == ["0", "1"]
    assert all(0.0 <= value <= 1.0 for _, value in sm_active)


def test_the_exporter_in_the_image_is_not_root(served: Exporter) -> None:
    # buildah run and its chroot runtime run as root here; every process it starts in the
    # container (its root directory is the container's) runs as the image's USER
    inside = [p for p in psutil.Process(served.proc.pid).children(recursive=True)
              if os.readlink(f"/proc/{p.pid}/root") != "/"]
    serve = [p for p in inside if "/opt/stepscope/bin/stepscope" in " ".join(p.cmdline())]
    assert serve, [p.cmdline() for p in inside]
    assert {(p.uids().real, p.uids().effective, p.gids().real) for p in inside} == {
        (10001, 10001, 10001)
    }


def test_the_healthcheck_passes_while_serving(
    image: images.Image, ctr: str, served: Exporter, listen: dict[str, str]
) -> None:
    assert image.healthcheck == ["python", "-m", "stepscope.app.healthcheck"]
    assert image.docker_config["Healthcheck"]["Interval"] == 30 * 10**9
    check = images.run_in(ctr, image.healthcheck, env=listen)
    assert check.returncode == 0, check.stderr


def test_the_healthcheck_fails_when_nothing_answers(
    image: images.Image, ctr: str
) -> None:
    port = free_port()
    check = images.run_in(ctr, image.healthcheck, env={"STEPSCOPE_LISTEN": f"127.0.0.1:{port}"})
    assert check.returncode == 1
    assert f"stepscope healthcheck: nothing answers on port {port}" in check.stderr


def test_the_image_has_the_package_version_and_nothing_to_install_packages_with(
    ctr: str,
) -> None:
    shown = images.run_in(ctr, ["stepscope", "--version"])
    assert shown.stdout.strip() == f"stepscope {__version__}", shown.stderr
    for module in ("pip", "setuptools"):
        found = images.run_in(ctr, ["python", "-c", f"import {module}"])
        assert found.returncode != 0 and "No module named" in found.stderr, module


IMPORTS = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        found[name] = True
    except ImportError:
        found[name] = False
print(json.dumps(found))
"""


def test_the_image_has_its_extras_and_nothing_of_the_tests(ctr: str) -> None:
    """The build stage installs the Dockerfile's EXTRAS (bcrypt for basic auth, grpc and
    the pod-resources stubs for Kubernetes attribution), no AWS SDK and nothing the tests
    use."""
    extras = image_extras()
    stubs = "stepscope.attribution.podresources.api_pb2_grpc"
    wanted = {"bcrypt": "auth" in extras, "boto3": "aws" in extras,
              "botocore.utils": "aws" in extras, "grpc": "kubernetes" in extras,
              stubs: "kubernetes" in extras, "pytest": False, "hypothesis": False,
              "torch": False}  # fmt: skip
    got = images.run_in(ctr, ["python", "-c", IMPORTS, *wanted])
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == wanted


def test_the_build_left_no_trace_of_its_wheelhouse(image: images.Image, ctr: str) -> None:
    # the wheelhouse was copied into the build stage only
    listed = images.run_in(ctr, ["python", "-c", "import os; print(os.path.exists('/wheelhouse'))"])
    assert listed.stdout.strip() == "False", listed.stderr
    # the venv links to the base's interpreter, which the runtime stage has too
    target = images.run_in(ctr, ["python", "-c",
                                 "import os; print(os.path.realpath('/opt/stepscope/bin/python'))"])
    assert Path(target.stdout.strip()).name.startswith("python3"), target.stderr
