"""``--log-format json``: every line the exporter logs is one JSON object a log pipeline
(Loki, CloudWatch Logs) can index, with the keys the Prometheus exporters use."""

from __future__ import annotations

import json
import logging
import sys

from stepscope.app.logformat import JsonFormatter


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
