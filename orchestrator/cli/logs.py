"""Log and progress lines on stderr, in one format per command line.

The library logs through the standard ``logging`` module and prints nothing by itself; the
command line is the one place that gives its records a handler (:func:`configure`). The same
format serves the progress lines of a run when no live table is shown, so that stderr reads as
one stream:

- ``terminal``: stderr is a terminal: log lines readable (colours), progress in a live table;
- ``plain``: off a terminal: ``HH:MM:SS level    text`` lines;
- ``json``: with ``--log-json``: one JSON object per line, progress events included.

The command line's own lines on stderr (an error, a note, how to resume an interrupted run) go
through :func:`note`: as they are, one line each, or as JSON lines with ``--log-json``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Literal

from .output import terminal_text

# the library's logging (.._log) is imported where needed: it loads structlog, which a usage
# error, said through note() before anything else is loaded, does without

__all__ = ["Style", "configure", "configured", "format_line", "note", "set_style", "style"]

Style = Literal["terminal", "plain", "json"]

_style: Style = "plain"
#: the logger named in the command line's own JSON lines
_CLI = "orchestrator.cli"
#: whether configure() gave the library's logger its handler
_configured = False


def style() -> Style:
    """The format chosen by the last :func:`configure` (``plain`` before any)."""
    return _style


def set_style(as_json: bool) -> None:
    """Choose the format before :func:`configure` can (the command line is not parsed yet):
    JSON lines with ``as_json``, else readable on a terminal and plain lines off one."""
    global _style
    _style = "json" if as_json else "terminal" if sys.stderr.isatty() else "plain"


def configured() -> bool:
    """Whether :func:`configure` gave the library's logger its handler (the command line was
    parsed, so its format is known)."""
    return _configured


def note(
    message: str, *, level: str = "info", event: str = "note", prefix: str = "", **fields: Any
) -> None:
    """Say one line of the command line itself on stderr (not a log record: shown at every
    verbosity): ``prefix`` and ``message`` as they are, or with ``--log-json`` one JSON object
    in the log lines' shape, ``message`` and ``fields`` in it (``event`` names the line)."""
    if _style == "json":
        line = format_line(level, {"event": event, **fields}, text=message, logger=_CLI)
    else:
        line = terminal_text(prefix + message)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def format_line(
    level: str,
    fields: dict[str, Any],
    *,
    text: str | None = None,
    logger: str | None = None,
    created: float | None = None,
    exception: str | None = None,
    as_style: Style | None = None,
) -> str:
    """One line of stderr (no newline): a log record's or a progress event's ``fields``
    (``event`` first) at ``level``, in the current style; ``text`` is what a person reads
    (default: the fields as ``event key=value ...``); ``logger`` defaults to the library's."""
    if logger is None:
        from .._log import ROOT

        logger = ROOT
    chosen = as_style or _style
    created = time.time() if created is None else created
    if chosen == "json":
        import orjson

        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        body = {
            "timestamp": f"{stamp}.{int(created % 1 * 1000):03d}Z",
            "level": level,
            "logger": logger,
            "event": fields.get("event"),  # first, whatever order the fields came in
            **fields,
            **({"message": text} if text is not None else {}),
            **({"exception": exception} if exception else {}),
        }
        return orjson.dumps(body, default=str).decode()
    if text is None:
        from .._log import plain_message

        text = plain_message(fields)
    line = f"{time.strftime('%H:%M:%S', time.localtime(created))} {level:<7} {text}"
    if exception:
        line += "\n" + exception
    if chosen == "terminal":
        colour = {"warning": "33", "error": "31", "critical": "31", "debug": "2"}.get(level)
        line = terminal_text(line)
        return f"\x1b[{colour}m{line}\x1b[0m" if colour else line
    return terminal_text(line)


class _Handler(logging.Handler):
    """Writes each record of the library to the current ``sys.stderr`` (looked up at each
    record: the live view redirects it to print above its table)."""

    def emit(self, record: logging.LogRecord) -> None:
        from .._log import EVENT_ATTR

        try:
            fields = getattr(record, EVENT_ATTR, None)
            if not isinstance(fields, dict):
                fields = {"event": record.getMessage()}
            exception = None
            if record.exc_info:
                exception = logging.Formatter().formatException(record.exc_info)
            line = format_line(
                record.levelname.lower(),
                fields,
                logger=record.name,
                created=record.created,
                exception=exception,
            )
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def configure(verbosity: int, as_json: bool) -> None:
    """Show the library's log lines on stderr: warnings, ``-v`` info, ``-vv`` debug; JSON
    lines with ``as_json``, else readable on a terminal and plain lines off one."""
    global _configured
    from .._log import ROOT

    set_style(as_json)
    _configured = True
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(old)
    logger.addHandler(_Handler())
    logger.setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(verbosity, 2)])
    logger.propagate = False  # printed here once, not again by a handler of the root logger
