"""The coordinator's idempotency keys, shared by the driver and the nodes."""

from __future__ import annotations

from ..pipeline._remote import RemoteTurn

__all__ = ["first_round_key", "round_key"]


def round_key(turn: RemoteTurn, number: int) -> str:
    """The claim of round ``number`` of ``turn``'s attempt: a node claims it with the
    coordinator before that round's prompt is sent, so a prompt is never sent twice."""
    return f"{turn.run_id}/{turn.name}/{turn.attempt}/{number}"


def first_round_key(turn: RemoteTurn) -> str:
    """The claim of ``turn``'s first prompt: unclaimed, the turn never began."""
    return round_key(turn, 1)
