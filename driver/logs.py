"""Structured logging: one JSON object per line (or plain text), with key/value context.

Use ``log = logging.getLogger(__name__)`` and pass context as
``log.info("moved NIC", extra={"kv": {"device": name, "pod": uid}})``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TextIO

LOG_FORMATS = ("auto", "json", "text")
"""``--log-format`` values; ``auto`` is :func:`resolve_format`."""


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


def resolve_format(fmt: str, stream: TextIO | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``auto``: text for a person at a terminal, JSON for a log collector (in a pod, where the
    kubelet sets ``KUBERNETES_SERVICE_HOST``, or when the stream is a pipe or a file)."""
    if fmt != "auto":
        return fmt
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    in_pod = "KUBERNETES_SERVICE_HOST" in environ
    return "text" if stream.isatty() and not in_pod else "json"


def setup_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure the root logger once for the process (``fmt``: json, text or auto)."""
    fmt = resolve_format(fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
