"""The ``orchestrator`` command line: a thin layer over :mod:`orchestrator.runs`.

Exit codes: 0 done, 1 a step or turn failed, 2 bad usage or input, 3 changes left unapplied
because files changed in the workspace since the run (settle them, then apply or resume again),
4 merge conflicts between branches (they need a merge strategy or a person), 130 interrupted.
Logs go to stderr (readable on a terminal, plain lines otherwise, JSON lines with
``--log-json``); ``--json`` prints exactly one
JSON object on stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .output import say, terminal_text

if TYPE_CHECKING:  # the heavy imports stay out of `--help`
    from ..protocol import types as t

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: changes left unapplied: files they touch changed in the workspace since the run
EXIT_WORKSPACE_CHANGED = 3
#: merge conflicts between branches, left to settle
EXIT_MERGE_CONFLICTS = 4

EXAMPLES = """\
examples:
  orchestrator prompt --agent demo --policy edit 'replace "colour" with "color" in **/*.md'
  orchestrator prompt --agent claude --json "Explain this repository"
  orchestrator prompt --agent "mine=python my_agent.py" --transcript ../wire.ndjson "hello"
  orchestrator run pipelines/batch_replace.py --policy edit --set change='Use pathlib'
  orchestrator compare --agent claude --agent codex --policy edit --verify "pytest -q" "Fix the bug"
  orchestrator runs; orchestrator show RUN; orchestrator apply RUN
  orchestrator replay RUN --policy deny-all   # the run again, offline, its agents played back
  orchestrator apply RUN --git-branch agent/result
  orchestrator agents --check
  orchestrator trust    # let this project's .orchestrator.toml start its agents

exit codes:
  0    done
  1    a step or turn failed (or an apply was refused: already applied, still running)
  2    bad usage or input
  3    changes left unapplied: files they touch changed in the workspace since the run
       (the changes are kept: settle the files, then `orchestrator apply RUN`)
  4    merge conflicts between branches: they need a merge strategy or a person
  130  interrupted
"""


#: the help of every command's --sandbox
SANDBOX_HELP = (
    "confine each agent and its commands with Landlock: writes only to its branch, its home "
    "and a private temp directory (rules: [sandbox] in the config; see the README)"
)

#: whether the command line being parsed asked for --json (its usage errors are JSON too)
_json_errors = False
#: whether it holds --log-json, for the lines said before it is parsed (a usage error)
_log_json_argv = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if _json_errors:
            # a script asked for one JSON object: bad usage is one too (and one line on stderr)
            _error(f"{message} (see {self.prog} --help)")
            _emit_json(
                {"error": {"type": "UsageError", "message": message}, "exitCode": EXIT_USAGE}
            )
            self.exit(EXIT_USAGE)
        # one line, as every other usage error: the usage block would bury it (--help has it)
        _note_before_parsed(
            f"{message} (see {self.prog} --help)",
            level="error",
            event="usage_error",
            prefix=f"{self.prog}: error: ",
        )
        self.exit(EXIT_USAGE)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args``, but arguments a subcommand does not take are an error of that
    subcommand's parser: its message points at its own ``--help`` (which lists its options),
    not the top-level one."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        chosen = parser
        for action in parser._actions:  # argparse keeps its subcommands only there
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, "command", None) or "", parser)
        chosen.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (importing nothing heavy, so ``--help`` is fast)."""
    parser = _Parser(
        prog="orchestrator",
        description="Run ACP coding agents as their client.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    _log_flags(parser, before=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    from .mcp import add_mcp_options
    from .runs import (
        DIFF_HELP,
        FILE_SIZE_HELP,
        PROMPT_NO_PROGRESS_HELP,
        add_parsers,
        add_prompt_input,
        add_session_choices,
        file_size,
        positive_seconds,
    )

    p = sub.add_parser(
        "prompt",
        help="one turn with one agent",
        description="Send TEXT to one agent and print its reply as it streams.",
        epilog="examples:\n  orchestrator prompt --agent demo 'rename foo to bar in *.py'\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--agent", required=True, help="a known name, a command line, or NAME=COMMAND")
    p.add_argument("--cwd", default=".", help="the session's directory (default: .)")
    p.add_argument(
        "--policy",
        help="permission policy: read-only, edit, trusted, deny-all, or a TOML file "
        "(default: reject every request)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="write the agent's changes to --cwd (all or nothing); without it nothing is touched",
    )
    p.add_argument(
        "--state-dir",
        help="where runs and branches live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--transcript", help="write every wire frame to this ND-JSON file")
    p.add_argument("--json", action="store_true", help="print one JSON result object")
    p.add_argument("--diff", action="store_true", help=DIFF_HELP)
    p.add_argument("--timeout", type=positive_seconds, help="seconds allowed for the whole turn")
    p.add_argument(
        "--idle-timeout", type=positive_seconds, help="seconds allowed without any update"
    )
    p.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    p.add_argument("--max-file-size", type=file_size, metavar="SIZE", help=FILE_SIZE_HELP)
    p.add_argument("--no-progress", action="store_true", help=PROMPT_NO_PROGRESS_HELP)
    add_prompt_input(p, what="prompt")
    add_session_choices(p)
    add_mcp_options(p)

    add_parsers(sub)

    from .agents import add_parser as add_agents_parser

    add_agents_parser(sub)

    from .trust import add_parser as add_trust_parser

    add_trust_parser(sub)

    from .prune import add_parser as add_prune_parser

    add_prune_parser(sub)

    from .batch import add_parser as add_batch_parser

    add_batch_parser(sub)

    from .replay import add_parser as add_replay_parser

    add_replay_parser(sub)
    for command in sub.choices.values():
        _log_flags(command, before=False)
    return parser


def _log_flags(parser: argparse.ArgumentParser, *, before: bool) -> None:
    """``-v`` and ``--log-json``, before the command (``orchestrator -v run``) or after it.

    The two places keep separate counts (a command's parser would otherwise overwrite what was
    given before it): :func:`verbosity` adds them up.
    """
    suffix = "" if before else "_after"
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        dest="verbose" + suffix,
        default=0 if before else argparse.SUPPRESS,
        help="more log output (-vv for debug); before or after the command",
    )
    parser.add_argument(
        "--log-json",
        action="store_true",
        dest="log_json" + suffix,
        default=False if before else argparse.SUPPRESS,
        help="logs as JSON lines on stderr",
    )


def verbosity(args: argparse.Namespace) -> tuple[int, bool]:
    """The log level (``-v`` count) and ``--log-json``, wherever on the command line given."""
    count = int(args.verbose) + int(getattr(args, "verbose_after", 0))
    return count, bool(args.log_json or getattr(args, "log_json_after", False))


def configure_logging(verbosity: int, as_json: bool) -> None:
    """The library's log lines on stderr (the only place they are given a handler): readable
    on a terminal, plain lines off one, JSON lines with ``--log-json``; warnings and errors,
    ``-v`` info, ``-vv`` debug."""
    from .logs import configure

    configure(verbosity, as_json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    global _json_errors, _log_json_argv
    argv = sys.argv[1:] if argv is None else list(argv)
    _json_errors = "--json" in argv
    options = argv[: argv.index("--")] if "--" in argv else argv
    _log_json_argv = "--log-json" in options
    refused = _not_utf8(argv)
    if refused is not None:
        _error(refused)
        if _json_errors:
            _emit_json(
                {"error": {"type": "UsageError", "message": refused}, "exitCode": EXIT_USAGE}
            )
        return EXIT_USAGE
    args = _parse(build_parser(), argv)
    configure_logging(*verbosity(args))
    from .agents import cmd_agents
    from .batch import cmd_batch
    from .prune import cmd_prune
    from .replay import cmd_replay
    from .runs import HANDLERS
    from .trust import cmd_trust

    handler: Callable[[argparse.Namespace], Any] = {
        "prompt": _cmd_prompt,
        "agents": cmd_agents,
        "trust": cmd_trust,
        "prune": cmd_prune,
        "batch": cmd_batch,
        "replay": cmd_replay,
        **HANDLERS,
    }[args.command]
    import trio

    return int(trio.run(_interruptible, handler, args))


def _not_utf8(argv: Sequence[str]) -> str | None:
    """Why the command line cannot be used, if one of its arguments is not UTF-8 text (bytes
    that do not decode, held as lone surrogates); else None.

    Everything given on the command line ends up as text: recorded with the run (JSON,
    SQLite), sent to agents (ACP is JSON), shown in reports. Refused here, in one place, before
    any of it is parsed or reaches a file.
    """
    from .._names import display_name, is_utf8

    for i, arg in enumerate(argv):
        if is_utf8(arg):
            continue
        option, equals, value = arg.partition("=")
        if arg.startswith("-") and equals and is_utf8(option):
            what, arg = f"argument {option}", value
        elif i > 0 and argv[i - 1].startswith("-") and is_utf8(argv[i - 1]):
            what = f"argument {argv[i - 1]}"
        else:
            what = "an argument"
        # the display form shows each byte that is not UTF-8 as \xHH
        return (
            f"{what} is not UTF-8 text: {display_name(arg)} (the command line is recorded "
            "and given to agents as JSON text)"
        )
    return None


async def _interruptible(handler: Callable[[argparse.Namespace], Any], args: Any) -> int:
    """Run a command; Ctrl-C cancels it cleanly (agents shut down) and exits 130.

    The first Ctrl-C (or SIGTERM) cancels the command: running turns get ``session/cancel``
    and a short grace to end, what they did is recorded, then the agents are stopped. A
    second one ends those graces at once: straight to the shutdown ladder.
    """
    import trio

    from .._log import get_logger
    from .._util import end_grace_periods
    from ..errors import (
        AgentStartError,
        ApplyRefused,
        CapabilityNotSupported,
        ClusterError,
        OrchestratorError,
        ResumeConflict,
        UnsettledConflicts,
        UsageError,
    )

    interrupted = False
    code = EXIT_FAILED
    as_json = bool(getattr(args, "json", False))

    args.run_ids = []  # filled by the run commands as their runs start
    args.run_kinds = {}  # and each run's kind (prompt, compare, pipeline)
    # set by a command whose work an interrupt no longer stops once under way (an apply, all or
    # nothing) when it completed anyway: its outcome, not the interrupt, makes the exit code
    args.completed_despite_interrupt = None

    def run_id(e: BaseException | None = None) -> dict[str, str]:
        if args.run_ids:
            return {"runId": args.run_ids[-1]}
        known = getattr(e, "run_id", None)  # a refusal names the run it refused
        return {"runId": known} if isinstance(known, str) and known else {}

    def fail(e: BaseException, exit_code: int) -> int:
        _error(str(e), type(e).__name__, exit_code)
        if as_json:  # scripts still get one JSON object on stdout
            from .._names import display_names

            paths = getattr(e, "paths", None)
            _emit_json(
                {
                    "error": {"type": type(e).__name__, "message": str(e)},
                    "exitCode": exit_code,
                    **run_id(e),
                    **({"paths": display_names(paths)} if paths else {}),
                }
            )
        return exit_code

    log = get_logger("orchestrator.cli")
    async with trio.open_nursery() as nursery:
        work = trio.CancelScope()

        # outside the command's scope, so that it still hears a second interrupt
        async def watch_signals(*, task_status: trio.TaskStatus[None]) -> None:
            nonlocal interrupted
            try:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    task_status.started()
                    await _each_signal(signals)
            except KeyboardInterrupt:
                # a signal that came as the command ended, delivered again as the receiver
                # closed: the command is over (it exits 130 if it was interrupted)
                interrupted = True

        async def _each_signal(signals: Any) -> None:
            nonlocal interrupted
            async for _ in signals:
                if interrupted:
                    # only a run has agents to stop (an apply just goes on to its end)
                    log.warning(
                        "interrupted again: stopping the agents now"
                        if args.run_ids
                        else "interrupted again"
                    )
                    end_grace_periods()
                    continue
                interrupted = True
                # a run's turns (once it started) end with grace; other work just stops
                log.warning(
                    "interrupted: ending the running turns (again to stop at once)"
                    if args.run_ids
                    else "interrupted"
                )
                work.cancel()

        # installed before the command runs: an interrupt while it imports is heard
        await nursery.start(watch_signals)
        with work:
            try:
                code = await handler(args)
            except UsageError as e:
                code = fail(e, EXIT_USAGE)
            except AgentStartError as e:
                not_found = isinstance(e.__cause__, FileNotFoundError | PermissionError)
                code = fail(e, EXIT_USAGE if not_found else EXIT_FAILED)
            except CapabilityNotSupported as e:
                code = fail(e, EXIT_USAGE)
            except ClusterError as e:  # no Ray, an address with no cluster: the setup's fault
                code = fail(e, EXIT_USAGE)
            except UnsettledConflicts as e:
                code = fail(e, EXIT_MERGE_CONFLICTS)
            except ApplyRefused as e:
                code = fail(e, EXIT_FAILED)
                # a run's apply refused (a write that failed, undone): its run ended first,
                # recorded; an interrupt that came meanwhile did not stop it
                args.completed_despite_interrupt = (
                    "interrupted while the run was finishing: it ended as said above"
                )
            except ResumeConflict as e:  # the workspace changed under files the run changed
                code = fail(e, EXIT_WORKSPACE_CHANGED)
            except OrchestratorError as e:
                code = fail(e, EXIT_FAILED)
        nursery.cancel_scope.cancel()
    if interrupted and args.completed_despite_interrupt:
        from .logs import note

        note(
            args.completed_despite_interrupt,
            level="warning",
            event="interrupted",
            prefix="orchestrator: ",
        )
        return code
    if interrupted and as_json:
        _emit_json(
            {
                "error": {"type": "Interrupted", "message": "interrupted"},
                "exitCode": 130,
                **run_id(),
            }
        )
    elif interrupted and args.run_ids:
        # the last word, whatever went before it (log lines, JSON ones off a terminal): which
        # run stopped and how to go on with it
        from .logs import note

        last = args.run_ids[-1]
        kind = args.run_kinds.get(last)
        note(
            _resume_hint(last, kind),
            level="warning",
            event="run_interrupted",
            runId=last,
            resume=_go_on(last, kind),
        )
    return EXIT_INTERRUPTED if interrupted else code


def _go_on(run_id: str, kind: str | None) -> str:
    """The command that goes on with an interrupted run: ``resume``; for a replay (kind
    ``replay OF``), replaying its recorded run again."""
    if kind and kind.startswith("replay "):
        return f"orchestrator {kind}"
    return f"orchestrator resume {run_id}"


def _resume_hint(run_id: str, kind: str | None) -> str:
    """The line that ends an interrupted run command: the run, and what ``resume`` does for it
    (a prompt's one turn starts again; elsewhere finished step instances are reused); a replay
    is replayed again."""
    if kind and kind.startswith("replay "):
        return f"run {run_id} interrupted; {_go_on(run_id, kind)} replays the run again"
    does = "runs the prompt again" if kind == "prompt" else "goes on"
    return f"run {run_id} interrupted; orchestrator resume {run_id} {does}"


def _error(message: str, kind: str = "UsageError", exit_code: int = EXIT_USAGE) -> None:
    """The one line of an error on stderr: ``orchestrator: error: MESSAGE``, or with
    ``--log-json`` a JSON line (event ``usage_error`` for exit code 2, else ``error``)."""
    _note_before_parsed(
        message,
        level="error",
        event="usage_error" if exit_code == EXIT_USAGE else "error",
        prefix="orchestrator: error: ",
        type=kind,
        exitCode=exit_code,
    )


def _note_before_parsed(message: str, **how: Any) -> None:
    """:func:`.logs.note`, in the format the command line asks for even when it was not
    parsed (yet, or at all: a usage error): then ``--log-json`` is looked for in it."""
    from . import logs

    if not logs.configured():
        logs.set_style(_log_json_argv)
    logs.note(message, **how)


def _emit_json(obj: Any) -> None:
    from .output import emit_json

    emit_json(obj)


async def _cmd_prompt(args: argparse.Namespace) -> int:
    from ..runs.prompt import prompt
    from .escalation import choose_escalation
    from .mcp import mcp_servers
    from .runs import finished_despite_interrupt, read_prompt, track_run
    from .trust import project_config

    text = await read_prompt(args)
    # without progress the reply is printed whole at the end, not streamed
    quiet = args.json or args.no_progress
    config = await project_config(args.cwd, args.state_dir)
    run = await prompt(
        args.agent,
        text,
        config=config,
        cwd=args.cwd,
        policy=args.policy,
        escalate=choose_escalation(),
        transcript=args.transcript,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
        # --json prints only the result: no callback, so chunks need no typed values
        on_update=None if quiet else _print_update,
        on_event=track_run(args, None),
        apply=args.apply,
        state_dir=args.state_dir,
        sandbox=args.sandbox or None,
        max_file_size=args.max_file_size,
        model=args.model,
        mode=args.mode,
        mcp_servers=mcp_servers(args, config),
    )
    finished_despite_interrupt(args, run.status)
    if run.exception is not None:
        # the turn never ended (the agent did not start, exited, answered an error): the
        # command line says so as it says every error, in one line or --json's error object,
        # exit 1 (the run is recorded failed; its runId is in the object)
        raise run.exception
    if args.json:
        _emit_json(run.to_json())
    else:
        from .render import prompt_ending

        if args.no_progress:
            sys.stdout.write(terminal_text(run.turn.text))
        if run.turn.text and not run.turn.text.endswith("\n"):
            sys.stdout.write("\n")
        say("")  # the streamed reply, then its ending, as `show RUN` lays them out
        # the object show RUN reads back (the prompt's, with its workspace)
        prompt_ending({"cwd": args.cwd, **run.to_json()}, sys.stdout, diff=args.diff)
    if run.exit_code:
        return run.exit_code
    return EXIT_OK if run.turn.stop_reason == "end_turn" else EXIT_FAILED


def _print_update(update: t.SessionUpdate) -> None:
    from ..agent.turn import content_text
    from ..protocol import types as t

    if isinstance(update, t.AgentMessageChunk):
        sys.stdout.write(terminal_text(content_text(update.content)))
        sys.stdout.flush()
    elif isinstance(update, t.ToolCall):
        kind = update.kind or "tool"
        fields = {"toolCallId": update.tool_call_id, "kind": kind, "title": update.title}
        _tool_line("info", "tool_call", f"> {kind}: {update.title}", fields)
    elif isinstance(update, t.ToolCallUpdateSessionUpdate) and update.status in (
        "completed",
        "failed",
    ):
        level = "warning" if update.status == "failed" else "info"
        fields = {"toolCallId": update.tool_call_id, "status": update.status}
        _tool_line(level, "tool_call_update", f"< {update.tool_call_id}: {update.status}", fields)
    elif isinstance(update, t.Notice):
        _notice_line(update)


def _notice_line(notice: t.Notice) -> None:
    """An agent's notice for the user, on stderr: an indented line on a terminal (after the
    message text streamed so far), else a line in the log lines' format."""
    from . import logs
    from .live import notice_progress, progress_line

    fields = {"severity": notice.severity, "title": notice.title}
    if notice.description:
        fields["description"] = notice.description
    level, verb, text = notice_progress(None, fields)
    if logs.style() == "terminal" and sys.stderr.isatty():
        say(f"  ! {text}", file=sys.stderr)
        return
    progress_line(level, verb, text, {"event": "notice", **fields})


def _tool_line(level: str, event: str, text: str, fields: dict[str, Any]) -> None:
    """A prompt's tool call as progress on stderr: an indented line on a terminal, else a line
    in the log lines' format (JSON with --log-json), as the progress of the other commands."""
    from . import logs
    from .live import progress_line

    if logs.style() == "terminal" and sys.stderr.isatty():
        say(f"  {text}", file=sys.stderr)
        return
    progress_line(level, "tool", text, {"event": event, **fields})


def entry() -> NoReturn:
    """Console-script entry point.

    Leaves without the interpreter's teardown, which frees every module and object one by one
    (about 0.1 s with the protocol types, trio and structlog loaded): by the time ``main``
    returns, everything it opened is closed (agents reaped, stores and files closed, threads
    joined), so only the standard streams and logging handlers are left to flush.
    """
    from .output import pipe_safe_stdout

    pipe_safe_stdout()  # before anything is printed: a reader may go away
    code = main()
    reaper = sys.modules.get("orchestrator.agent.reaper")
    if reaper is not None:  # atexit handlers do not run on os._exit
        reaper.stop_watchdog()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # stderr's reader went away; nothing more to say
        pass
    logging.shutdown()
    os._exit(code)
