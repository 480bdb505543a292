"""Structured JSON logs: one JSON object per line carrying pipeline, step and event id.

``eventbus gateway --log-format json`` and a pipeline's ``observability: {logs: json}`` (its
replicas) install :class:`JsonFormatter` on the ``eventbus`` logger. Fields: ``ts`` (RFC 3339,
UTC), ``level``, ``logger``, ``message``, then ``pipeline``, ``step``, ``event_id`` (from the
record's ``extra=`` or the formatter's defaults, e.g. the replica's pipeline), ``replica``
where known, and ``exc`` with the traceback of an exception.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = ["JsonFormatter", "configure_json_logging"]

_FIELDS = ("component", "pipeline", "step", "event_id", "replica", "source", "status")


class JsonFormatter(logging.Formatter):
    """Formats records as JSON lines.

    Args:
        defaults: fields every line carries unless the record has its own (``pipeline``...).

    Example:
        >>> import logging
        >>> f = JsonFormatter({"pipeline": "orders"})
        >>> r = logging.LogRecord("eventbus", logging.WARNING, "x", 1, "step failed", None, None)
        >>> r.step = "score"
        >>> sorted(orjson.loads(f.format(r)))
        ['level', 'logger', 'message', 'pipeline', 'step', 'ts']
    """

    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.defaults = dict(defaults or {})

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k in _FIELDS:
            v = getattr(record, k, None)
            if v is None:
                v = self.defaults.get(k)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_json_logging(
    defaults: dict[str, Any] | None = None, *, logger: str = "eventbus", level: int = logging.INFO
) -> logging.Handler:
    """Send ``logger``'s records to stderr as JSON lines (replacing a previous JSON handler).

    Returns:
        The installed handler.
    """
    import sys

    log = logging.getLogger(logger)
    for h in list(log.handlers):
        if isinstance(h.formatter, JsonFormatter):
            log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(defaults))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return handler
