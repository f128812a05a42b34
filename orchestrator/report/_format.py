"""Plain-text formatting of numbers and outcomes, shared by the HTML and Markdown reports."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from .._words import seconds_text
from ._model import AgentView, PermissionCounts, as_num, as_str

__all__ = [
    "DASH",
    "agent_cost_text",
    "context_text",
    "cost_text",
    "costs_text",
    "count_text",
    "files_text",
    "first_line",
    "json_text",
    "lines_text",
    "permissions_text",
    "seconds_text",
    "time_text",
    "tokens_text",
    "tool_calls_text",
    "verify_text",
]

#: what an unknown value renders as
DASH = "-"


def time_text(epoch: float | None) -> str:
    """An epoch time as ``2025-01-31 17:04:05 UTC`` (UTC: the same report reads the same
    anywhere); ``-`` when unknown."""
    if epoch is None:
        return DASH
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
    except (OverflowError, OSError, ValueError):
        return DASH


def count_text(value: float | None) -> str:
    """An integer count with thousands separators; ``-`` when unknown."""
    return DASH if value is None else f"{round(value):,}"


def cost_text(amount: float, currency: str) -> str:
    """``0.02 USD``; small amounts keep four decimals so they do not read as zero."""
    digits = 2 if abs(amount) >= 0.1 or amount == 0 else 4
    return f"{amount:.{digits}f} {currency}".rstrip()


def costs_text(costs: Mapping[str, float]) -> str:
    """Several currencies joined with `` + ``; ``-`` when none."""
    if not costs:
        return DASH
    return " + ".join(cost_text(a, c) for c, a in sorted(costs.items()))


def agent_cost_text(agent: AgentView) -> str:
    """The agent's reported cost as ``0.02 USD``; ``-`` when it reported none."""
    return cost_text(*agent.cost) if agent.cost else DASH


def files_text(agent: AgentView) -> str:
    """``3 (2 modified, 1 added)``: files changed, by kind; ``0`` when none."""
    n = agent.files_changed
    if n == 0:
        return "0"
    kinds = agent.change_counts()
    detail = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
    return f"{n} ({detail})"


def tool_calls_text(agent: AgentView) -> str:
    """``5 (1 failed)``; just the count when none failed."""
    n = len(agent.tool_calls)
    failed = agent.failed_tool_calls
    return f"{n} ({failed} failed)" if failed else str(n)


def tokens_text(agent: AgentView) -> str:
    """``1,200 (900 in / 300 out)``; ``-`` when the agent reported no tokens."""
    total = agent.total_tokens
    if total is None:
        return DASH
    parts = []
    for key, label in (("inputTokens", "in"), ("outputTokens", "out")):
        n = as_num(agent.tokens.get(key))
        if n is not None:
            parts.append(f"{count_text(n)} {label}")
    return count_text(total) + (f" ({' / '.join(parts)})" if parts else "")


def context_text(usage: Mapping[str, Any]) -> str:
    """Context window use: ``1,200 / 200,000 (0.6%)``; ``-`` when unknown."""
    used, size = as_num(usage.get("used")), as_num(usage.get("size"))
    if used is None:
        return DASH
    if not size:
        return count_text(used)
    return f"{count_text(used)} / {count_text(size)} ({100 * used / size:.1f}%)"


def permissions_text(counts: PermissionCounts) -> str:
    """``3 asked: 2 allowed, 1 rejected`` (cancelled only when there were some)."""
    if counts.asked == 0:
        return "none asked"
    text = f"{counts.asked} asked: {counts.allowed} allowed, {counts.rejected} rejected"
    if counts.cancelled:
        text += f", {counts.cancelled} cancelled"
    return text


def lines_text(added: int, removed: int) -> str:
    """``+12 -3``."""
    return f"+{added} -{removed}"


def verify_text(verify: Mapping[str, Any] | None) -> str:
    """``passed (exit 0)`` / ``failed (exit 1)``; ``-`` when no verify command ran."""
    if verify is None:
        return DASH
    code = as_num(verify.get("exitCode"))
    if code is None:
        return "no exit code"
    return f"{'passed' if code == 0 else 'failed'} (exit {round(code)})"


def first_line(text: str | None, limit: int = 80) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters with an ellipsis."""
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "\u2026"
    return ""


def json_text(value: Any) -> str:
    """A JSON value as readable text: strings as they are, anything else pretty-printed."""
    text = as_str(value)
    if isinstance(value, str) and text is not None:
        return text
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)
