"""stepscope serve refusing a bad ingest URL, as a process."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from tests.support import REPO


def test_the_exporter_exits_on_a_host_part_and_creates_nothing_at_the_root() -> None:
    name = f"ss-url-{uuid.uuid4().hex[:8]}"
    url = f"unix://{name}/x/ingest.sock"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "stepscope", "serve", "--simulate", "1", "--listen",
             "127.0.0.1:0", "--ingest", url],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert result.returncode == 2, result.stderr
        assert "takes no host part" in result.stderr and f"unix:///{name}/x" in result.stderr
        assert not Path(f"/{name}").exists() and not Path("/x/ingest.sock").exists()
    finally:
        if Path(f"/{name}").exists():  # the old behaviour, should this test ever fail
            subprocess.run(["rm", "-rf", f"/{name}"], check=False)
