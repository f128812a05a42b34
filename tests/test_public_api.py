"""The public API is explicit and pinned: a change to it must change this test too."""

from __future__ import annotations

import subprocess
import sys

import orchestrator

EXPECTED = [
    "AcpSession",
    "AgentConnection",
    "AgentIdentity",
    "AgentInput",
    "AgentOutcome",
    "AgentSpec",
    "ApplyOutcome",
    "BatchOutcome",
    "Budget",
    "CancelToken",
    "ClientOptions",
    "ClientServices",
    "ClusterSpec",
    "Config",
    "FileChange",
    "InstanceOutcome",
    "Limits",
    "McpServer",
    "PermissionDecision",
    "PermissionEntry",
    "PermissionRecord",
    "Pipeline",
    "PromptRun",
    "PruneOutcome",
    "Rate",
    "RepoOutcome",
    "Results",
    "RunEvent",
    "RunOutcome",
    "RunStore",
    "Sandbox",
    "SessionContext",
    "Step",
    "StepContext",
    "StepOutcome",
    "StepResult",
    "Supervisor",
    "ToolCallEntry",
    "ToolCallState",
    "TranscriptWriter",
    "Turn",
    "TurnResult",
    "Verdict",
    "VerifyEntry",
    "__version__",
    "agent_input",
    "agents_input",
    "aio",
    "apply_run",
    "apply_run_sync",
    "batch",
    "batch_sync",
    "compare",
    "compare_sync",
    "diff_run",
    "diff_run_sync",
    "errors",
    "get_run_json",
    "get_run_json_sync",
    "list_runs",
    "list_runs_sync",
    "load_pipeline",
    "open_agent",
    "open_agent_on_stream",
    "open_run_store",
    "open_supervisor",
    "prompt",
    "prompt_sync",
    "prune",
    "prune_sync",
    "render_report",
    "replay_run",
    "replay_run_sync",
    "resolve_agent",
    "resume_batch",
    "resume_batch_sync",
    "resume_run",
    "resume_run_sync",
    "run_pipeline",
    "run_pipeline_sync",
    "step",
]


def test_all_is_pinned() -> None:
    """__all__ lists exactly the pinned names."""
    assert sorted(orchestrator.__all__) == EXPECTED


def test_every_name_resolves() -> None:
    """Every exported name can be imported from the package."""
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name) is not None


def test_import_is_light() -> None:
    """Importing the package does not import trio or the generated types (fast CLI start)."""
    code = (
        "import orchestrator, sys; "
        "print('trio' in sys.modules, 'orchestrator.protocol.types' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
