"""The library API: what the command line does, callable from Python.

Every function has an ``async`` form for trio code and a synchronous twin for scripts::

    from orchestrator import prompt_sync
    result = prompt_sync("demo", 'replace "a" with "b" in *.txt', cwd="project")
    print(result.turn.text)
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio
from attrs import field, frozen

from .._names import display_names, parse_name
from ..agent.client import ClientOptions
from ..agent.content import check_prompt
from ..agent.permissions import Escalate
from ..agent.services import ClientServices, PermissionRecord
from ..agent.turn import TurnAccumulator, TurnResult
from ..agents import AgentSpec
from ..config import Config
from ..errors import OrchestratorError, UsageError
from ..mcp import McpServer
from ..pipeline import Pipeline, Step
from ..pipeline import step as step_decorator
from ..pipeline.results import RunEvent, StepResult, changes_from_json, cut_turn
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import SandboxChoice
from ..supervisor import Connector
from ._face import check_trio_face
from .default_policy import DefaultRejections
from .outcomes import FileChange
from .run import RunOutcome, launchable, run_pipeline, workspace_root

__all__ = ["PromptRun", "prompt", "prompt_result"]


@frozen
class PromptRun:
    """The outcome of one prompt to one agent."""

    #: an id for this run
    run_id: str
    #: the agent as configured
    agent: AgentSpec
    #: what the agent said about itself in ``initialize``
    agent_info: t.Implementation | None
    #: the session the turn ran in
    session_id: str
    #: the turn's result
    turn: TurnResult
    #: wall-clock seconds from start to the end of the turn
    wall_seconds: float
    #: the files the agent changed in its branch, as a run's :attr:`RunOutcome.changes`
    changes: tuple[FileChange, ...] = ()
    #: (path, target) of the changed paths that are symbolic links after the change (also
    #: each such change's ``symlink``)
    symlinks: tuple[tuple[str, str], ...] = ()
    #: the unified diff of those changes
    diff: str = ""
    #: whether the changes were written to the workspace (``apply=True`` and no conflict)
    applied: bool = False
    #: files the agent changed that changed in the workspace during the run too (asked to apply
    #: or not), so the changes were not applied; they are kept in the run store (``orchestrator
    #: apply RUN`` once the workspace is settled)
    workspace_changed: tuple[str, ...] = ()
    #: changed files that ``changes.patch`` leaves out: they changed in the workspace before the
    #: run kept their content, so there is no base to patch (the run store keeps their changes)
    patch_left_out: tuple[str, ...] = ()
    #: the run's directory in the state directory (it keeps ``changes.patch``)
    run_dir: str = ""
    #: the run's status: succeeded, failed, conflicts or interrupted
    status: str = "succeeded"
    #: the command line's exit code for this run (see the README)
    exit_code: int = 0
    #: what confined the agent (Landlock ABI, rights, rules), or None when it ran unconfined
    sandbox: Mapping[str, Any] | None = None
    #: what the run store left out of the turn's text and tool calls, as its step's ``cut``
    #: (see :func:`~orchestrator.pipeline.results.cut_turn`); None when it kept them whole.
    #: :meth:`to_json` gives them as stored, :attr:`turn` whole
    cut: Mapping[str, Any] | None = None
    #: the permission requests rejected because no policy was given (its ``message`` says so,
    #: for people); none when a policy was given
    default_rejections: DefaultRejections = field(factory=DefaultRejections)
    #: the model the session ran (chosen, or the agent's default when it reports one)
    model: str | None = None
    #: the ids of the agent quirks its ``initialize`` matched (see the README's agent quirks)
    quirks: tuple[str, ...] = ()
    #: the session mode it ran in, if the agent has modes
    mode: str | None = None
    #: the agent asked for permissions, every one was refused, and it changed nothing: the turn
    #: may have ended well, but did none of its work (see :attr:`warnings`)
    did_nothing: bool = False
    #: what a caller should know although the run did not fail, one sentence each
    warnings: tuple[str, ...] = ()
    #: why the run failed, for people (as its step's ``error``); None when it did not
    error: str | None = None
    #: what kind of failure it was (``agent-start``, ``agent-exited``, ``timeout``, ...: see
    #: :data:`~orchestrator.errors.ErrorKind`), as its step's ``error_kind``; None when it did
    #: not fail
    error_kind: str | None = None
    #: the exception that failed the turn (an agent that could not start, exited, answered an
    #: error, ...), None when none did: the turn is then empty
    exception: Exception | None = field(default=None, eq=False, repr=False)

    @property
    def permissions(self) -> list[PermissionRecord]:
        """The permission decisions of the turn, in order."""
        return self.turn.permissions

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object of ``orchestrator prompt``: the turn as the run store keeps it."""
        info = self.agent_info
        text, calls, _ = cut_turn(
            self.turn.text,
            [c.to_json() for c in self.turn.tool_calls.values()],
            self.cut["limit"] if self.cut else None,
        )
        return {
            "kind": "prompt",
            "runId": self.run_id,
            "status": self.status,
            "sessionId": self.session_id,
            "agent": {
                "name": self.agent.name,
                "version": info.version if info else None,
                "reportedName": info.name if info else None,
                "quirks": list(self.quirks),
            },
            "model": self.model,
            "mode": self.mode,
            "stopReason": self.turn.stop_reason,
            "text": text,
            "toolCalls": calls,
            "cut": dict(self.cut) if self.cut else None,
            "permissions": [
                {
                    "toolCallId": p.tool_call_id,
                    "kind": p.kind,
                    "title": p.title,
                    "verdict": p.verdict,
                    "optionId": p.option_id,
                    "rule": p.rule,
                }
                for p in self.turn.permissions
            ],
            "notices": self.turn.notices_json(),
            "usage": self.turn.usage_json(),
            "changes": [c.to_json() for c in self.changes],
            "diff": self.diff,
            "applied": self.applied,
            "workspaceChanged": display_names(self.workspace_changed),
            "patch": os.path.join(self.run_dir, "changes.patch") if self.changes else None,
            "patchLeftOut": display_names(self.patch_left_out),
            "wallSeconds": round(self.wall_seconds, 3),
            "sandbox": dict(self.sandbox) if self.sandbox is not None else None,
            "defaultRejections": self.default_rejections.to_json(),
            "didNothing": self.did_nothing,
            "warnings": list(self.warnings),
            "error": self.error,
            "errorKind": self.error_kind,
        }


def prompt_pipeline(
    agent: str,
    timeout: float | None,
    idle_timeout: float | None,
    model: str | None = None,
    mode: str | None = None,
) -> Pipeline:
    """A prompt as a run: one agent step, named ``prompt``, whose prompt is the input ``text``."""

    def prompt(text: str) -> str:
        return text

    made: Step = step_decorator(
        agent=agent, timeout=timeout, idle_timeout=idle_timeout, model=model, mode=mode
    )(prompt)
    return Pipeline.from_steps([made], name="prompt")


def _implementation(info: Mapping[str, Any] | None) -> t.Implementation | None:
    if not info:
        return None
    return t.Implementation(
        name=str(info.get("name") or ""), version=str(info.get("version") or "")
    )


def _prompt_run(outcome: RunOutcome, last: Any, spec: AgentSpec, wall_seconds: float) -> PromptRun:
    """The prompt's result, from the run's one step instance (its typed turn kept); a turn that
    failed before it ended (the agent did not start, exited, answered an error) gives an empty
    one, the run failed with the step's error."""
    result = outcome.result
    step = outcome.steps.get("prompt")
    error = step.error if step is not None else None
    kind = step.error_kind if step is not None else None
    if not isinstance(last, StepResult) or last.turn is None:
        if not isinstance(last, Exception):
            raise OrchestratorError(f"run {outcome.run_id}: the prompt's turn left no result")
        return PromptRun(
            run_id=outcome.run_id,
            agent=spec,
            agent_info=None,
            session_id="",
            turn=TurnAccumulator().result(None),
            wall_seconds=wall_seconds,
            run_dir=outcome.run_dir,
            status=outcome.status,
            exit_code=outcome.exit_code,
            sandbox=result.get("sandbox"),
            default_rejections=DefaultRejections.from_json(result.get("defaultRejections")),
            error=error,
            error_kind=kind,
            exception=last,
        )
    _, symlinks = changes_from_json(result.get("changes"))
    stored = (result.get("steps") or {}).get("prompt", {}).get("instances", {}).get("prompt")
    unapplied = tuple(parse_name(p) for p in result.get("workspaceChanged") or ())
    return PromptRun(
        run_id=outcome.run_id,
        agent=spec,
        agent_info=_implementation(last.agent_info),
        quirks=last.quirks,
        session_id=last.session_id or "",
        turn=last.turn,
        wall_seconds=wall_seconds,
        changes=outcome.changes,
        symlinks=symlinks,
        diff=str(result.get("diff") or ""),
        applied=bool(result.get("applied")),
        workspace_changed=unapplied,
        patch_left_out=tuple(parse_name(p) for p in result.get("patchLeftOut") or ()),
        run_dir=outcome.run_dir,
        status=outcome.status,
        exit_code=outcome.exit_code,
        sandbox=result.get("sandbox"),
        cut=(stored or {}).get("cut"),
        default_rejections=DefaultRejections.from_json(result.get("defaultRejections")),
        model=last.model,
        mode=last.mode,
        did_nothing=outcome.did_nothing,
        warnings=outcome.warnings,
        error=error,
        error_kind=kind,
    )


def prompt_result(outcome: RunOutcome, spec: AgentSpec, wall_seconds: float) -> dict[str, Any]:
    """A prompt run's ``--json`` object: the run's, with the prompt's fields when its turn ran
    (a resumed prompt reads like a prompt; one that never got a turn, like a one-step run)."""
    last = outcome.outcomes.get("prompt", {}).get(None)
    if not isinstance(last, StepResult) or last.turn is None:
        return dict(outcome.result)
    return _as_prompt(outcome, _prompt_run(outcome, last, spec, wall_seconds))


#: what a one-step run's object holds that a prompt's does not (its step holds the turn again)
_RUN_ONLY = frozenset({"steps", "graph", "inputs", "pipeline", "name"})


def _as_prompt(outcome: RunOutcome, run: PromptRun) -> dict[str, Any]:
    """The run's object as a prompt's: the prompt's fields, without the one-step run's."""
    shared = {k: v for k, v in outcome.result.items() if k not in _RUN_ONLY}
    return {**shared, **run.to_json()}


async def prompt(
    agent: str | AgentSpec,
    text: str,
    *,
    cwd: str | os.PathLike[str] = ".",
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    apply: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
    config: Config | None = None,
    sandbox: SandboxChoice = None,
    max_file_size: int | str | None = None,
    model: str | None = None,
    mode: str | None = None,
    connector: Connector | None = None,
    mcp_servers: Sequence[McpServer | str] = (),
    record_transcripts: bool = True,
) -> PromptRun:
    """Run one turn of ``agent`` with ``text`` on a branch of ``cwd``: a one-step run.

    ``text`` is the prompt: text, or (as for a session's prompt) a content block or a list of
    texts and blocks; anything else is a :class:`~orchestrator.errors.UsageError`, raised
    before anything is recorded or started.

    The agent is resolved through the config (``config``, else the user's and ``cwd``'s
    ``.orchestrator.toml`` over the built-in table), started through the supervisor, and works
    in its own copy of the workspace (a VFS branch materialized under the state directory):
    what it writes through ``fs/*``, on disk itself or with terminal commands is harvested into
    the branch. The run is recorded in the run store before anything is applied; the workspace
    is written only when ``apply`` is true, all or nothing, and only if the touched files did
    not change meanwhile (else the changes stay recorded: ``workspace_changed`` lists the files,
    and :func:`~orchestrator.runs.apply_run` applies them later). The changes are also kept as
    a git-applicable ``changes.patch`` in the run directory.

    Permission requests are answered by ``policy`` (a preset name, a TOML file or a
    :class:`PolicySet`; default: reject everything), with ``escalate`` called for ``ask``
    verdicts. The agent gets real terminals (in its branch directory) whose commands the same
    policy vets. Passing ``services`` replaces the permission, terminal and elicitation services
    (the fs service of the branch is always installed). If the agent cannot be started or its
    turn fails (it exits, answers an error, asks to authenticate, times out), the run is
    recorded failed and returned so: ``error`` and ``error_kind`` say why (as a pipeline step's),
    ``exception`` holds the error, the turn is empty when it never ended. A file changed to
    more than ``max_file_size`` bytes (default: the config's, else 100 MiB) fails the run,
    naming the file (see :func:`~orchestrator.runs.run_pipeline`).

    ``sandbox`` (``True`` or :class:`~orchestrator.sandbox.Sandbox` rules) runs the agent and
    its terminal commands confined by Landlock (see :func:`~orchestrator.runs.run_pipeline`).

    The agent's wire transcript is kept in the run store, as every run's is (a replay plays
    it): ``record_transcripts=False`` declines that, unless ``transcript`` names a file, which
    gets its lines appended as they come as well.

    ``model`` and ``mode`` are set in the session before the turn: the model through the
    agent's config option of category ``model`` (by value or name), the mode through its
    ``mode`` option or ``session/set_mode``. One the agent does not offer fails the run,
    recorded, its ``exception`` a :class:`~orchestrator.errors.NotOffered` naming those it
    does. ``agent`` may name its model itself (``"claude:sonnet"``); another ``model`` as well
    is a :class:`~orchestrator.errors.UsageError`. The result's ``model`` and ``mode`` say
    what the session ran.

    ``mcp_servers`` are MCP servers the agent's session gets (see
    :func:`~orchestrator.runs.run_pipeline`); one of a kind the agent cannot take fails the
    run before the session starts (:class:`~orchestrator.errors.McpServerUnsupported`).

    ``connector`` starts the agent instead of a subprocess (as for
    :func:`~orchestrator.runs.run_pipeline`), e.g.
    :class:`~orchestrator.testing.connector.InProcessAgents` in tests: its command is then not
    looked for.
    """
    check_trio_face("prompt")  # before anything starts
    check_prompt(text)  # bad usage: refused before anything is recorded or started
    root = workspace_root(cwd)
    cfg = (
        config
        if config is not None
        else await trio.to_thread.run_sync(
            functools.partial(Config.load, root, state_dir=state_dir)
        )
    )
    spec = cfg.resolve_agent(agent) if isinstance(agent, str) else agent
    if model is not None and spec.model is not None and model != spec.model:
        raise UsageError(f"agent {spec.name} runs model {spec.model!r}: it cannot run {model!r}")
    spec = spec.resolved(os.getcwd())  # the agent runs elsewhere: its branch directory
    if connector is None:  # as every run checks its agents: before anything starts
        launchable(spec)
    cfg = cfg.with_agents({spec.name: spec})
    started = time.monotonic()
    made: list[PromptRun] = []

    def finish(outcome: RunOutcome) -> Mapping[str, Any]:
        last = outcome.outcomes.get("prompt", {}).get(None)
        run = _prompt_run(outcome, last, spec, time.monotonic() - started)
        made.append(run)
        # a prompt whose turn never ended reads like the one-step run it is, its step's error
        # there (as when resumed: see prompt_result)
        return dict(outcome.result) if run.exception is not None else _as_prompt(outcome, run)

    await run_pipeline(
        prompt_pipeline(spec.name, timeout, idle_timeout, model, mode),
        {"text": text},
        cwd=root,
        policy=policy,
        escalate=escalate,
        config=cfg,
        apply=apply,
        on_event=on_event,
        on_update=on_update,
        state_dir=state_dir,
        transcript=transcript,
        options=options,
        services=services,
        sandbox=sandbox,
        mcp_servers=mcp_servers,
        max_file_size=max_file_size,
        connector=connector,
        # a prompt keeps its turn, audit, changes and wire transcript, as every run does (what
        # a replay of it plays); a caller may decline the transcript, unless it names a file
        record_transcripts=record_transcripts,
        _kind="prompt",
        # recorded before the run starts, so an interrupted prompt can be resumed
        _extra_options={
            "prompt": {
                "agent": spec.name,
                "timeout": timeout,
                "idleTimeout": idle_timeout,
                "model": model,
                "mode": mode,
            }
        },
        _finish_result=finish,
    )
    return made[0]
