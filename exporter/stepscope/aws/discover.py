"""``stepscope discover``: GPU instances from the EC2 API as a Prometheus file_sd list.

For Prometheus servers outside AWS, or without the IAM rights ``ec2_sd_configs`` needs on
the server itself: run this where credentials are (cron, a systemd timer) and point a
``file_sd_configs`` job at the file. Prometheus re-reads the file when it changes; it is
replaced atomically, never half-written.

Each running instance becomes one target group ``{"targets": ["10.0.1.5:9400"],
"labels": {...}}`` with its instance id, type, availability zone and placement group, so
straggler queries can group by placement (what ``ec2_sd`` cannot label).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 2


class DiscoverError(Exception):
    """AWS could not be asked (no boto3, no credentials, access denied): one line for users."""


def instance_filters(tags: Sequence[str], instance_types: Sequence[str]) -> list[dict[str, Any]]:
    """EC2 ``Filters`` for running instances with every tag (KEY=VALUE, or KEY for any
    value) and one of the instance types (wildcards allowed: ``p5.*``)."""
    filters: list[dict[str, Any]] = [{"Name": "instance-state-name", "Values": ["running"]}]
    for tag in tags:
        key, sep, value = tag.partition("=")
        if not key:
            raise DiscoverError(f"--tag {tag!r}: expected KEY=VALUE or KEY")
        if sep:
            filters.append({"Name": f"tag:{key}", "Values": [value]})
        else:
            filters.append({"Name": "tag-key", "Values": [key]})
    if instance_types:
        filters.append({"Name": "instance-type", "Values": list(instance_types)})
    return filters


def target_groups(
    reservations: Iterable[Mapping[str, Any]], port: int, address: str = "private"
) -> list[dict[str, Any]]:
    """file_sd target groups, one per instance with an address, sorted by instance id."""
    key = "PrivateIpAddress" if address == "private" else "PublicIpAddress"
    groups: list[dict[str, Any]] = []
    for reservation in reservations:
        for inst in reservation.get("Instances", ()):
            ip = inst.get(key)
            if not ip:
                continue
            placement = inst.get("Placement", {})
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", ())}
            labels = {
                "instance_id": inst["InstanceId"],
                "instance_type": inst.get("InstanceType", ""),
                "availability_zone": placement.get("AvailabilityZone", ""),
                "placement_group": placement.get("GroupName", ""),
            }
            if placement.get("PartitionNumber") is not None:
                labels["placement_partition"] = str(placement["PartitionNumber"])
            if tags.get("Name"):
                labels["instance_name"] = tags["Name"]
            host = f"[{ip}]" if ":" in ip else ip
            groups.append({"targets": [f"{host}:{port}"], "labels": labels})
    groups.sort(key=lambda g: g["labels"]["instance_id"])
    return groups


def describe_running(
    filters: list[dict[str, Any]],
    region: str | None = None,
    endpoint_url: str | None = None,
    page_size: int = 1000,
) -> list[dict[str, Any]]:
    """Every reservation matching ``filters``, across all pages of DescribeInstances."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise DiscoverError("boto3 is not installed: pip install 'stepscope[aws]'") from None
    try:
        client = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)
        pages = client.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": page_size}
        )
        return [r for page in pages for r in page.get("Reservations", ())]
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise DiscoverError(
            f"EC2 DescribeInstances failed: {err.get('Code', 'error')}: "
            f"{err.get('Message', str(exc))}"
        ) from None
    except BotoCoreError as exc:
        # NoCredentialsError, NoRegionError, EndpointConnectionError, ...
        raise DiscoverError(f"EC2 DescribeInstances failed: {exc}") from None
    except ValueError as exc:  # botocore's check of --endpoint-url
        raise DiscoverError(f"--endpoint-url {endpoint_url!r}: {exc}") from None


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, so Prometheus never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_writable(path: Path) -> None:
    """DiscoverError unless ``path``'s directory exists (or can be made) and is writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DiscoverError(f"--output {path}: cannot make its directory: "
                            f"{exc.strerror or exc}") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        why = "is a directory" if path.is_dir() else f"{path.parent} is not writable"
        raise DiscoverError(f"--output {path}: {why}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``discover`` subcommand's flags."""
    parser.add_argument("--region", help="AWS region (default: the SDK's, e.g. $AWS_REGION)")
    parser.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="only instances with this tag (repeatable; all must match)",
    )
    parser.add_argument(
        "--instance-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="only these instance types, wildcards allowed: p5.*, g6.* (repeatable)",
    )
    parser.add_argument("--port", type=int, default=9400, help="exporter port (default 9400)")
    parser.add_argument(
        "--address",
        choices=("private", "public"),
        default="private",
        help="which IP to scrape (default private)",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="write the file_sd JSON here, atomically (default: standard output)",
    )
    parser.add_argument("--endpoint-url", help=argparse.SUPPRESS)  # tests, VPC endpoints
    parser.add_argument("--page-size", type=int, default=1000, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope discover``; errors are one line on stderr and exit status 2."""
    try:
        if not 1 <= args.port <= 65535:
            raise DiscoverError(f"--port {args.port}: must be 1-65535")
        if not 5 <= args.page_size <= 1000:  # DescribeInstances' MaxResults
            raise DiscoverError(f"--page-size {args.page_size}: must be 5-1000")
        if args.output:  # before asking AWS: a file that cannot be written is a typo
            _check_writable(Path(args.output))
        reservations = describe_running(
            instance_filters(args.tag, args.instance_type),
            region=args.region,
            endpoint_url=args.endpoint_url,
            page_size=args.page_size,
        )
    except DiscoverError as exc:
        print(f"stepscope: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = json.dumps(target_groups(reservations, args.port, args.address), indent=2) + "\n"
    if args.output:
        try:
            write_atomically(Path(args.output), text)
        except OSError as exc:
            print(f"stepscope: error: --output {args.output}: cannot write it: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        sys.stdout.write(text)
    return EXIT_OK
