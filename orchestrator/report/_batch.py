"""The report of a batch run: one table row per repository, and each repository's diff.

The input is the batch object (``batch --json``, ``show --json BATCH``) as a plain dict and the
repositories' diffs by name; any key may be missing, null or of an unexpected type (it shows as
``-``). :func:`repo_rows` and :func:`batch_summary` are shared with the command line's table, so
the table on a terminal and in the report say the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from .._words import count
from ._diff import parse_diff
from ._format import DASH, count_text, first_line, seconds_text
from ._html import _kv, _lines_cell, _table, badge, diff_html, page
from ._markdown import _diffs, cell, code, table
from ._markup import Markup, el, join
from ._model import as_bool, as_map, as_maps, as_num, as_str

__all__ = [
    "RepoRow",
    "batch_html",
    "batch_markdown",
    "batch_summary",
    "repo_rows",
]

#: the most repository names the summary names in each of its lists
SUMMARY_NAMES = 10
#: how much of a failure's reason the summary keeps (the table keeps more)
SUMMARY_REASON = 40


@frozen
class RepoRow:
    """One repository of a batch, as the tables show it."""

    name: str
    #: succeeded, failed, skipped, interrupted, pending, running (None: not said)
    status: str | None
    #: the one-line reason it failed or was skipped
    error: str | None
    #: why it was skipped (``budget``)
    skipped: str | None
    exit_code: int | None
    files: int | None
    added: int | None
    removed: int | None
    #: passed, failed, or None (nothing was verified)
    verify: str | None
    applied: bool
    branch: str | None
    pushed: str | None
    tokens: float | None
    cost: float | None
    seconds: float | None
    run_id: str | None
    path: str | None

    def outcome(self, limit: int | None = 60) -> str:
        """``succeeded`` (``, applied``), ``failed: <error>`` (cut to ``limit`` characters),
        ``skipped: budget``, ``interrupted``, ``running``, ``pending``; ``-`` when unknown."""
        status = self.status
        if status == "succeeded":
            return "succeeded, applied" if self.applied else "succeeded"
        if status in ("failed", "skipped"):
            why = self.skipped if status == "skipped" and self.skipped else self.error
            reason = first_line(why, limit or 1_000_000) if why else ""
            if reason:
                return f"{status}: {reason}"
            return f"failed (exit {self.exit_code})" if self.exit_code is not None else status
        return status or DASH

    def lines_text(self) -> str:
        """``+10 -2``; ``-`` when the run counted no lines."""
        if self.added is None and self.removed is None:
            return DASH
        return f"+{self.added or 0} -{self.removed or 0}"

    def branch_text(self) -> str:
        """The branch committed, and ``pushed to REMOTE`` when it was pushed; ``-`` if none."""
        if not self.branch:
            return f"pushed to {self.pushed}" if self.pushed else DASH
        return f"{self.branch}, pushed to {self.pushed}" if self.pushed else self.branch

    def reason(self) -> str | None:
        """Why it failed, short, for the summary line: its exit code, else the head of its
        error (``clone failed`` of ``clone failed: ...``)."""
        if self.skipped:  # the budget, not the run's exit code, is why
            return first_line(self.skipped, SUMMARY_REASON) or None
        if self.exit_code is not None:
            return f"exit {self.exit_code}"
        head = first_line(self.error).split(": ", 1)[0]
        return first_line(head, SUMMARY_REASON) or None


def _int(value: Any) -> int | None:
    number = as_num(value)
    return None if number is None or number != number else int(number)


def repo_rows(batch: Mapping[str, Any]) -> tuple[RepoRow, ...]:
    """The batch's repositories, in its order (entries that are not objects left out)."""
    rows = []
    for i, entry in enumerate(as_maps(as_map(batch).get("repos"))):
        name = as_str(entry.get("name")) or as_str(entry.get("source")) or f"repository {i + 1}"
        rows.append(
            RepoRow(
                name=name,
                status=as_str(entry.get("status")),
                error=as_str(entry.get("error")),
                skipped=as_str(entry.get("skipped")),
                exit_code=_int(entry.get("exitCode")),
                files=_int(entry.get("files")),
                added=_int(entry.get("added")),
                removed=_int(entry.get("removed")),
                verify=as_str(entry.get("verify")),
                applied=as_bool(entry.get("applied")) or False,
                branch=as_str(entry.get("branch")),
                pushed=as_str(entry.get("pushed")),
                tokens=as_num(entry.get("tokens")),
                cost=as_num(entry.get("cost")),
                seconds=as_num(entry.get("seconds")),
                run_id=as_str(entry.get("runId")),
                path=as_str(entry.get("path")),
            )
        )
    return tuple(rows)


def _names(rows: Sequence[RepoRow], why: bool) -> str:
    """``a (exit 1), b (clone failed)``: the first :data:`SUMMARY_NAMES`, then how many more."""
    shown = []
    for r in rows[:SUMMARY_NAMES]:
        reason = r.reason() if why else None
        shown.append(f"{r.name} ({reason})" if reason else r.name)
    more = len(rows) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def batch_summary(batch: Mapping[str, Any]) -> str:
    """One sentence: how many repositories succeeded, then which failed (with their exit code
    or the head of their error), were skipped, interrupted, or are still to finish; and the
    budget that was spent, if one was."""
    rows = repo_rows(batch)
    if not rows:
        return "no repositories"
    ok = sum(r.status == "succeeded" for r in rows)
    running = as_str(as_map(batch).get("status")) == "running"
    parts = [f"{ok} of {count(len(rows), 'repository', 'repositories')} succeeded"]
    if running:
        parts[0] += " so far"
    for status, label, why in (
        ("failed", "failed", True),
        ("skipped", "skipped", True),
        ("interrupted", "interrupted", False),
        ("running", "running", False),
        ("pending", "pending", False),
    ):
        chosen = [r for r in rows if r.status == status]
        if chosen:
            parts.append(f"{label}: {_names(chosen, why)}")
    other = [r for r in rows if r.status not in KNOWN_STATUSES]
    if other:
        parts.append(f"status unknown: {_names(other, False)}")
    spent = as_str(as_map(as_map(batch).get("budget")).get("spent"))
    if spent:
        parts.append(f"budget spent ({first_line(spent, 120)})")
    return "; ".join(parts)


#: the statuses a batch's repository can have
KNOWN_STATUSES = ("succeeded", "failed", "skipped", "interrupted", "running", "pending")


def _title(batch: Mapping[str, Any]) -> str:
    name = as_str(batch.get("pipelineName")) or as_str(batch.get("pipeline"))
    return f"Batch {first_line(name)}" if name else "Batch"


def _tokens_total(rows: Sequence[RepoRow]) -> float | None:
    known = [r.tokens for r in rows if r.tokens is not None]
    return sum(known) if known else None


# --------------------------------------------------------------------------- HTML


def _anchor(i: int) -> str:
    return f"repo-{i + 1}"


def batch_html(batch: Mapping[str, Any], diffs: Mapping[str, str]) -> str:
    """The HTML page of a batch: its summary, the table, and each repository's diff."""
    batch = as_map(batch)
    rows = repo_rows(batch)
    status = as_str(batch.get("status"))
    meta = join(
        el("span", badge(status)) if status else None,
        el("span", "run ", el("code", as_str(batch.get("runId")) or DASH)),
        el("span", count(len(rows), "repository", "repositories")),
        el("span", seconds_text(as_num(batch.get("seconds")))),
    )
    facts: list[tuple[str, object]] = [
        ("Status", badge(status)),
        ("Outcome", batch_summary(batch)),
        ("Run", el("code", as_str(batch.get("runId")) or DASH)),
        ("Pipeline", el("code", as_str(batch.get("pipeline")) or DASH)),
        ("Exit code", as_str(batch.get("exitCode")) or DASH),
        ("Time", seconds_text(as_num(batch.get("seconds")))),
        ("Tokens", count_text(_tokens_total(rows))),
    ]
    table_rows = [
        [
            el("a", r.name, href=f"#{_anchor(i)}"),
            badge(r.status) if r.status in ("succeeded", "failed", "skipped") else r.outcome(),
            r.outcome(None) if r.status in ("failed", "skipped") else "",
            DASH if r.files is None else str(r.files),
            _lines_cell(r.added or 0, r.removed or 0) if r.lines_text() != DASH else DASH,
            r.verify or DASH,
            r.branch_text(),
            count_text(r.tokens),
            seconds_text(r.seconds),
            el("code", r.run_id) if r.run_id else DASH,
        ]
        for i, r in enumerate(rows)
    ]
    summary = join(
        _kv(facts),
        _table(
            [
                "Repository",
                "Outcome",
                "Why",
                "Files",
                "+/-",
                "Verify",
                "Branch",
                "Tokens",
                "Time",
                "Run",
            ],
            table_rows,
            num=(3, 4, 7, 8),
        ),
    )
    parts: list[Markup] = []
    for i, r in enumerate(rows):
        diff = diffs.get(r.name, "")
        if r.run_id is None:
            body = el("p", "No run: " + r.outcome(None), class_="empty")
        else:
            body = diff_html(parse_diff(diff), open_all=False if len(rows) > 1 else None)
        parts.append(
            el(
                "div",
                el("h3", r.name, " ", badge(r.status)),
                el("p", "run ", el("code", r.run_id), ", ", r.path or "") if r.run_id else None,
                body,
                id=_anchor(i),
            )
        )
    sections = [
        ("summary", "Summary", summary),
        ("diffs", "Diffs", join(parts) if parts else el("p", "No repositories.", class_="empty")),
    ]
    return page(_title(batch), meta, sections, None)


# --------------------------------------------------------------------------- Markdown


def batch_markdown(batch: Mapping[str, Any], diffs: Mapping[str, str]) -> str:
    """The Markdown report of a batch: its summary, the table, each repository's diff."""
    batch = as_map(batch)
    rows = repo_rows(batch)
    out = [f"# {cell(_title(batch))}", "", "## Summary", "", cell(batch_summary(batch)), ""]
    out += table(
        ["", ""],
        [
            ["Status", cell(as_str(batch.get("status")) or DASH)],
            ["Run", code(as_str(batch.get("runId")))],
            ["Pipeline", code(as_str(batch.get("pipeline")))],
            ["Exit code", cell(as_str(batch.get("exitCode")) or DASH)],
            ["Time", seconds_text(as_num(batch.get("seconds")))],
            ["Tokens", count_text(_tokens_total(rows))],
        ],
    )
    out += table(
        ["Repository", "Outcome", "Files", "+/-", "Verify", "Branch", "Tokens", "Time", "Run"],
        [
            [
                cell(r.name),
                cell(r.outcome(None)),
                DASH if r.files is None else str(r.files),
                r.lines_text(),
                cell(r.verify or DASH),
                cell(r.branch_text()),
                count_text(r.tokens),
                seconds_text(r.seconds),
                code(r.run_id),
            ]
            for r in rows
        ],
    )
    out += ["## Diffs", ""]
    if not rows:
        out += ["No repositories.", ""]
    for r in rows:
        out += [f"### {cell(r.name)}", "", f"{cell(r.outcome(None))}; run {code(r.run_id)}", ""]
        if r.run_id is None:
            continue
        out += _diffs(parse_diff(diffs.get(r.name, "")), "####")
    return "\n".join(out).rstrip("\n") + "\n"
