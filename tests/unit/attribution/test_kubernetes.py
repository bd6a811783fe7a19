"""Kubernetes attribution: GPU series carry the pod, namespace and container of the
workload the kubelet allocated the GPU to.

The kubelet is played by a real gRPC server (grpcio, the stubs generated from the
kubelet's own api.proto) on a Unix socket, serving the real pod-resources protocol to a
real ``stepscope serve`` process; the mapping itself is tested as plain data.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.attribution.kubernetes import (
    DeviceAllocation,
    KubeletUnavailable,
    KubernetesSource,
    PodContainer,
    allocations,
    attribute,
    list_pod_resources,
)
from stepscope.core.labels import GpuIdentity
from stepscope.core.source import ReadContext
from tests.support import REPO
from tests.support.kubelet import (
    MIG_A,
    MIG_B,
    UUID_A,
    UUID_B,
    KubeletServer,
    container,
    pod,
    response,
)

# ------------------------------------------------------------------ the mapping


def test_a_whole_gpu_is_attributed_to_the_container_it_is_allocated_to() -> None:
    listed = response(
        pod("ml", "trainer-0",
            container("pytorch", ("nvidia.com/gpu", [UUID_A]), ("vpc.amazonaws.com/efa", ["0"])),
            container("sidecar")),
        pod("kube-system", "aws-node-x", container("aws-node", ("hugepages-2Mi", ["1"]))),
    )  # fmt: skip
    part = attribute(allocations(listed), pods=len(listed.pod_resources))
    assert part.gpus == {UUID_A: PodContainer("ml", "trainer-0", "pytorch")}
    assert part.pods == 2 and not part.sharers and not part.mig_devices
    source = KubernetesSource("/nonexistent")
    gpus = [GpuIdentity(0, UUID_A, "00:1", "H200"), GpuIdentity(1, UUID_B, "00:2", "H200")]
    assert source.gpu_labels(part, gpus) == {
        UUID_A: (("pod", "trainer-0"), ("namespace", "ml"), ("container", "pytorch"))
    }


def test_mig_devices_are_counted_not_attributed_and_break_nothing() -> None:
    listed = response(
        pod("ml", "small-0",
            container("a", ("nvidia.com/mig-1g.18gb", [MIG_A])),
            # the "single" MIG strategy: MIG slices under nvidia.com/gpu
            container("b", ("nvidia.com/gpu", [MIG_B])),
            container("c", ("nvidia.com/gpu", ["nvidia0/gi3"]))),  # GKE's MIG ids
        pod("ml", "big-0", container("main", ("nvidia.com/gpu", [UUID_B]))),
    )  # fmt: skip
    part = attribute(allocations(listed))
    assert part.gpus == {UUID_B: PodContainer("ml", "big-0", "main")}
    assert len(part.mig_devices) == 3
    assert any("3 MIG device(s)" in line for line in KubernetesSource().evidence(part))


def test_a_shared_gpu_carries_one_container_and_keeps_it_while_it_holds_the_gpu() -> None:
    first = PodContainer("ml", "a", "main")
    second = PodContainer("ml", "b", "main")
    # time-slicing: the device plugin lists replicas of one GPU as "<UUID>::<n>"
    a = DeviceAllocation(first, "nvidia.com/gpu", (f"{UUID_A}::0",))
    b = DeviceAllocation(second, "nvidia.com/gpu", (f"{UUID_A}::1",))
    # dcgm-exporter's rule: the last container listed
    part = attribute([a, b])
    assert part.gpus == {UUID_A: second} and part.sharers == {UUID_A: 2}
    # the kubelet lists pods in no stable order: the container shown stays while it
    # still holds the GPU, so the series do not flap between reads
    assert attribute([b, a], previous=part.gpus).gpus == {UUID_A: second}
    assert attribute([a], previous=part.gpus).gpus == {UUID_A: first}
    lines = KubernetesSource().evidence(part)
    assert lines == [f"GPU {UUID_A} is shared by 2 containers; its series carry ml/b/main"]


# ------------------------------------------------------------------ a real kubelet API




def test_the_source_reads_the_real_protocol_and_names_a_missing_socket(
    kubelet: KubeletServer, tmp_path: Path
) -> None:
    kubelet.kubelet.listed = response(
        pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [UUID_A, UUID_B])))
    )
    assert list_pod_resources(str(kubelet.socket)) == kubelet.kubelet.listed
    ctx = ReadContext(now=0.0, interval=1.0, slow_interval=10.0)
    part = KubernetesSource(str(kubelet.socket)).read(ctx)
    owner = PodContainer("ml", "trainer-0", "pytorch")
    assert part.gpus == {UUID_A: owner, UUID_B: owner}
    with pytest.raises(KubeletUnavailable, match="no such socket"):
        list_pod_resources(str(tmp_path / "absent.sock"))


def test_without_grpcio_the_read_fails_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, kubelet: KubeletServer
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    with pytest.raises(KubeletUnavailable, match=r"pip install 'stepscope\[kubernetes\]'"):
        list_pod_resources(str(kubelet.socket))


# ------------------------------------------------------------------ the exporter


def test_a_process_that_may_not_connect_is_told_why(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("running as another uid needs root to fork a child that drops to nobody")
    # the kubelet's layout: a root-owned socket, mode 0755, in a root-owned 0750 directory
    directory = tmp_path / "pod-resources"
    directory.mkdir(mode=0o750)
    path = directory / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        path.chmod(0o755)
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover (the child reports through the pipe)
            try:
                os.setgid(65534)
                os.setuid(65534)
                list_pod_resources(str(path))
                message = "connected"
            except Exception as exc:
                message = str(exc)
            os.write(write_end, message.encode())
            os._exit(0)
        os.close(write_end)
        os.waitpid(child, 0)
        with os.fdopen(read_end) as pipe:
            message = pipe.read()
    assert message == (
        f"{path}: permission denied: only uid 0 may connect to the kubelet's socket "
        "(no capability needed); this process runs as uid 65534"
    )


# ------------------------------------------------------------------ as the chart deploys it


def _as_the_chart_runs_the_exporter(script: str, mount: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as the chart's exporter container runs: uid 0 with every capability
    dropped (bounding set included), gid 10001, no privilege escalation, the kubelet's
    pod-resources directory bind-mounted read-only (a private mount namespace)."""
    if os.geteuid() != 0:
        pytest.skip("a private read-only mount and dropped capabilities need root to set up")
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) is not installed")
    inner = (
        f"mount --bind {mount} {mount} && mount -o remount,ro,bind {mount} && "
        "exec setpriv --reuid=0 --regid=10001 --clear-groups --no-new-privs "
        "--inh-caps=-all --bounding-set=-all "
        f"{sys.executable} -c {shlex.quote(script)}"
    )
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return subprocess.run(["unshare", "--mount", "sh", "-c", inner], capture_output=True,
                          text=True, timeout=60, env=env)


def test_uid_0_without_any_capability_reads_the_kubelet_through_a_read_only_mount(
    tmp_path: Path,
) -> None:
    """What the chart grants is what the kubelet's socket needs, no more: its socket is
    root's with mode 0755 in a 0750 directory; connect() needs write permission on the
    socket file, which the owner has without CAP_DAC_OVERRIDE, and no write access to the
    file system (the mount is read-only)."""
    directory = tmp_path / "pod-resources"
    directory.mkdir(mode=0o750)
    server = KubeletServer(directory / "kubelet.sock")
    server.start()
    try:
        (directory / "kubelet.sock").chmod(0o755)
        server.kubelet.listed = response(
            pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [UUID_A]))))
        script = (
            "import os, pathlib\n"
            "from stepscope.attribution.kubernetes import list_pod_resources\n"
            f"d = pathlib.Path({str(directory)!r})\n"
            "try:\n"
            "    (d / 'probe').write_text('x')\n"
            "    print('writable')\n"
            "except OSError as exc:\n"
            "    print('read-only' if exc.errno == 30 else exc)\n"
            "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
            "print(os.getuid(), os.getgid(), caps[0])\n"
            "r = list_pod_resources(str(d / 'kubelet.sock')).pod_resources[0]\n"
            "print(r.name, r.containers[0].devices[0].device_ids[0])\n"
        )
        done = _as_the_chart_runs_the_exporter(script, directory)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "read-only", "0 10001 0000000000000000", f"trainer-0 {UUID_A}"]
    finally:
        server.stop()
