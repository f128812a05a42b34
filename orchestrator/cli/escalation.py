"""The command line's escalation: an ``ask`` verdict becomes a question at the terminal.

:func:`choose_escalation` is the one place every command (prompt, run, compare, resume)
chooses how ``ask`` verdicts are answered: by the human at the controlling terminal when
there is one, else not at all (the policy's timeout rejects).
"""

from __future__ import annotations

import os
import select
import sys

import trio

from .._log import get_logger
from ..agent.permissions import Escalate, Escalation
from ..policy import Answer
from .live import paused_views
from .output import terminal_text

__all__ = ["choose_escalation", "terminal_prompt_escalation"]

log = get_logger(__name__)


def choose_escalation(*, interactive: bool | None = None) -> Escalate | None:
    """The escalation of a command: the terminal question when stdin and stderr are a
    terminal (or ``interactive`` says so), else None (``ask`` rules reject)."""
    if interactive is None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
    return terminal_prompt_escalation if interactive else None


# --------------------------------------------------------------------------- terminal prompt

_ANSWERS: dict[str, Answer] = {
    "y": "allow",
    "yes": "allow",
    "a": "allow_always",
    "always": "allow_always",
    "n": "reject",
    "no": "reject",
    "": "reject",
    "r": "reject_always",
    "never": "reject_always",
}
_QUESTION = "Allow? [y]es once, [a]lways, [n]o (default), neve[r]: "
# One question on the terminal at a time, whatever the number of agents asking.
_PROMPT_LOCK = trio.Lock()


def _describe(escalation: Escalation) -> str:
    query = escalation.query
    lines = [
        "",
        f"Permission request from {query.agent}"
        + (f" (step {query.step})" if query.step else "")
        + f", session {query.session_id}:",
        f"  {query.kind or 'other'}: {query.title or query.tool_call_id}",
    ]
    if escalation.command is not None:
        lines.append(f"  command: {escalation.command}")
    if escalation.env:
        lines.append(f"  sets: {', '.join(escalation.env)}")
    lines += [f"  path: {path}" for path in escalation.paths]
    lines.append(f"  rule: {escalation.rule}")
    # the agent chose the title, command and paths: no control character reaches the terminal
    return terminal_text("\n".join(lines)) + "\n" + _QUESTION


def _ask_tty(tty: str, text: str) -> Answer | None:
    """Runs in a worker thread: ask on ``tty`` until a valid answer, polling for cancellation."""
    fd = os.open(tty, os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, text.encode())
        buffer = b""
        try:
            while True:
                trio.from_thread.check_cancelled()
                ready, _, _ = select.select([fd], [], [], 0.05)
                if not ready:
                    continue
                chunk = os.read(fd, 1024)
                if not chunk:
                    return None
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    word = line.decode(errors="replace").strip().lower()
                    if word in _ANSWERS:
                        return _ANSWERS[word]
                    os.write(fd, _QUESTION.encode())
        except trio.Cancelled:
            os.write(fd, b"\n(question withdrawn)\n")
            raise
    finally:
        os.close(fd)


async def terminal_prompt_escalation(
    escalation: Escalation, *, tty: str = "/dev/tty"
) -> Answer | None:
    """Ask the human at the controlling terminal; None when there is no terminal.

    Questions are asked one at a time. The wait is cancellable (the worker thread polls for
    cancellation), so the policy's timeout and ``session/cancel`` both withdraw the question.
    """
    text = _describe(escalation)
    async with _PROMPT_LOCK:
        try:
            with paused_views():  # the live table would redraw over the question
                return await trio.to_thread.run_sync(_ask_tty, tty, text)
        except OSError as exc:
            log.warning("cannot ask on the terminal", tty=tty, error=repr(exc))
            return None
