"""The library's loggers: structlog's interface, delivered through the standard ``logging``.

Every module logs with ``log = get_logger(__name__)`` (names under ``orchestrator``) and
structured fields (``log.warning("agent exited", pid=12, code=1)``). The records go to the
stdlib logger of that name, so the library follows stdlib conventions whatever the program
does with structlog's own global configuration:

- silent by default: the ``orchestrator`` logger has a :class:`logging.NullHandler`, so
  nothing is printed (not even warnings, through :data:`logging.lastResort`) unless the
  program configures logging;
- ``logging.basicConfig(level=logging.INFO)`` shows the lines, as
  ``event key=value ...``; a handler can read the structured fields themselves from the
  record's :data:`EVENT_ATTR` attribute (the command line renders them as JSON that way).

A call below the logger's effective level costs one ``isEnabledFor`` check: the processors
run only for records that will be handled.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["EVENT_ATTR", "ROOT", "get_logger", "plain_message"]

#: the parent of every logger of the library
ROOT = "orchestrator"
#: the LogRecord attribute holding a line's structured fields (``event`` and the keywords)
EVENT_ATTR = "orchestrator_event"

logging.getLogger(ROOT).addHandler(logging.NullHandler())

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def plain_message(fields: dict[str, Any]) -> str:
    """A log line's fields as one line of text: the event, then ``key=value`` for the rest
    (a text value with spaces, quotes or ``=`` in it, or none at all, is quoted)."""
    parts = [str(fields.get("event", ""))]
    for key, value in fields.items():
        if key == "event":
            continue
        if isinstance(value, str) and (not value or any(c.isspace() or c in "\"'=" for c in value)):
            value = repr(value)
        parts.append(f"{key}={value}")
    return " ".join(parts)


def _to_record(logger: Any, method: str, fields: MutableMapping[str, Any]) -> Any:
    """The last processor: the arguments of the stdlib call (message, exc_info, fields)."""
    kwargs: dict[str, Any] = {}
    for key in ("exc_info", "stack_info"):
        if key in fields:
            kwargs[key] = fields.pop(key)
    fields.pop("positional_args", None)
    kwargs["extra"] = {EVENT_ATTR: dict(fields)}
    return (plain_message(kwargs["extra"][EVENT_ATTR]),), kwargs


class _Logger(structlog.stdlib.BoundLogger):
    """structlog's stdlib logger that skips the processors of a record nobody handles."""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: str, **event_kw: Any
    ) -> Any:
        level = _LEVELS.get(method_name)
        if level is not None and not self._logger.isEnabledFor(level):
            return None
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The structured logger of module ``name`` (a stdlib logger under ``orchestrator``)."""
    return _Logger(logging.getLogger(name), processors=[_to_record], context={})
