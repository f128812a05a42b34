"""What a replay found different from the record: :class:`Divergence`."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from attrs import frozen

from ..errors import JsonRpcError

__all__ = [
    "NOT_REPLAYABLE",
    "REPLAY_DIVERGED",
    "Divergence",
    "DivergenceKind",
    "diverged_error",
    "short",
]

#: the JSON-RPC error code of a prompt a strict replay stopped at its first divergence
REPLAY_DIVERGED = -32050
#: the JSON-RPC error code of a prompt whose recorded turn cannot be replayed
NOT_REPLAYABLE = -32051

DivergenceKind = Literal[
    "prompt", "fs-read", "permission", "terminal", "request", "not-replayable", "disk"
]

#: how long a text in a divergence may be (the record holds the whole of it)
_TEXT_LIMIT = 200


def short(value: Any) -> Any:
    """``value`` kept short for a report: a long text is cut, a large JSON value summarised."""
    if isinstance(value, str):
        if len(value) <= _TEXT_LIMIT:
            return value
        return f"{value[:_TEXT_LIMIT]}... ({len(value)} chars)"
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        return short(repr(value))
    return value if len(text) <= _TEXT_LIMIT else short(text)


@frozen
class Divergence:
    """One way a replayed step differs from its record."""

    #: the step instance's key (None: the session was not opened for a known step)
    step: str | None
    #: the attempt of the step the recorded session served
    attempt: int
    #: the turn's index in the session (0 for the first prompt)
    turn: int
    kind: DivergenceKind
    #: what differs, in one line
    detail: str
    #: the recorded value (kept short)
    recorded: Any = None
    #: the value now (kept short)
    now: Any = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "attempt": self.attempt,
            "turn": self.turn,
            "kind": self.kind,
            "detail": self.detail,
            "recorded": short(self.recorded),
            "now": short(self.now),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Divergence:
        """A divergence from its JSON form (as ``to_json`` writes it)."""
        return cls(
            value.get("step"),
            int(value.get("attempt", 1)),
            int(value.get("turn", 0)),
            value["kind"],
            str(value.get("detail", "")),
            value.get("recorded"),
            value.get("now"),
        )


def diverged_error(divergence: Divergence) -> JsonRpcError:
    """The answer to a prompt a strict replay stopped at ``divergence``."""
    return JsonRpcError(
        f"replay diverged: {divergence.detail}",
        {"divergence": divergence.to_json()},
        code=REPLAY_DIVERGED,
    )
