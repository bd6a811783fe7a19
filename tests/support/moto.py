"""moto's server mode: the EC2 API on a loopback port."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator

from tests.support.ports import free_port

CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _moto(extra_env: dict[str, str] | None = None) -> Iterator[str]:
    exe = shutil.which("moto_server")
    assert exe, "moto[server] is installed with the test extra"
    port = free_port()
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **CREDS, **(extra_env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError("moto_server did not start") from None
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _client_creds() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDS["AWS_DEFAULT_REGION"],
    }
