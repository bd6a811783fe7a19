"""Kubernetes attribution: GPU series carry the pod, namespace and container of the
workload the kubelet allocated the GPU to.

The kubelet is played by a real gRPC server (grpcio, the stubs generated from the
kubelet's own api.proto) on a Unix socket, serving the real pod-resources protocol to a
real ``stepscope serve`` process; the mapping itself is tested as plain data.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
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
from stepscope.attribution.podresources import api_pb2, api_pb2_grpc
from stepscope.core.labels import GpuIdentity
from stepscope.core.source import ReadContext
from tests.support import REPO, Exporter, parse_samples, start_exporter, wait_for

# The device plugin's whole-GPU ids are GPU UUIDs.
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
# MIG slices are named by MIG UUIDs
MIG_A = "MIG-11111111-2222-3333-4444-555555555555"
MIG_B = "MIG-66666666-2222-3333-4444-555555555555"


def container(name: str, *devices: tuple[str, Sequence[str]]) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name,
        devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices],
    )


def pod(namespace: str, name: str, *containers: api_pb2.ContainerResources
        ) -> api_pb2.PodResources:  # fmt: skip
    return api_pb2.PodResources(name=name, namespace=namespace, containers=containers)


def response(*pods: api_pb2.PodResources) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


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


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's side of v1.PodResourcesLister: List answers what the test set, or
    hangs (never answers) while ``hang`` is set."""

    def __init__(self) -> None:
        self.listed = response()
        self.hang = threading.Event()
        self.calls = 0

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
             ) -> api_pb2.ListPodResourcesResponse:  # fmt: skip
        self.calls += 1
        # a stuck kubelet: hold the call until the client gives up (its deadline)
        while self.hang.is_set() and context.is_active():
            time.sleep(0.05)
        return self.listed


class KubeletServer:
    """A gRPC server on a Unix socket, stoppable and restartable like a kubelet."""

    def __init__(self, path: Path) -> None:
        self.socket = path
        self.kubelet = FakeKubelet()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.kubelet, server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self.kubelet.hang.clear()
            self._server.stop(grace=None).wait(10)
            self._server = None


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletServer]:
    path = tmp_path / "kubelet.sock"
    assert len(str(path)) < 100, f"{path}: too long for a Unix socket path"
    server = KubeletServer(path)
    server.start()
    yield server
    server.stop()


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


def serve(tmp_path: Path, sock: Path, env: dict[str, str] | None = None) -> Exporter:
    return start_exporter(
        ["--simulate", "2", "--hostname", "k8s-node", "--interval", "0.2",
         "--slow-interval", "0.5", "--ingest", f"unix://{tmp_path}/ingest.sock",
         "--kubernetes-pod-resources", str(sock)],
        env,
    )  # fmt: skip


def gpu_series(exp: Exporter) -> list[dict[str, str]]:
    """Label sets of every GPU series (those with the GPU's own pci_bus_id label)."""
    fams = parse_samples(exp.metrics())
    return [lbl for samples in fams.values() for lbl, _ in samples if "pci_bus_id" in lbl]


def uuids(exp: Exporter) -> dict[str, str]:
    """GPU index -> UUID, as the exporter serves them."""
    samples = parse_samples(exp.metrics())["DCGM_FI_DEV_GPU_UTIL"]
    return {lbl["gpu"]: lbl["UUID"] for lbl, _ in samples}


def owners(exp: Exporter) -> dict[str, set[tuple[str | None, str | None, str | None]]]:
    """GPU index -> the (pod, namespace, container) values its series carry."""
    out: dict[str, set[tuple[str | None, str | None, str | None]]] = {}
    for lbl in gpu_series(exp):
        out.setdefault(lbl["gpu"], set()).add(
            (lbl.get("pod"), lbl.get("namespace"), lbl.get("container"))
        )
    return out


def kubernetes_health(exp: Exporter) -> tuple[float | None, str | None]:
    """(stepscope_collector_success, last_error) of the kubernetes source."""
    fams = parse_samples(exp.metrics())
    success = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_success"]}
    _, _, body = exp.get("/api/v1/diagnosis")
    source = json.loads(body)["sources"].get("kubernetes", {})
    return success.get("kubernetes"), source.get("last_error")


UNATTRIBUTED = {(None, None, None)}


def test_a_pod_requesting_a_gpu_shows_on_that_gpus_series_and_follows_pod_churn(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    exp = serve(tmp_path, kubelet.socket)
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0",
                container("pytorch", ("nvidia.com/gpu", [gpu["1"]]),
                          ("vpc.amazonaws.com/efa", ["0"]))),
            pod("kube-system", "aws-node-x", container("aws-node")),
        )  # fmt: skip
        wait_for(lambda: owners(exp) == {
            "0": UNATTRIBUTED, "1": {("trainer-0", "ml", "pytorch")}
        })  # fmt: skip
        assert kubernetes_health(exp) == (1.0, None)
        # every GPU series of GPU 1 carries the labels, none of GPU 0's does
        series = gpu_series(exp)
        assert sum(lbl["gpu"] == "1" for lbl in series) > 20

        # the job's pod is replaced (rescheduled as trainer-1, on GPU 0 this time) and
        # another workload takes GPU 1
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-1", container("pytorch", ("nvidia.com/gpu", [gpu["0"]]))),
            pod("infer", "llm-0", container("server", ("nvidia.com/gpu", [gpu["1"]]))),
        )
        wait_for(lambda: owners(exp) == {
            "0": {("trainer-1", "ml", "pytorch")}, "1": {("llm-0", "infer", "server")}
        })  # fmt: skip
        kubelet.kubelet.listed = response()  # every pod gone
        wait_for(lambda: owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED})
    finally:
        assert exp.stop() == 0


def test_a_kubelet_that_goes_away_costs_the_labels_and_a_failing_source_only(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    exp = serve(tmp_path, kubelet.socket)
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [gpu["0"]])))
        )
        attributed = {"0": {("trainer-0", "ml", "pytorch")}, "1": UNATTRIBUTED}
        wait_for(lambda: owners(exp) == attributed)
        kubelet.stop()
        wait_for(lambda: owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED})
        success, error = kubernetes_health(exp)
        assert success == 0.0 and error and str(kubelet.socket) in error
        # the GPUs themselves are still served, in full
        fams = parse_samples(exp.metrics())
        assert {lbl["gpu"] for lbl, _ in fams["DCGM_FI_DEV_GPU_UTIL"]} == {"0", "1"}
        # the kubelet restarts: the labels come back without restarting the exporter
        kubelet.start()
        wait_for(lambda: owners(exp) == attributed)
        assert kubernetes_health(exp) == (1.0, None)
    finally:
        assert exp.stop() == 0


def test_a_kubelet_that_never_answers_holds_up_no_scrape(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    kubelet.kubelet.hang.set()
    exp = serve(tmp_path, kubelet.socket)
    try:
        wait_for(lambda: kubelet.kubelet.calls >= 1)
        # while the List call hangs (up to its 5 s deadline), every scrape answers at once
        # and the passes go on
        latencies: list[float] = []
        passes: set[float] = set()

        def scrape() -> bool:
            t0 = time.monotonic()
            fams = parse_samples(exp.metrics())
            latencies.append(time.monotonic() - t0)
            passes.add(fams["stepscope_last_collect_timestamp_seconds"][0][1])
            return len(passes) >= 5  # several passes published during the hung call

        wait_for(scrape, timeout=4)
        assert kubelet.kubelet.calls == 1, "the first List call was still hanging"
        assert max(latencies) < 2.5, f"a scrape took {max(latencies):.2f} s"
        assert owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED}
        # the health says the kubelet did not answer in time
        wait_for(lambda: (h := kubernetes_health(exp))[0] == 0.0 and "DEADLINE" in (h[1] or ""),
                 timeout=20)
    finally:
        assert exp.stop() == 0


def test_serve_starts_without_grpcio_and_the_source_says_what_is_missing(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    # a grpc package that cannot be imported shadows the installed one
    blocked = tmp_path / "blocked"
    (blocked / "grpc").mkdir(parents=True)
    (blocked / "grpc" / "__init__.py").write_text("raise ImportError('grpc blocked by the test')\n")
    exp = serve(tmp_path, kubelet.socket, env={"PYTHONPATH": str(blocked)})
    try:
        success, error = wait_for(lambda: (h := kubernetes_health(exp))[1] and h)
        assert success == 0.0
        assert "pip install 'stepscope[kubernetes]'" in error
        assert owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED}
        wait_for(lambda: any("source kubernetes failed" in line for line in exp.stderr_lines))
    finally:
        assert exp.stop() == 0


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


def _prometheus_relabeling(operator: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator RelabelConfig as the relabel_config Prometheus runs."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): (str(v).lower() if k == "action" else v)
            for k, v in operator.items()}


@pytest.mark.parametrize("attribution", [True, False], ids=["chart", "without-labeldrop"])
def test_the_workloads_pod_labels_reach_prometheus_under_the_charts_scrape_config(
    tmp_path: Path, kubelet: KubeletServer, attribution: bool
) -> None:
    """The Prometheus Operator gives every target of a ServiceMonitor the labels pod,
    namespace and container of the scraped pod (the exporter's own). With honor_labels
    false, as shipped, a GPU series' pod label of the workload then becomes exported_pod
    and every "which pod is on this GPU" query finds nothing. The chart's scrape drops
    those target labels; without that step the labels are renamed, as here."""
    from tests.test_helm import one, rendered_objects
    from tests.test_prometheus_e2e import Prometheus

    objs = rendered_objects({"podResources": {"enabled": attribution}, "cluster": "c1"})
    (endpoint,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is False
    relabel = [_prometheus_relabeling(r) for r in endpoint["relabelings"]]

    exp = serve(tmp_path, kubelet.socket)
    prom = None
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [gpu["0"]]))))
        wait_for(lambda: owners(exp)["0"] == {("trainer-0", "ml", "pytorch")})
        # the target labels the Operator gives the target before the monitor's relabelings
        operator_target = {"namespace": "monitoring", "pod": "stepscope-x7k2p",
                           "container": "stepscope"}
        prom = Prometheus(tmp_path, [exp.address], REPO / "deploy" / "prometheus" / "rules",
                          static_configs=[{"targets": [exp.address], "labels": operator_target}],
                          relabel_configs=relabel)

        def stored() -> list[dict[str, str]] | None:
            assert prom is not None
            result = prom.api("query", query="DCGM_FI_DEV_GPU_UTIL")["result"]
            return [r["metric"] for r in result] if len(result) == 2 else None

        series = {m["gpu"]: m for m in wait_for(stored, timeout=30, interval=0.5)}
        if attribution:
            assert {k: series["0"].get(k) for k in ("pod", "namespace", "container")} == {
                "pod": "trainer-0", "namespace": "ml", "container": "pytorch"}
            assert not any(k.startswith("exported_") for m in series.values() for k in m)
            assert "pod" not in series["1"], "a GPU no pod holds carries no pod label"
            assert series["0"]["cluster"] == "c1"
        else:
            # what an Operator-made target does to the workload's labels
            assert series["0"]["exported_pod"] == "trainer-0"
            assert series["0"]["pod"] == series["1"]["pod"] == "stepscope-x7k2p"
    finally:
        if prom is not None:
            prom.stop()
        assert exp.stop() == 0
