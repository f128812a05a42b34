"""Comparisons: the same task to several agents at once, each in its own branch, side by side."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._log import get_logger
from .._names import display_names
from ..agent.client import ClientOptions
from ..agent.permissions import Escalate
from ..agent.services import ClientServices
from ..agents import AgentSpec
from ..cluster._connect import ClusterSpec
from ..config import Config
from ..errors import UsageError
from ..mcp import McpServer
from ..pipeline import Pipeline, Step
from ..pipeline import step as step_decorator
from ..pipeline.results import RunEvent
from ..pipeline.runner import AgentPool
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import SandboxChoice
from ..state import state_directory
from ..store import open_run_store
from ..supervisor import Connector
from ._face import check_trio_face
from .apply import apply_run
from .run import RunOutcome, run_pipeline, workspace_root

log = get_logger(__name__)

__all__ = ["compare"]


def _compare_config(
    cwd: str,
    names: Sequence[str],
    commands: Mapping[str, Any],
    *,
    state_dir: str | os.PathLike[str] | None = None,
) -> Config:
    """The agent table of a recorded comparison: each label with the command it ran."""
    base = Config.load(cwd, state_dir=state_dir)
    ran: dict[str, AgentSpec] = {}
    for name in names:
        argv = tuple(commands.get(name) or ())
        known = base.agents.get(name)
        if known is not None and (not argv or known.command == argv):
            continue
        if not argv:
            raise UsageError(f"the comparison does not record how to start agent {name!r}")
        ran[name] = attrs.evolve(known, command=argv) if known else AgentSpec(name, argv)
    return base.with_agents(ran)


def _compare_pipeline(
    task: str,
    agents: Sequence[str],
    timeout: float | None = None,
    idle_timeout: float | None = None,
    model: str | None = None,
    mode: str | None = None,
    verify: str | None = None,
    rounds: int = 1,
) -> Pipeline:
    def compare(task: str) -> str:
        return task

    made: Step = step_decorator(
        agent=list(agents),
        timeout=timeout,
        idle_timeout=idle_timeout,
        model=model,
        mode=mode,
        # more than one round: the verify command is each round's check, its output the
        # next round's feedback; one round is the verify command alone, run after the turn
        check=verify if rounds > 1 else None,
        rounds=rounds,
    )(compare)
    # one agent or many, each instance is named after its agent (compare[NAME])
    return Pipeline.from_steps([attrs.evolve(made, keyed_by_agent=True)], name="compare")


async def compare(
    agents: Sequence[str | AgentSpec],
    task: str,
    *,
    verify: str | None = None,
    rounds: int = 1,
    apply: str | None = None,
    config: Config | None = None,
    cwd: str | os.PathLike[str] = ".",
    timeout: float | None = None,
    idle_timeout: float | None = None,
    model: str | None = None,
    mode: str | None = None,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    max_sessions: int | None = None,
    max_file_size: int | str | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    transcript: str | os.PathLike[str] | None = None,
    connector: Connector | None = None,
    pool: AgentPool | None = None,
    options: ClientOptions | None = None,
    services: ClientServices | None = None,
    record_transcripts: bool = True,
    sandbox: SandboxChoice = None,
    mcp_servers: Sequence[McpServer | str] = (),
    cluster: str | ClusterSpec | None = None,
) -> RunOutcome:
    """The same task to each agent at once, each in its own branch; side by side.

    ``verify`` is a shell command run in each agent's branch directory after its turn: an
    agent succeeds when its turn ends ``end_turn`` and the command exits 0 (an empty or blank
    command is a :class:`~orchestrator.errors.UsageError`). With ``rounds`` above 1 each
    agent gets up to that many rounds in its session: while the command fails, the agent is
    prompted again with its output (as a pipeline step's ``check=`` with ``rounds=``), and
    each agent's ``rounds`` lists them, its ``verify`` being the last one's; ``rounds`` 1 (the
    default) runs the command once after the turn, without feedback. The comparison
    succeeds when at least one agent did; its result names them (``succeeded``) and the
    ``winner`` (see :mod:`orchestrator.runs.verdict`). ``apply`` names the agent whose
    changes to write to the workspace, if that agent succeeded (else the status is failed).
    The other keyword arguments are :func:`~orchestrator.runs.run_pipeline`'s (``policy``,
    ``sandbox``, ``mcp_servers``, ``state_dir``, ``cluster``, ...); under a sandbox the verify
    command runs confined too.

    One agent on several models: ``["claude:sonnet", "claude:opus"]`` (``NAME:MODEL`` of a
    known agent, see :func:`~orchestrator.agents.resolve_agent`), labelled apart, each model
    set through the agent's ``model`` config option. ``model`` is the model of the agents
    that name none, ``mode`` the session mode of every agent. A model or mode an agent does
    not offer fails that agent like any failure (its entry ``failed``, its ``error`` the
    :class:`~orchestrator.errors.NotOffered` message naming what it offers); the others run.
    """
    check_trio_face("compare")  # before anything starts
    if len(agents) < 1:
        raise UsageError("compare needs at least one agent")
    if verify is not None and not verify.strip():  # else no check would run, yet all pass
        raise UsageError("the verify command is empty")
    if not isinstance(rounds, int) or isinstance(rounds, bool):
        raise TypeError(f"rounds must be an int, not {type(rounds).__name__}")
    if rounds < 1:
        raise UsageError(f"rounds must be 1 or more, not {rounds}")
    if rounds > 1 and verify is None:
        raise UsageError("rounds need a verify command: it is the check each round runs")
    root = workspace_root(cwd)
    cfg = config if config is not None else Config.load(root, state_dir=state_dir)
    specs = cfg.resolve_agents(agents, base=os.getcwd())
    names = [s.name for s in specs]
    for i, name in enumerate(names):
        if name in names[:i]:
            first = agents[names.index(name)]
            raise UsageError(
                f"{_agent_text(first)!r} and {_agent_text(agents[i])!r} are the same agent"
                f" ({name}); label them with NAME=COMMAND to compare it with itself"
            )
    # the comparison's step names its agents by label: the table maps each to its spec
    cfg = cfg.with_agents({s.name: s for s in specs})
    if apply is not None and apply not in names:
        raise UsageError(f"apply {apply!r}: not one of the agents ({', '.join(names)})")
    pipe = _compare_pipeline(task, names, timeout, idle_timeout, model, mode, verify, rounds)
    # recorded before the run starts, so an interrupted comparison can be resumed
    info = {
        "task": task,
        "agents": names,
        "commands": {s.name: list(s.command) for s in specs},
        "timeout": timeout,
        "idle_timeout": idle_timeout,
        "model": model,
        "mode": mode,
        "rounds": rounds,
    }
    outcome = await run_pipeline(
        pipe,
        {"task": task},
        cwd=root,
        config=cfg,
        verify={"compare": verify} if verify else None,
        _kind="compare",
        _extra_options={"compare": info},
        policy=policy,
        escalate=escalate,
        max_sessions=max_sessions,
        max_file_size=max_file_size,
        on_event=on_event,
        on_update=on_update,
        state_dir=state_dir,
        transcript=transcript,
        connector=connector,
        pool=pool,
        options=options,
        services=services,
        record_transcripts=record_transcripts,
        sandbox=sandbox,
        mcp_servers=mcp_servers,
        cluster=cluster,
    )
    if apply is not None and outcome.status == "succeeded":
        if apply not in outcome.result.get("succeeded", ()):
            # only work that passed is written on the way; a failed agent's branch stays in
            # the store, for a deliberate apply_run(..., step="compare[NAME]")
            log.warning("not applied: the agent did not succeed", agent=apply)
            result = {**outcome.result, "applied": None}
            return attrs.evolve(outcome, status="failed", result=result)
        # past the run's point of no return (its verdict is recorded): the apply asked for
        # goes through, however late a cancel comes, as for a pipeline's apply
        with trio.CancelScope(shield=True):
            applied = await apply_run(outcome.run_id, step=f"compare[{apply}]", state_dir=state_dir)
        changed = applied.workspace_changed
        entries = [
            {**a, "applied": applied.applied, "workspaceChanged": display_names(changed)}
            if a.get("name") == apply
            else a
            for a in outcome.result.get("agents") or ()
        ]
        result = {
            **outcome.result,
            "agents": entries,
            "applied": apply if applied.applied else None,
            "workspaceChanged": display_names(changed),
        }
        # kept as the run's object, as run_pipeline keeps it: get_run_json gives it back
        with trio.CancelScope(shield=True):
            async with open_run_store(state_directory(state_dir)) as store:
                await store.update_run(outcome.run_id, result=result)
        return attrs.evolve(outcome, result=result, workspace_changed=changed, apply_asked=True)
    return outcome


def _agent_text(agent: str | AgentSpec) -> str:
    return agent if isinstance(agent, str) else agent.name
