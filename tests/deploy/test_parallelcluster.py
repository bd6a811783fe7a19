"""The ParallelCluster bootstrap (install-stepscope.sh) run for real against a fake root:
a wheelhouse it installs from without any package index, in a network namespace with no
network where the kernel allows one; the images' Pythons (too old, found under another
name, installed by dnf); and every failure logged loudly with exit 0, because a custom
bootstrap action that exits non-zero fails the node (ParallelCluster docs)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import platform
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from stepscope import __version__
from stepscope.app.config import load
from tests.support import REPO, start_exporter

PCLUSTER = REPO / "deploy" / "parallelcluster"
SCRIPT = PCLUSTER / "install-stepscope.sh"
UNIT = REPO / "systemd" / "stepscope.service"
# what the script runs besides bash builtins; nothing else is on its PATH here
TOOLS = ("date", "mkdir", "mktemp", "rm", "cp", "find", "sort", "tail", "dirname", "id",
         "install", "chmod", "env", "cat")
REAL_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _wheel(dest: Path, name: str, version: str, files: dict[str, str],
           requires: tuple[str, ...] = (), scripts: dict[str, str] | None = None) -> Path:
    """A pure-Python wheel with a correct RECORD, made here (no build backend needed)."""
    dist = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
    meta += [f"Provides-Extra: {r.split('extra == ')[1].strip(chr(34))}\n"
             for r in requires if "extra == " in r]
    meta += [f"Requires-Dist: {r}\n" for r in requires]
    content = {
        **files,
        f"{dist}/METADATA": "".join(meta),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if scripts:
        content[f"{dist}/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items()
        )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, text in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        writer.writerow([path, f"sha256={digest.decode()}", len(text.encode())])
    writer.writerow([f"{dist}/RECORD", "", ""])
    out = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in content.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", record.getvalue())
    return out


def _pip_wheel() -> Path:
    """pip's own wheel as Python ships it (ensurepip's bundle, or Debian's copy)."""
    import ensurepip

    candidates = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    candidates += sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    if not candidates:
        pytest.skip("no pip wheel on this machine (ensurepip bundle or python3-pip-whl)")
    return candidates[-1]


def make_release(
    dest: Path, *, with_pip: bool = True, requires: tuple[str, ...] = (), extras: str = ""
) -> Path:
    """What build-wheelhouse.sh puts in S3 or on a shared filesystem, with a stand-in
    stepscope (a console script that prints its version), a helper dependency, and an
    ``auth`` extra's dependency (installed only with ``extras``)."""
    wheelhouse = dest / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    _wheel(
        wheelhouse, "stepscope", "9.9.9",
        {"stepscope/__init__.py": "def main():\n    print('stepscope 9.9.9')\n"},
        requires=("stepscope-helper", 'stepscope-auth-helper; extra == "auth"', *requires),
        scripts={"stepscope": "stepscope:main"},
    )
    _wheel(wheelhouse, "stepscope_helper", "1.0", {"stepscope_helper.py": ""})
    _wheel(wheelhouse, "stepscope_auth_helper", "1.0", {"stepscope_auth_helper.py": ""})
    if extras:
        (dest / "extras").write_text(extras + "\n")
    if with_pip:
        shutil.copy2(_pip_wheel(), wheelhouse)
    shutil.copy2(UNIT, dest / "stepscope.service")
    for script in ("slurm-prolog.sh", "slurm-epilog.sh"):
        shutil.copy2(PCLUSTER / script, dest / script)
    return dest


@dataclass
class Node:
    """A fake root and the commands of a node image, recording every call."""

    root: Path
    bin: Path

    @property
    def calls(self) -> list[str]:
        log = self.root / "calls"
        return log.read_text().splitlines() if log.exists() else []

    def command(self, name: str, body: str = "") -> None:
        path = self.bin / name
        path.write_text(
            f'#!/bin/sh\necho "{name} $*" >> "{self.root}/calls"\n{body}\n'
        )
        path.chmod(0o755)

    def python(self, name: str, version: tuple[int, int]) -> None:
        """An interpreter called ``name`` on PATH: this machine's Python when the version
        is supported, else a stand-in that answers the version check as that Python."""
        if version >= (3, 10):
            (self.bin / name).symlink_to(REAL_PYTHON)
        else:
            self.command(name, "exit 1")

    def run(self, *args: str, network: bool = False,
            script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(self.bin), "STEPSCOPE_ROOT": str(self.root), "HOME": str(self.root),
               "TMPDIR": str(self.root / "tmp")}
        cmd = [shutil.which("bash") or "/bin/bash", str(script), *args]
        unshare = shutil.which("unshare")
        if not network and unshare and _can_unshare_network(unshare):
            cmd = [unshare, "--net", *cmd]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)

    @property
    def log(self) -> str:
        path = self.root / "var" / "log" / "stepscope-install.log"
        return path.read_text() if path.exists() else ""


def _can_unshare_network(unshare: str) -> bool:
    return subprocess.run([unshare, "--net", "true"], capture_output=True).returncode == 0


@pytest.fixture
def node(tmp_path: Path) -> Node:
    root, bindir = tmp_path / "root", tmp_path / "bin"
    (root / "tmp").mkdir(parents=True)
    bindir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    n = Node(root, bindir)
    n.command("systemctl")
    n.command("useradd")
    n.command("logger")
    return n


def _assert_gave_up(run: subprocess.CompletedProcess[str], node: Node, reason: str) -> None:
    assert run.returncode == 0, "a failing bootstrap action fails the node"
    assert reason in run.stderr, run.stderr
    assert "stepscope is NOT installed on this node" in run.stderr
    assert reason in node.log, "the reason is kept in /var/log/stepscope-install.log"
    assert any(c.startswith("logger -t stepscope-install") for c in node.calls), "and syslog"
    assert "systemctl enable --now stepscope.service" not in node.calls


# ---- installing


def test_installs_from_a_shared_filesystem_wheelhouse_without_network(
    node: Node, tmp_path: Path
) -> None:
    release = make_release(tmp_path / "fsx" / "stepscope")
    node.python("python3", (3, 11))
    run = node.run(str(release))
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    venv = node.root / "opt" / "stepscope"
    # the stand-in, not a checkout on the PYTHONPATH the test runs with
    out = subprocess.run([str(venv / "bin" / "stepscope")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.strip() == "stepscope 9.9.9"
    # pip ran from its wheel and left nothing of itself in the venv
    assert not list(venv.glob("bin/pip*"))
    assert not list(venv.glob("lib/python*/site-packages/pip"))
    unit = node.root / "etc" / "systemd" / "system" / "stepscope.service"
    assert unit.read_text() == UNIT.read_text()
    defaults = (node.root / "etc" / "default" / "stepscope").read_text()
    assert "STEPSCOPE_INTERVAL=1" in defaults and "HPC_JOB" not in defaults
    # the YAML file the unit passes as --config and `systemctl reload` re-reads: a
    # commented template the exporter loads as no settings
    config = node.root / "etc" / "stepscope" / "config.yaml"
    assert "host_label: hostname" in config.read_text()
    defaults_only = load({}, env={"NODE_NAME": "n"})
    assert load({"config": str(config)}, env={"NODE_NAME": "n"}) == replace(
        defaults_only, config_file=config
    )
    commands = [c for c in node.calls if not c.startswith("logger ")]
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl enable --now stepscope.service"]
    assert any(c.startswith("useradd --system") and c.endswith(" stepscope") for c in node.calls)
    assert "installed stepscope 9.9.9 and started stepscope.service" in node.log


def _unit_header_route() -> list[list[str]]:
    """The install commands the unit file's header gives, as argv lists."""
    lines = UNIT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# Installed from a release"))
    commands = []
    for line in lines[start + 1:]:
        if not line.startswith("#   "):
            break
        commands.append(shlex.split(line.removeprefix("#").split("  #", 1)[0]))
    return commands


def test_the_units_header_route_installs_the_real_exporter_without_network(
    node: Node, tmp_path: Path
) -> None:
    """Issue 36: the header said `/opt/stepscope/bin/pip install stepscope`, which fails (no
    such distribution on PyPI). Its commands now, run as written from a checkout: the
    release is built from this checkout (pip fetching the dependencies through its own
    configuration, for this machine's Python only: the script's optional version list,
    three Pythons by default), then installed on a node without network, and the
    installed exporter serves."""
    build, install = _unit_header_route()
    assert build[0] == "deploy/parallelcluster/build-wheelhouse.sh", build
    version = ".".join(platform.python_version_tuple()[:2])
    work = tmp_path / "checkout"
    work.mkdir()
    made = subprocess.run(
        ["bash", str(REPO / build[0]), *build[1:], version], cwd=work,
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    node.python("python3", sys.version_info[:2])
    script = work / install[0]
    source = install[1].replace("$PWD", str(work))
    run = node.run(source, script=script)
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    venv = node.root / "opt" / "stepscope"
    # the installed package, not this checkout on the test's PYTHONPATH
    installed = {"PYTHONPATH": ""}
    shown = subprocess.run([str(venv / "bin" / "stepscope"), "--version"],
                           capture_output=True, text=True, env={**os.environ, **installed})
    assert shown.stdout.strip() == f"stepscope {__version__}", shown.stderr
    assert "systemctl enable --now stepscope.service" in node.calls
    unit = node.root / "etc" / "systemd" / "system" / "stepscope.service"
    assert unit.read_text() == UNIT.read_text()
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import stepscope; print(stepscope.__file__)"],
                           capture_output=True, text=True, env={**os.environ, **installed})
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    exp = start_exporter(["--simulate", "1", "--ingest", "udp://127.0.0.1:9"], env=installed,
                         command=[str(venv / "bin" / "stepscope"), "serve",
                                  "--listen", "127.0.0.1:0"])
    try:
        assert "stepscope_gpu_up" in exp.metrics()
    finally:
        assert exp.stop() == 0


def test_installs_from_s3_through_the_aws_cli(node: Node, tmp_path: Path) -> None:
    bucket = make_release(tmp_path / "bucket" / "stepscope")
    # the AWS CLI of every ParallelCluster AMI, here copying from a local "bucket"
    node.command(
        "aws",
        f'src=$(echo "$5" | sed "s#^s3://b/#{tmp_path}/bucket/#"); '
        'if [ "$4" = --recursive ]; then mkdir -p "$6" && cp -R "$src/." "$6"; '
        f'else src=$(echo "$4" | sed "s#^s3://b/#{tmp_path}/bucket/#"); cp "$src" "$5"; fi',
    )
    (node.bin / "sed").symlink_to(shutil.which("sed") or "/bin/sed")
    node.python("python3.11", (3, 11))
    run = node.run("s3://b/stepscope", "--hpc-job")
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr + node.log
    assert bucket.is_dir()
    assert (
        "aws s3 cp --only-show-errors --recursive s3://b/stepscope/wheelhouse/ "
        in "\n".join(node.calls) + " "
    )
    assert "STEPSCOPE_HPC_JOB_DIR=/run/stepscope-jobs" in (
        node.root / "etc" / "default" / "stepscope"
    ).read_text()


def _installed(node: Node, module: str) -> bool:
    venv = node.root / "opt" / "stepscope"
    return bool(list(venv.glob(f"lib/python*/site-packages/{module}.py")))


def test_a_release_built_with_extras_installs_them(node: Node, tmp_path: Path) -> None:
    """Issue 27: the wheelhouse could not carry extras, so basic auth (bcrypt) could not
    be installed on a node without an index. build-wheelhouse.sh --extras auth writes
    OUT/extras; the install reads it."""
    release = make_release(tmp_path / "release", extras="auth")
    node.python("python3", (3, 11))
    run = node.run(str(release))
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr + node.log
    assert _installed(node, "stepscope_auth_helper") and _installed(node, "stepscope_helper")


def test_a_release_without_extras_installs_none(node: Node, tmp_path: Path) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 11))
    assert node.run(str(release)).returncode == 0
    assert _installed(node, "stepscope_helper") and not _installed(node, "stepscope_auth_helper")


def test_build_wheelhouse_downloads_the_extras_and_names_them(tmp_path: Path) -> None:
    """Against a stand-in Python that records its pip calls (the real one needs PyPI)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'if [ "$3" = wheel ]; then touch "$6/stepscope-1.0.0-py3-none-any.whl"; fi\n'
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(PCLUSTER / "build-wheelhouse.sh"), "--extras", "auth", str(out), "3.11"],
        env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    downloads = [c for c in calls.read_text().splitlines() if " download " in f" {c} "
                 and "stepscope-1.0.0" in c]
    assert len(downloads) == 2  # x86_64 and aarch64
    assert all(c.endswith("stepscope-1.0.0-py3-none-any.whl[auth]") for c in downloads)
    assert (out / "extras").read_text() == "auth\n"
    assert run.stdout.strip().endswith("wheels, extras auth")
    bad = subprocess.run(
        ["bash", str(PCLUSTER / "build-wheelhouse.sh"), "--extras", "auth;rm", str(out)],
        env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr == (
        "build-wheelhouse.sh: --extras takes names such as auth or auth,aws, got 'auth;rm'\n"
    )


def test_an_existing_settings_file_is_kept(node: Node, tmp_path: Path) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 11))
    settings = node.root / "etc" / "default" / "stepscope"
    settings.parent.mkdir(parents=True)
    settings.write_text("STEPSCOPE_INTERVAL=5\n")
    config = node.root / "etc" / "stepscope" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("host_label: hostname\n")
    assert node.run(str(release)).returncode == 0
    assert settings.read_text() == "STEPSCOPE_INTERVAL=5\n"
    assert config.read_text() == "host_label: hostname\n"


# ---- the images' Pythons


@pytest.mark.parametrize(
    ("image", "pythons"),
    [
        ("Ubuntu 22.04", {"python3": (3, 10)}),
        ("Ubuntu 24.04", {"python3": (3, 12), "python3.12": (3, 12)}),
        ("a node with several", {"python3": (3, 9), "python3.11": (3, 11)}),
    ],
)
def test_the_first_python_3_10_or_newer_is_used(
    node: Node, tmp_path: Path, image: str, pythons: dict[str, tuple[int, int]]
) -> None:
    release = make_release(tmp_path / "release")
    for name, version in pythons.items():
        node.python(name, version)
    run = node.run(str(release))
    assert run.returncode == 0 and "ERROR" not in run.stderr, (image, run.stderr)
    assert (node.root / "opt" / "stepscope" / "bin" / "stepscope").exists()


def test_amazon_linux_2023_gets_python3_11_from_dnf(node: Node, tmp_path: Path) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 9))  # AL2023's system Python
    ln = shutil.which("ln") or "/bin/ln"
    node.command("dnf", f'{ln} -s "{REAL_PYTHON}" "{node.bin}/python3.11"')
    run = node.run(str(release))
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    assert "dnf install -y -q python3.11" in node.calls
    assert "installing python3.11 with dnf" in node.log


def test_an_image_without_python_3_10_logs_what_to_do_and_exits_0(
    node: Node, tmp_path: Path
) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 8))  # Ubuntu 20.04; no dnf there
    run = node.run(str(release))
    _assert_gave_up(run, node, "no Python >= 3.10 on this node")
    assert "--python PATH" in run.stderr
    assert not (node.root / "opt" / "stepscope").exists()


def test_python_given_explicitly_is_checked_and_used(node: Node, tmp_path: Path) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 7))  # Amazon Linux 2
    shared = tmp_path / "fsx" / "python" / "bin"
    shared.mkdir(parents=True)
    (shared / "python3").symlink_to(REAL_PYTHON)
    run = node.run(str(release), "--python", str(shared / "python3"))
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    old = tmp_path / "old-python"
    old.write_text("#!/bin/sh\nexit 1\n")
    old.chmod(0o755)
    (node.root / "calls").unlink()
    _assert_gave_up(node.run(str(release), "--python", str(old)), node, "is not a Python >= 3.10")


# ---- never fail the node


def test_a_missing_wheelhouse_does_not_fail_the_node(node: Node, tmp_path: Path) -> None:
    node.python("python3", (3, 11))
    (tmp_path / "empty").mkdir()
    _assert_gave_up(node.run(str(tmp_path / "empty")), node, "no wheelhouse/ in")


def test_a_wheelhouse_without_pip_does_not_fail_the_node(node: Node, tmp_path: Path) -> None:
    node.python("python3", (3, 11))
    release = make_release(tmp_path / "release", with_pip=False)
    _assert_gave_up(node.run(str(release)), node, "no pip wheel in")


def test_a_dependency_missing_from_the_wheelhouse_is_not_fetched_from_an_index(
    node: Node, tmp_path: Path
) -> None:
    # with network allowed: --no-index, not the sandbox, is what keeps pip offline
    node.python("python3", (3, 11))
    release = make_release(tmp_path / "release", requires=("not-in-the-wheelhouse",))
    run = node.run(str(release), network=True)
    _assert_gave_up(run, node, "pip could not install stepscope from")
    assert "not-in-the-wheelhouse" in node.log
    assert "pypi.org" not in node.log


def test_a_failing_service_manager_does_not_fail_the_node(node: Node, tmp_path: Path) -> None:
    node.python("python3", (3, 11))
    node.command("systemctl", 'case "$1" in enable) exit 1;; esac')
    release = make_release(tmp_path / "release")
    run = node.run(str(release))
    assert run.returncode == 0
    assert "systemctl enable --now stepscope failed" in run.stderr
    assert "stepscope is NOT installed on this node" in run.stderr


@pytest.mark.parametrize("args", [[], ["--role"], ["s3://b/p", "--role", "login"],
                                  ["s3://b/p", "extra"], ["--hpc-job"],
                                  ["s3://b/p", "--ingest-group", "users\nUser=root"],
                                  ["s3://b/p", "--ingest-group", "-x"]])
def test_bad_arguments_are_logged_and_exit_0(node: Node, args: list[str]) -> None:
    run = node.run(*args)
    assert run.returncode == 0
    assert "stepscope is NOT installed on this node" in run.stderr


# ---- who may report


def test_ingest_group_makes_the_socket_that_groups_and_no_one_elses(
    node: Node, tmp_path: Path
) -> None:
    """The unit runs with the group (a drop-in), so the socket, created 0660 with the
    service's group, admits its members; a second install without the flag removes it."""
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 11))
    node.command("getent", '[ "$2" = slurm-users ]')
    run = node.run(str(release), "--ingest-group", "slurm-users")
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    dropin = node.root / "etc/systemd/system/stepscope.service.d/ingest-group.conf"
    lines = [ln for ln in dropin.read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["[Service]", "Group=slurm-users"]
    assert "training ranks of group slurm-users may report" in node.log
    # the unit itself is installed unchanged
    unit = node.root / "etc" / "systemd" / "system" / "stepscope.service"
    assert unit.read_text() == UNIT.read_text()

    assert node.run(str(release)).returncode == 0
    assert not dropin.exists(), "the default again: the service's own group"


def test_an_unknown_ingest_group_is_logged_and_the_exporter_still_installed(
    node: Node, tmp_path: Path
) -> None:
    release = make_release(tmp_path / "release")
    node.python("python3", (3, 11))
    node.command("getent", "exit 2")
    run = node.run(str(release), "--ingest-group", "nosuchgroup")
    assert run.returncode == 0
    assert "ERROR: no group 'nosuchgroup' on this node" in run.stderr
    assert not (node.root / "etc/systemd/system/stepscope.service.d").exists()
    assert "systemctl enable --now stepscope.service" in node.calls


# ---- head node


def test_head_node_gets_the_slurm_scripts_only_with_hpc_job(node: Node, tmp_path: Path) -> None:
    release = make_release(tmp_path / "release")
    run = node.run(str(release), "--role", "head")
    assert run.returncode == 0 and "nothing to install" in run.stderr
    assert not (node.root / "opt").exists() and node.calls == [
        c for c in node.calls if c.startswith("logger")
    ]
    run = node.run(str(release), "--role", "head", "--hpc-job")
    assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr
    scripts = node.root / "opt" / "slurm" / "etc" / "scripts"
    for kind in ("prolog", "epilog"):
        installed = scripts / f"{kind}.d" / "90_stepscope.sh"
        assert installed.read_text() == (PCLUSTER / f"slurm-{kind}.sh").read_text()
        assert os.access(installed, os.X_OK)
    assert not (node.root / "opt" / "stepscope").exists()


# ---- the cluster configuration that calls it


def test_cluster_config_example_passes_the_role_and_a_release_source() -> None:
    cfg = yaml.safe_load((PCLUSTER / "cluster-config-example.yaml").read_text())
    head = cfg["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    queue = cfg["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    for action, role in ((head, "head"), (queue, "compute")):
        assert action["Script"].endswith("/install-stepscope.sh")
        args = action["Args"]
        assert args[0].startswith("s3://") and args[args.index("--role") + 1] == role
