"""``--log-format json``: every line the exporter logs is one JSON object a log pipeline
(Loki, CloudWatch Logs) can index, with the keys the Prometheus exporters use."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from stepscope.app.logformat import JsonFormatter
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


def test_a_multi_line_message_and_its_traceback_stay_one_record() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord(
            "stepscope", logging.ERROR, __file__, 1, "failed:\n%s", ("x",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["msg"] == "failed:\nx" and doc["level"] == "error"
    assert "ValueError: bad\nvalue" in doc["exception"]
