"""Command lines for the counterpart agents of the interop tests.

- :func:`sdk_agent_command`: ``tests/agents/sdk_agent.py``, built on the official Python SDK
  (always available: the SDK is a test dependency).
- :func:`ts_example_agent_command`: the example agent of the official TypeScript SDK, under
  node; installed by ``python tools/install_node_agents.py``. Tests that use it should call
  :func:`ts_example_agent_skip_reason` first and skip with its sentence (mark them ``node``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

__all__ = [
    "SDK_AGENT",
    "TS_SDK_VERSION",
    "node_cache_dir",
    "sdk_agent_command",
    "ts_example_agent_command",
    "ts_example_agent_path",
    "ts_example_agent_skip_reason",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
SDK_AGENT = Path(__file__).resolve().parent / "agents" / "sdk_agent.py"
TS_SDK_PACKAGE = "@agentclientprotocol/sdk"
TS_SDK_VERSION = "1.9.0"  # keep in step with tools/install_node_agents.py
_INSTALL_HINT = "install it with `python tools/install_node_agents.py`"


def sdk_agent_command(*, require_auth: bool = False) -> list[str]:
    """``argv`` that runs the Python-SDK agent with this interpreter."""
    command = [sys.executable, str(SDK_AGENT)]
    if require_auth:
        command.append("--require-auth")
    return command


def node_cache_dir() -> Path:
    """Where the installer puts node packages (``$ORCHESTRATOR_NODE_CACHE`` or ``.cache/node``)."""
    env = os.environ.get("ORCHESTRATOR_NODE_CACHE")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache" / "node"


def _package_dir() -> Path:
    return node_cache_dir() / "node_modules" / Path(*TS_SDK_PACKAGE.split("/"))


def ts_example_agent_path() -> Path:
    """The TypeScript SDK's ``dist/examples/agent.js`` inside the node cache (may be absent)."""
    return _package_dir() / "dist" / "examples" / "agent.js"


def _installed_version() -> str | None:
    try:
        manifest = json.loads((_package_dir() / "package.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    version = manifest.get("version") if isinstance(manifest, dict) else None
    return version if isinstance(version, str) else None


def ts_example_agent_command() -> list[str]:
    """``argv`` that runs the TypeScript SDK example agent under node.

    Check :func:`ts_example_agent_skip_reason` first: this does not look at the disk.
    """
    node = shutil.which("node") or "node"
    return [node, str(ts_example_agent_path())]


def ts_example_agent_skip_reason() -> str | None:
    """None when node and the installed example agent are present, else what is missing."""
    if shutil.which("node") is None:
        return "node is not on PATH: the TypeScript SDK example agent cannot run"
    agent = ts_example_agent_path()
    if not agent.is_file():
        return f"{TS_SDK_PACKAGE}@{TS_SDK_VERSION} is not installed ({agent} is missing): " + (
            _INSTALL_HINT
        )
    version = _installed_version()
    if version != TS_SDK_VERSION:
        # The tests pin the example's exact behaviour, which is version specific.
        return (
            f"{TS_SDK_PACKAGE} {version} is installed in {node_cache_dir()}, the tests need "
            f"{TS_SDK_VERSION}: {_INSTALL_HINT}"
        )
    return None
