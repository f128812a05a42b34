"""acp-orchestrator: run many ACP coding agents at once, as their client.

The public API is listed in ``__all__`` and pinned by ``tests/test_public_api.py``; everything
else is internal and may change. The run functions are trio's (``prompt``); their twins for
scripts and threads (``prompt_sync``) live in :mod:`orchestrator.sync`, those for asyncio in
:mod:`orchestrator.aio` (``await orchestrator.aio.prompt(...)``). Test helpers (a scripted ACP
agent) live in :mod:`orchestrator.testing`; the generated protocol types in
:mod:`orchestrator.protocol.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

from . import _startup

_startup.install()

# Names resolved on first use, so `import orchestrator` (and `orchestrator --help`) stays fast.
_EXPORTS: dict[str, str] = {
    "AcpSession": "orchestrator.agent.client",
    "AgentConnection": "orchestrator.agent.client",
    "ClientOptions": "orchestrator.agent.client",
    "Turn": "orchestrator.agent.client",
    "open_agent": "orchestrator.agent.client",
    "open_agent_on_stream": "orchestrator.agent.client",
    "ClientServices": "orchestrator.agent.services",
    "PermissionDecision": "orchestrator.agent.services",
    "PermissionRecord": "orchestrator.agent.services",
    "SessionContext": "orchestrator.agent.services",
    "TranscriptWriter": "orchestrator.agent.transcript",
    "ToolCallState": "orchestrator.agent.turn",
    "TurnResult": "orchestrator.agent.turn",
    "AgentSpec": "orchestrator.agents",
    "resolve_agent": "orchestrator.agents",
    "PromptRun": "orchestrator.runs",
    "prompt": "orchestrator.runs",
    "Config": "orchestrator.config",
    "AgentInput": "orchestrator.pipeline",
    "Budget": "orchestrator.pipeline",
    "ClusterSpec": "orchestrator.cluster",
    "Rate": "orchestrator.cluster",
    "Pipeline": "orchestrator.pipeline",
    "Step": "orchestrator.pipeline",
    "agent_input": "orchestrator.pipeline",
    "agents_input": "orchestrator.pipeline",
    "load_pipeline": "orchestrator.pipeline",
    "step": "orchestrator.pipeline",
    "Results": "orchestrator.pipeline.results",
    "RunEvent": "orchestrator.pipeline.results",
    "StepContext": "orchestrator.pipeline.results",
    "StepResult": "orchestrator.pipeline.results",
    "render_report": "orchestrator.report",
    "Sandbox": "orchestrator.sandbox",
    "McpServer": "orchestrator.mcp",
    "ApplyOutcome": "orchestrator.runs",
    "RunOutcome": "orchestrator.runs",
    "AgentIdentity": "orchestrator.runs",
    "AgentOutcome": "orchestrator.runs",
    "FileChange": "orchestrator.runs",
    "InstanceOutcome": "orchestrator.runs",
    "PermissionEntry": "orchestrator.runs",
    "StepOutcome": "orchestrator.runs",
    "ToolCallEntry": "orchestrator.runs",
    "VerifyEntry": "orchestrator.runs",
    "Verdict": "orchestrator.runs",
    "apply_run": "orchestrator.runs",
    "compare": "orchestrator.runs",
    "diff_run": "orchestrator.runs",
    "get_run_json": "orchestrator.runs",
    "list_runs": "orchestrator.runs",
    "resume_run": "orchestrator.runs",
    "replay_run": "orchestrator.runs",
    "PruneOutcome": "orchestrator.runs",
    "BatchOutcome": "orchestrator.runs",
    "RepoOutcome": "orchestrator.runs",
    "batch": "orchestrator.runs",
    "resume_batch": "orchestrator.runs",
    "prune": "orchestrator.runs",
    "run_pipeline": "orchestrator.runs",
    "RunStore": "orchestrator.store",
    "open_run_store": "orchestrator.store",
    "Limits": "orchestrator.supervisor",
    "Supervisor": "orchestrator.supervisor",
    "open_supervisor": "orchestrator.supervisor",
    "errors": "orchestrator.errors",
    "aio": "orchestrator.aio",
    "CancelToken": "orchestrator.sync",
    "apply_run_sync": "orchestrator.sync",
    "batch_sync": "orchestrator.sync",
    "resume_batch_sync": "orchestrator.sync",
    "compare_sync": "orchestrator.sync",
    "diff_run_sync": "orchestrator.sync",
    "get_run_json_sync": "orchestrator.sync",
    "list_runs_sync": "orchestrator.sync",
    "prompt_sync": "orchestrator.sync",
    "prune_sync": "orchestrator.sync",
    "resume_run_sync": "orchestrator.sync",
    "replay_run_sync": "orchestrator.sync",
    "run_pipeline_sync": "orchestrator.sync",
}
# the names above that are modules
_MODULES = {"aio", "errors"}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:
    from . import aio as aio
    from . import errors as errors
    from .agent.client import (
        AcpSession as AcpSession,
    )
    from .agent.client import (
        AgentConnection as AgentConnection,
    )
    from .agent.client import (
        ClientOptions as ClientOptions,
    )
    from .agent.client import (
        Turn as Turn,
    )
    from .agent.client import (
        open_agent as open_agent,
    )
    from .agent.client import (
        open_agent_on_stream as open_agent_on_stream,
    )
    from .agent.services import (
        ClientServices as ClientServices,
    )
    from .agent.services import (
        PermissionDecision as PermissionDecision,
    )
    from .agent.services import (
        PermissionRecord as PermissionRecord,
    )
    from .agent.services import (
        SessionContext as SessionContext,
    )
    from .agent.transcript import TranscriptWriter as TranscriptWriter
    from .agent.turn import ToolCallState as ToolCallState
    from .agent.turn import TurnResult as TurnResult
    from .agents import AgentSpec as AgentSpec
    from .agents import resolve_agent as resolve_agent
    from .cluster import ClusterSpec as ClusterSpec
    from .cluster import Rate as Rate
    from .config import Config as Config
    from .mcp import McpServer as McpServer
    from .pipeline import AgentInput as AgentInput
    from .pipeline import Budget as Budget
    from .pipeline import Pipeline as Pipeline
    from .pipeline import Step as Step
    from .pipeline import agent_input as agent_input
    from .pipeline import agents_input as agents_input
    from .pipeline import load_pipeline as load_pipeline
    from .pipeline import step as step
    from .pipeline.results import Results as Results
    from .pipeline.results import RunEvent as RunEvent
    from .pipeline.results import StepContext as StepContext
    from .pipeline.results import StepResult as StepResult
    from .report import render_report as render_report
    from .runs import AgentIdentity as AgentIdentity
    from .runs import AgentOutcome as AgentOutcome
    from .runs import ApplyOutcome as ApplyOutcome
    from .runs import BatchOutcome as BatchOutcome
    from .runs import FileChange as FileChange
    from .runs import InstanceOutcome as InstanceOutcome
    from .runs import PermissionEntry as PermissionEntry
    from .runs import PromptRun as PromptRun
    from .runs import PruneOutcome as PruneOutcome
    from .runs import RepoOutcome as RepoOutcome
    from .runs import RunOutcome as RunOutcome
    from .runs import StepOutcome as StepOutcome
    from .runs import ToolCallEntry as ToolCallEntry
    from .runs import Verdict as Verdict
    from .runs import VerifyEntry as VerifyEntry
    from .runs import apply_run as apply_run
    from .runs import batch as batch
    from .runs import compare as compare
    from .runs import diff_run as diff_run
    from .runs import get_run_json as get_run_json
    from .runs import list_runs as list_runs
    from .runs import prompt as prompt
    from .runs import prune as prune
    from .runs import replay_run as replay_run
    from .runs import resume_batch as resume_batch
    from .runs import resume_run as resume_run
    from .runs import run_pipeline as run_pipeline
    from .sandbox import Sandbox as Sandbox
    from .store import RunStore as RunStore
    from .store import open_run_store as open_run_store
    from .supervisor import Limits as Limits
    from .supervisor import Supervisor as Supervisor
    from .supervisor import open_supervisor as open_supervisor
    from .sync import CancelToken as CancelToken
    from .sync import apply_run_sync as apply_run_sync
    from .sync import batch_sync as batch_sync
    from .sync import compare_sync as compare_sync
    from .sync import diff_run_sync as diff_run_sync
    from .sync import get_run_json_sync as get_run_json_sync
    from .sync import list_runs_sync as list_runs_sync
    from .sync import prompt_sync as prompt_sync
    from .sync import prune_sync as prune_sync
    from .sync import replay_run_sync as replay_run_sync
    from .sync import resume_batch_sync as resume_batch_sync
    from .sync import resume_run_sync as resume_run_sync
    from .sync import run_pipeline_sync as run_pipeline_sync


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(module_name)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
