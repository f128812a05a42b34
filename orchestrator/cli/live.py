"""Progress display for runs: a live table on a terminal, plain lines elsewhere.

Both consume :class:`~orchestrator.pipeline.results.RunEvent` values. The live view (rich) keeps
one line per step instance: state, elapsed time, last tool call and tokens. The plain view
prints one line per event that matters (not per streamed update) to stderr.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from attrs import define, field

from .._words import count
from ..pipeline.results import RunEvent
from .output import say, terminal_text

__all__ = ["LiveView", "PlainView", "open_view"]

_STATE_STYLE = {
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "skipped": "dim",
    "retrying": "magenta",
    "reused": "cyan",
}


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


@define
class PlainView:
    """One line per meaningful event, for logs and pipes."""

    out: IO[str] = field(factory=lambda: sys.stderr)

    def __call__(self, event: RunEvent) -> None:
        name = event.instance or "run"
        data = event.data
        text: str | None = None
        if event.type == "step_started":
            text = f"started  {name}" + (f" ({event.agent})" if event.agent else "")
        elif event.type == "step_finished":
            text = f"done     {name} ({count(data.get('changes', 0), 'file')} changed)"
        elif event.type == "step_failed":
            text = f"FAILED   {name}: {data.get('error')}"
        elif event.type == "step_skipped":
            text = f"skipped  {name}: {data.get('cause')}"
        elif event.type == "step_retry":
            text = f"retry    {name} after: {data.get('error')}"
        elif event.type == "step_reused":
            text = f"reused   {name} (finished in an earlier attempt)"
        elif event.type == "conflict":
            text = (
                f"conflict {name}: {data.get('path')} ({data.get('kind')}) "
                f"resolution={data.get('resolution')}"
            )
        elif event.type == "permission":
            text = f"permit   {name}: {data.get('verdict')} {data.get('title')}"
        elif event.type == "run_finished":
            text = f"run {event.run_id}: {data.get('status')}"
        if text is not None:
            say(text, self.out, flush=True)

    def close(self) -> None:
        """Nothing to tear down."""


class LiveView:
    """A rich live table, one row per step instance, refreshed as events arrive."""

    def __init__(self, title: str, out: IO[str] | None = None):
        from rich.console import Console
        from rich.live import Live

        self._title = title
        self._lines: dict[str, _Line] = {}
        self._console = Console(file=out or sys.stderr)
        self._live = Live(
            self._render(), console=self._console, refresh_per_second=8, transient=False
        )
        self._live.start()

    def _render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        def cell(value: str, style: str = "") -> Text:
            # a Text is never read as markup ("[/x]" in an agent's text is text, not a tag),
            # and terminal_text shows its control characters instead of sending them
            return Text(terminal_text(value), style=style)

        table = Table(title=cell(self._title), expand=False, show_edge=False)
        for column in ("step", "agent", "state", "time", "last tool call", "tokens"):
            table.add_column(column, overflow="ellipsis", no_wrap=True, max_width=48)
        for line in self._lines.values():
            table.add_row(
                cell(line.name),
                cell(line.agent or "-"),
                cell(line.state, _STATE_STYLE.get(line.state, "")),
                cell(f"{line.elapsed():6.1f}s"),
                cell(line.note or line.last_tool or ""),
                cell(str(line.tokens) if line.tokens is not None else ""),
            )
        return table

    def __call__(self, event: RunEvent) -> None:
        name = event.instance
        if name is None:
            return
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = _Line(name, event.agent)
        data = event.data
        if event.type == "step_started":
            line.state, line.started, line.ended, line.note = "running", time.monotonic(), None, ""
        elif event.type == "update":
            if data.get("title"):
                line.last_tool = str(data["title"])
            if data.get("tokens") is not None:
                line.tokens = int(data["tokens"])
        elif event.type in ("step_finished", "step_failed", "step_skipped", "step_reused"):
            line.state = {
                "step_finished": "succeeded",
                "step_failed": "failed",
                "step_skipped": "skipped",
                "step_reused": "reused",
            }[event.type]
            line.ended = time.monotonic()
            line.note = str(data.get("error") or data.get("cause") or "")
        elif event.type == "step_retry":
            line.state = "retrying"
        elif event.type == "conflict":
            line.note = f"conflict: {data.get('path')}"
        self._live.update(self._render())

    def close(self) -> None:
        """Stop refreshing (the last table stays on screen)."""
        self._live.update(self._render())
        self._live.stop()


def open_view(title: str, *, enabled: bool = True) -> LiveView | PlainView | None:
    """The live view on a terminal, plain lines otherwise; None when progress is off."""
    if not enabled:
        return None
    if sys.stderr.isatty():
        return LiveView(title)
    return PlainView()
