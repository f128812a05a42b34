"""``orchestrator batch``: one pipeline over many repositories, and its progress.

The progress is one row per repository (state, the step running there, elapsed time, tokens)
on a terminal, one line per repository started and finished elsewhere; the result is the
summary table on stdout (:mod:`.batchview`), or with ``--json`` the batch object.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .cluster import add_cluster_options, cluster_option
from .output import say

if TYPE_CHECKING:  # the parser is built without trio or attrs loaded (a fast --help)
    from ..pipeline.results import RunEvent

__all__ = ["BatchProgress", "add_parser", "cmd_batch", "finish_batch"]

BATCH_EXAMPLES = """\
examples:
  orchestrator batch fix.py --repos repos.txt --policy edit
  orchestrator batch fix.py --repo ../svc-a --repo ../svc-b --git-branch agent/fix
  orchestrator batch fix.py --repos repos.txt --git-branch agent/fix --push origin \\
      --max-tokens 200000 --max-repos 8
  orchestrator resume BATCH     # only the repositories (and steps) that did not succeed

A line of the repository list is a local directory or a git URL with an optional ref
(`https://host/org/svc.git main`); `#` starts a comment. URLs are cloned shallow into a cache in
the state directory and fetched again by later batches; local checkouts are read as they are.
Nothing is written anywhere unless --apply (local checkouts, in place) or --git-branch is given.
"""

#: rows kept in the live table once a repository finished, beyond those running
_FINISHED_ROWS = 6


def add_parser(sub: Any) -> None:
    """Add ``batch`` to the ``orchestrator`` parser's subcommands."""
    from . import SANDBOX_HELP
    from .mcp import add_mcp_options
    from .runs import (
        FILE_SIZE_HELP,
        MAX_SET_DEPTH,
        file_size,
        positive_amount,
        positive_int,
        positive_seconds,
    )

    p = sub.add_parser(
        "batch",
        help="one pipeline over many repositories",
        description="Run a pipeline in each repository of a list, each as a child run of one "
        "batch run; nothing is touched unless --apply or --git-branch says so.",
        epilog=BATCH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pipeline", help="the pipeline file")
    p.add_argument("--repos", metavar="FILE", help="the repository list (one per line)")
    p.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="REPO",
        help="a repository: a directory, or a git URL (with a ref: 'URL REF'); repeatable",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a run input, as for `run` (JSON nested at most {MAX_SET_DEPTH} levels); repeatable",
    )
    p.add_argument(
        "--policy", help="permission policy: a preset name or a TOML file (default: reject all)"
    )
    p.add_argument("--max-repos", type=positive_int, help="repositories at once (default: 4)")
    p.add_argument(
        "--max-sessions",
        type=positive_int,
        help="live agent sessions at once, across all repositories (default: the config's, else "
        "8; on a cluster, its agent slots)",
    )
    add_cluster_options(p)
    out = p.add_argument_group("what comes out (default: nothing is touched)")
    out.add_argument(
        "--apply", action="store_true", help="write each local repository's changes in place"
    )
    out.add_argument(
        "--git-branch",
        metavar="NAME",
        help="commit each repository's changes on a new branch NAME (working tree untouched)",
    )
    out.add_argument("--push", metavar="REMOTE", help="push each new branch to REMOTE")
    out.add_argument(
        "--message",
        metavar="TEMPLATE",
        help="the commit message; may name {batch_id}, {run_id}, {pipeline}, {repo}",
    )
    budget = p.add_argument_group("budget of the whole batch")
    budget.add_argument("--max-tokens", type=positive_int, help="tokens the agents report")
    budget.add_argument("--max-cost", type=positive_amount, help="cost the agents report")
    budget.add_argument("--max-seconds", type=positive_seconds, help="wall-clock seconds")
    budget.add_argument(
        "--on-budget",
        choices=("finish", "cancel"),
        default="finish",
        help="when spent: let running turns finish (default) or cancel them",
    )
    p.add_argument("--cwd", default=".", help="where relative --repo paths are read (default: .)")
    p.add_argument(
        "--state-dir",
        help="where runs, branches and clones live (default: $ORCHESTRATOR_STATE_DIR or "
        "~/.local/state/acp-orchestrator)",
    )
    p.add_argument("--json", action="store_true", help="print the batch as one JSON object")
    p.add_argument("--report", metavar="DIR", help="write report.html and report.md into DIR")
    p.add_argument("--max-file-size", type=file_size, metavar="SIZE", help=FILE_SIZE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    add_mcp_options(p)


class BatchProgress:
    """The ``on_event`` of ``batch`` (and of its resume): keeps the batch's id for the error
    object and the resume hint, and draws one row per repository on the progress view."""

    def __init__(self, args: argparse.Namespace, view: Any) -> None:
        self._args = args
        self._view = view
        self._tokens: dict[str, dict[str, int]] = {}
        self.wants_updates = view is not None

    def __call__(self, event: RunEvent) -> None:
        from ..pipeline.results import RunEvent

        if event.type == "batch_started":
            ids: list[str] = getattr(self._args, "run_ids", [])
            if event.run_id not in ids:
                ids.append(event.run_id)
                getattr(self._args, "run_kinds", {})[event.run_id] = "batch"
            return
        view = self._view
        if view is None:
            return
        from .live import LiveView, progress_line

        live = isinstance(view, LiveView)
        repo = event.data.get("repo")
        if event.type == "repo_started":
            if live:
                view(RunEvent("step_started", event.run_id, step=str(repo), agent="-"))
            else:
                progress_line(
                    "info",
                    "repo",
                    f"{repo} started",
                    {"event": "repo_started", "repo": repo, "runId": event.run_id},
                )
        elif event.type == "repo_finished":
            self._finished(event, live)
        elif live and isinstance(repo, str):
            self._child(view, repo, event)

    def _child(self, view: Any, repo: str, event: RunEvent) -> None:
        from ..pipeline.results import RunEvent

        """A child run's event, as its repository's row shows it."""
        if event.type == "step_started":
            view(
                RunEvent(
                    "update",
                    event.run_id,
                    step=repo,
                    agent=event.instance,
                    data={"title": f"{event.instance} started"},
                )
            )
        elif event.type == "step_round":
            from .live import round_note

            view(
                RunEvent("update", event.run_id, step=repo, data={"title": round_note(event.data)})
            )
        elif event.type == "update":
            data = event.data
            tokens = data.get("tokens")
            if isinstance(tokens, int) and event.instance is not None:
                per = self._tokens.setdefault(repo, {})
                per[event.instance] = tokens
                view(
                    RunEvent("update", event.run_id, step=repo, data={"tokens": sum(per.values())})
                )
            if data.get("title"):
                view(RunEvent("update", event.run_id, step=repo, data={"title": data["title"]}))

    def _finished(self, event: RunEvent, live: bool) -> None:
        from ..pipeline.results import RunEvent
        from ..report._batch import repo_rows
        from .live import progress_line

        data = event.data
        repo = str(data.get("repo"))
        status = data.get("status")
        said = repo_rows({"repos": [{**data, "name": repo}]})[0].outcome()
        self._tokens.pop(repo, None)
        if not live:
            level = "info" if status == "succeeded" else "warning"
            fields = {
                "event": "repo_finished",
                "repo": repo,
                "status": status,
                "runId": data.get("runId"),
                "exitCode": data.get("exitCode"),
            }
            progress_line(level, "repo", f"{repo} {said}", fields, created=event.time)
            return
        kind = {
            "succeeded": "step_finished",
            "skipped": "step_skipped",
        }.get(str(status), "step_failed")
        self._view(
            RunEvent(
                kind,  # type: ignore[arg-type]
                event.run_id,
                step=repo,
                data={"error": "" if status == "succeeded" else said, "tokens": data.get("tokens")},
            )
        )
        # the rows of repositories long finished make way: the table stays a screen high
        rows = self._view.names()
        done = [name for name, state in rows if state not in ("running", "retrying")]
        for name in done[: max(0, len(done) - _FINISHED_ROWS)]:
            self._view.forget(name)


async def finish_batch(args: argparse.Namespace, outcome: Any) -> int:
    """Print a batch's result (the table and summary, or ``--json``); its exit code."""
    from .batchview import batch_summary_line, batch_table
    from .runs import _emit

    result = dict(outcome.result)
    if getattr(args, "report", None):
        result["report"] = await _write_report(args.report, outcome.run_id, args.state_dir)
    if args.json:
        _emit(result)
        return int(outcome.exit_code)
    import sys

    out = sys.stdout
    for line in batch_table(result):
        say(line, out)
    say(batch_summary_line(result), out)
    if result.get("report"):
        say(f"report: {result['report']['html']}", out)
    ended = f"batch {outcome.run_id}: {outcome.status}"
    if outcome.status != "succeeded":
        ended += f" (orchestrator show {outcome.run_id}; orchestrator resume {outcome.run_id})"
    say(ended, out)
    return int(outcome.exit_code)


async def _write_report(out_dir: str, run_id: str, state_dir: str | None) -> dict[str, str]:
    import trio

    from ..runs.recorded import write_batch_report

    with trio.CancelScope(shield=True):  # the batch is done: its report is written whole
        _, paths = await write_batch_report(run_id, out_dir, state_dir=state_dir)
    return {"html": str(paths.html), "markdown": str(paths.markdown)}


async def cmd_batch(args: argparse.Namespace) -> int:
    """``orchestrator batch``."""
    from ..errors import UsageError
    from ..runs.batch import batch
    from .escalation import choose_escalation
    from .mcp import mcp_servers
    from .runs import _inputs, _view
    from .trust import project_config

    if not args.repos and not args.repo:
        raise UsageError("no repositories: give --repos FILE or --repo REPO (repeatable)")
    if args.push and not args.git_branch:
        raise UsageError("--push needs --git-branch: the branch to push")
    if args.message and not args.git_branch:
        raise UsageError("--message needs --git-branch: the commit it is the message of")
    if args.apply and args.git_branch:
        raise UsageError("--apply and --git-branch: choose one")
    config = await project_config(args.cwd, args.state_dir)
    with _view(args, f"batch {args.pipeline}", headers=_HEADERS) as view:
        outcome = await batch(
            args.pipeline,
            args.repo,
            _inputs(args.set),
            repos_file=args.repos,
            cwd=args.cwd,
            policy=args.policy,
            escalate=choose_escalation(),
            config=config,
            max_repos=args.max_repos,
            max_sessions=args.max_sessions,
            max_file_size=args.max_file_size,
            apply=args.apply,
            git_branch=args.git_branch,
            push=args.push,
            message=args.message,
            max_tokens=args.max_tokens,
            max_cost=args.max_cost,
            max_seconds=args.max_seconds,
            on_budget=args.on_budget,
            on_event=BatchProgress(args, view),
            state_dir=args.state_dir,
            sandbox=args.sandbox or None,
            mcp_servers=mcp_servers(args, config),
            cluster=cluster_option(args),
        )
    return await finish_batch(args, outcome)


#: the live table's columns, as a batch names them
_HEADERS = {"step": "repository", "agent": "step", "last tool call": "now"}


async def cmd_resume_batch(args: argparse.Namespace) -> int:
    """``orchestrator resume BATCH``."""
    from ..errors import UsageError
    from ..runs.batch import resume_batch
    from .escalation import choose_escalation
    from .runs import _view

    # a batch goes on with its recorded apply or branch; these are a pipeline run's
    for flag, given in (
        ("--apply", args.apply),
        ("--max-file-size", args.max_file_size is not None),
        ("--transcript", args.transcript is not None),
        ("--diff", args.diff),
    ):
        if given:
            raise UsageError(f"{flag} is for resuming a pipeline run; run {args.run} is a batch")
    with _view(args, f"resume {args.run}", headers=_HEADERS) as view:
        outcome = await resume_batch(
            args.run,
            state_dir=args.state_dir,
            policy=args.policy,
            max_repos=args.max_repos,
            max_sessions=args.max_sessions,
            max_tokens=args.max_tokens,
            max_cost=args.max_cost,
            max_seconds=args.max_seconds,
            on_budget=args.on_budget,
            escalate=choose_escalation(),
            on_event=BatchProgress(args, view),
            sandbox=args.sandbox or None,
            cluster=cluster_option(args),
        )
    return await finish_batch(args, outcome)
