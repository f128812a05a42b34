"""The human result of the run commands, rendered from a run's recorded result object.

One rule for every run command (``prompt``, ``compare``, ``run``, ``resume``): the result goes
to stdout, progress and logs to stderr, and diffs only when asked (``--diff``, or
``orchestrator diff RUN``). The ending a command prints when its run finishes and what ``show
RUN`` prints later come from the same functions here, fed by the same object (the ``--json``
one), so the two cannot drift apart.

Every value that came from an agent, a file or a user goes through :func:`~.output.say`, so no
control character reaches the terminal raw.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from .._names import display_name, one_line, parse_name
from .._words import count as count_of
from .._words import round_lines
from .output import say, say_default_policy_note, terminal_text

__all__ = [
    "COMPARE_MESSAGE_LINES",
    "compare_result",
    "conflict_line",
    "cut_line",
    "default_policy_note",
    "diff_header",
    "diff_stat",
    "prompt_details",
    "prompt_ending",
    "refusal",
    "resume_hint",
    "run_ending",
    "sandbox_lines",
    "step_details",
    "steps_result",
    "terminal_width",
]

#: the width of a table written to a pipe or a file, where no terminal says how wide it is
PIPE_WIDTH = 120
#: how many lines of each agent's final message ``compare`` prints
COMPARE_MESSAGE_LINES = 10


def terminal_width(out: IO[str] | None = None) -> int:
    """The width to render for: ``$COLUMNS``, else the terminal's, else :data:`PIPE_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size((out or sys.stdout).fileno()).columns
    except (OSError, ValueError, AttributeError):
        return PIPE_WIDTH


def _width(text: str) -> int:
    """The cells ``text`` takes on a terminal (wide characters take two)."""
    from rich.cells import cell_len

    return cell_len(text)


def _pad(text: str, width: int, right: bool = False) -> str:
    fill = " " * max(0, width - _width(text))
    return fill + text if right else text + fill


# ---------------------------------------------------------------------------------------------
# the pieces


def _view(obj: Mapping[str, Any], default: str) -> Any:
    from ..report._model import AgentView

    return AgentView.from_json(obj, default)


def diff_stat(
    diff: str, changes: Sequence[Mapping[str, Any]], width: int | None = None
) -> list[str]:
    """The changed files as ``git diff --stat`` lists them: one line per file (with ``(new)``,
    ``(deleted)`` or its symlink target), then the totals. [] when nothing changed."""
    from ..report._diff import parse_diff

    files = {f.path: f for f in parse_diff(diff)}
    # (name shown, count column, lines added and removed: None when the diff counts none)
    rows: list[tuple[str, str, tuple[int, int] | None]] = []
    listed = list(changes) or [
        {"path": f.path, "change": f.change if f.change in ("added", "deleted") else "modified"}
        for f in files.values()
    ]
    for c in listed:
        path = str(c.get("path"))
        name = one_line(path)
        if c.get("symlink") is not None:
            name += f" -> {one_line(str(c['symlink']))} (symlink)"
        elif c.get("change") == "added":
            name += " (new)"
        elif c.get("change") == "deleted":
            name += " (deleted)"
        f = files.get(path)
        if f is None:  # named by the changes, not in the diff (too large to show, say)
            rows.append((name, "-", None))
        elif f.binary:
            rows.append((name, "Bin", None))
        else:
            rows.append((name, str(f.added + f.removed), (f.added, f.removed)))
    if not rows:
        return []
    name_w = max(_width(terminal_text(n)) for n, _, _ in rows)
    count_w = max(len(c) for _, c, _ in rows)
    # as git does: the +/- bar is scaled down to the room the width leaves
    room = max(10, (width or terminal_width()) - name_w - count_w - 5)
    most = max((sum(lines) for _, _, lines in rows if lines), default=0)
    scale = min(1.0, room / most) if most else 1.0
    out = []
    for name, count, counted in rows:
        bar = ""
        if counted:
            plus, minus = counted
            bar = " " + "+" * max(round(plus * scale), min(plus, 1))
            bar += "-" * max(round(minus * scale), min(minus, 1))
        out.append(f" {_pad(terminal_text(name), name_w)} | {_pad(count, count_w, True)}{bar}")
    added = sum(lines[0] for _, _, lines in rows if lines)
    removed = sum(lines[1] for _, _, lines in rows if lines)
    n = len(rows)
    total = f" {count_of(n, 'file')} changed"
    if added:
        total += f", {count_of(added, 'insertion')}(+)"
    if removed:
        total += f", {count_of(removed, 'deletion')}(-)"
    out.append(total)
    return out


def _message(text: str | None, limit: int | None, more: str) -> list[str]:
    """An agent's final message, indented; its first ``limit`` lines and a line saying how
    many more there are and where to read them (``more``: the command)."""
    lines = (text or "").rstrip("\n").splitlines()
    if not lines:
        return ["  (no message)"]
    shown = lines if limit is None else lines[:limit]
    out = [f"  {line}" for line in shown]
    if len(lines) > len(shown):
        out.append(f"  \u2026 ({len(lines) - len(shown)} more lines: {more})")
    return out


def diff_header(name: str, agent: Mapping[str, Any], step: str = "compare") -> str:
    """The line above one diff among several (``# STEP[NAME]: STATUS, N files changed, +A
    -R``: an agent of a comparison, an instance of a pipeline's step; ``STEP`` alone when
    ``name`` is the step's): a comment to ``git apply`` and ``patch``, which skip text before a
    file's header."""
    view = _view(agent, name)
    added, removed = view.lines
    n = view.files_changed
    label = step if name == step else f"{step}[{name}]"
    return f"# {label}: {view.status or '-'}, {count_of(n, 'file')} changed, +{added} -{removed}"


def _tokens(view: Any) -> float | None:
    """An agent's tokens: the turn's total the prompt response reported, else the context
    window's use from its last ``usage_update`` (``used``: what the live view and a step's
    token budget count); None when it reported neither."""
    from ..report._model import as_num

    total: float | None = view.total_tokens
    return total if total is not None else as_num(view.usage.get("used"))


# ---------------------------------------------------------------------------------------------
# compare


def _columns(max_rounds: int = 1) -> tuple[tuple[str, int, bool, Callable[[Any], str]], ...]:
    """The table's columns: (header, priority, right-aligned, the cell of an agent); the lowest
    priority is dropped first when the table is too wide. ``max_rounds``: the rounds each
    agent had."""
    from ..report._format import DASH, agent_cost_text, count_text, seconds_text

    def verify(a: Any) -> str:
        if a.verify is None:
            return DASH
        return "passed" if a.verify_passed else "failed"

    def rounds(a: Any) -> str:
        if not a.rounds:
            return DASH
        check = a.rounds[-1].get("check")
        # green: the check passed; red: it failed every round; stopped: the last turn ended
        # before a check (the agent's cancel or refusal, the budget)
        how = (
            "stopped"
            if not isinstance(check, Mapping)
            else "green"
            if check.get("passed")
            else "red"
        )
        return f"{how} in {len(a.rounds)}/{max(max_rounds, len(a.rounds))} rounds"

    def tools(a: Any) -> str:
        failed = a.failed_tool_calls
        return f"{len(a.tool_calls)}" + (f" ({failed} failed)" if failed else "")

    def permissions(a: Any) -> str:
        c = a.permission_counts
        return f"{c.asked}/{c.allowed}/{c.rejected}"

    return (
        ("AGENT", 100, False, lambda a: a.name),
        ("OUTCOME", 90, False, lambda a: a.status or DASH),
        ("VERIFY", 60, False, verify),
        ("ROUNDS", 65, False, rounds),
        ("FILES", 70, True, lambda a: str(a.files_changed)),
        ("+/-", 80, True, lambda a: "+{} -{}".format(*a.lines)),
        ("TOOLS", 40, True, tools),
        ("ASK/OK/NO", 30, True, permissions),
        ("TOKENS", 20, True, lambda a: count_text(_tokens(a))),
        ("COST", 10, True, agent_cost_text),
        ("TIME", 50, True, lambda a: seconds_text(a.wall_seconds)),
    )


def compare_table(
    agents: Sequence[Mapping[str, Any]], winner: str | None, width: int, max_rounds: int = 1
) -> list[str]:
    """One row per agent, the winner starred; columns dropped, least useful first, until the
    table fits ``width`` (never the agent's name, which is never cut). Verify, rounds (of
    ``max_rounds``), tokens and cost show only when some agent has one."""
    from ..report._format import DASH

    views = [_view(a, f"agent {i + 1}") for i, a in enumerate(agents)]
    cols = []
    for header, priority, right, value in _columns(max_rounds):
        cells = [terminal_text(value(v)) for v in views]
        if header in ("VERIFY", "ROUNDS", "TOKENS", "COST") and all(c == DASH for c in cells):
            continue
        cols.append((header, priority, right, cells))

    def total(chosen: list[Any]) -> int:
        widths = [max(_width(h), *(_width(c) for c in cells)) for h, _, _, cells in chosen]
        return 2 + sum(widths) + 2 * (len(widths) - 1)

    while total(cols) > width and len(cols) > 2:
        cols.remove(min(cols[2:], key=lambda c: c[1]))
    widths = [max(_width(h), *(_width(c) for c in cells)) for h, _, _, cells in cols]
    last = len(cols) - 1

    def row(mark: str, cells: list[str]) -> str:
        parts = [
            _pad(cell, w, right) if i < last or right else cell
            for i, (cell, w, (_, _, right, _)) in enumerate(zip(cells, widths, cols, strict=True))
        ]
        return (mark + " " + "  ".join(parts)).rstrip()

    lines = [row(" ", [h for h, _, _, _ in cols])]
    for i, v in enumerate(views):
        lines.append(row("*" if v.name == winner else " ", [cells[i] for _, _, _, cells in cols]))
    return lines


def compare_result(
    result: Mapping[str, Any],
    out: IO[str],
    *,
    message_lines: int | None = COMPARE_MESSAGE_LINES,
    diff: bool = False,
    width: int | None = None,
) -> None:
    """A comparison's result: the table, each agent's final message (its first
    ``message_lines``; all with None), each agent's diff with ``diff``, the winner and why."""
    from ..runs.verdict import judge

    agents = list(result.get("agents") or [])
    run_id = str(result.get("runId") or "RUN")
    verdict = judge(agents)
    width = width or terminal_width(out)
    max_rounds = result.get("maxRounds")
    rounds = max_rounds if isinstance(max_rounds, int) and max_rounds > 0 else 1
    for line in compare_table(agents, verdict.winner, width, rounds):
        say(line, out)
    for i, agent in enumerate(agents):
        view = _view(agent, f"agent {i + 1}")
        say("", out)
        about = ", ".join(p for p in (view.identity, view.stop_reason) if p)
        say(f"{view.name}" + (f" ({about})" if about else "") + ":", out)
        for line in _message(view.text, message_lines, f"orchestrator show {run_id}"):
            say(line, out)
        if view.error:
            first, *rest = view.error.rstrip("\n").splitlines() or [""]
            say(f"  error: {first}", out)
            for line in rest:
                say(f"    {line}", out)
        cut_line(agent.get("cut"), "  ", out)
    if diff:
        for i, agent in enumerate(agents):
            text = str(agent.get("diff") or "")
            if text:
                say("", out)
                say(diff_header(str(agent.get("name") or f"agent {i + 1}"), agent), out)
                out.write(terminal_text(text))
    say("", out)
    if verdict.winner is not None:
        say(f"winner: {verdict.winner} ({verdict.reason})", out)
    elif agents and result.get("status") == "running":
        say("winner: none yet (the run is still running)", out)
    elif agents and result.get("status") == "interrupted":
        # the run never finished: its agents did not all get their chance
        say("winner: none (interrupted before any agent succeeded)", out)
    elif agents:
        say("winner: none (no agent succeeded)", out)


# ---------------------------------------------------------------------------------------------
# prompt


def prompt_details(result: Mapping[str, Any], out: IO[str]) -> None:
    """What ``show`` adds above a prompt's ending (``prompt`` streamed it as it came): the
    agent's message, its tool calls and the permission decisions."""
    text = str(result.get("text") or "")
    if text:
        out.write(terminal_text(text if text.endswith("\n") else text + "\n"))
    else:
        say("(no message)", out)
    calls = list(result.get("toolCalls") or [])
    if calls:
        say("", out)
        say("tool calls:", out)
        for c in calls:
            status, kind = c.get("status") or "-", c.get("kind") or "tool"
            say(f"  {status:<11} {kind:<8} {c.get('title')}", out)
            if c.get("error"):  # why a failed call failed, as the agent said
                say(f"{'':<14}{c['error']}", out)
    permissions = list(result.get("permissions") or [])
    if permissions:
        say("", out)
        say("permissions:", out)
        for p in permissions:
            say(
                f"  {p.get('verdict') or '-':<9} {p.get('kind') or '-':<8} {p.get('title')}"
                f"  (rule {p.get('rule') or '-'})",
                out,
            )
    notices = list(result.get("notices") or [])
    if notices:
        say("", out)
        say("notices:", out)
        notice_lines(notices, "  ", out)
    cut_line(result.get("cut"), "", out)


def notice_lines(notices: Sequence[Mapping[str, Any]], indent: str, out: IO[str]) -> None:
    """An agent's notices for the user, one line each: severity, title, description."""
    for n in notices:
        detail = f" ({n['description']})" if n.get("description") else ""
        say(f"{indent}{n.get('severity') or '-':<9} {n.get('title')}{detail}", out)


def prompt_ending(result: Mapping[str, Any], out: IO[str], *, diff: bool = False) -> None:
    """A prompt's ending: one line on the turn (agent, stop reason, tool calls, permissions,
    tokens, cost, time), the diff with ``diff``, the diff stat, the run's status, whether the
    changes reached the workspace (or how to apply them), where ``--report`` wrote the report,
    and the default policy's rejections."""
    from ..report._format import agent_cost_text, count_text, permissions_text, seconds_text

    view = _view(result, "agent")
    facts = [view.stop_reason or "no stop reason"]
    n = len(view.tool_calls)
    facts.append(count_of(n, "tool call"))
    if view.failed_tool_calls:
        facts[-1] += f" ({view.failed_tool_calls} failed)"
    facts.append(f"permissions {permissions_text(view.permission_counts)}")
    tokens = _tokens(view)
    if tokens is not None:
        facts.append(f"{count_text(tokens)} tokens")
    if view.cost is not None:
        facts.append(agent_cost_text(view))
    facts.append(seconds_text(view.wall_seconds))
    name = view.agent or view.name
    about = f" ({view.identity})" if view.identity else ""
    say(f"{name}{about}: " + ", ".join(facts), out)
    text = str(result.get("diff") or "")
    if diff and text:
        out.write(terminal_text(text))
    for line in diff_stat(text, list(result.get("changes") or []), terminal_width(out)):
        say(line, out)
    run_id = str(result.get("runId") or "")
    _run_line(result, run_id, out)
    _prompt_apply(result, run_id, out)
    _report_line(result, out)
    default_policy_note(result, out)


def _changes_in(result: Any) -> list[Mapping[str, Any]]:
    """Every change entry (``{"path": ..., "change": ...}``) of a run's result, wherever it
    is: the run's, an agent's, a step instance's."""
    found: list[Mapping[str, Any]] = []
    stack = [result]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            if isinstance(value.get("path"), str) and "change" in value:
                found.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _shown(name: str) -> str:
    """A path of the workspace on one line of output: its display form, line breaks
    escaped (a name may hold them)."""
    return one_line(display_name(name))


#: how many entries in the way of one path a refusal names
IN_THE_WAY_SHOWN = 5


def refusal(
    result: Mapping[str, Any] | None, cwd: Any, names: Sequence[str], changed: str
) -> tuple[list[str], str]:
    """What a refused apply of the paths ``names`` (display names, as a result gives them)
    says, and when it can go on. A path the workspace ``cwd`` holds as a real directory where
    the run made a file or a symlink is named with what in that directory is in the way (not
    deleted by the run: files it never copied, ignored ones say, and empty directories; see
    :func:`~orchestrator.vfs.apply.in_the_way`): nothing the run started from changed there.
    The others ``changed`` says how ("changed in the workspace during the run")."""
    from ..vfs.apply import in_the_way  # the VFS only when a refusal is said

    changes = _changes_in(result)
    deleted = {parse_name(c["path"]) for c in changes if c.get("change") == "deleted"}
    links = {c["path"] for c in changes if c.get("symlink") is not None}
    lines: list[str] = []
    others: list[str] = []
    blocked = False
    for name in names:
        path = parse_name(name)
        top = os.path.join(str(cwd), path) if cwd else None
        if top is None or os.path.islink(top) or not os.path.isdir(top):
            others.append(name)
            continue
        found, more = in_the_way(str(cwd), path, deleted, IN_THE_WAY_SHOWN)
        if not found:
            others.append(name)
            continue
        blocked = True
        what = "a symlink" if name in links else "a file"
        listed = ", ".join(map(_shown, found)) + (" and more" if more else "")
        lines.append(
            f"NOT applied: the run made {_shown(name)} {what}, and the workspace's directory "
            f"there holds what the run did not copy: {listed}"
        )
    if others:
        lines.insert(0, f"NOT applied: {changed}: " + ", ".join(map(_shown, others)))
    if others and blocked:
        hint = (
            "once those files are as they were when the run started and what is in the way "
            "is moved away"
        )
    elif blocked:
        hint = "once what is in the way is moved away"
    else:
        hint = "once those files are as they were when the run started"
    return lines, hint


def unappliable_links(result: Mapping[str, Any]) -> list[str]:
    """The symlinks among ``result``'s changes that no apply writes in its workspace (leading
    outside it, round a loop, into ``.git``: see :func:`~orchestrator.vfs.apply_changes`),
    each as ``PATH -> TARGET (why)``, as the apply would name them."""
    changes = [c for c in result.get("changes") or () if isinstance(c, Mapping)]
    cwd = result.get("cwd")
    if not cwd or not any(c.get("symlink") is not None for c in changes):
        return []
    import os
    import stat

    from .._names import name_bytes
    from ..vfs._links import refused_links
    from ..vfs.changes import Change, Delete, Write

    made: dict[str, Change] = {}
    for c in changes:
        path = parse_name(str(c.get("path")))
        if c.get("symlink") is not None:
            target = name_bytes(parse_name(str(c["symlink"])))
            made[path] = Write(target, stat.S_IFLNK | 0o777)
        elif c.get("change") == "deleted":
            made[path] = Delete()
        else:
            made[path] = Write(b"")  # a file: where links lead is all that is asked
    return [
        f"{_shown(path)} -> {_shown(target)} ({why})"
        for path, target, why in refused_links(os.path.realpath(str(cwd)), made)
    ]


def _refused_links_said(result: Mapping[str, Any], run_id: str, out: IO[str]) -> bool:
    """Whether the run's changes hold symlinks no apply writes, said so (an apply would
    refuse them: it is not offered)."""
    links = unappliable_links(result)
    if not links:
        return False
    shown = ", ".join(links[:10]) + (" ..." if len(links) > 10 else "")
    say(
        f"nothing was written to the workspace, and no apply will write it: it makes "
        f"symlinks the workspace cannot take: {shown}; orchestrator diff {run_id} shows the "
        "changes",
        out,
    )
    return True


def _half_applied(result: Mapping[str, Any], run_id: str, out: IO[str]) -> bool:
    """Whether the run's apply was cut short (its process killed while writing: see
    ``applyInterrupted``), said so: whatever else its record says, the workspace holds part
    of its changes until ``apply`` finishes it or rolls it back."""
    if not result.get("applyInterrupted"):
        return False
    say(
        f"its apply was cut short: the workspace holds part of its changes; orchestrator "
        f"apply {run_id} finishes it (or rolls it back if files changed since)",
        out,
    )
    return True


def _prompt_apply(result: Mapping[str, Any], run_id: str, out: IO[str]) -> None:
    """Whether a prompt's changes reached the workspace, else how to apply them."""
    changes = list(result.get("changes") or [])
    if _half_applied(result, run_id, out):
        return
    if result.get("status") == "interrupted":
        # its turn never ended: the run has no final changes to apply, its one step has what
        # the agent did before it stopped
        hint = resume_hint(run_id, "prompt")
        if changes:
            hint += f" (what it changed so far: orchestrator apply {run_id} --step prompt)"
        say(f"nothing was written to the workspace; {hint}", out)
        return
    if not changes:
        say("no file changed", out)
        return
    patch = result.get("patch") or "changes.patch"
    left_out = ", ".join(result.get("patchLeftOut") or [])
    changed = list(result.get("workspaceChanged") or [])
    if result.get("applied"):
        from .._words import count

        say(f"applied to the workspace ({count(len(changes), 'file')})", out)
    elif changed:
        refused, hint = refusal(
            result, result.get("cwd"), changed, "changed in the workspace during the run"
        )
        for line in refused:
            say(line, out)
        # the patch is named only if it holds every change
        where = (
            f"in the run store ({patch} leaves out {left_out})"
            if left_out
            else f"in the run store and in {patch}"
        )
        say(
            f"the changes are kept {where}: orchestrator diff {run_id} shows them; "
            f"{hint}, "
            f"orchestrator apply {run_id} writes them",
            out,
        )
    elif left_out:
        say(
            f"not applied; {patch} leaves out {left_out} (changed in the workspace during the "
            f"run): orchestrator diff {run_id} shows every change; once those files are as "
            f"they were when the run started, orchestrator apply {run_id} writes them",
            out,
        )
    elif _refused_links_said(result, run_id, out):
        pass
    elif any(c.get("symlink") is not None for c in changes):
        # git apply would write a symlink wherever it leads; orchestrator apply checks each
        say(f"not applied; to apply: orchestrator apply {run_id}", out)
    else:
        from ..runs.git_apply import git_apply_command

        # a command that works from any directory, also below the top of a git work tree
        git = git_apply_command(str(result.get("cwd") or "."), patch)
        say(f"not applied; to apply: orchestrator apply {run_id} (or {git})", out)


# ---------------------------------------------------------------------------------------------
# pipelines, and the ending every run shares


#: lines of a final step's value in a run's result (``show --json`` has all of it)
VALUE_LINES = 20


def steps_result(
    result: Mapping[str, Any], out: IO[str], *, diff: bool = False, limit: int | None = VALUE_LINES
) -> None:
    """A pipeline run's result: its steps, their failures' tracebacks, its conflicts, the
    values of its final steps (what the pipeline is for), the diff with ``diff``, and the diff
    stat of its final changes."""
    for name, step in (result.get("steps") or {}).items():
        extra = step.get("error") or step.get("cause") or ""
        say(f"  {name:<20} {step.get('status'):<10} {extra}".rstrip(), out)
        _traceback(step.get("traceback"), "      ", out)
    for c in result.get("conflicts") or []:
        say(conflict_line(c), out)
    for line in final_values(result, limit):
        say(line, out)
    text = str(result.get("diff") or "")
    if diff and text:
        out.write(terminal_text(text))
    for line in diff_stat(text, list(result.get("changes") or []), terminal_width(out)):
        say(line, out)


def final_values(result: Mapping[str, Any], limit: int | None = VALUE_LINES) -> list[str]:
    """The values the final steps (those no step depends on) of a pipeline run returned: a
    heading per instance, then the value (a string as it is, anything else as JSON), its first
    ``limit`` lines. Steps of an agent, failed ones and values of None are left out."""
    raw = result.get("graph")
    graph: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    nodes = [n for n in graph.get("nodes") or () if isinstance(n, Mapping)]
    parents = {str(e[0]) for e in graph.get("edges") or () if isinstance(e, list) and e}
    agents = {str(n.get("name")) for n in nodes if n.get("agents") or n.get("agentsInput")}
    steps = result.get("steps") or {}
    lines: list[str] = []
    more = f"orchestrator show {result.get('runId')} --json"
    for node in nodes:
        name = str(node.get("name"))
        if name in parents or name in agents or not isinstance(steps.get(name), Mapping):
            continue
        for key, instance in (steps[name].get("instances") or {}).items():
            value = instance.get("value")
            if instance.get("status") != "succeeded" or value is None:
                continue
            text = value if isinstance(value, str) else json.dumps(value, indent=2)
            lines.append(f"{name}:" if key == name else f"{name}[{key}]:")
            lines += _message(text, limit, more)
    return lines


def run_ending(result: Mapping[str, Any], run_id: str, out: IO[str]) -> None:
    """The last lines of a comparison or pipeline run: ``run RUN: STATUS``, then whether its
    changes reached the workspace, else how to apply them (or to resume the run), where
    ``--report`` wrote the report, and the default policy's rejections."""
    _run_line(result, run_id, out)
    _branches_line(result, out)
    _run_apply(result, run_id, out)
    _report_line(result, out)
    default_policy_note(result, out)


def _run_line(result: Mapping[str, Any], run_id: str, out: IO[str]) -> None:
    """``run RUN: STATUS``, with why when the record says (a run whose process is gone)."""
    reason = f" ({result['statusReason']})" if result.get("statusReason") else ""
    say(f"run {run_id}: {result.get('status')}{reason}", out)


def _branches_line(result: Mapping[str, Any], out: IO[str]) -> None:
    """What the run's branch directories cost, when it made or reused any."""
    from .._sizes import format_size
    from .._words import count

    branches = result.get("branches")
    if not isinstance(branches, Mapping) or not (branches.get("made") or branches.get("reused")):
        return
    made, reused = int(branches.get("made") or 0), int(branches.get("reused") or 0)
    copied, peak = int(branches.get("bytesCopied") or 0), int(branches.get("peakBytes") or 0)
    reflinked = int(branches.get("bytesReflinked") or 0)
    shared = f", {format_size(reflinked)} reflinked" if reflinked else ""
    say(
        f"branches: {count(made, 'directory', 'directories')} made, {reused} reused, "
        f"{format_size(copied)} copied{shared}, peak {format_size(peak)} on disk",
        out,
    )


def _report_line(result: Mapping[str, Any], out: IO[str]) -> None:
    """Where ``--report`` wrote the run's report, when it did."""
    report = result.get("report")
    if isinstance(report, Mapping) and report.get("html"):
        say(f"report: {report['html']}", out)


def resume_hint(run_id: str, kind: Any) -> str:
    """What ``orchestrator resume RUN`` does for a run that did not finish: a prompt's one
    turn starts again; elsewhere finished step instances are reused and the rest run."""
    does = "runs the prompt again" if kind == "prompt" else "goes on"
    return f"orchestrator resume {run_id} {does}"


def only_usage_failures(result: Mapping[str, Any]) -> bool:
    """Whether everything that failed in the run of ``result`` failed as a usage error
    (``errorKind`` ``usage``): refused as asked, so a resume, which asks the same, fails too."""
    kinds = [a.get("errorKind") for a in result.get("agents") or () if a.get("status") == "failed"]
    for step in dict(result.get("steps") or {}).values():
        if step.get("status") != "failed":
            continue
        failed = [
            i.get("errorKind")
            for i in dict(step.get("instances") or {}).values()
            if i.get("status") == "failed"
        ]
        kinds += failed or [step.get("errorKind")]
    return bool(kinds) and all(kind == "usage" for kind in kinds)


def _run_apply(result: Mapping[str, Any], run_id: str, out: IO[str]) -> None:
    """Whether the changes of a comparison or pipeline run were applied, else how to apply
    them, or how to go on with a run that did not finish."""
    from .._words import count

    status = result.get("status")
    compare = result.get("kind") == "compare"
    applied = result.get("applied")
    if _half_applied(result, run_id, out):
        return
    if applied:
        if compare:  # the name of the agent whose changes were written
            agents = [a for a in result.get("agents") or () if a.get("name") == applied]
            n = len(agents[0].get("changes") or ()) if agents else 0
            say(f"applied compare[{applied}] to the workspace ({count(n, 'file')})", out)
        else:
            n = len(result.get("changes") or ())
            say(f"applied to the workspace ({count(n, 'file')})", out)
        return
    # quoted: a shell such as zsh reads compare[NAME] as a glob
    # the agent asked to apply (its entry says what the apply found), else the winner
    asked = [a.get("name") for a in result.get("agents") or () if a.get("workspaceChanged")]
    step = shlex.quote(f"compare[{(asked and asked[0]) or result.get('winner') or 'NAME'}]")
    how = f"orchestrator apply {run_id}" + (f" --step {step}" if compare else "")
    winner = [a for a in result.get("agents") or () if a.get("name") == result.get("winner")]
    winner_changed = bool(winner and winner[0].get("changes"))
    if result.get("workspaceChanged"):
        names = list(result["workspaceChanged"])
        refused, hint = refusal(
            result, result.get("cwd"), names, "changed in the workspace during the run"
        )
        for line in refused:
            say(line, out)
        say(
            f"the changes are kept in the run store: orchestrator diff {run_id} shows them; "
            f"{hint}: {how}",
            out,
        )
    elif status == "failed" and only_usage_failures(result):
        # what failed was refused as it was asked (an MCP server the agent cannot take, say):
        # a resume would ask the same, so it is not offered
        say(
            "nothing was written to the workspace; what failed was refused as asked, and a "
            f"resume would fail the same way: see orchestrator show {run_id}",
            out,
        )
    elif status in ("interrupted", "failed") and isinstance(result.get("replay"), Mapping):
        # a replay is not resumed (that would start the real agents): it is replayed again
        of = result["replay"].get("of")
        say(f"nothing was written to the workspace; orchestrator replay {of} replays it again", out)
    elif status in ("interrupted", "failed"):
        # the run's final changes do not exist (finished steps can be applied one by one:
        # orchestrator apply RUN --step STEP); a resume runs what did not succeed again
        say(f"nothing was written to the workspace; {resume_hint(run_id, result.get('kind'))}", out)
    elif status != "succeeded":
        # merge conflicts: settled by a merge strategy and a resume, or step by step
        say(f"nothing was written to the workspace; see: orchestrator show {run_id}", out)
    elif compare and winner_changed:
        say(f"nothing was written to the workspace; to apply: {how}", out)
        say(f"each agent's diff: orchestrator diff {run_id}", out)
    elif result.get("changes") and not _refused_links_said(result, run_id, out):
        say(f"nothing was written to the workspace; to apply: {how}", out)
    else:
        say("no file changed", out)


def step_details(result: Mapping[str, Any], out: IO[str]) -> None:
    """What ``show`` prints of a pipeline's steps: each step's outcome and traceback, its
    instances' outcomes and tracebacks, and what the run store cut from their turns."""
    for name, step in (result.get("steps") or {}).items():
        extra = step.get("error") or step.get("cause") or ""
        say(f"  {name:<20} {step.get('status'):<10} {extra}".rstrip(), out)
        shown = {k: i for k, i in (step.get("instances") or {}).items() if k != name}
        # a fanned-out step's traceback is its first failed instance's: shown with it
        if not any(i.get("traceback") == step.get("traceback") for i in shown.values()):
            _traceback(step.get("traceback"), "      ", out)
        for key, inst in shown.items():
            say(f"    [{key}] {inst.get('status')} {inst.get('error') or ''}", out)
            _traceback(inst.get("traceback"), "        ", out)
        for key, inst in (step.get("instances") or {}).items():
            if inst.get("quirks"):
                quirks = ", ".join(str(q) for q in inst["quirks"])
                say(f"    quirks{'' if key == name else f' [{key}]'}: {quirks}", out)
            if inst.get("notices"):
                say(f"    notices{'' if key == name else f' [{key}]'}:", out)
                notice_lines(inst["notices"], "      ", out)
            if inst.get("rounds"):
                say(f"    rounds{'' if key == name else f' [{key}]'}:", out)
                for line in round_lines(inst["rounds"]):
                    say(f"      {line}", out)
            cut_line(inst.get("cut"), "      ", out)


def sandbox_lines(sandbox: Any) -> list[str]:
    """What confined a run's agents (its ``sandbox`` object), for people; [] when nothing."""
    if not isinstance(sandbox, dict) or not sandbox.get("confined"):
        return []
    lines = [f"sandbox: Landlock ABI {sandbox.get('landlockAbi')}"]
    for step, agents in (sandbox.get("confined") or {}).items():
        for agent, rules in (agents or {}).items():
            ports = rules.get("ports")
            if ports is None:
                net = "any TCP port"
            else:
                net = "TCP ports " + ",".join(map(str, ports)) if ports else "no TCP connection"
            writes = ", ".join(["its branch", f"home {rules.get('home')}", "a private temp"])
            writes += "".join(f", {p}" for p in rules.get("write") or [])
            reads = ", ".join(rules.get("read") or []) or "nothing"
            lines.append(f"  {step}/{agent}: writes {writes}; reads {reads}; {net}")
    return lines


def conflict_line(c: Mapping[str, Any]) -> str:
    """One conflict as a line: where, what, how settled, and whose versions ours and theirs are.

    ``ours`` is the merge so far in the fan-in's order, ``theirs`` the instance merged into it.
    """
    resolution = c.get("resolution")
    settled = "unresolved" if resolution in (None, "fail") else f"resolved: {resolution}"
    line = f"  conflict in {c.get('path')} at {c.get('step')} ({c.get('kind')}): {settled}"
    branches = c.get("branches") or []
    ours = c.get("oursLabel") or (branches[0] if branches else None)
    theirs = c.get("theirsLabel") or (branches[1] if len(branches) > 1 else None)
    if ours and theirs:
        line += f"; ours {ours}, theirs {theirs}"
    also = [a.get("label") for a in c.get("alsoChanged") or [] if isinstance(a, Mapping)]
    if also:
        line += f"; also changed by {', '.join(map(str, also))}"
    return line


def default_policy_note(result: Mapping[str, Any], out: IO[str]) -> None:
    """The last line of a run's result when the default policy rejected permission requests
    (no policy was given): how many, and the option that allows edits."""
    from ..runs.default_policy import DefaultRejections

    say_default_policy_note(DefaultRejections.from_json(result.get("defaultRejections")), out)


def _traceback(text: Any, indent: str, out: IO[str]) -> None:
    """A failure's Python traceback (if it has one), indented under the line it explains."""
    if not isinstance(text, str) or not text:
        return
    for line in text.rstrip("\n").splitlines():
        say(f"{indent}{line}", out)


def cut_line(cut: Any, prefix: str, out: IO[str]) -> None:
    """Say what the run store left out of a turn (its ``cut``), if anything."""
    if not isinstance(cut, dict):
        return
    say(
        f"{prefix}turn cut in the run store (limit max_turn_record_bytes = "
        f"{cut.get('limit'):,} bytes): {cut.get('droppedTextBytes'):,} of "
        f"{cut.get('textBytes'):,} bytes of text and {cut.get('droppedToolCalls'):,} of "
        f"{cut.get('toolCalls'):,} tool calls left out",
        out,
    )
