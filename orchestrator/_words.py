"""Counted nouns and durations in messages: ``1 file``, ``2 files``, ``0.34 s``; a step's
rounds as lines (a pure leaf)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["count", "round_lines", "seconds_text"]


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


def round_lines(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per round of a step with a check: how its turn ended, what the check said
    (with the first line of its output)."""
    lines = []
    for r in rounds:
        check = r.get("check")
        if not isinstance(check, Mapping):
            said = f"turn ended {r.get('stopReason')}, not checked"
        else:
            said = "check passed" if check.get("passed") else "check failed"
            if check.get("timedOut"):
                said += " (timed out)"
            elif check.get("exitCode") is not None:
                said += f" (exit {check.get('exitCode')})"
            first = next((x for x in str(check.get("output") or "").splitlines() if x.strip()), "")
            if first:
                said += f": {first[:100]}"
        lines.append(f"round {r.get('turn')}: {said}")
    return lines
