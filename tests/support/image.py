"""The container image built from the shipped Dockerfile by the offline route its header
documents, run as written: no image registry is reachable from CI, Debian's package
mirror and pip's configured index are.

- The base: a Debian bookworm root with Python (``mmdebstrap``), imported into buildah's
  store as ``localhost/stepscope-test-base:<key>``: the header's ``BASE``, a local image
  with python3 3.11 and python3-venv. The root is cached as a tarball under
  ``~/.cache/stepscope-test-base`` (a machine pays for it once); the key changes when the
  recipe does.
- The packages: the header's ``build-wheelhouse.sh`` line, run as written (the
  ParallelCluster release script, fetching through pip's own configuration), into
  ``dist/release`` of a copy of the build context (the files .dockerignore admits).
- The build: the header's ``buildah bud`` line, run as written in that context, with
  ``BASE`` and the tag substituted. It asks no registry and no package index.
- ``BUILDAH_ISOLATION=chroot``: no runc, no network namespace; a container's server
  listens on the host's loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

SUITE = "bookworm"
# python-is-python3: the Dockerfile runs `python`; python3-venv: its `python -m venv`;
# passwd: its groupadd/useradd (not in minbase)
PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
MIRROR = os.environ.get("STEPSCOPE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stepscope-test-base"
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
    """Names the base: changes when its recipe (packages, mirror) does."""
    recipe = json.dumps([_mmdebstrap_args(Path("-")), platform.machine()])
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


def _run(args: Sequence[str], timeout: float = 600, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, env=env or ENV,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
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
            _run(["buildah", "add", "--quiet", ctr, str(tar), "/"])
            _run(["buildah", "config", "--env",
                  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "--cmd", "python3", ctr])
            _run(["buildah", "commit", "--quiet", ctr, name])
        finally:
            _run(["buildah", "rm", ctr])
    return name


def documented_commands() -> tuple[list[str], list[str]]:
    """The Dockerfile header's offline route: the ``build-wheelhouse.sh`` line and the
    ``buildah bud`` line, as argv lists."""
    header = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.removeprefix("#").strip())
    (wheels,) = [ln for ln in header if ln.startswith("deploy/parallelcluster/build-wheelhouse")]
    (bud,) = [ln for ln in header if ln.startswith("buildah bud ")]
    return shlex.split(wheels), shlex.split(bud)


def dockerignore() -> list[tuple[bool, str]]:
    """.dockerignore's rules in order: (re-included, pattern)."""
    rules: list[tuple[bool, str]] = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, line.lstrip("!").rstrip("/")))
    return rules


def excluded(path: str, rules: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, pattern in rules:
        regex = fnmatch.translate(pattern).replace(".*", "[^/]*")
        if any(re.match(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def build_context(dest: Path) -> Path:
    """The tracked files .dockerignore admits, copied as `docker build .` sends them, with
    the Dockerfile and .dockerignore (always sent)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rules = dockerignore()
    for rel in files:
        if excluded(rel, rules) or not (REPO / rel).is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy2(REPO / name, dest / name)
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
    """The Dockerfile header's offline route, run as written in a copy of the build
    context: the release's wheelhouse by build-wheelhouse.sh, then ``buildah bud`` with
    the test base as ``BASE`` and ``name`` as the tag. Docker format: an OCI image config
    has no HEALTHCHECK."""
    base = base_image()
    context = build_context(workdir / "context")
    wheels, bud = documented_commands()
    # the script from this checkout; its output path as written, relative to the context
    _run(["bash", str(REPO / wheels[0]), *wheels[1:]], timeout=600, cwd=context,
         env={**ENV, "PYTHON": sys.executable})
    bud = [f"PYTHON_IMAGE={base}" if arg == "PYTHON_IMAGE=BASE" else arg for arg in bud]
    bud[bud.index("-t") + 1] = name
    _run(bud, timeout=900, cwd=context)
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
