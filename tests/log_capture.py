"""Capture the library's log lines in a test (imported by plain name, like ``fakes``).

The library logs through the standard ``logging`` module (``orchestrator._log``); this is the
counterpart of ``structlog.testing.capture_logs`` for it: each entry is a line's fields with
its ``log_level`` (and, when it has one, ``exc_info`` and ``exception``, the traceback's text).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator._log import EVENT_ATTR, ROOT


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(getattr(record, EVENT_ATTR, None) or {"event": record.getMessage()})
        fields["log_level"] = record.levelname.lower()
        if record.exc_info:
            fields["exc_info"] = record.exc_info
            fields["exception"] = logging.Formatter().formatException(record.exc_info)
        self.entries.append(fields)


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Every line the library logs (all levels) while the block runs, in order."""
    logger = logging.getLogger(ROOT)
    handler = _Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.entries
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
