"""Log lines that say which event they are about, as text or JSON.

A line logged inside :func:`event_context` carries the event's ``source``, ``event_id``,
``record_key``, ``shard`` and ``attempt``; so does a Sentry event captured there (as
tags). The ``log_format`` setting (``KEYLANE_LOG_FORMAT=json``) switches to JSON lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import sentry_sdk

_EVENT_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "keylane_event", default=None
)
CONTEXT_FIELDS = ("source", "event_id", "record_key", "shard", "attempt")


@contextlib.contextmanager
def event_context(**fields: Any) -> Iterator[None]:
    """Within this block, log lines (and Sentry events) carry these event fields."""
    merged = {**(_EVENT_CONTEXT.get() or {}), **fields}
    token = _EVENT_CONTEXT.set(merged)
    try:
        if not sentry_sdk.get_client().is_active():
            yield  # no Sentry: a scope of tags would cost every event and carry nothing
            return
        with sentry_sdk.new_scope() as scope:
            for name, value in merged.items():
                if name != "attempt":
                    scope.set_tag(f"keylane.{name}", str(value))
            yield
    finally:
        _EVENT_CONTEXT.reset(token)


class EventFields(logging.Filter):
    """Adds the current event's fields to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _EVENT_CONTEXT.get() or {}
        for name in CONTEXT_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, context.get(name))
        return True


class KeyValueFormatter(logging.Formatter):
    """``2026-12-02T15:30:20 INFO keylane.lanes applied source=demo event_id=e1 ...``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        pairs = [
            f"{n}={getattr(record, n)}"
            for n in CONTEXT_FIELDS
            if getattr(record, n, None) is not None
        ]
        if pairs:
            line += " " + " ".join(pairs)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Root logging for a keylane process (stderr), in ``text`` or ``json`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    handler.addFilter(EventFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
