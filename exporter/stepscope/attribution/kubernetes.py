"""Which pod uses which GPU, from the kubelet's pod-resources API.

The kubelet serves, on a Unix socket of the node (normally
``/var/lib/kubelet/pod-resources/kubelet.sock``), the gRPC service
``v1.PodResourcesLister``; its ``List`` names every container and the devices the
device plugins allocated to it. The NVIDIA device plugin's device ids are GPU UUIDs by
default, so a GPU allocated to a container gets that container's ``pod``, ``namespace``
and ``container`` labels on its series, the names dcgm-exporter uses (its
``transformation/kubernetes.go``), so dashboards keyed on them keep working.

What is attributed, as dcgm-exporter does it:

- resources ``nvidia.com/gpu`` and ``nvidia.com/mig-*``; every other resource is skipped;
- a whole GPU by UUID; a time-sliced replica (``GPU-…::3``, the device plugin's sharing)
  counts as its GPU;
- one container per GPU: when several list the same GPU (time-slicing), the series
  carry one of them, never a join and never a copy per container. dcgm-exporter keeps the
  last one listed; the kubelet lists pods in no stable order, so we keep the container
  already shown while it still holds the GPU and take the last listed otherwise: the
  same choice without the labels flapping between reads;
- MIG devices (``MIG-…`` ids, ``nvidia.com/mig-*`` resources, GKE's ``nvidia0/gi0``) are
  not attributed yet: the GPU's series would name a pod that uses a slice of it. They
  are counted and shown as evidence, never an error.

The read is a background source: the kubelet is another process that may be slow,
restarting or absent, so the read runs in its own thread every ``slow_interval`` with a
deadline on the call, and a scrape never waits for it. While it fails, the GPU series are
served without these labels and ``stepscope_collector_success{collector="kubernetes"}``
reads 0 with the reason in ``/api/v1/diagnosis``.

grpcio and protobuf are the optional ``kubernetes`` extra, imported only when the
attribution is configured: ``stepscope serve`` runs without them, and refuses to start
(exit 2, one line saying what to install) when ``kubernetes_pod_resources`` is set and
they are missing (:func:`check_extra`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stepscope.core.labels import GpuIdentity, Pairs
from stepscope.core.source import PartKey, ReadContext, Source, Tier

if TYPE_CHECKING:
    from stepscope.attribution.podresources.api_pb2 import ListPodResourcesResponse

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# Deadline of one List call. A kubelet answers in milliseconds; one that takes longer is
# stuck, and the read must end so the next one can try again (dcgm-exporter waits 10 s).
RPC_TIMEOUT_S = 5.0
# dcgm-exporter's resource names (appconfig/const.go) and label names (transformation/
# const.go, its default, not the pre-2.x pod_name/pod_namespace/container_name).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_ID_PREFIX = "MIG-"
POD_LABELS = ("pod", "namespace", "container")
# The NVIDIA device plugin's time-slicing replicas: "<GPU UUID>::<replica>".
_REPLICA_SEPARATOR = "::"
# GKE's MIG partitions: "nvidia<index>/gi<instance>", optionally "/vgpu<n>".
_GKE_MIG_RE = re.compile(r"\Anvidia[0-9]+/gi[0-9]+(/vgpu[0-9]+)?\Z")
_INSTALL_HINT = "pip install 'stepscope[kubernetes]'"


class KubeletUnavailable(RuntimeError):
    """The pod-resources API could not be read; the message says why."""


@dataclass(frozen=True, slots=True, order=True)
class PodContainer:
    """A container of a pod: what the series of a GPU allocated to it are labelled with."""

    namespace: str
    pod: str
    container: str

    def pairs(self) -> Pairs:
        """The label pairs, under dcgm-exporter's names."""
        return tuple(zip(POD_LABELS, (self.pod, self.namespace, self.container), strict=True))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One container's devices of one NVIDIA resource, as the kubelet lists them."""

    owner: PodContainer
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PodAttribution:
    """The part: GPU UUID -> the container its series are attributed to.

    ``sharers``: for a GPU listed by more than one container, how many list it.
    ``mig_devices``: MIG device ids allocated to containers, not attributed (yet).
    """

    gpus: Mapping[str, PodContainer] = field(default_factory=dict)
    sharers: Mapping[str, int] = field(default_factory=dict)
    mig_devices: tuple[str, ...] = ()
    pods: int = 0


def is_mig_device(resource: str, device_id: str) -> bool:
    """Whether a device is a MIG slice (any way a device plugin names one)."""
    return (
        resource.startswith(MIG_RESOURCE_PREFIX)
        or device_id.startswith(MIG_ID_PREFIX)
        or _GKE_MIG_RE.match(device_id) is not None
    )


def gpu_uuid_of(device_id: str) -> str:
    """The GPU a whole-GPU device id names: the id itself, or a replica's GPU."""
    return device_id.split(_REPLICA_SEPARATOR, 1)[0]


def allocations(response: ListPodResourcesResponse) -> tuple[DeviceAllocation, ...]:
    """The NVIDIA devices of a ``List`` response, in the kubelet's order, as plain data."""
    out: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            owner = PodContainer(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                resource = devices.resource_name
                if resource != GPU_RESOURCE and not resource.startswith(MIG_RESOURCE_PREFIX):
                    continue  # NICs, FPGAs, hugepages...: not ours to label
                out.append(DeviceAllocation(owner, resource, tuple(devices.device_ids)))
    return tuple(out)


def attribute(
    allocated: Iterable[DeviceAllocation],
    previous: Mapping[str, PodContainer] | None = None,
    pods: int = 0,
) -> PodAttribution:
    """Which container each whole GPU is attributed to (pure: no I/O).

    A GPU listed by several containers goes to the one in ``previous`` (the last read's
    choice) while it still lists the GPU, else to the last one listed (dcgm-exporter's
    rule).
    """
    holders: dict[str, list[PodContainer]] = {}
    mig: list[str] = []
    for alloc in allocated:
        for device_id in alloc.device_ids:
            if is_mig_device(alloc.resource, device_id):
                mig.append(device_id)
                continue
            uuid = gpu_uuid_of(device_id)
            if not uuid:
                continue
            owners = holders.setdefault(uuid, [])
            if alloc.owner not in owners:
                owners.append(alloc.owner)
    previous = previous or {}
    gpus: dict[str, PodContainer] = {}
    for uuid, owners in holders.items():
        kept = previous.get(uuid)
        gpus[uuid] = kept if kept in owners else owners[-1]
    sharers = {uuid: len(owners) for uuid, owners in holders.items() if len(owners) > 1}
    return PodAttribution(gpus, sharers, tuple(mig), pods)


def _check_socket(socket: str) -> None:
    """Say plainly why the socket cannot be used, before gRPC says it less plainly."""
    try:
        os.stat(socket)
        # connect() needs write permission on the socket itself
        allowed = os.access(socket, os.W_OK)
    except FileNotFoundError:
        raise KubeletUnavailable(
            f"{socket}: no such socket (the kubelet is not running, or its pod-resources "
            "directory is not mounted here)"
        ) from None
    except PermissionError:
        allowed = False
    if not allowed:
        # the kubelet creates the socket root-owned, mode 0755, in a 0750 directory
        raise KubeletUnavailable(
            f"{socket}: permission denied: only uid 0 may connect to the kubelet's socket "
            f"(no capability needed); this process runs as uid {os.getuid()}"
        )


def check_extra() -> None:
    """Raise KubeletUnavailable, saying what to install, when the ``kubernetes`` extra
    (grpcio, protobuf) is missing or too old for the generated stubs. ``stepscope serve``
    calls it at start when the attribution is configured: a configured feature that
    cannot start stops the start."""
    try:
        import grpc  # noqa: F401

        from stepscope.attribution.podresources import api_pb2, api_pb2_grpc  # noqa: F401
    except Exception as exc:  # ImportError, or the generated code's version checks
        raise KubeletUnavailable(
            f"Kubernetes attribution needs grpcio and protobuf ({_INSTALL_HINT}): {exc}"
        ) from None


def list_pod_resources(socket: str, timeout: float = RPC_TIMEOUT_S) -> ListPodResourcesResponse:
    """One ``List`` call to the kubelet on ``socket``, with a deadline.

    Raises KubeletUnavailable: the kubernetes extra is missing, the socket is absent,
    the kubelet refused, failed or did not answer in time.
    """
    check_extra()
    import grpc

    from stepscope.attribution.podresources import api_pb2, api_pb2_grpc

    _check_socket(socket)
    # A channel per read, as dcgm-exporter does: a kubelet restart recreates the socket,
    # and a fresh channel connects at once instead of waiting out a reconnect back-off.
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response: ListPodResourcesResponse = stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout
            )
        except grpc.RpcError as exc:
            # a failed call's error is also its grpc.Call (status code and details); the
            # type stubs cannot say so
            code, details = getattr(exc, "code", None), getattr(exc, "details", None)
            name = getattr(code(), "name", "ERROR") if callable(code) else "ERROR"
            text = details() if callable(details) else str(exc)
            raise KubeletUnavailable(f"List on {socket}: {name}: {text}") from None
    return response


KUBERNETES_PART: PartKey[PodAttribution] = PartKey("kubernetes")


class KubernetesSource(Source[PodAttribution]):
    """Attributes each GPU to the pod container it is allocated to (``pod``,
    ``namespace``, ``container`` labels), read from the kubelet off the sampling pass."""

    key = KUBERNETES_PART
    # the kubelet is another process: its slowness must never hold up a pass
    background = True
    # pods start and stop over seconds to minutes: the slow cadence (default 10 s) is
    # fresh enough and costs the kubelet one small call per node per read
    tier = Tier.SLOW

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = RPC_TIMEOUT_S) -> None:
        self.socket = socket
        self.timeout = timeout
        self._last: Mapping[str, PodContainer] = {}

    def read(self, ctx: ReadContext) -> PodAttribution:
        try:
            response = list_pod_resources(self.socket, self.timeout)
        except KubeletUnavailable:
            self._last = {}  # the labels go with the kubelet; the next read starts afresh
            raise
        part = attribute(allocations(response), self._last, len(response.pod_resources))
        self._last = part.gpus
        return part

    def gpu_labels(
        self, part: PodAttribution, gpus: Sequence[GpuIdentity]
    ) -> Mapping[str, Pairs]:
        return {g.uuid: part.gpus[g.uuid].pairs() for g in gpus if g.uuid in part.gpus}

    def evidence(self, part: PodAttribution) -> Sequence[str]:
        lines = [
            f"GPU {uuid} is shared by {n} containers; its series carry {part.gpus[uuid]}"
            for uuid, n in sorted(part.sharers.items())
        ]
        if part.mig_devices:
            lines.append(
                f"{len(part.mig_devices)} MIG device(s) allocated to pods are not attributed "
                "(pod labels are served for whole GPUs only)"
            )
        return lines
