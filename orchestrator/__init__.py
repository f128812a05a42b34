"""acp-orchestrator: run many ACP coding agents at once, as their client.

The public API is listed in ``__all__`` and pinned by ``tests/test_public_api.py``; everything
else is internal and may change. Test helpers (a scripted ACP agent) live in
:mod:`orchestrator.testing`; the generated protocol types in :mod:`orchestrator.protocol.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

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
    "PromptRun": "orchestrator.api",
    "prompt": "orchestrator.api",
    "prompt_sync": "orchestrator.api",
    "errors": "orchestrator.errors",
}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:
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
    from .api import PromptRun as PromptRun
    from .api import prompt as prompt
    from .api import prompt_sync as prompt_sync


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(module_name)
    value = module if name == "errors" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
