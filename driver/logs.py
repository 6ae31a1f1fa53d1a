"""Structured logging: one JSON object per line (or plain text), with key/value context.

Use ``log = logging.getLogger(__name__)`` and pass context as
``log.info("moved NIC", extra={"kv": {"device": name, "pod": uid}})``.
"""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """Formats records as JSON lines: ts, level, logger, msg, plus the ``kv`` extra."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "kv", {}) or {})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines with ``key=value`` context appended."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        kv = getattr(record, "kv", {}) or {}
        return base + ("" if not kv else " " + " ".join(f"{k}={v}" for k, v in kv.items()))


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger once for the process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
