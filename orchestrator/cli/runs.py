"""The run commands of the command line: run, compare, runs, show, resume, apply, diff."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pipeline.results import RunEvent
    from ..store import RunRecord

from .._names import display_names
from .._words import count
from . import EXIT_FAILED, EXIT_MERGE_CONFLICTS, EXIT_OK, EXIT_USAGE, SANDBOX_HELP
from .cluster import add_cluster_options, cluster_option
from .mcp import add_mcp_options, mcp_servers
from .output import say, terminal_text
from .render import conflict_line, final_values, sandbox_lines, step_details

RUN_EXAMPLES = """\
examples:
  orchestrator run pipelines/batch_replace.py --set change='Use pathlib' --cwd ~/proj --policy edit
  orchestrator run pipelines/plan_implement_review.py --policy edit --apply \\
      --set task="add a --verbose flag"
  orchestrator run examples/demo_pipeline.py --cwd examples/sample-project --policy edit \\
      --report report/
"""
COMPARE_EXAMPLES = """\
examples:
  orchestrator compare --agent claude --agent codex --policy edit --verify "pytest -q" \\
      "Fix the failing test"
  orchestrator compare --agent a=demo --agent b=demo --policy edit --report out/ \\
      'rename x to y in *.py'
"""


#: the largest value of a whole-number option: far beyond any real count, and within what the
#: run store (SQLite, 64-bit integers) and JSON readers keep exactly
MAX_INT_OPTION = 1_000_000_000
# ASCII digits only: int() would take any script's digits ("١٢٣") and underscores ("1_0")
_WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def positive_int(text: str) -> int:
    """An argparse type: a whole number (ASCII digits) from 1 to :data:`MAX_INT_OPTION`."""
    if not _WHOLE_NUMBER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if value > MAX_INT_OPTION:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT_OPTION:,}, got {text.strip()}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (``nan``, ``inf``, 0 and negative
    numbers mean no duration; leaving the option out means no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, got {text!r} (leave it out for no limit)"
        )
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def positive_amount(text: str) -> float:
    """An argparse type: a finite amount above 0 (a cost, in the agents' currency)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an amount, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite amount above 0, got {text!r} (leave it out for no limit)"
        )
    return value


#: how deep the JSON of a ``--set`` value may nest (values are recorded with the run as JSON)
MAX_SET_DEPTH = 100


def file_size(text: str) -> int:
    """An argparse type: a size in bytes, or a number with K, M or G (powers of 1024)."""
    from .._sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the help of ``--max-file-size``
FILE_SIZE_HELP = (
    "the largest file a step may change, in bytes or with K, M, G (default: the config's, "
    "else 100M); a step leaving a larger file fails"
)


#: the help of ``prompt --no-progress``
PROMPT_NO_PROGRESS_HELP = (
    "print the reply once the turn ends, without streaming it or the tool calls on stderr"
)


def add_prompt_input(p: argparse.ArgumentParser, *, what: str) -> None:
    """The prompt text of ``prompt`` and ``compare``: TEXT, ``-`` (standard input) or a file."""
    p.add_argument(
        "text",
        nargs="?",
        metavar="TEXT",
        help=f"the {what}; - reads it from standard input",
    )
    p.add_argument(
        "--prompt-file",
        metavar="FILE",
        help=f"read the {what} from FILE (UTF-8 text; - for standard input) instead of TEXT",
    )


def add_session_choices(p: argparse.ArgumentParser, *, each: bool = False) -> None:
    """``--model`` and ``--mode``: set in each agent session before its turn."""
    whose = " (for each agent not named NAME:MODEL)" if each else ""
    p.add_argument(
        "--model",
        metavar="MODEL",
        help="the model to run, a value or name of the agent's model config option" + whose,
    )
    p.add_argument(
        "--mode",
        metavar="MODE",
        help="the session mode to run in (such as plan), one the agent offers"
        + (" (for each agent)" if each else ""),
    )


async def read_prompt(args: argparse.Namespace) -> str:
    """The prompt text of a command: TEXT, standard input (``-``) or ``--prompt-file``.

    Refused with one line (a usage error): both TEXT and a file, neither, a file that cannot
    be read, text that is not UTF-8, and an empty prompt (nothing an agent could act on).
    """
    import trio

    from .._names import display_name
    from ..errors import UsageError

    text: str | None = args.text
    path: str | None = args.prompt_file
    if text is not None and path is not None:
        raise UsageError("give the prompt as TEXT or with --prompt-file, not both")
    if text is None and path is None:
        raise UsageError("no prompt: give TEXT, - to read standard input, or --prompt-file FILE")
    if text is not None and text != "-":
        source = "the prompt"
    else:
        source = (
            "standard input"
            if (path or text) == "-"
            else f"--prompt-file {display_name(path or '')}"
        )

        def read() -> bytes:
            if path is None or path == "-":
                return sys.stdin.buffer.read()
            with open(path, "rb") as f:
                return f.read()

        try:
            # a thread: waiting on a pipe or a terminal must not stop Ctrl-C
            data = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        except OSError as e:
            raise UsageError(f"{source}: {e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{source}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise UsageError(f"{source} is empty")
    return text


#: the help of every command's --diff
DIFF_HELP = "print the diff with the result (else: orchestrator diff RUN)"


def _shared(p: argparse.ArgumentParser, *, state_only: bool = False) -> None:
    p.add_argument(
        "--state-dir",
        help="where runs and branches live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON result object")
    if state_only:
        return
    p.add_argument("--cwd", default=".", help="the workspace (default: .)")
    p.add_argument(
        "--policy", help="permission policy: a preset name or a TOML file (default: reject all)"
    )
    p.add_argument("--transcript", help="append every wire frame to this ND-JSON file")
    p.add_argument("--report", metavar="DIR", help="write report.html and report.md into DIR")
    p.add_argument(
        "--max-sessions", type=positive_int, help="live agent sessions at once (default: 8)"
    )
    p.add_argument("--max-file-size", type=file_size, metavar="SIZE", help=FILE_SIZE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--diff", action="store_true", help=DIFF_HELP)
    p.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    add_mcp_options(p)


def add_parsers(sub: Any) -> None:
    """Add the run commands to the ``orchestrator`` parser's subcommands."""
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "run",
        help="run a pipeline file",
        description="Run a pipeline (a Python file of @step functions) on branches of --cwd.",
        epilog=RUN_EXAMPLES,
        formatter_class=raw,
    )
    p.add_argument("pipeline", help="the pipeline file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run input (VALUE is JSON if it parses, else a string; JSON nested at most "
        f"{MAX_SET_DEPTH} levels); an input that names agents takes an agent name, or a JSON "
        'list of them for a fan-out (--set agents=\'["claude", "codex"]\'); repeatable',
    )
    p.add_argument("--apply", action="store_true", help="write the run's changes to --cwd")
    _shared(p)
    add_cluster_options(p)

    c = sub.add_parser(
        "compare",
        help="the same task to several agents, side by side",
        description="Give TEXT to every --agent at once, each in its own branch, and compare.",
        epilog=COMPARE_EXAMPLES,
        formatter_class=raw,
    )
    c.add_argument("--agent", action="append", required=True, help="repeat for each agent")
    c.add_argument("--verify", metavar="CMD", help="a command run in each agent's branch after it")
    c.add_argument(
        "--rounds",
        type=positive_int,
        metavar="N",
        help="give each agent up to N rounds: while --verify fails, the agent gets its output "
        "and tries again in the same session (default: 1, no feedback)",
    )
    c.add_argument("--apply", metavar="NAME", help="write this agent's changes to --cwd")
    c.add_argument("--timeout", type=positive_seconds, help="seconds allowed for each agent's turn")
    c.add_argument(
        "--idle-timeout", type=positive_seconds, help="seconds allowed without any update"
    )
    add_prompt_input(c, what="task")
    add_session_choices(c, each=True)
    _shared(c)
    add_cluster_options(c)

    r = sub.add_parser(
        "runs",
        help="list recorded runs",
        description="List runs, newest first; a batch run with the runs of its repositories "
        "under it.",
    )
    r.add_argument(
        "--limit",
        type=positive_int,
        default=20,
        help="how many (default: 20; a batch counts once, with all its runs)",
    )
    _shared(r, state_only=True)

    s = sub.add_parser("show", help="show a run", description="Show a recorded run's steps.")
    s.add_argument("run", help="a run id (a unique prefix is enough)")
    s.add_argument("--report", metavar="DIR", help="write report.html and report.md into DIR")
    s.add_argument("--diff", action="store_true", help=DIFF_HELP)
    _shared(s, state_only=True)

    u = sub.add_parser(
        "resume",
        help="resume a run",
        description="Run a recorded run again: finished steps are reused, the rest run.",
    )
    u.add_argument("run", help="a run id")
    u.add_argument("--apply", action="store_true", help="write the run's changes to its workspace")
    u.add_argument(
        "--policy", help="permission policy: replaces the run's recorded one (default: restored)"
    )
    u.add_argument(
        "--max-sessions",
        type=positive_int,
        help="live agent sessions at once (default: as recorded)",
    )
    u.add_argument(
        "--max-file-size",
        type=file_size,
        metavar="SIZE",
        help="the largest file a step may change, in bytes or with K, M, G (default: as recorded)",
    )
    u.add_argument("--report", metavar="DIR", help="write report.html and report.md into DIR")
    add_cluster_options(u)
    batch = u.add_argument_group("a batch's (default: as recorded; a budget counts again from 0)")
    batch.add_argument("--max-repos", type=positive_int, help="repositories at once")
    batch.add_argument("--max-tokens", type=positive_int, help="tokens the agents report")
    batch.add_argument("--max-cost", type=positive_amount, help="cost the agents report")
    batch.add_argument("--max-seconds", type=positive_seconds, help="wall-clock seconds")
    batch.add_argument(
        "--on-budget",
        choices=("finish", "cancel"),
        help="when spent: let running turns finish or cancel them",
    )
    u.add_argument("--transcript", help="append every wire frame to this ND-JSON file")
    u.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    u.add_argument("--diff", action="store_true", help=DIFF_HELP)
    u.add_argument(
        "--sandbox",
        action="store_true",
        help="confine the agents with Landlock (a confined run stays confined; see the README)",
    )
    _shared(u, state_only=True)

    a = sub.add_parser(
        "apply",
        help="write a run's changes to its workspace",
        description="Write a run's changes (or one step's) to its workspace, all or nothing, "
        "if every file they touch is still as the run found it (else exit 3); or commit them "
        "on a new git branch (--git-branch).",
    )
    a.add_argument("run", help="a run id")
    a.add_argument("--step", help="only this step (STEP or STEP[KEY]; compare runs: compare[NAME])")
    a.add_argument(
        "--git-branch",
        metavar="NAME",
        help="commit the changes on a new git branch NAME at HEAD instead; the working tree, "
        "index and current branch are left alone",
    )
    _shared(a, state_only=True)

    d = sub.add_parser("diff", help="print a run's diff", description="Print a run's unified diff.")
    d.add_argument("run", help="a run id")
    d.add_argument("--step", help="only this step (STEP or STEP[KEY])")
    _shared(d, state_only=True)


def _inputs(pairs: list[str]) -> dict[str, Any]:
    from ..errors import UsageError

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--set {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
            deep = _depth(out[key]) > MAX_SET_DEPTH
        except json.JSONDecodeError as e:
            if value.lstrip().startswith(("[", "{")):
                # meant as a list or an object: as text it would reach the pipeline as a string
                where = (
                    f"line {e.lineno}, column {e.colno}" if e.lineno > 1 else f"column {e.colno}"
                )
                raise UsageError(
                    f"--set {key}: the value starts like JSON but is not valid JSON: {e.msg} "
                    f"at {where} (give text that starts with [ or {{ as a JSON string: "
                    "'\"...\"')"
                ) from None
            out[key] = value
            deep = False
        except ValueError:
            out[key] = value
            deep = False
        except RecursionError:  # the decoder recurses once per level: deeper still
            deep = True
        if deep:
            raise UsageError(
                f"--set {key}: the JSON value is nested more than {MAX_SET_DEPTH} levels deep"
            )
    return out


def _depth(value: Any) -> int:
    """How many levels of arrays and objects ``value`` nests (0 for a scalar)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_SET_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _emit(obj: Any) -> None:
    from .output import emit_json

    emit_json(obj)


def track_run(
    args: argparse.Namespace, view: Callable[[RunEvent], None] | None
) -> Callable[[RunEvent], None]:
    """The ``on_event`` of a run command: keeps the run's id (for the error object of an
    interrupted or failed run) and kind, and passes every event on to the progress view."""
    ids: list[str] = getattr(args, "run_ids", [])
    kinds: dict[str, str] = getattr(args, "run_kinds", {})

    def on_event(event: RunEvent) -> None:
        if event.type == "run_started" and event.run_id not in ids:
            ids.append(event.run_id)
            kinds[event.run_id] = str(event.data.get("kind") or "")
        if view is not None:
            view(event)

    # without a view, the session updates of every turn need not become events
    on_event.wants_updates = view is not None  # type: ignore[attr-defined]
    return on_event


@contextmanager
def _view(
    args: argparse.Namespace, title: str, *, headers: dict[str, str] | None = None
) -> Iterator[Any]:
    """The progress view of a run command (None when progress is off), closed on the way out.

    A ``--report`` directory that cannot be made is a usage error before the run starts, not
    after its work is done.
    """
    from .live import open_view

    report = getattr(args, "report", None)
    if report:
        from pathlib import Path

        from ..errors import UsageError
        from ..report import dir_problem

        try:
            Path(report).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--report {report}: {dir_problem(Path(report), e)}") from e

    view = open_view(
        title,
        enabled=not getattr(args, "no_progress", False) and not args.json,
        headers=headers,
    )
    try:
        yield view
    finally:
        if view is not None:
            view.close()


def _finish(args: argparse.Namespace, outcome: Any) -> int:
    finished_despite_interrupt(args, outcome.status)
    result = dict(outcome.result)
    if getattr(args, "report", None):
        from ..report import render_report

        paths = render_report(result, args.report)
        result["report"] = {"html": str(paths.html), "markdown": str(paths.markdown)}
    if args.json:
        _emit(result)
    else:
        _restored_line(result.get("restored"))
        _summary(result, outcome.run_id, diff=args.diff)
    return int(outcome.exit_code)


def finished_despite_interrupt(args: argparse.Namespace, status: str) -> None:
    """A run that ends succeeded or with conflicts went past its point of no return (its
    verdict recorded, the apply asked for made): an interrupt that came after that did not
    stop it, and the exit code must say how it ended, not 130. (A failed run is left alone:
    an interrupt can be what failed it.)"""
    if status in ("succeeded", "conflicts"):
        args.completed_despite_interrupt = (
            "interrupted while the run was finishing, so it was completed"
        )


def _restored_line(restored: Any) -> None:
    """What a resume restored from the record and what its options replaced, with what
    (stderr)."""
    from .logs import note

    if not isinstance(restored, dict):
        return
    said = [_setting(restored, key) for key in _SETTINGS if key in restored.get("restored", [])]
    if said:
        note("restored from the run: " + "; ".join(said), event="resume_restored")
    replaced = [_setting(restored, key) for key in restored.get("overridden") or []]
    if replaced:
        note("replaced by this resume: " + "; ".join(replaced), event="resume_replaced")


#: the settings a resume restores or replaces, in the order they are said
_SETTINGS = ("policy", "maxSessions", "maxFileSize", "agents", "sandbox", "mcpServers")


def _setting(restored: dict[str, Any], key: str) -> str:
    """A resume's setting ``key`` (as ``Restored.to_json`` names it) and its value now."""
    if key == "policy":
        return f"policy {restored.get('policy') or '(default)'} ({restored.get('policyRules')})"
    if key == "maxSessions":
        return f"max sessions {restored.get('maxSessions')}"
    if key == "maxFileSize":
        return f"max file size {restored.get('maxFileSize')} bytes"
    if key == "agents":
        return "agents " + ", ".join(restored.get("agents") or [])
    if key == "sandbox":
        return "the sandbox"
    if key == "mcpServers":
        return "MCP servers " + ", ".join(restored.get("mcpServers") or [])
    if key.startswith("agents."):
        return f"agent {key.removeprefix('agents.')} as the config defines it now"
    return key


def _summary(result: dict[str, Any], run_id: str, *, diff: bool = False) -> None:
    """The human result of run, compare and resume, on stdout (see :mod:`.render`)."""
    from .render import compare_result, prompt_ending, run_ending, steps_result

    out = sys.stdout
    if result.get("kind") == "prompt" and "stopReason" in result:
        # a resumed prompt ends as the prompt would have
        for line in sandbox_lines(result.get("sandbox")):
            say(line, out)
        prompt_ending(result, out, diff=diff)
        return
    if result.get("kind") == "compare":
        compare_result(result, out, diff=diff)
    else:
        steps_result(result, out, diff=diff)
    for line in sandbox_lines(result.get("sandbox")):
        say(line, out)
    run_ending(result, run_id, out)


async def cmd_run(args: argparse.Namespace) -> int:
    """``orchestrator run``."""
    from ..runs import run_pipeline
    from .escalation import choose_escalation
    from .trust import project_config

    config = await project_config(args.cwd, args.state_dir)
    with _view(args, f"pipeline {args.pipeline}") as view:
        outcome = await run_pipeline(
            args.pipeline,
            _inputs(args.set),
            cwd=args.cwd,
            config=config,
            policy=args.policy,
            escalate=choose_escalation(),
            apply=args.apply,
            on_event=track_run(args, view),
            state_dir=args.state_dir,
            transcript=args.transcript,
            max_sessions=args.max_sessions,
            sandbox=args.sandbox or None,
            max_file_size=args.max_file_size,
            mcp_servers=mcp_servers(args, config),
            cluster=cluster_option(args),
        )
    return _finish(args, outcome)


async def cmd_compare(args: argparse.Namespace) -> int:
    """``orchestrator compare``."""
    from ..errors import UsageError
    from ..runs import compare
    from .escalation import choose_escalation
    from .trust import project_config

    if args.rounds is not None and args.verify is None:
        raise UsageError("--rounds needs --verify: the command each round is checked with")
    task = await read_prompt(args)
    config = await project_config(args.cwd, args.state_dir)
    with _view(args, "compare") as view:
        outcome = await compare(
            args.agent,
            task,
            config=config,
            verify=args.verify,
            rounds=args.rounds or 1,
            apply=args.apply,
            cwd=args.cwd,
            policy=args.policy,
            escalate=choose_escalation(),
            on_event=track_run(args, view),
            state_dir=args.state_dir,
            transcript=args.transcript,
            max_sessions=args.max_sessions,
            max_file_size=args.max_file_size,
            timeout=args.timeout,
            idle_timeout=args.idle_timeout,
            sandbox=args.sandbox or None,
            model=args.model,
            mode=args.mode,
            mcp_servers=mcp_servers(args, config),
            cluster=cluster_option(args),
        )
    return _finish(args, outcome)


async def cmd_resume(args: argparse.Namespace) -> int:
    """``orchestrator resume``."""
    from ..errors import ResumeConflict, UsageError
    from ..runs import resume_run
    from ..runs.recorded import get_run
    from .escalation import choose_escalation

    if (await get_run(args.run, state_dir=args.state_dir)).kind == "batch":
        from .batch import cmd_resume_batch

        return await cmd_resume_batch(args)
    batch_only = [
        flag
        for flag, value in (
            ("--max-repos", args.max_repos),
            ("--max-tokens", args.max_tokens),
            ("--max-cost", args.max_cost),
            ("--max-seconds", args.max_seconds),
            ("--on-budget", args.on_budget),
        )
        if value is not None
    ]
    if batch_only:
        raise UsageError(f"{batch_only[0]} is for resuming a batch; run {args.run} is not one")

    with _view(args, f"resume {args.run}") as view:
        try:
            outcome = await resume_run(
                args.run,
                state_dir=args.state_dir,
                policy=args.policy,
                max_sessions=args.max_sessions,
                max_file_size=args.max_file_size,
                escalate=choose_escalation(),
                apply=args.apply,
                on_event=track_run(args, view),
                sandbox=args.sandbox or None,
                transcript=args.transcript,
                cluster=cluster_option(args),
            )
        except ResumeConflict as e:
            # the command's error object names the run (and the files, below)
            if e.run_id:
                args.run_ids.append(e.run_id)
            raise
    return _finish(args, outcome)


async def _interrupted(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The applies a crash interrupted, as ``--json`` shows them, each with ``finish``: the
    command that finishes it (an apply first finishes every interrupted one, so any does for
    an apply no run is named in)."""
    import shlex

    from ..runs.apply import interrupted_applies, interrupted_json

    found = []
    for apply in await interrupted_applies(args.state_dir):
        shown = interrupted_json(apply)
        run_id, step = shown["runId"], shown["step"]
        finish = f"orchestrator apply {run_id}" if run_id else None
        if finish and step:
            finish += f" --step {shlex.quote(step)}"
        found.append({**shown, "finish": finish})
    return found


def _interrupted_of(found: list[dict[str, Any]], run_id: str) -> dict[str, Any] | None:
    """The interrupted apply of run ``run_id`` (its ``applyInterrupted`` field), if any."""
    return next((a for a in found if a["runId"] == run_id), None)


def _warn_interrupted(found: list[dict[str, Any]], run_id: str | None, cwd: str | None) -> None:
    """One line on stderr per interrupted apply: of run ``run_id``, or in its workspace ``cwd``
    (all of them when both are None), and how to finish it."""
    import os

    from .logs import note

    for a in found:
        ws = a["workspace"]
        here = cwd is not None and os.path.realpath(cwd) == os.path.realpath(ws)
        if run_id is not None and a["runId"] != run_id and not here:
            continue
        whose = f"run {a['runId']}'s changes are" if a["runId"] else "changes are"
        if a["edited"]:
            # recovery leaves such files alone and rolls the rest back
            finish = (
                f"{', '.join(a['edited'])} changed since: it cannot be completed; "
                f"{a['finish'] or 'the next orchestrator apply, run or prompt'} rolls it back "
                "except for those files, which stay as they are (its changes to them not made)"
            )
        elif a["finish"]:
            finish = (
                "to finish it (completed from its journal, or rolled back and applied again): "
                + a["finish"]
            )
        else:
            finish = f"the next orchestrator apply, run or prompt finishes it ({a['journal']})"
        note(
            f"interrupted apply: {whose} half written to {ws} ({count(len(a['files']), 'file')}); "
            f"{finish}",
            level="warning",
            event="apply_interrupted",
        )


async def cmd_runs(args: argparse.Namespace) -> int:
    """``orchestrator runs``: the runs that belong to no batch, newest first (``--limit``
    counts them), a batch run followed by its child runs, one line each."""
    from ..runs.prune import store_usage
    from ..runs.recorded import batch_json, list_run_groups
    from .prune import usage_json, usage_line

    groups = await list_run_groups(state_dir=args.state_dir, limit=args.limit)
    runs = [r for top, children in groups for r in (top, *children)]
    interrupted = await _interrupted(args)
    usage = await store_usage(state_dir=args.state_dir)
    if args.json:
        _emit(
            {
                "runs": [
                    {**r.to_json(), "applyInterrupted": _interrupted_of(interrupted, r.run_id)}
                    for r in runs
                ],
                "store": usage_json(usage),
            }
        )
        return EXIT_OK
    for top, children in groups:
        say(_run_line(top, interrupted))
        names = {
            str(e.get("runId")): str(e.get("name") or "")
            for e in batch_json(top)["repos"]
            if e.get("runId")
        }
        for child in children:
            say(_run_line(child, interrupted, batch=top, name=names.get(child.run_id)))
    from .logs import note

    if not runs:
        note("no runs recorded", event="no_runs")
    else:
        # on stderr: stdout stays one line per run, for scripts that read it
        note(usage_line(usage), event="store_size")
    _warn_interrupted(interrupted, None, None)
    return EXIT_OK


def _run_line(
    r: RunRecord,
    interrupted: list[dict[str, Any]],
    *,
    batch: RunRecord | None = None,
    name: str | None = None,
) -> str:
    """A run's line in ``runs``: id, start, kind, status, applied, what it ran. A batch's child
    run (``batch`` given) is indented under it with ``↳``, its start cut to fit the same
    columns (the time alone on the batch's day), and says its repository (``name``, else its
    directory)."""
    import datetime

    start = datetime.datetime.fromtimestamp(r.created)
    when = start.strftime("%Y-%m-%d %H:%M:%S")
    inputs = dict(r.inputs)
    what = r.pipeline or inputs.get("task") or inputs.get("text") or ""
    applied = " applied" if r.applied else ""
    if _interrupted_of(interrupted, r.run_id):
        applied = " apply-interrupted"
    status = f"{r.status} ({r.status_reason})" if r.status_reason else r.status
    if batch is None:
        what = " ".join(str(what).split())  # one line per run, whatever the task holds
        return f"{r.run_id}  {when}  {r.kind:<8} {status:<11}{applied}  {what[:60]}"
    same_day = datetime.datetime.fromtimestamp(batch.created).date() == start.date()
    when = start.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M:%S")
    repo = " ".join((name or os.path.basename(r.cwd.rstrip("/")) or r.cwd).split())
    return f"  ↳ {r.run_id}  {when:>15}  {r.kind:<8} {status:<11}{applied}  {repo[:60]}"


async def cmd_show(args: argparse.Namespace) -> int:
    """``orchestrator show``: what the run's command printed when it finished, from the
    record (a comparison's messages whole)."""
    from ..runs import get_run_json
    from .render import compare_result, prompt_details, prompt_ending, run_ending, steps_result

    result = await get_run_json(args.run, state_dir=args.state_dir)
    interrupted = await _interrupted(args)
    result["applyInterrupted"] = _interrupted_of(interrupted, result["runId"])
    if result.get("kind") == "batch":
        return await _show_batch(args, result, interrupted)
    if args.report:
        from ..report import render_report

        paths = render_report(result, args.report)
        result["report"] = {"html": str(paths.html), "markdown": str(paths.markdown)}
    if args.json:
        _emit(result)
        return EXIT_OK
    run_id = result["runId"]
    if result.get("kind") == "compare":
        say(f"run {run_id} (compare) in {result['cwd']}")
        _replay_line(result)
        say(f"task: {result.get('task')}")
        say("")
        compare_result(result, sys.stdout, message_lines=None, diff=args.diff)
        _show_tail(result)
        run_ending(result, run_id, sys.stdout)
    elif result.get("kind") == "prompt" and "stopReason" in result:
        say(f"run {run_id} (prompt) in {result['cwd']}")
        _replay_line(result)
        say("")
        prompt_details(result, sys.stdout)
        say("")
        _show_tail(result)
        prompt_ending(result, sys.stdout, diff=args.diff)
    else:
        reason = f" ({result['statusReason']})" if result.get("statusReason") else ""
        say(f"run {run_id} ({result['kind']}) in {result['cwd']}: {result['status']}{reason}")
        if result.get("parent"):
            say(await _batch_line(run_id, str(result["parent"]), args.state_dir))
        _replay_line(result)
        step_details(result, sys.stdout)
        for line in final_values(result, None):  # whole, where run printed their first lines
            say(line)
        # the conflicts, the diff (with --diff) and the diff stat, as run printed them
        steps_result({**result, "steps": {}}, sys.stdout, diff=args.diff)
        _show_tail(result, conflicts=False)
        run_ending(result, run_id, sys.stdout)
    _warn_interrupted(interrupted, run_id, result.get("cwd"))
    return EXIT_OK


def _replay_line(result: dict[str, Any]) -> None:
    """For a replay run: which run it replays, and how far it matched the record."""
    replay = result.get("replay")
    if not isinstance(replay, dict):
        return
    found = len(replay.get("divergences") or ()) + len(replay.get("notReplayable") or ())
    how = "no divergence" if not found else f"{found} divergence{'s' if found != 1 else ''}"
    say(f"a replay of run {replay.get('of')}: {how} (show --json lists them)")


async def _batch_line(run_id: str, batch_id: str, state_dir: str | None) -> str:
    """The line ``show CHILD`` says which batch the run belongs to, and which repository of
    it the run is."""
    from ..errors import RunNotFound
    from ..runs.recorded import batch_json, get_run

    try:
        batch = batch_json(await get_run(batch_id, state_dir=state_dir))
    except RunNotFound:
        return f"part of batch {batch_id} (no longer recorded)"
    from .batchview import cell_text

    name = next((e.get("name") for e in batch["repos"] if e.get("runId") == run_id), None)
    of = f" (repository {cell_text(str(name))})" if name else ""
    return f"part of batch {batch_id}{of}: orchestrator show {batch_id}"


async def _show_batch(
    args: argparse.Namespace, batch: dict[str, Any], interrupted: list[dict[str, Any]]
) -> int:
    """``orchestrator show BATCH``: the batch's table and summary (``--json``: its object),
    its repositories' runs and how to look at one; ``--report DIR`` writes its report,
    ``--diff`` prints each repository's diff."""
    from ..runs.recorded import get_run, write_batch_report
    from .batchview import batch_summary_line, batch_table, cell_text
    from .render import terminal_width

    run_id = str(batch["runId"])
    if args.report:
        _, paths = await write_batch_report(run_id, args.report, state_dir=args.state_dir)
        batch["report"] = {"html": str(paths.html), "markdown": str(paths.markdown)}
    if args.json:
        _emit(batch)
        return EXIT_OK
    record = await get_run(run_id, state_dir=args.state_dir)
    reason = f" ({batch['statusReason']})" if batch.get("statusReason") else ""
    what = f" ({batch['pipeline']})" if batch.get("pipeline") else ""
    say(f"batch {run_id}{what} in {record.cwd}: {batch.get('status')}{reason}")
    say("")
    for line in batch_table(batch, terminal_width(sys.stdout)):
        say(line)
    say("")
    say(batch_summary_line(batch))
    if args.diff:
        text = await _batch_diff_text(run_id, args.state_dir)
        if text:
            say("")
            sys.stdout.write(terminal_text(text))
    children = [e for e in batch.get("repos") or () if e.get("runId")]
    if children:
        say("")
        say("the runs of its repositories:")
        for e in children:
            say(f"  {e['runId']}  {cell_text(str(e.get('name') or '-'))}")
        one = children[0]["runId"]
        say(f"to look at one: orchestrator show RUN (its diff: orchestrator diff RUN), e.g. "
            f"orchestrator show {one}")  # fmt: skip
    status = batch.get("status")
    if status in ("interrupted", "failed"):
        say(f"orchestrator resume {run_id} runs again the repositories that did not succeed")
    elif status == "running":
        say(f"still running: orchestrator show {run_id} again shows how far it got")
    if isinstance(batch.get("report"), dict):
        say(f"report: {batch['report']['html']}")
    _warn_interrupted(interrupted, run_id, record.cwd)
    return EXIT_OK


async def _batch_diff_text(run_id: str, state_dir: str | None) -> str:
    """Each repository's diff of batch ``run_id`` under a ``# NAME (run CHILD): STATUS, N files
    changed, +A -R`` line (a comment to ``git apply``): the repositories are different trees,
    so read it, and apply each repository's run on its own."""
    from ..report._diff import count_lines, parse_diff
    from ..runs.recorded import batch_diffs, batch_json
    from ..state import state_directory
    from ..store import open_run_store
    from .batchview import cell_text

    async with open_run_store(state_directory(state_dir)) as store:
        record = await store.get_run(run_id)
        diffs = await batch_diffs(record.run_id, store=store)
    parts = []
    for e, (name, diff) in zip(batch_json(record)["repos"], diffs.items(), strict=False):
        if not e.get("runId"):
            continue
        files = parse_diff(diff)
        added, removed = count_lines(files)
        head = (
            f"# {cell_text(name)} (run {e['runId']}): {e.get('status') or '-'}, "
            f"{count(len(files), 'file')} changed, +{added} -{removed}"
        )
        parts.append(head + "\n" + (diff or "# (no changes)\n"))
    return "\n".join(parts)


def _show_tail(result: dict[str, Any], *, conflicts: bool = True) -> None:
    """The conflicts (unless already listed), the sandbox and the MCP servers of a shown
    run."""
    if conflicts:
        for c in result.get("conflicts") or []:
            say(conflict_line(c))
    for line in sandbox_lines(result.get("sandbox")):
        say(line)
    for line in mcp_lines(result.get("mcpServers")):
        say(line)


def mcp_lines(recorded: Any) -> list[str]:
    """The MCP servers a run's sessions had (as recorded: secrets redacted), one line per
    step and agent."""
    lines: list[str] = []
    for step, agents in dict(recorded or {}).items():
        for agent, servers in dict(agents or {}).items():
            shown = []
            for server in servers or ():
                if server.get("type", "stdio") == "stdio":
                    where = shlex.join(server.get("command") or ())
                    table = server.get("env") or {}
                else:
                    where = str(server.get("url"))
                    table = server.get("headers") or {}
                pairs = " ".join(f"{k}={v}" for k, v in table.items())
                extra = f" {pairs}" if pairs else ""
                shown.append(f"{server.get('name')} ({server.get('type')}: {where}{extra})")
            if shown:
                lines.append(f"MCP servers of {step} [{agent}]: {'; '.join(shown)}")
    return lines


async def cmd_apply(args: argparse.Namespace) -> int:
    """``orchestrator apply``."""
    import trio

    from ..errors import ApplyRefused, RunBusy, RunNotFound, UnsettledConflicts, UsageError
    from ..runs import apply_run
    from ..runs.recorded import batch_refused, get_run
    from .logs import note

    try:
        try:
            record: RunRecord | None = await get_run(args.run, state_dir=args.state_dir)
        except RunNotFound:
            record = None  # apply_run says so, after what it checks first (interrupted applies)
        if record is not None and record.kind == "batch":
            raise batch_refused(record.run_id, "apply")
        outcome = await apply_run(
            args.run, step=args.step, git_branch=args.git_branch, state_dir=args.state_dir
        )
    except trio.Cancelled:
        # interrupted before the write began (once begun, it is completed): none of it happened
        note(
            "interrupted: nothing applied",
            level="warning",
            event="interrupted",
            prefix="orchestrator: ",
        )
        raise
    except (ApplyRefused, RunBusy) as e:
        if isinstance(e, UnsettledConflicts):
            code = EXIT_MERGE_CONFLICTS
        elif isinstance(e, UsageError):  # symlinks out of the workspace: the changes are bad
            code = EXIT_USAGE
        else:
            code = EXIT_FAILED
        note(
            str(e),
            level="error",
            event="usage_error" if code == EXIT_USAGE else "error",
            prefix="orchestrator: error: ",
            type=type(e).__name__,
            exitCode=code,
        )
        if args.json:
            error = {"type": type(e).__name__, "message": str(e)}
            _emit(
                {
                    "runId": e.run_id,
                    "step": args.step,
                    "applied": False,
                    "error": error,
                    "exitCode": code,
                }
            )
        return code
    if args.json:
        document = outcome.to_json()
        if outcome.workspace_changed and not outcome.applied:
            # a refusal reads like every command's error object, with the files it names
            message = "; ".join(_refused_lines(outcome, record))
            document["error"] = {"type": "WorkspaceChanged", "message": message}
            document["exitCode"] = int(outcome.exit_code)
        _emit(document)
    else:
        _apply_summary(outcome, record)
    if outcome.applied:
        # an interrupt that came while the write was under way did not stop it: the changes
        # are all written and recorded, which the exit code must say (not 130)
        args.completed_despite_interrupt = (
            "interrupted while the apply was finishing, so it was completed"
        )
    return int(outcome.exit_code)


def _refused_lines(outcome: Any, record: RunRecord | None) -> list[str]:
    """What a refused ``orchestrator apply`` says of the files it refused (see
    :func:`.render.refusal`): a git branch is made from ``HEAD``, so the files differ there,
    and nothing of the workspace is in its way."""
    from .render import refusal

    names = display_names(outcome.workspace_changed)
    if outcome.git_branch:
        return [f"NOT applied: files differ at HEAD from the run: {', '.join(names)}"]
    result = record.result if record is not None else None
    cwd = record.cwd if record is not None else None
    return refusal(result, cwd, names, "files changed in the workspace since the run")[0]


def _apply_summary(outcome: Any, record: RunRecord | None) -> None:
    """What ``orchestrator apply`` did, for people (stderr); ``record``: the run's."""
    from .logs import note

    for report in outcome.recovered:
        apply = report.apply
        of = dict(apply.origin or {}).get("runId") if apply is not None else None
        what = f"apply of run {of}" if of else "apply"
        where = f" to {apply.workspace}" if apply is not None else ""
        if report.problems:
            edited = ", ".join(display_names(report.problems))
            note(
                f"rolled back the interrupted {what}{where} first, as it could not be completed: "
                f"{edited} changed since the crash and are left as they are (its changes to "
                f"them not made); {count(len(report.changed), 'file')} restored, the other files "
                f"hold what they held before it (what {edited} held before it is kept in "
                f"{report.journal})",
                level="warning",
                event="apply_recovered",
            )
        else:
            note(
                f"finished the interrupted {what}{where} first: {report.action} "
                f"({count(len(report.paths), 'file')})",
                level="info",
                event="apply_recovered",
            )
    what = f"run {outcome.run_id}"
    if outcome.step is not None:
        what = f"{outcome.step} of {what}"
    files = len(outcome.written) + len(outcome.deleted) + len(outcome.mode_changed)
    if outcome.applied and outcome.git_branch:
        note(
            f"committed {what} on git branch {outcome.git_branch} ({outcome.git_commit[:12]}): "
            f"{count(files, 'file')}; the working tree, index and HEAD are untouched",
            level="info",
            event="applied",
        )
    elif outcome.applied:
        note(f"applied {what}: {count(files, 'file')} written or deleted", event="applied")
    elif outcome.workspace_changed:
        lines = _refused_lines(outcome, record)
        for line in lines[:-1]:
            note(line, level="warning", event="apply_refused")
        note(
            f"{lines[-1]}; none of its changes were written",
            level="warning",
            event="apply_refused",
        )
    else:
        note(f"nothing to apply: {what} changed no files", event="applied")


async def cmd_diff(args: argparse.Namespace) -> int:
    """``orchestrator diff``."""
    from ..runs import diff_run
    from ..runs.recorded import get_run

    record = await get_run(args.run, state_dir=args.state_dir)
    if record.kind == "batch":
        from ..errors import UsageError

        if args.step is not None:
            raise UsageError(
                f"run {record.run_id} is a batch run: it has no steps; give one of its "
                f"repositories' runs (orchestrator show {record.run_id} lists them)"
            )
        # each repository's diff under a line naming it: read them, apply each run on its own
        text = await _batch_diff_text(record.run_id, args.state_dir)
    elif record.kind == "compare" and args.step in (None, "compare") and not args.json:
        # a comparison's agents are alternatives: each diff under a line naming its agent
        text = await _labelled_diffs(record.run_id, args.state_dir)
    else:
        text = await diff_run(args.run, step=args.step, state_dir=args.state_dir)
        if args.step is None and not args.json and record.kind == "pipeline":
            # no final changes: the step instances' diffs, each from its own branch (a later
            # step's holds its parents' changes again), so each under a line naming it
            text = await _step_diffs(record.run_id, args.state_dir) or text
    interrupted = await _interrupted(args)
    if args.json:
        _emit(
            {
                "runId": record.run_id,
                "step": args.step,
                "diff": text,
                "applyInterrupted": _interrupted_of(interrupted, record.run_id),
            }
        )
    else:
        # only control characters change: ordinary text stays a patch git applies
        sys.stdout.write(terminal_text(text))
        _warn_interrupted(interrupted, record.run_id, record.cwd)
    return EXIT_OK


async def _labelled_diffs(run_id: str, state_dir: str | None) -> str:
    """Each agent's diff of comparison ``run_id``, under a ``# compare[NAME]: ...`` line."""
    from ..runs import get_run_json
    from .render import diff_header

    result = await get_run_json(run_id, state_dir=state_dir)
    parts = []
    for agent in result.get("agents") or []:
        name = str(agent.get("name"))
        diff = str(agent.get("diff") or "")
        parts.append(diff_header(name, agent) + "\n" + (diff or "# (no changes)\n"))
    return "\n".join(parts)


async def _step_diffs(run_id: str, state_dir: str | None) -> str | None:
    """The diffs of pipeline run ``run_id``'s step instances, each under a ``# STEP[KEY]: ...``
    line, when the run has no final changes (an interrupted or failed run); else None. Each is
    what ``diff RUN --step STEP[KEY]`` prints: its branch against the run's base, so a step's
    holds its parents' changes again (apply one, not all)."""
    from ..runs import diff_run, get_run_json
    from .render import diff_header

    result = await get_run_json(run_id, state_dir=state_dir)
    if result.get("diff") or result.get("status") == "succeeded":
        return None
    parts = []
    for name, step in (result.get("steps") or {}).items():
        for key, instance in (step.get("instances") or {}).items():
            # as the unlabelled diff: what finished, and what an interruption stopped
            if instance.get("status") not in ("succeeded", "interrupted"):
                continue
            full = name if key == name else f"{name}[{key}]"
            diff = await diff_run(run_id, step=full, state_dir=state_dir)
            if diff:
                about = {"status": instance.get("status"), "diff": diff}
                parts.append(diff_header(str(key), about, str(name)) + "\n" + diff)
    return "\n".join(parts) if parts else None


HANDLERS = {
    "run": cmd_run,
    "compare": cmd_compare,
    "runs": cmd_runs,
    "show": cmd_show,
    "resume": cmd_resume,
    "apply": cmd_apply,
    "diff": cmd_diff,
}
