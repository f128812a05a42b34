"""Pure helpers of the replay agent over recorded frames: a prompt's text, the recorded
answers of a turn by request, ids as keys, a frame's params mapped to the live session, an exit
status, and the option kind a permission answer chose. No I/O."""

from __future__ import annotations

from typing import Any

from .record import RecordedTurn

__all__ = ["answers", "chosen", "id_key", "mapped", "prompt_text", "status"]


def prompt_text(prompt: Any) -> str:
    """The text blocks of a live prompt, joined as ``RecordedTurn.prompt_text`` joins them."""
    if not isinstance(prompt, list):
        return ""
    return "\n".join(
        str(block.get("text", ""))
        for block in prompt
        if isinstance(block, dict) and block.get("type") == "text"
    )


def answers(turn: RecordedTurn) -> dict[int, dict[str, Any]]:
    """Frame index of each recorded request of the agent -> our recorded answer to it."""
    pending: dict[Any, int] = {}
    answers: dict[int, dict[str, Any]] = {}
    for i, frame in enumerate(turn.frames):
        msg = frame.msg
        if frame.dir == "recv" and "method" in msg and "id" in msg:
            pending[id_key(msg["id"])] = i
        elif frame.dir == "send" and "method" not in msg and "id" in msg:
            at = pending.pop(id_key(msg["id"]), None)
            if at is not None:
                answers[at] = msg
    return answers


def id_key(value: Any) -> Any:
    """A JSON-RPC id as a dict key: its type kept (an agent numbers ids of each type apart, so
    ``"1"``, ``1`` and ``1.0`` are three ids), a list or object id made hashable."""
    return (type(value).__name__, value) if isinstance(value, str | int) else repr(value)


def mapped(value: Any, terminals: dict[str, str], old_cwd: str | None, new_cwd: str) -> Any:
    """A copy of ``value`` with every recorded ``terminalId`` replaced by the live one, and
    every path under the recorded cwd moved under the live cwd."""
    if isinstance(value, dict):
        return {
            k: terminals.get(v, v)
            if k == "terminalId" and isinstance(v, str)
            else mapped(v, terminals, old_cwd, new_cwd)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mapped(v, terminals, old_cwd, new_cwd) for v in value]
    if isinstance(value, str) and old_cwd is not None and value.startswith(old_cwd):
        rest = value[len(old_cwd) :]
        if not rest or rest.startswith("/"):
            return new_cwd + rest
    return value


def status(value: Any) -> dict[str, Any] | None:
    """A terminal's exit status as compared: its exit code and signal (absent and null alike)."""
    if not isinstance(value, dict):
        return None
    return {k: value.get(k) for k in ("exitCode", "signal")}


def chosen(answer: dict[str, Any], options: Any) -> str:
    """A permission answer as the kind of the option chosen (``cancelled``, or the option id
    when the request does not list it)."""
    outcome = answer.get("outcome")
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return "cancelled"
    option_id = outcome.get("optionId")
    for option in options if isinstance(options, list) else ():
        if isinstance(option, dict) and option.get("optionId") == option_id:
            return str(option.get("kind"))
    return f"option {option_id!r}"
