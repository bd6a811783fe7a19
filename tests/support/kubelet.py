"""A fake kubelet: a real gRPC server of the pod-resources protocol on a Unix socket,
and the responses it gives."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from stepscope.attribution.podresources import api_pb2, api_pb2_grpc

# The device plugin's whole-GPU ids are GPU UUIDs; MIG devices have their own.
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
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


def running_kubelet(tmp_path: Path) -> Iterator[KubeletServer]:
    """A started fake kubelet on ``tmp_path/kubelet.sock``, stopped after the test."""
    path = tmp_path / "kubelet.sock"
    assert len(str(path)) < 100, f"{path}: too long for a Unix socket path"
    server = KubeletServer(path)
    server.start()
    yield server
    server.stop()
