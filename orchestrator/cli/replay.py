"""``orchestrator replay``: a recorded run again, offline, its agents played from the record.

``orchestrator replay RUN [PIPELINE.py]`` is a new run (see :func:`~orchestrator.runs.replay.
replay_run`) whose result ends with what differed from the record, per step; ``--save FILE``
writes the run's replay record to a file and runs nothing (what a test keeps beside it).
Exit 0: the replay succeeded with nothing different; 1: it failed or something differed (or
a turn could not be replayed); 2: bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .output import say, terminal_text

__all__ = ["add_parser", "cmd_replay"]

REPLAY_EXAMPLES = """\
examples:
  orchestrator replay RUN                       # the run again, its agents played from the record
  orchestrator replay RUN pipelines/fix.py      # with the pipeline file as it is now
  orchestrator replay RUN --policy deny-all     # where would a stricter policy have stopped it?
  orchestrator replay RUN --save tests/records/fix.json    # keep the record beside a test
  orchestrator replay tests/records/fix.json --cwd tests/fixtures/project --strict

No agent is started and no model is called: each agent's requests (file reads and writes,
terminal commands, permission requests) are made again against the new run's branches, decided
by the policy again. What differs from the record is listed per step; exit 1 when anything does.
"""


def add_parser(sub: Any) -> None:
    """Add ``replay`` to the ``orchestrator`` parser's subcommands."""
    from .runs import DIFF_HELP, positive_int

    p = sub.add_parser(
        "replay",
        help="run a recorded run again, its agents played from the record",
        description="Run a recorded run again as a new run, offline: every agent is a replay "
        "agent playing the recorded sessions; what differs from the record is reported per step.",
        epilog=REPLAY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="a run id (a unique prefix is enough) or a replay record file")
    p.add_argument(
        "pipeline",
        nargs="?",
        help="the pipeline file to run, as it is now (default: the text the run recorded)",
    )
    p.add_argument(
        "--policy",
        help="permission policy: replaces the run's recorded one (default: the recorded one)",
    )
    p.add_argument(
        "--strict", action="store_true", help="stop a step's turn at its first divergence"
    )
    p.add_argument(
        "--timing",
        choices=("fast", "recorded"),
        default="fast",
        help="send the recorded updates at once (default) or at their recorded pace",
    )
    p.add_argument(
        "--cwd", help="the workspace to replay on (default: the recorded run's workspace)"
    )
    p.add_argument(
        "--save",
        metavar="FILE",
        help="write the run's replay record to FILE and run nothing (to keep beside a test)",
    )
    p.add_argument(
        "--apply", action="store_true", help="write the replay's changes to the workspace"
    )
    p.add_argument(
        "--max-sessions",
        type=positive_int,
        help="live agent sessions at once (default: as recorded)",
    )
    p.add_argument("--transcript", help="append every wire frame to this ND-JSON file")
    p.add_argument("--report", metavar="DIR", help="write report.html and report.md into DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--diff", action="store_true", help=DIFF_HELP)
    p.add_argument(
        "--state-dir",
        help="where runs and branches live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON result object")


#: the options that make a replay run, which --save does not
_RUN_ONLY = (
    ("pipeline", "PIPELINE"),
    ("policy", "--policy"),
    ("strict", "--strict"),
    ("cwd", "--cwd"),
    ("apply", "--apply"),
    ("max_sessions", "--max-sessions"),
    ("transcript", "--transcript"),
    ("report", "--report"),
    ("diff", "--diff"),
)


async def cmd_replay(args: argparse.Namespace) -> int:
    """``orchestrator replay``."""
    from ..errors import UsageError

    if args.save is not None:
        given = [flag for name, flag in _RUN_ONLY if getattr(args, name)]
        if args.timing != "fast":
            given.append("--timing")
        if given:
            raise UsageError(
                f"--save writes the run's replay record and runs nothing: {given[0]} is for a "
                "replay (leave out --save to replay)"
            )
        return await _save(args)
    return await _replay(args)


async def _save(args: argparse.Namespace) -> int:
    import trio

    from ..errors import UsageError
    from ..runs.replay import load_replay_record

    if not args.save:
        raise UsageError("--save: the file name is empty")
    record = await load_replay_record(args.run, state_dir=args.state_dir)
    if not record.run.get("kind"):
        raise UsageError(f"{args.run} holds no run to save")
    try:
        await trio.to_thread.run_sync(record.dump, args.save)
    except OSError as e:
        raise UsageError(f"--save {args.save}: {e.strerror or e}") from None
    sessions = sum(len(s) for s in record.steps.values())
    if args.json:
        from .output import emit_json

        emit_json(
            {
                "runId": record.run_id,
                "saved": args.save,
                "steps": len(record.steps),
                "sessions": sessions,
            }
        )
    else:
        say(
            f"saved the replay record of run {record.run_id} to {terminal_text(args.save)} "
            f"({len(record.steps)} step instances, {sessions} sessions); replay it with "
            f"orchestrator replay {terminal_text(args.save)}"
        )
    return 0


async def _replay(args: argparse.Namespace) -> int:
    from ..runs.replay import replay_run
    from .escalation import choose_escalation
    from .runs import _finish, _view, track_run

    with _view(args, f"replay {args.run}") as view:
        outcome = await replay_run(
            args.run,
            args.pipeline,
            policy=args.policy,
            strict=args.strict,
            timing=args.timing,
            cwd=args.cwd,
            state_dir=args.state_dir,
            max_sessions=args.max_sessions,
            escalate=choose_escalation(),
            apply=args.apply,
            on_event=_replay_events(args, track_run(args, view)),
            transcript=args.transcript,
        )
    code = _finish(args, outcome)
    replay = dict(outcome.result.get("replay") or {})
    if not args.json:
        _divergence_lines(replay, outcome.status)
        for warning in outcome.result.get("warnings") or ():
            if str(warning).startswith("not applied: the replay differs"):
                say(terminal_text(str(warning)), sys.stdout)
    if code:
        return code
    return 1 if replay.get("divergences") or replay.get("notReplayable") else 0


def _replay_events(args: argparse.Namespace, on_event: Any) -> Any:
    """``on_event`` that marks the run as a replay (an interrupted one is replayed again, not
    resumed: the interrupt's last line says so)."""

    def heard(event: Any) -> None:
        on_event(event)
        if event.type == "run_started":
            args.run_kinds[event.run_id] = f"replay {args.run}"

    heard.wants_updates = getattr(on_event, "wants_updates", True)  # type: ignore[attr-defined]
    return heard


def _divergence_lines(replay: dict[str, Any], status: str) -> None:
    """What differed from the record, per step (stdout, after the result)."""
    out = sys.stdout
    found = [*(replay.get("divergences") or ()), *(replay.get("notReplayable") or ())]
    of = replay.get("of") or "?"
    if not found:
        if status == "succeeded":
            say(f"replay of run {of}: as recorded, no divergence", out)
        else:  # never "as recorded" for a run that did not do what the record did
            say(f"replay of run {of}: no divergence reported, but the replay {status}", out)
        return
    divergences = len(replay.get("divergences") or ())
    cannot = len(replay.get("notReplayable") or ())
    parts = []
    if divergences:
        parts.append(f"{divergences} divergence{'s' if divergences != 1 else ''}")
    if cannot:
        parts.append(f"{cannot} turn{'s' if cannot != 1 else ''} not replayable")
    say(f"replay of run {of}: {', '.join(parts)}", out)
    by_step: dict[str, list[dict[str, Any]]] = {}
    for item in found:
        if isinstance(item, dict):
            by_step.setdefault(str(item.get("step") or "(no step)"), []).append(item)
    for step, items in by_step.items():
        say(f"  {terminal_text(step)}", out)
        for item in items:
            where = f"attempt {item.get('attempt')}, turn {item.get('turn')}"
            detail = terminal_text(str(item.get("detail") or ""))
            say(f"    {item.get('kind')} ({where}): {detail}", out)
