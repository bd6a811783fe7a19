"""A fake EC2 instance metadata service (IMDSv2) on a loopback port."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "AQAEAtoken=="

IDENTITY = {
    "instanceId": "i-0abc1234def567890",
    "instanceType": "p5.48xlarge",
    "region": "us-east-2",
    "availabilityZone": "us-east-2b",
    "accountId": "123456789012",
}

FULL = {"availability-zone-id": "use2-az2", "group-name": "train-pg", "partition-number": "3"}


class FakeImds(ThreadingHTTPServer):
    """IMDSv2 as EC2 serves it: PUT /latest/api/token with a TTL header gives a token;
    every GET without that token is 401."""

    def __init__(self, placement: dict[str, str], v2: bool = True) -> None:
        self.placement = placement
        self.v2 = v2
        self.requests: list[tuple[str, str, bool]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.holding = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        srv = self.server
        srv.requests.append(("PUT", self.path, False))
        if not srv.hold.is_set():
            srv.holding += 1
            srv.hold.wait(30)
            srv.holding -= 1
        if not srv.v2 or self.path != "/latest/api/token":
            return self._send(403)
        if not self.headers.get("x-aws-ec2-metadata-token-ttl-seconds"):
            return self._send(400)
        self._send(200, TOKEN)

    def do_GET(self) -> None:
        srv = self.server
        authed = self.headers.get("x-aws-ec2-metadata-token") == TOKEN
        srv.requests.append(("GET", self.path, authed))
        if not authed:
            return self._send(401)
        if self.path == "/latest/dynamic/instance-identity/document":
            return self._send(200, json.dumps(IDENTITY))
        prefix = "/latest/meta-data/placement/"
        name = self.path.removeprefix(prefix)
        if self.path.startswith(prefix) and name in srv.placement:
            return self._send(200, srv.placement[name])
        self._send(404, "Not Found")


def _serve(placement: dict[str, str], v2: bool = True) -> Iterator[FakeImds]:
    server = FakeImds(placement, v2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.hold.set()
        server.shutdown()
        server.server_close()


def _env(server: FakeImds) -> dict[str, str]:
    return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": server.url}


def _no_botocore(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with a botocore and a boto3 that cannot be imported, as in the image."""
    for name in ("botocore", "boto3"):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}
