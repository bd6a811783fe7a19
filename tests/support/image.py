"""The container image built from the shipped Dockerfile with buildah, on a base the tests
make themselves: no image registry is reachable from CI, Debian's package mirror and
pip's configured index are.

- The base: a Debian bookworm root with Python (``mmdebstrap``), imported into buildah's
  store as ``localhost/stepscope-test-base:<key>`` and passed as the Dockerfile's
  ``PYTHON_IMAGE`` build argument, the one thing overridden. The root is cached as a
  tarball under ``~/.cache/stepscope-test-base`` (a machine pays for it once); the key
  changes when the recipe does.
- The dependencies: a wheelhouse fetched on the host for the base's Python through pip's
  own configuration (index, certificates, proxy), bind-mounted at ``/mnt`` during the
  build; the base's ``/etc/pip.conf`` says ``no-index``, ``find-links = /mnt``. The build
  needs no network, and the mount leaves nothing in the image (``/mnt`` is an existing
  empty directory).
- ``BUILDAH_ISOLATION=chroot``: no runc, no network namespace; a container's server
  listens on the host's loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from tests.support.paths import REPO

SUITE = "bookworm"
# python-is-python3: the Dockerfile runs `python`; python3-venv: its `python -m venv`;
# passwd: its groupadd/useradd (not in minbase)
PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
# bookworm's python3, the interpreter the wheelhouse is fetched for
PYTHON = "3.11"
# bookworm's glibc: wheels tagged manylinux_2_17 up to this one fit
GLIBC_MINOR = 36
MIRROR = os.environ.get("STEPSCOPE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stepscope-test-base"
# what the base's pip reads during the build: the wheelhouse mounted at /mnt, nothing else
PIP_CONF = "[global]\nno-index = true\nfind-links = /mnt\n"
ENV = {**os.environ, "BUILDAH_ISOLATION": "chroot"}


def _mmdebstrap_args(out: Path) -> list[str]:
    # docs, man pages and translations are not needed to run (what slim bases drop too)
    excludes = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*",
                "/usr/share/info/*")
    return [
        "mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        *[f"--dpkgopt=path-exclude={p}" for p in excludes],
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        SUITE, str(out),
        f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-updates main",
        f"deb {MIRROR.removesuffix('/debian')}/debian-security {SUITE}-security main",
    ]  # fmt: skip


def base_key() -> str:
    """Names the base: changes when its recipe (packages, mirror, pip.conf) does."""
    recipe = json.dumps([_mmdebstrap_args(Path("-")), PIP_CONF, platform.machine()])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def base_name() -> str:
    return f"localhost/stepscope-test-base:{base_key()}"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One maker of the base at a time per machine (two test runs may start together)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: Sequence[str], timeout: float = 600) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, env=ENV,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args[:3])} ... exited {done.returncode}:\n"
                             f"{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _tarball() -> Path:
    """The base's root filesystem as a tarball in the cache, made once."""
    tar = CACHE / f"base-{base_key()}.tar"
    if not tar.exists():
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            part = Path(tmp) / tar.name
            _run(_mmdebstrap_args(part), timeout=900)
            os.replace(part, tar)
    return tar


def _has_image(name: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", name], env=ENV,
                          capture_output=True).returncode == 0


def base_image() -> str:
    """The base in buildah's store (imported from the cached tarball when missing)."""
    name = base_name()
    with _locked():
        if _has_image(name):
            return name
        tar = _tarball()
        ctr = _run(["buildah", "from", "scratch"]).strip()
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
                conf.write(PIP_CONF)
                conf.flush()
                _run(["buildah", "add", "--quiet", ctr, str(tar), "/"])
                _run(["buildah", "add", "--quiet", "--chmod", "0644", ctr, conf.name,
                      "/etc/pip.conf"])
            _run(["buildah", "config", "--env",
                  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "--cmd", "python3", ctr])
            _run(["buildah", "commit", "--quiet", ctr, name])
        finally:
            _run(["buildah", "rm", ctr])
    return name


def dockerfile_extras() -> list[str]:
    """The extras the Dockerfile installs by default (its EXTRAS build argument)."""
    (extras,) = re.findall(r'^ARG EXTRAS="([^"]*)"$', (REPO / "Dockerfile").read_text(),
                           re.MULTILINE)
    return [e for e in extras.split(",") if e]


def requirements() -> list[str]:
    """What the Dockerfile's pip install needs: the build backend, the dependencies and
    those of its default extras, read from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    for extra in dockerfile_extras():
        reqs += project["project"]["optional-dependencies"][extra]
    return reqs


def wheelhouse(dest: Path) -> Path:
    """Wheels of :func:`requirements` for the base's Python and platform, fetched by the
    host's pip (its index and certificates)."""
    arch = platform.machine()
    # pip does not widen a manylinux_2_N platform to the older tags: each one named
    platforms = [f"manylinux_2_{n}_{arch}" for n in range(17, GLIBC_MINOR + 1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest),
          "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
          "--abi", f"cp{PYTHON.replace('.', '')}",
          *[f"--platform={p}" for p in platforms], *requirements()])
    return dest


@dataclass(frozen=True)
class Image:
    """An image built from the shipped Dockerfile."""

    name: str
    base: str
    size: str
    config: dict[str, Any]
    docker_config: dict[str, Any]
    layers: int

    @property
    def healthcheck(self) -> list[str]:
        """The HEALTHCHECK's command (``CMD`` form: the argv)."""
        test = self.docker_config["Healthcheck"]["Test"]
        assert test[0] == "CMD", test
        return list(test[1:])


def inspect(name: str, base: str) -> Image:
    data = json.loads(_run(["buildah", "inspect", "--type", "image", name]))
    (listed,) = json.loads(_run(["buildah", "images", "--json", name]))
    return Image(name=name, base=base, size=listed["size"], config=data["OCIv1"]["config"],
                 docker_config=data["Docker"]["config"],
                 layers=len(data["OCIv1"]["rootfs"]["diff_ids"]))


def build(name: str, workdir: Path) -> Image:
    """``buildah bud`` of the repository's Dockerfile as shipped, the base overridden.
    Docker format: an OCI image config has no HEALTHCHECK."""
    base = base_image()
    wheels = wheelhouse(workdir / "wheels")
    _run(["buildah", "bud", "--quiet", "--format", "docker", "--pull=never",
          "--build-arg", f"PYTHON_IMAGE={base}", "--volume", f"{wheels}:/mnt:ro",
          "--tag", name, "--file", str(REPO / "Dockerfile"), str(REPO)], timeout=900)
    return inspect(name, base)


def remove_image(name: str) -> None:
    subprocess.run(["buildah", "rmi", name], env=ENV, capture_output=True)


@contextlib.contextmanager
def container(image: str) -> Iterator[str]:
    """A working container of ``image`` (its root filesystem, for ``buildah run``)."""
    ctr = _run(["buildah", "from", "--pull=never", image]).strip()
    try:
        yield ctr
    finally:
        _run(["buildah", "rm", ctr])


def run_in(ctr: str, argv: Sequence[str], env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``argv`` run in the container as its image's USER, with ``env`` added."""
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(["buildah", "run", *flags, ctr, "--", *argv], env=ENV,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_command(ctr: str, env: dict[str, str] | None = None) -> list[str]:
    """The ``buildah run`` prefix for a long-lived process in the container."""
    return ["buildah", "run", *[f"--env={k}={v}" for k, v in (env or {}).items()], ctr, "--"]
