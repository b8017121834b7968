"""Log lines: text, or one JSON object per line with ``RECALL_LOG_FORMAT=json``.

Every line carries the current trace ID when tracing is on (``trace_id``), so a
log line leads to its trace. The request line's fields (request ID, operation,
status, duration, degradation codes) come as ``extra`` from ``requests``. The
JSON is the standard library's: one object per line needs no more.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from gateway.observability.tracing import current_trace_id

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            record.trace_id = current_trace_id()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        trace_id = getattr(record, "trace_id", None)
        if request_id:
            text += f" request_id={request_id}"
        degradations = getattr(record, "degradations", None)
        if degradations:
            text += " degradations=" + ",".join(degradations)
        if trace_id:
            text += f" trace_id={trace_id}"
        return text


def configure(level: str, log_format: str) -> None:
    """Send the gateway's loggers to standard error in ``log_format``; once per process
    (a second call, e.g. a second app in tests, changes nothing)."""
    logger = logging.getLogger("gateway")
    if any(getattr(h, "_recall_gateway", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler._recall_gateway = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(TraceIdFilter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
