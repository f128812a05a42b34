"""Test helpers for ACP clients: a scripted ACP agent, in memory or as a subprocess.

Build an :class:`AgentScript` (the format is documented in
:mod:`orchestrator.testing.script`), then either serve it over a stream with
:func:`serve_scripted_agent` or launch it with the command from
:func:`scripted_agent_command`. The agent's :class:`AgentRecord` tells what your client
sent (see :mod:`orchestrator.testing.scripted_agent`).

To test your own pipelines: :class:`InProcessAgents` serves the demo agent and scripted
agents in your test's process (pass it as ``connector=``), :class:`TempProjects` makes
projects, :func:`assert_replays` replays a recorded run (:mod:`orchestrator.testing.replay`),
and :mod:`orchestrator.testing.pytest_plugin` hands both out as pytest fixtures,
with a state directory of the test's own.

:mod:`orchestrator.testing.hostile` is a catalogue of hostile agents (:data:`ATTACKS`) and
:func:`probe_policy`, which runs them against your policy and says which held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.testing.script import (
    ALLOW_REJECT,
    AgentScript,
    AskPermission,
    AuthMethod,
    Capabilities,
    ConfigOption,
    ConfigValue,
    Crash,
    DeleteDisk,
    ErrorReply,
    ExitAtStart,
    Flood,
    FloodRequests,
    HugeLine,
    Location,
    Mode,
    Notify,
    PermissionOption,
    PermissionToolCall,
    Plan,
    PlanEntry,
    PromptPredicate,
    Raw,
    ReadFile,
    Replace,
    Request,
    Say,
    Sleep,
    Spawn,
    Stall,
    Step,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Turn,
    Update,
    Usage,
    UserMessage,
    WriteDisk,
    WriteFile,
    diff_content,
    terminal_content,
    text_content,
)

if TYPE_CHECKING:
    from orchestrator.testing.connector import InProcessAgents
    from orchestrator.testing.hostile import (
        ATTACKS,
        Attack,
        AttackResult,
        probe_policy,
        probe_policy_sync,
    )
    from orchestrator.testing.project import TempProjects
    from orchestrator.testing.replay import ReplayAgents, assert_replays, replay_connector
    from orchestrator.testing.scripted_agent import (
        AgentRecord,
        scripted_agent_command,
        serve_scripted_agent,
    )

__all__ = [
    "ALLOW_REJECT",
    "ATTACKS",
    "AgentRecord",
    "AgentScript",
    "AskPermission",
    "Attack",
    "AttackResult",
    "AuthMethod",
    "Capabilities",
    "ConfigOption",
    "ConfigValue",
    "Crash",
    "DeleteDisk",
    "ErrorReply",
    "ExitAtStart",
    "Flood",
    "FloodRequests",
    "HugeLine",
    "InProcessAgents",
    "Location",
    "Mode",
    "Notify",
    "PermissionOption",
    "PermissionToolCall",
    "Plan",
    "PlanEntry",
    "PromptPredicate",
    "Raw",
    "ReadFile",
    "Replace",
    "ReplayAgents",
    "Request",
    "Say",
    "Sleep",
    "Spawn",
    "Stall",
    "Step",
    "TempProjects",
    "Terminal",
    "Think",
    "ToolCall",
    "ToolUpdate",
    "Turn",
    "Update",
    "Usage",
    "UserMessage",
    "WriteDisk",
    "WriteFile",
    "assert_replays",
    "diff_content",
    "probe_policy",
    "probe_policy_sync",
    "replay_connector",
    "scripted_agent_command",
    "serve_scripted_agent",
    "terminal_content",
    "text_content",
]

_AGENT_NAMES = frozenset({"AgentRecord", "scripted_agent_command", "serve_scripted_agent"})
_LAZY = {
    "InProcessAgents": "connector",
    "TempProjects": "project",
    "ReplayAgents": "replay",
    "assert_replays": "replay",
    "replay_connector": "replay",
}
_HOSTILE_NAMES = frozenset(
    {"ATTACKS", "Attack", "AttackResult", "probe_policy", "probe_policy_sync"}
)


def __getattr__(name: str) -> Any:
    # Imported lazily: `python -m orchestrator.testing.scripted_agent` imports this package
    # first, and an eager import would make runpy warn about running a loaded module.
    if name in _AGENT_NAMES:
        from orchestrator.testing import scripted_agent

        return getattr(scripted_agent, name)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _HOSTILE_NAMES:
        from orchestrator.testing import hostile

        return getattr(hostile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
