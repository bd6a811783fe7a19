"""The exporter's logs as a process writes them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import start_exporter


def test_the_exporter_logs_one_json_object_per_line(tmp_path: Path) -> None:
    exp = start_exporter(
        ["--simulate", "1", "--ingest", f"unix://{tmp_path}/i.sock", "--log-format", "json"],
        env={"AWS_EC2_METADATA_DISABLED": "true"},
    )
    try:
        assert exp.metrics()
    finally:
        assert exp.stop() == 0
    lines = [line for line in exp.stderr_lines if line.strip()]
    assert lines
    docs = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    for doc in docs:
        assert {"time", "level", "logger", "msg"} <= doc.keys(), doc
        assert doc["time"].endswith("Z") and doc["level"] in ("debug", "info", "warning")
    assert any("/metrics" in doc["msg"] for doc in docs)
