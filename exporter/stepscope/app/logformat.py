"""How log records are written: plain text, or one JSON object per line.

Text suits a terminal and journald. JSON suits log pipelines that index fields (Loki,
CloudWatch Logs Insights, Elasticsearch): the keys follow the Prometheus exporters' own
JSON logs (``time``, ``level``, ``msg``), so one query serves both.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (RFC 3339, UTC), ``level``, ``logger``,
    ``msg`` and, for an exception, ``exception`` with its traceback. A message with
    newlines stays one line, so a log shipper never splits a record."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=timezone.utc)
        doc: dict[str, str] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False)


def log_formatter(log_format: str) -> logging.Formatter:
    """The formatter for a ``log_format`` setting (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT)
