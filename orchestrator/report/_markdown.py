"""The Markdown report: the same facts as the HTML page, readable as plain text and on forges.

Text from agents is inert here too, and reads as written in a terminal: table cells escape
Markdown's own way (a backslash, never HTML entities), only where a character would start
Markdown in its place (see :data:`_CELL_SPECIAL`: ``edit[alice]`` and ``end_turn`` stay as they
are, ``[x](y)``, ``<b>`` and ``**`` do not become a link, a tag or emphasis), and fold line
breaks; longer text goes into fenced blocks whose fence is longer than any backtick run inside,
so nothing can close it early. The graph is a ``mermaid`` block (drawn by forges that support
it, readable elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._words import count, round_lines
from ._dag import STATUSES
from ._diff import FileDiff, count_lines
from ._format import (
    DASH,
    agent_cost_text,
    context_text,
    costs_text,
    count_text,
    files_text,
    first_line,
    json_text,
    lines_text,
    permissions_text,
    seconds_text,
    time_text,
    tokens_text,
    tool_calls_text,
    verify_text,
)
from ._model import (
    AgentView,
    CompareView,
    ConflictView,
    PermissionCounts,
    PipelineView,
    StepView,
    applied_text,
    as_str,
    conflicts_text,
    default_policy_text,
    instance_label,
    layers,
    sum_costs,
    sum_tokens,
    tool_call_error,
)

__all__ = ["markdown_document"]


def markdown_document(view: CompareView | PipelineView) -> str:
    """The whole Markdown report for a result view."""
    parts = _pipeline(view) if isinstance(view, PipelineView) else _compare(view)
    notice = default_policy_text(view.default_rejections)
    if notice:  # under the title: the first thing read
        parts[2:2] = [f"> **Note:** {cell(notice)}", ""]
    return "\n".join(parts).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- escaping

# Backslash escapes (CommonMark's, for ASCII punctuation), only where the character would
# start Markdown in its place, so that text reads as written in a terminal (``end_turn``,
# ``edit[alice]``, ``a > b``): a backtick and a ``|`` always; a backslash before punctuation
# (it would escape it); ``*`` unless spaces stand on both sides and ``_`` unless letters or
# digits do (they cannot open or close emphasis there); ``]`` before ``(``, ``[`` or ``:`` (a
# link, a reference or a definition; one whose text ends there is then no link); ``<`` before
# what would open a tag or an autolink; ``&`` where an entity reference would start.
_CELL_SPECIAL = re.compile(
    r"""[`|]|\\(?=[!-/:-@[-`{-~])|(?<!\s)\*|\*(?!\s)|(?<![^\W_])_|_(?![^\W_])"""
    r"""|\](?=[(\[:])|<(?=[A-Za-z/!?])|&(?=#|[A-Za-z0-9]+;)"""
)
# what would start a block (a heading, quote, list item, thematic break, setext underline or
# fence) at the start of a line
_BLOCK_START = re.compile(r"(\d{1,9})([.)])|([#>+=~-])")


def cell(value: object) -> str:
    """A value as the text of one table cell (or one inline phrase), escaped as Markdown."""
    text = value if isinstance(value, str) else str(value)
    if text == "":
        return DASH
    text = " ".join(text.split())  # tables are one line per row
    return _CELL_SPECIAL.sub(lambda m: "\\" + m.group(), text) or DASH


def paragraph(value: object) -> str:
    """A value as a paragraph of its own: :func:`cell`, and what would start a block escaped."""
    text = cell(value)
    found = _BLOCK_START.match(text)
    if found is None:
        return text
    if found.group(1):
        return f"{found.group(1)}\\{found.group(2)}{text[found.end() :]}"
    return "\\" + text


def code(value: str | None) -> str:
    """Inline code for a short value (paths, ids); ``-`` when missing.

    Inside a table a ``|`` would still split the cell, so such values fall back to escaped text.
    """
    if not value:
        return DASH
    if "|" in value or "\n" in value:
        return cell(value)
    run = max((len(m) for m in re.findall(r"`+", value)), default=0)
    ticks = "`" * (run + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or run else ""
    return f"{ticks}{pad}{value}{pad}{ticks}"


def fence(text: str, lang: str = "") -> list[str]:
    """``text`` as a fenced block whose fence no line inside can close."""
    run = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
    ticks = "`" * max(3, run + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return [f"{ticks}{lang}", body.rstrip("\n") if body else "", ticks, ""]


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured table; cells must already be escaped (see :func:`cell`)."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    out.append("")
    return out


def _dash(value: str | None) -> str:
    return cell(value) if value else DASH


# --------------------------------------------------------------------------- shared pieces


def _diffs(files: Sequence[FileDiff], level: str, changes: AgentView | None = None) -> list[str]:
    if not files:
        return ["No changes.", ""]
    added, removed = count_lines(files)
    out = [
        f"{count(len(files), 'file')} changed, {lines_text(added, removed)}",
        "",
    ]
    for f in files:
        kind = (changes.change_of(f.path) if changes else None) or f.change
        binary = ", binary" if f.binary else ""
        out.append(
            f"{level} {code(f.path)} ({cell(kind)}{binary}, {lines_text(f.added, f.removed)})"
        )
        out.append("")
        out.extend(fence(f.text, "diff"))
    return out


def _traceback(text: str | None) -> list[str]:
    """A Python traceback as a fenced block under the error it explains."""
    return ["Traceback:", "", *fence(text, "pytb")] if text else []


def _notices(owners: Sequence[tuple[str, AgentView]], owner_label: str) -> list[str]:
    """The notices the agents sent for the user, in order, each with its owner."""
    rows = [
        [
            cell(owner),
            _dash(as_str(n.get("severity"))),
            _dash(as_str(n.get("title"))),
            _dash(as_str(n.get("description"))),
        ]
        for owner, agent in owners
        for n in agent.notices
    ]
    if not rows:
        return ["No notices.", ""]
    return table([owner_label, "Severity", "Title", "Description"], rows)


def _permissions(owners: Sequence[tuple[str, AgentView]], owner_label: str) -> list[str]:
    rows = []
    total = PermissionCounts()
    for owner, agent in owners:
        total = total + agent.permission_counts
        for p in agent.permissions:
            rows.append(
                [
                    cell(owner),
                    code(as_str(p.get("toolCallId"))),
                    _dash(as_str(p.get("kind"))),
                    _dash(as_str(p.get("title"))),
                    _dash(as_str(p.get("verdict"))),
                    code(as_str(p.get("optionId"))),
                    _dash(as_str(p.get("rule"))),
                ]
            )
    if not rows:
        return ["No permission requests.", ""]
    return [
        permissions_text(total),
        "",
        *table([owner_label, "Tool call", "Kind", "Title", "Verdict", "Option", "Rule"], rows),
    ]


def _tool_calls(agent: AgentView) -> list[str]:
    if not agent.tool_calls:
        return ["No tool calls.", ""]
    out = table(
        ["#", "Title", "Kind", "Status"],
        [
            [
                str(n + 1),
                _dash(as_str(c.get("title"))),
                _dash(as_str(c.get("kind"))),
                _dash(as_str(c.get("status"))),
            ]
            for n, c in enumerate(agent.tool_calls)
        ],
    )
    # a failed call's error text, which may span lines, under the table in a block of its own
    for n, c in enumerate(agent.tool_calls):
        error = tool_call_error(c)
        if error:
            out += [f"Tool call {n + 1} failed:", "", *fence(error, "text")]
    return out


# --------------------------------------------------------------------------- compare


def _compare(view: CompareView) -> list[str]:
    label = "Prompt" if view.kind == "prompt" else "Compare"
    title = f"{label}: {first_line(view.task)}" if view.task else label
    agents = view.agents
    perms = sum((a.permission_counts for a in agents), PermissionCounts())
    out = [f"# {cell(title)}", "", "## Summary", ""]
    succeeded = sum(a.status == "succeeded" for a in agents)
    failed = sum(a.status == "failed" for a in agents)
    out += table(
        ["", ""],
        [
            ["Status", _dash(view.status)],
            ["Run", code(view.run_id)],
            ["Directory", code(view.cwd)],
            ["Started", time_text(view.times.created)],
            ["Time", seconds_text(view.times.wall_seconds)],
            ["Agents", f"{len(agents)} ({succeeded} succeeded, {failed} failed)"],
            ["Winner", _dash(view.winner)],
            ["Applied", cell(applied_text(view.applied))],
            ["Conflicts", conflicts_text(view.conflicts)],
            ["Tokens", count_text(sum_tokens(agents))],
            ["Cost", costs_text(sum_costs(agents))],
            ["Permissions", permissions_text(perms)],
        ],
    )
    if view.task:
        out += ["Task:", "", *fence(view.task, "text")]
    out += ["## Agents", ""]
    if agents:

        def name(a: AgentView) -> str:
            tags = [
                t
                for t, on in (("winner", a.name == view.winner), ("applied", view.applied_to(a)))
                if on
            ]
            return cell(a.name) + (f" ({', '.join(tags)})" if tags else "")

        metrics: list[tuple[str, list[str]]] = [
            ("Agent", [_dash(a.identity) for a in agents]),
            ("Outcome", [_dash(a.status) for a in agents]),
            ("Stop reason", [_dash(a.stop_reason) for a in agents]),
            ("Verify", [cell(verify_text(a.verify)) for a in agents]),
            ("Files changed", [files_text(a) for a in agents]),
            ("Lines", [lines_text(*a.lines) for a in agents]),
            ("Tool calls", [tool_calls_text(a) for a in agents]),
            ("Permissions", [permissions_text(a.permission_counts) for a in agents]),
            ("Tokens", [tokens_text(a) for a in agents]),
            ("Context", [context_text(a.usage) for a in agents]),
            ("Cost", [agent_cost_text(a) for a in agents]),
            ("Time", [seconds_text(a.wall_seconds) for a in agents]),
            ("Error", [_dash(a.error) for a in agents]),
        ]
        out += table(["", *(name(a) for a in agents)], [[m, *vals] for m, vals in metrics])
        out += ["### Final messages", ""]
        for a in agents:
            out += [f"#### {cell(a.name)}", ""]
            if a.error:
                out += [f"Error: {cell(a.error)}", ""]
            out += _traceback(a.traceback)
            out += fence(a.text, "text") if a.text else ["(no message)", ""]
            if a.verify is not None:
                command = code(as_str(a.verify.get("command")))
                out += [f"Verify {command}: {cell(verify_text(a.verify))}", ""]
                output = as_str(a.verify.get("output"))
                if output:
                    out += fence(output, "text")
            out += _rounds(a.rounds)  # a comparison's rounds against its verify command
    else:
        out += ["No agents in this result.", ""]
    out += ["## Steps (tool calls)", ""]
    for a in agents:
        out += [f"### {cell(a.name)}", "", *_tool_calls(a)]
    out += ["## Conflicts", ""]
    refused = [[cell(a.name), code(p)] for a in agents for p in a.apply_conflicts]
    for n, c in enumerate(view.conflicts):
        out += _conflict(n, c)
    if refused:
        out += [
            "The apply refused these files: they changed in the workspace during the run, or a "
            "directory holding what the run did not copy is where the run made a file.",
            "",
            *table(["Agent", "Path"], refused),
        ]
    if not refused and not view.conflicts:
        out += ["No conflicts.", ""]
    out += ["## Diffs", ""]
    for a in agents:
        out += [f"### {cell(a.name)}", "", *_diffs(a.files, "####", a)]
    out += ["## Permissions", "", *_permissions([(a.name, a) for a in agents], "Agent")]
    out += ["## Notices", "", *_notices([(a.name, a) for a in agents], "Agent")]
    return out


# --------------------------------------------------------------------------- pipeline


def _pipeline(view: PipelineView) -> list[str]:
    instances = [i for _, i in view.instances()]
    title = f"Pipeline {view.name or view.pipeline or ''}".rstrip()
    counts = view.status_counts()
    steps = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    added, removed = count_lines(view.files)
    files = len(view.changes) if view.changes else len(view.files)
    out = [f"# {cell(title)}", "", "## Summary", ""]
    out += table(
        ["", ""],
        [
            ["Pipeline", f"{_dash(view.name)} {code(view.pipeline)}"],
            ["Status", f"**{_dash(view.status)}**"],
            ["Run", code(view.run_id)],
            ["Directory", code(view.cwd)],
            ["Started", time_text(view.times.created)],
            ["Time", seconds_text(view.times.wall_seconds)],
            ["Steps", f"{len(view.steps)} ({cell(steps)})"],
            ["Conflicts", conflicts_text(view.conflicts)],
            ["Files changed", str(files)],
            ["Lines", lines_text(added, removed)],
            ["Applied", cell(applied_text(view.applied))],
            ["Tokens", count_text(sum_tokens(instances))],
            ["Cost", costs_text(sum_costs(instances))],
            [
                "Permissions",
                permissions_text(sum((i.permission_counts for i in instances), PermissionCounts())),
            ],
        ],
    )
    if view.inputs:
        out += ["Inputs:", ""]
        out += table(
            ["Input", "Value"], [[cell(k), cell(json_text(v))] for k, v in view.inputs.items()]
        )
    out += ["## Graph", "", *_mermaid(view)]
    out += ["## Steps", ""]
    if view.steps:
        rows = []
        for s in view.steps:
            a, r = count_lines(f for i in s.instances for f in i.files)
            agents = ", ".join(s.agents) or ", ".join(
                dict.fromkeys(i.agent for i in s.instances if i.agent)
            )
            rows.append(
                [
                    cell(s.name),
                    _dash(s.kind),
                    f"**{_dash(s.status)}**",
                    _dash(agents),
                    str(len(s.instances)),
                    seconds_text(s.wall_seconds),
                    lines_text(a, r),
                    _dash(s.error or s.cause),
                ]
            )
        out += table(
            ["Step", "Kind", "Status", "Agents", "Instances", "Time", "Lines", "Error / cause"],
            rows,
        )
        for s in view.steps:
            out += _step(s)
    else:
        out += ["No steps in this result.", ""]
    out += ["## Conflicts", ""]
    if view.conflicts:
        for n, c in enumerate(view.conflicts):
            out += _conflict(n, c)
    else:
        out += ["No conflicts.", ""]
    out += ["## Final diff", "", *_diffs(view.files, "###")]
    owners = [(instance_label(s, i), i) for s, i in view.instances()]
    out += ["## Permissions", "", *_permissions(owners, "Step[instance]")]
    out += ["## Notices", "", *_notices(owners, "Step[instance]")]
    return out


def _step(s: StepView) -> list[str]:
    out = [f"### Step {cell(s.name)}: {_dash(s.status)}", ""]
    if s.description:
        out += [paragraph(s.description), ""]
    facts = [
        f"kind {_dash(s.kind)}",
        f"agents {_dash(', '.join(s.agents))}",
        f"over {_dash(s.over)}",
        f"merge {_dash(s.merge)}",
        f"time {seconds_text(s.wall_seconds)}",
    ]
    out += [" · ".join(facts), ""]
    if s.error:
        out += [f"Error: {cell(s.error)}", ""]
    out += _traceback(s.own_traceback)
    if s.cause:
        out += [f"Cause: {cell(s.cause)}", ""]
    if not s.instances:
        return [*out, "No instances ran.", ""]
    items = any(i.item is not None for i in s.instances)
    out += table(
        [
            "Instance",
            "Agent",
            *(["Item"] if items else []),
            "Status",
            "Time",
            "Stop",
            "Tool calls",
            "Permissions",
            "Tokens",
            "Cost",
            "Lines",
        ],
        [
            [
                cell(i.name),
                _dash(i.agent),
                *([cell(json_text(i.item))] if items else []),
                _dash(i.status),
                seconds_text(i.wall_seconds),
                _dash(i.stop_reason),
                tool_calls_text(i),
                permissions_text(i.permission_counts),
                tokens_text(i),
                agent_cost_text(i),
                lines_text(*i.lines),
            ]
            for i in s.instances
        ],
    )
    for i in s.instances:
        out += [f"#### {cell(instance_label(s, i))}", ""]
        facts = [f"agent {_dash(i.agent)}" + (f" ({cell(i.identity)})" if i.identity else "")]
        if i.session_id:
            facts.append(f"session {code(i.session_id)}")
        if i.item is not None:
            facts.append(f"item {cell(json_text(i.item))}")
        if i.attempt and i.attempt > 1:
            facts.append(f"attempt {i.attempt}")
        if i.verify is not None:
            facts.append(f"verify {cell(verify_text(i.verify))}")
        out += [" · ".join(facts), ""]
        if i.error:
            out += [f"Error: {cell(i.error)}", ""]
        out += _traceback(i.traceback)
        out += _rounds(i.rounds)
        if i.text:
            out += fence(i.text, "text")
        if i.has_value and i.status != "failed":  # a failed step returned nothing
            out += ["Value:", "", *fence(json_text(i.value), "json")]
        if i.files:
            out += _diffs(i.files, "#####", i)
    return out


def _rounds(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """A step's rounds: a line each, then the output of each check that failed and what each
    round changed."""
    if not rounds:
        return []
    out = ["Rounds:", "", *(f"- {cell(line)}" for line in round_lines(rounds)), ""]
    for r in rounds:
        check = r.get("check")
        if isinstance(check, Mapping) and not check.get("passed") and check.get("output"):
            out += [f"Check output, round {r.get('turn')}:", "", *fence(str(check["output"]))]
        diff = r.get("diff")
        if isinstance(diff, str) and diff:
            out += [f"Changed in round {r.get('turn')}:", "", *fence(diff, "diff")]
    return out


def _conflict(n: int, c: ConflictView) -> list[str]:
    state = f"resolved: {c.resolution}" if c.resolved else "unresolved"
    out = [
        f"### {n + 1}. {code(c.path)} in step {_dash(c.step)} ({_dash(c.kind)}, {cell(state)})",
        "",
        f"Branches: {cell(', '.join(c.branches)) if c.branches else DASH}",
        "",
    ]
    versions = (
        ("base", "Base", c.base),
        ("ours", f"Ours: {c.ours_label}", c.ours),
        ("theirs", f"Theirs: {c.theirs_label}", c.theirs),
        *(("theirs", f"Also changed by: {label}", text) for label, text in c.also_changed),
    )
    for side, label, text in versions:
        out += [f"**{cell(label)}**", ""]
        out += fence(text, "text") if text is not None else [c.missing_text(side), ""]
    return out


def _mermaid(view: PipelineView) -> list[str]:
    if not view.steps:
        return ["No graph in this result.", ""]
    ids = {s.name: f"n{i}" for i, s in enumerate(view.steps)}
    # a viewer draws the graph at its page's width: a long one left to right would shrink
    # past reading, top to bottom it keeps its size and the page scrolls
    long = len(layers([s.name for s in view.steps], view.edges)) > MERMAID_WIDE_LAYERS
    lines = ["flowchart TD" if long else "flowchart LR"]
    for s in view.steps:
        label = _mermaid_label(f"{s.name}\n{s.status or 'unknown'}")
        status = s.status if s.status in STATUSES else "unknown"
        lines.append(f'  {ids[s.name]}["{label}"]:::{status}')
    for a, b in view.edges:
        if a in ids and b in ids and a != b:
            lines.append(f"  {ids[a]} --> {ids[b]}")
    lines += _MERMAID_CLASSES
    out = fence("\n".join(lines), "mermaid")
    # an edge list too, for readers whose viewer does not draw mermaid
    if paths := _paths(view.edges):
        out += ["Edges:", "", *(f"- {' → '.join(cell(n) for n in p)}" for p in paths), ""]
    return out


def _paths(edges: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The edges as paths: a run of steps each the only child of the one before is one path.

    A chain of twenty steps reads as one line, not nineteen pairs that name each step twice.
    """
    unique = list(dict.fromkeys((a, b) for a, b in edges if a != b))
    children: dict[str, list[str]] = {}
    parents: dict[str, list[str]] = {}
    for a, b in unique:
        children.setdefault(a, []).append(b)
        parents.setdefault(b, []).append(a)

    def follows(a: str, b: str) -> bool:  # b continues a path that reached a
        return children[a] == [b] and parents[b] == [a]

    used: set[tuple[str, str]] = set()
    paths: list[list[str]] = []
    # paths start where a step is not the middle of a run (a cycle's edges are left to the end)
    starts = [
        e
        for e in unique
        if not (len(parents.get(e[0], [])) == 1 and follows(parents[e[0]][0], e[0]))
    ]
    for a, b in starts + unique:
        if (a, b) in used:
            continue
        used.add((a, b))
        path = [a, b]
        while len(children.get(path[-1], [])) == 1:
            nxt = children[path[-1]][0]
            if (path[-1], nxt) in used or not follows(path[-1], nxt):
                break
            used.add((path[-1], nxt))
            path.append(nxt)
        paths.append(path)
    return paths


def _mermaid_label(text: str) -> str:
    """Text safe inside a quoted mermaid label (entity codes for the characters it parses)."""
    for raw, entity in (
        ("#", "#35;"),
        ('"', "#quot;"),
        ("<", "#lt;"),
        (">", "#gt;"),
        ("`", "#96;"),
    ):
        text = text.replace(raw, entity)
    return text.replace("\n", "<br/>")


#: past this many columns the mermaid graph is drawn top to bottom
MERMAID_WIDE_LAYERS = 6

_MERMAID_CLASSES = [
    "  classDef succeeded fill:#dafbe1,stroke:#1a7f37",
    "  classDef failed fill:#ffebe9,stroke:#cf222e",
    "  classDef skipped fill:#eaeef2,stroke:#6e7781,stroke-dasharray:4 3",
    "  classDef running fill:#ddf4ff,stroke:#0969da",
    "  classDef pending fill:#eaeef2,stroke:#6e7781",
    "  classDef interrupted fill:#fff8c5,stroke:#9a6700",
    "  classDef conflicts fill:#fbefff,stroke:#8250df",
    "  classDef cancelled fill:#fff8c5,stroke:#9a6700",
    "  classDef unknown fill:#eaeef2,stroke:#6e7781",
]
