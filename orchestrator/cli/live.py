"""Progress display for runs: a live table on a terminal, lines elsewhere.

Both consume :class:`~orchestrator.pipeline.results.RunEvent` values. The live view (rich) keeps
one row per step instance: state, elapsed time, agent, tokens and the last tool call (or why it
failed); it redraws itself a few times a second, so the elapsed times move between events, and
it fits its columns to the terminal's width. The line view prints one line per event that
matters (not per streamed update) to stderr, in the format of the log lines around it
(:mod:`.logs`: plain lines, or JSON lines with ``--log-json``). A notice an agent sends for the
user is such a line in both views (above the live table).

Everything shown comes from agents, files or users, and is shown as text: never read as rich
markup, control characters made visible.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from attrs import define, field

from .._words import count
from ..pipeline.results import RunEvent
from . import logs
from .output import terminal_text

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType
    from rich.live import Live

__all__ = ["LiveView", "PlainView", "open_view", "paused_views", "progress_line"]

_STATE_STYLE = {
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "skipped": "dim",
    "retrying": "magenta",
    "reused": "cyan",
    "interrupted": "red",
}
_ENDED = {
    "step_finished": "succeeded",
    "step_failed": "failed",
    "step_skipped": "skipped",
    "step_reused": "reused",
}
#: how often the live table redraws (and so its elapsed times move)
REFRESH_PER_SECOND = 4
#: the live tables on screen now (a question at the terminal pauses them)
_SHOWN: list[LiveView] = []


@define
class _Line:
    name: str
    agent: str | None = None
    state: str = "running"
    started: float = field(factory=time.monotonic)
    ended: float | None = None
    last_tool: str = ""
    tokens: int | None = None
    note: str = ""

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started


def _progress(event: RunEvent) -> tuple[str, str, str] | None:
    """The level, verb and text of an event's progress line; None for an event not worth one."""
    name = event.instance or "run"
    data = event.data
    if event.type == "step_started":
        return "info", "started", name + (f" ({event.agent})" if event.agent else "")
    if event.type == "step_finished":
        return "info", "done", f"{name} ({count(data.get('changes', 0), 'file')} changed)"
    if event.type == "step_failed":
        return "error", "FAILED", f"{name}: {data.get('error')}"
    if event.type == "step_skipped":
        return "info", "skipped", f"{name}: {data.get('cause')}"
    if event.type == "step_retry":
        return "warning", "retry", f"{name} after: {data.get('error')}"
    if event.type == "step_reused":
        return "info", "reused", f"{name} (finished in an earlier attempt)"
    if event.type == "step_round":
        return "info", "round", f"{name}: {round_note(data)}"
    if event.type == "conflict":
        where = f"{data.get('path')} ({data.get('kind')})"
        return "warning", "conflict", f"{name}: {where} resolution={data.get('resolution')}"
    if event.type == "permission":
        return "info", "permit", f"{name}: {data.get('verdict')} {data.get('title')}"
    if event.type == "run_finished":
        return "info", "run", f"{event.run_id}: {data.get('status')}"
    if event.type == "update" and data.get("kind") == "notice":
        return notice_progress(name, data)
    return None


def round_note(data: Mapping[str, Any]) -> str:
    """What a ``step_round`` event says: the round's check, and the round that comes next."""
    number, rounds = data.get("round"), data.get("rounds")
    if data.get("passed"):
        return f"check passed in round {number} of {rounds}"
    if isinstance(number, int) and isinstance(rounds, int) and number < rounds:
        return f"check failed, round {number + 1} of {rounds}"
    return f"check failed in round {number} of {rounds}"


def notice_progress(name: str | None, notice: Mapping[str, Any]) -> tuple[str, str, str]:
    """The level, verb and text of an agent's notice (``{severity, title, description?}``):
    the one line a person sees of it, live or in a log (``name``: the step instance's)."""
    severity = str(notice.get("severity") or "info")
    level = severity if severity in ("warning", "error") else "info"
    text = f"{name}: {notice.get('title')}" if name else str(notice.get("title"))
    if notice.get("description"):
        text += f" ({notice['description']})"
    if level == "info" and severity != "info":  # a severity newer than the schema: said
        text += f" [{severity}]"
    return level, "notice", text


def progress_line(
    level: str,
    verb: str,
    text: str,
    fields: dict[str, Any],
    *,
    created: float | None = None,
    out: IO[str] | None = None,
) -> None:
    """Write one progress line on stderr (or ``out``) in the log lines' format: a person's
    line aligns the verbs; a JSON line carries ``fields`` (``event`` first) too."""
    text = f"{verb} {text}" if logs.style() == "json" else f"{verb:<8} {text}"
    line = logs.format_line(
        level, fields, text=text, logger="orchestrator.progress", created=created
    )
    stream = out or sys.stderr
    stream.write(line + "\n")
    stream.flush()


@define
class PlainView:
    """One line per meaningful event on stderr, in the log lines' format (for logs and pipes)."""

    out: IO[str] | None = None

    def __call__(self, event: RunEvent) -> None:
        said = _progress(event)
        if said is None:
            return
        level, verb, text = said
        if verb == "run" and logs.style() != "json":
            # a person reads `run RUN: STATUS` once, at the end of the result on stdout; a
            # stream of JSON events keeps its last one
            return
        fields = {k: v for k, v in event.to_json().items() if v is not None and k != "time"}
        fields = {"event": fields.pop("type"), "instance": event.instance, **fields}
        if event.instance is None:
            del fields["instance"]
        progress_line(level, verb, text, fields, created=event.time, out=self.out)

    def close(self) -> None:
        """Nothing to tear down."""


# the columns of the live table: the step, state and time always; the others, most important
# first, only while the terminal is wide enough
_ALWAYS = ("step", "state", "time")
_OPTIONAL = ("last tool call", "agent", "tokens")
#: the narrowest the last tool call column gets before it is left out
_MIN_TOOL = 12
#: the width between two columns (a rule with a space each side)
_GAP = 3


class LiveView:
    """A rich live table, one row per step instance, redrawn as events arrive and a few times
    a second in between (so the elapsed times move)."""

    def __init__(
        self, title: str, out: IO[str] | None = None, *, headers: Mapping[str, str] | None = None
    ):
        from rich.console import Console

        self._title = title
        # what the columns are called, where a view names them otherwise (a batch's rows are
        # repositories, and their "agent" the step running there)
        self._headers = dict(headers or {})
        self._lines: dict[str, _Line] = {}
        # the refresh thread renders while events arrive: one at a time
        self._lock = threading.Lock()
        self._console = Console(file=out or sys.stderr)
        self._paused = False
        self._live = self._start()
        _SHOWN.append(self)

    def _start(self) -> Live:
        """A new live display of this table, drawn from where the cursor stands.

        Each start gets a new one: a restarted display remembers the height of its last frame
        and would move up that many lines to draw over it, over what was written below the
        table meanwhile (a question and its answer).
        """
        from rich.live import Live

        # stderr is redirected (log lines print above the table); stdout is the result's
        live = Live(
            self,
            console=self._console,
            auto_refresh=True,
            refresh_per_second=REFRESH_PER_SECOND,
            redirect_stdout=False,
            transient=False,
        )
        live.start()
        return live

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        with self._lock:
            lines = [
                (r.name, r.agent, r.state, r.elapsed(), r.tokens, r.note or r.last_tool)
                for r in self._lines.values()
            ]
        yield self._table(lines, options.max_width)

    def _table(self, lines: list[tuple[Any, ...]], width: int) -> RenderableType:
        from rich.table import Table
        from rich.text import Text

        def cell(value: str, style: str = "") -> Text:
            # a Text is never read as markup ("[/x]" or "work[a]" is text, not a tag), and
            # terminal_text shows its control characters instead of sending them
            return Text(terminal_text(value), style=style)

        rows = [
            {
                "step": cell(name),
                "agent": cell(agent or "-"),
                "state": cell(state, _STATE_STYLE.get(state, "")),
                "time": cell(_elapsed(elapsed)),
                "tokens": cell(str(tokens) if tokens is not None else ""),
                "last tool call": cell(note),
            }
            for name, agent, state, elapsed, tokens, note in lines
        ]
        shown, step_width, tool_width = _columns(rows, width)
        table = Table(title=cell(self._title), expand=False, show_edge=False)
        for column in shown:
            header = self._headers.get(column, column)
            if column == "step":  # the instance name is folded onto more lines, never cut
                table.add_column(header, overflow="fold", min_width=step_width)
            elif column == "last tool call":
                table.add_column(header, overflow="ellipsis", no_wrap=True, max_width=tool_width)
            else:
                table.add_column(header, no_wrap=True, min_width=len(header))
        for row in rows:
            table.add_row(*(row[column] for column in shown))
        return table

    def __call__(self, event: RunEvent) -> None:
        name = event.instance
        if name is None:
            return
        if event.type == "update" and event.data.get("kind") == "notice":
            # a notice is for the user to read: a line that stays, printed above the table
            # (rich moves what is written to stderr there), not a cell the next update hides
            PlainView()(event)
            return
        with self._lock:
            line = self._lines.get(name)
            if line is None:
                line = self._lines[name] = _Line(name, event.agent)
            elif event.agent is not None:
                line.agent = event.agent
            data = event.data
            if event.type == "step_started":
                line.state, line.started, line.ended, line.note = (
                    "running",
                    time.monotonic(),
                    None,
                    "",
                )
            elif event.type == "update":
                if data.get("title"):
                    line.last_tool = str(data["title"])
                if data.get("tokens") is not None:
                    line.tokens = int(data["tokens"])
            elif event.type in _ENDED:
                line.state = _ENDED[event.type]
                line.ended = time.monotonic()
                line.note = str(data.get("error") or data.get("cause") or "")
            elif event.type == "step_retry":
                line.state = "retrying"
            elif event.type == "step_round":
                line.note = round_note(data)
            elif event.type == "conflict":
                line.note = f"conflict: {data.get('path')}"
            if self._paused:
                return
        self._live.refresh()

    def forget(self, name: str) -> None:
        """Drop the row ``name`` (a long batch keeps the rows still running and the last ones
        finished, not every one)."""
        with self._lock:
            self._lines.pop(name, None)

    def names(self) -> list[tuple[str, str]]:
        """The rows as they stand: (name, state), oldest first."""
        with self._lock:
            return [(line.name, line.state) for line in self._lines.values()]

    def pause(self) -> None:
        """Stop redrawing until :meth:`resume` (the table as it stands stays on screen)."""
        with self._lock:
            if self._paused or self not in _SHOWN:
                return
            self._paused = True
        self._live.stop()

    def resume(self) -> None:
        """Redraw again after :meth:`pause`, below what was written meanwhile."""
        with self._lock:
            if not self._paused:
                return
            self._paused = False
        if self in _SHOWN:
            self._live = self._start()

    def close(self) -> None:
        """Stop refreshing (the last table stays on screen).

        A row still running or retrying then was cut short (Ctrl-C, or the run ended with an
        error): the last frame shows it ``interrupted``, its time stopped, as the run's record
        has it.
        """
        with self._lock:
            ended = time.monotonic()
            for line in self._lines.values():
                if line.state in ("running", "retrying"):
                    line.state, line.ended = "interrupted", ended
        if self in _SHOWN:
            _SHOWN.remove(self)
        self._live.stop()


@contextmanager
def paused_views() -> Iterator[None]:
    """The live tables stop redrawing while the block runs: a question written to the
    terminal meanwhile would be drawn over a few times a second."""
    views = list(_SHOWN)
    for view in views:
        view.pause()
    try:
        yield
    finally:
        for view in views:
            view.resume()


def _elapsed(seconds: float) -> str:
    """``12.3s``, ``4m05s`` or ``1h02m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _columns(rows: list[dict[str, Any]], width: int) -> tuple[list[str], int, int]:
    """The columns that fit in ``width``, in display order; the step and last tool call
    columns' widths.

    The step, state and time are always shown, the step at its whole width; then the last
    tool call, the agent and the tokens while they fit beside them (the least important is
    left out first). Only when the step, state and time alone do not fit is the step column
    narrowed (to a third of the line at least): longer names are folded onto more lines, never
    cut. The last tool call takes what is left.
    """

    def natural(column: str) -> int:
        return max([len(column), *(int(row[column].cell_len) for row in rows)])

    need = {column: natural(column) for column in (*_ALWAYS, *_OPTIONAL)}
    need["last tool call"] = _MIN_TOOL

    def total(columns: tuple[str, ...]) -> int:
        # a space pads each cell on both sides, a rule stands between two columns
        return sum(need[c] for c in columns) + _GAP * (len(columns) - 1) + 2

    kept = list(_OPTIONAL)
    while kept and total((*_ALWAYS, *kept)) > width:
        kept.pop()
    shown = (*_ALWAYS, *kept)
    # no optional column is left, and still the whole name does not fit: it folds
    need["step"] = min(need["step"], max(12, width // 3, width - total(shown) + need["step"]))
    tool_width = width - total(shown) + need["last tool call"]
    order = ("step", "agent", "state", "time", "tokens", "last tool call")
    return [c for c in order if c in shown], need["step"], tool_width


def open_view(
    title: str, *, enabled: bool = True, headers: Mapping[str, str] | None = None
) -> LiveView | PlainView | None:
    """The progress view: a live table on a terminal, lines in the log format otherwise (and
    with ``--log-json``, where stderr is JSON lines); None when progress is off. ``headers``
    renames the live table's columns."""
    if not enabled:
        return None
    if logs.style() == "terminal" and sys.stderr.isatty():
        return LiveView(title, headers=headers)
    return PlainView()
