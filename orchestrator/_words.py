"""Counted nouns and durations in messages: ``1 file``, ``2 files``, ``0.34 s`` (a pure leaf)."""

from __future__ import annotations

__all__ = ["count", "seconds_text"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural``, default ``noun + "s"``):
    ``count(1, "file")`` is ``1 file``, ``count(2, "permission request")`` is
    ``2 permission requests``."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def seconds_text(seconds: float | None) -> str:
    """``0.08 s``, ``12.3 s``, ``2 min 05 s``, ``1 h 02 min``; ``-`` when unknown. One rounding
    for every place a duration is shown, so a table and a sentence never disagree."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
