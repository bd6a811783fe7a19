"""The EC2 instance this exporter runs on, read once through IMDSv2.

Placement group and partition are what ``ec2_sd_configs`` cannot tell Prometheus, and
cross-AZ or scattered placement is a known straggler cause, so they are served in one
``stepscope_node_info`` series. The read is IMDSv2 over plain HTTP (the standard
library's urllib: a token PUT, then GETs with the token; no AWS SDK in the image), one
attempt with a short timeout, in a background thread: a host that is not on EC2 starts
as fast as any other and simply has no node info. The AWS SDKs' own settings apply:
``AWS_EC2_METADATA_DISABLED=true`` turns the read off,
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` points it elsewhere,
``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`` uses the IPv6 endpoint and
``AWS_METADATA_SERVICE_TIMEOUT`` sets the timeout in seconds (default 1).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("stepscope.aws")

DEFAULT_TIMEOUT = 1.0
ENDPOINT_IPV4 = "http://169.254.169.254/"
ENDPOINT_IPV6 = "http://[fd00:ec2::254]/"
# The token only has to outlive the handful of GETs below.
TOKEN_TTL_SECONDS = 60


@dataclass(frozen=True)
class NodeTopology:
    """Where the instance runs. Empty strings for what the instance does not have
    (no placement group, not a partition placement group)."""

    instance_id: str
    instance_type: str
    region: str
    availability_zone: str
    availability_zone_id: str = ""
    placement_group: str = ""
    placement_partition: str = ""


def topology_from_metadata(
    identity: Mapping[str, object], extra: Mapping[str, str]
) -> NodeTopology:
    """Build the topology from the instance identity document and the single-value
    placement paths (``availability-zone-id``, ``group-name``, ``partition-number``)."""
    return NodeTopology(
        instance_id=str(identity.get("instanceId", "")),
        instance_type=str(identity.get("instanceType", "")),
        region=str(identity.get("region", "")),
        availability_zone=str(identity.get("availabilityZone", "")),
        availability_zone_id=extra.get("availability-zone-id", ""),
        placement_group=extra.get("group-name", ""),
        placement_partition=extra.get("partition-number", ""),
    )


def _endpoint(env: Mapping[str, str]) -> str:
    explicit = env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").strip()
    if explicit:
        return explicit if explicit.endswith("/") else explicit + "/"
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "").strip().lower() == "ipv6":
        return ENDPOINT_IPV6
    return ENDPOINT_IPV4


def _timeout(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get("AWS_METADATA_SERVICE_TIMEOUT", DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


class _Imds:
    """IMDSv2 requests. Never through an HTTP proxy: a proxy would answer with its own
    instance's metadata, or not at all (the SDKs bypass proxies for IMDS as well)."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.token = ""

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        req = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        try:
            with self.opener.open(req, timeout=self.timeout) as resp:
                return int(resp.status), resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            err.close()
            return err.code, ""

    def fetch_token(self) -> bool:
        """The session token; False when IMDSv2 refuses (IMDS off, or v1 only: then we
        read nothing, never falling back to unauthenticated IMDSv1)."""
        status, body = self._request(
            "PUT",
            "latest/api/token",
            {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
        )
        if status != 200 or not body:
            return False
        self.token = body
        return True

    def get(self, path: str, optional: bool) -> str | None:
        status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self.token})
        if status == 404 and optional:
            return None
        if status != 200:
            raise RuntimeError(f"IMDS {path}: HTTP {status}")
        return body


def read_node_topology(
    timeout: float | None = None, env: Mapping[str, str] | None = None
) -> NodeTopology | None:
    """The instance's topology, or None off EC2 or when IMDSv2 does not answer (IMDSv1
    is never used). Never raises."""
    env = os.environ if env is None else env
    if env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true":
        return None
    imds = _Imds(_endpoint(env), _timeout(env) if timeout is None else timeout)
    try:
        if not imds.fetch_token():
            return None
        identity = json.loads(imds.get("latest/dynamic/instance-identity/document", False) or "{}")
        extra: dict[str, str] = {}
        for name in ("availability-zone-id", "group-name", "partition-number"):
            value = imds.get(f"latest/meta-data/placement/{name}", True)
            if value and value.strip():
                extra[name] = value.strip()
        return topology_from_metadata(identity, extra)
    except Exception as exc:  # off EC2 every failure means "no node info"
        log.debug("no EC2 node info from IMDSv2: %s", exc)
        return None


def read_in_background(
    publish: Callable[[NodeTopology], None], timeout: float | None = None
) -> threading.Thread:
    """Read the topology in a daemon thread and hand it to ``publish`` when found."""

    def run() -> None:
        node = read_node_topology(timeout)
        if node is not None:
            log.info(
                "EC2 instance %s (%s) in %s%s",
                node.instance_id,
                node.instance_type,
                node.availability_zone,
                f", placement group {node.placement_group}" if node.placement_group else "",
            )
            publish(node)

    thread = threading.Thread(target=run, name="stepscope-imds", daemon=True)
    thread.start()
    return thread
