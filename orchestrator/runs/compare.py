"""Comparisons: the same task to several agents at once, each in its own branch, side by side."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog
import trio

from ..agents import AgentSpec
from ..config import Config
from ..errors import UsageError
from ..pipeline import Pipeline, Step
from ..pipeline import step as step_decorator
from .apply import apply_run
from .run import RunOutcome, _agents, run_pipeline

log = structlog.get_logger(__name__)

__all__ = ["compare", "compare_sync"]


def _compare_config(cwd: str, names: Sequence[str], commands: Mapping[str, Any]) -> Config:
    """The agent table of a recorded comparison: each label with the command it ran."""
    base = Config.load(cwd)
    table = dict(base.agents)
    for name in names:
        argv = tuple(commands.get(name) or ())
        known = table.get(name)
        if known is not None and (not argv or known.command == argv):
            continue
        if not argv:
            raise UsageError(f"the comparison does not record how to start agent {name!r}")
        table[name] = attrs.evolve(known, command=argv) if known else AgentSpec(name, argv)
    return Config(agents=table, max_sessions=base.max_sessions, sources=base.sources)


def _compare_pipeline(
    task: str,
    agents: Sequence[str],
    timeout: float | None = None,
    idle_timeout: float | None = None,
) -> Pipeline:
    def compare(task: str) -> str:
        return task

    made: Step = step_decorator(agent=list(agents), timeout=timeout, idle_timeout=idle_timeout)(
        compare
    )
    return Pipeline.from_steps([made], name="compare")


async def compare(
    agents: Sequence[str | AgentSpec],
    task: str,
    *,
    verify: str | None = None,
    apply: str | None = None,
    config: Config | None = None,
    cwd: str | os.PathLike[str] = ".",
    timeout: float | None = None,
    idle_timeout: float | None = None,
    **kwargs: Any,
) -> RunOutcome:
    """The same task to each agent at once, each in its own branch; side by side.

    ``verify`` is a shell command run in each agent's branch directory after its turn.
    ``apply`` names the agent whose changes to write to the workspace.
    """
    if len(agents) < 1:
        raise UsageError("compare needs at least one --agent")
    root = Path(cwd).absolute()
    cfg = _agents(config, root)
    specs = [cfg.resolve_agent(a) if isinstance(a, str) else a for a in agents]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError(
            f"two agents share a name ({', '.join(names)}): label them with NAME=COMMAND"
        )
    table = dict(cfg.agents)
    table.update({s.name: s.resolved(os.getcwd()) for s in specs})
    cfg = Config(agents=table, max_sessions=cfg.max_sessions, sources=cfg.sources)
    if apply is not None and apply not in names:
        raise UsageError(f"--apply {apply}: not one of the agents ({', '.join(names)})")
    pipe = _compare_pipeline(task, names, timeout, idle_timeout)
    # recorded before the run starts, so an interrupted comparison can be resumed
    info = {
        "task": task,
        "agents": names,
        "commands": {s.name: list(table[s.name].command) for s in specs},
        "timeout": timeout,
        "idle_timeout": idle_timeout,
    }
    outcome = await run_pipeline(
        pipe,
        {"task": task},
        cwd=root,
        config=cfg,
        verify={"compare": verify} if verify else None,
        _kind="compare",
        _extra_options={"compare": info},
        **kwargs,
    )
    state_dir = kwargs.get("state_dir")
    if apply is not None and outcome.status == "succeeded":
        applied = await apply_run(outcome.run_id, step=f"compare[{apply}]", state_dir=state_dir)
        changed = applied.workspace_changed
        result = {
            **outcome.result,
            "applied": apply if applied.applied else None,
            "workspaceChanged": list(changed),
        }
        return RunOutcome(outcome.run_id, outcome.status, result, outcome.run_dir, changed)
    return outcome


def compare_sync(agents: Sequence[str | AgentSpec], task: str, **kwargs: Any) -> RunOutcome:
    """:func:`compare` for scripts: runs its own trio loop."""
    return trio.run(lambda: compare(agents, task, **kwargs))
