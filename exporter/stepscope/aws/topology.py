"""The EC2 instance this exporter runs on, read once through IMDSv2.

Placement group and partition are what ``ec2_sd_configs`` cannot tell Prometheus, and
cross-AZ or scattered placement is a known straggler cause, so they are served in one
``stepscope_node_info`` series. The read uses botocore's IMDS fetcher (IMDSv2: a token
PUT, then GETs with the token), one attempt with a short timeout, in a background thread:
a host that is not on EC2 starts as fast as any other and simply has no node info.
``AWS_EC2_METADATA_DISABLED=true`` turns the read off, ``AWS_EC2_METADATA_SERVICE_ENDPOINT``
points it elsewhere and ``AWS_METADATA_SERVICE_TIMEOUT`` sets the timeout in seconds
(default 1): the AWS SDKs' own settings.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("stepscope.aws")

DEFAULT_TIMEOUT = 1.0


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


def read_node_topology(
    timeout: float | None = None, env: Mapping[str, str] | None = None
) -> NodeTopology | None:
    """The instance's topology, or None off EC2, without botocore, or when IMDSv2 does
    not answer (IMDSv1 is never used). Never raises."""
    env = os.environ if env is None else env
    try:
        from botocore.utils import IMDSFetcher
    except ImportError:
        log.debug("botocore is not installed: no EC2 node info")
        return None
    if timeout is None:
        try:
            timeout = float(env.get("AWS_METADATA_SERVICE_TIMEOUT", DEFAULT_TIMEOUT))
        except ValueError:
            timeout = DEFAULT_TIMEOUT
    config = {}
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        config["ec2_metadata_service_endpoint"] = env["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    try:
        fetcher = IMDSFetcher(timeout=timeout, num_attempts=1, env=dict(env), config=config)
        return _read(fetcher)
    except Exception as exc:  # off EC2 every failure means "no node info"
        log.debug("no EC2 node info from IMDSv2: %s", exc)
        return None


def _read(fetcher: Any) -> NodeTopology | None:
    """IMDSv2 through botocore's fetcher: its token PUT and GET (the same private calls
    botocore's own region and credential fetchers make)."""
    token = fetcher._fetch_metadata_token()
    if token is None:
        return None  # not on EC2, or IMDS is off for this instance

    def get(path: str, optional: bool) -> str | None:
        response = fetcher._get_request(
            path, retry_func=lambda r: r.status_code >= 500, token=token
        )
        if response.status_code == 404 and optional:
            return None
        if response.status_code != 200:
            raise RuntimeError(f"IMDS {path}: HTTP {response.status_code}")
        return str(response.text)

    identity = json.loads(get("latest/dynamic/instance-identity/document", False) or "{}")
    extra: dict[str, str] = {}
    for name in ("availability-zone-id", "group-name", "partition-number"):
        value = get(f"latest/meta-data/placement/{name}", True)
        if value and value.strip():
            extra[name] = value.strip()
    return topology_from_metadata(identity, extra)


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
