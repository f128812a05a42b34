"""Counted nouns in messages: ``1 file``, ``2 files`` (a pure leaf)."""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural``, default ``noun + "s"``):
    ``count(1, "file")`` is ``1 file``, ``count(2, "permission request")`` is
    ``2 permission requests``."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
