"""Agent specs: how to launch an agent, by a known name or by a command line.

``--agent`` accepts a known name (``claude``, ``codex``, ``gemini``, ``qwen``, ``demo``, ...), a
command line (``"npx some-agent --acp"``), or ``NAME=COMMAND`` to label a command line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping

from attrs import field, frozen

from .errors import UsageError

__all__ = ["KNOWN_AGENTS", "AgentSpec", "resolve_agent"]


@frozen
class AgentSpec:
    """How to start one agent."""

    #: the label used in logs, reports and ``--json`` output
    name: str
    #: the argv to run
    command: tuple[str, ...]
    #: extra environment variables
    env: Mapping[str, str] = field(factory=dict)
    #: one line on what it is
    description: str = ""
    #: how to install it, for messages when the command is missing
    install: str = ""

    def resolved(self, base: str | os.PathLike[str]) -> AgentSpec:
        """The spec with relative paths in its command made absolute against ``base``.

        Agents run in their branch directory, not where the user typed the command, so
        ``--agent "python tools/agent.py"`` must name ``tools/agent.py`` absolutely. Rewritten:
        a relative program path containing ``/``, and relative arguments containing ``/`` that
        exist under ``base``; everything else (options, words, URLs) is left alone.
        """
        root = os.fspath(base)
        argv = list(self.command)
        head = argv[0]
        if "/" in head and not os.path.isabs(head):
            argv[0] = os.path.join(root, head)
        for i, arg in enumerate(argv[1:], start=1):
            if (
                "/" in arg
                and not arg.startswith("-")
                and "://" not in arg
                and not os.path.isabs(arg)
                and os.path.exists(os.path.join(root, arg))
            ):
                argv[i] = os.path.join(root, arg)
        if tuple(argv) == self.command:
            return self
        return AgentSpec(self.name, tuple(argv), self.env, self.description, self.install)

    def executable_found(self) -> bool:
        """Whether the command's program is on PATH (or is a path that exists)."""
        return shutil.which(self.command[0]) is not None


def _demo_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "orchestrator.demo")


#: Known agents and their usual ACP launch commands.
KNOWN_AGENTS: dict[str, AgentSpec] = {
    spec.name: spec
    for spec in (
        AgentSpec(
            "claude",
            ("npx", "-y", "@zed-industries/claude-code-acp"),
            description="Claude Code through its ACP adapter",
            install="npm install -g @zed-industries/claude-code-acp",
        ),
        AgentSpec(
            "codex",
            ("npx", "-y", "@zed-industries/codex-acp"),
            description="OpenAI Codex through its ACP adapter",
            install="npm install -g @zed-industries/codex-acp",
        ),
        AgentSpec(
            "gemini",
            ("gemini", "--experimental-acp"),
            description="Gemini CLI in ACP mode",
            install="npm install -g @google/gemini-cli",
        ),
        AgentSpec(
            "qwen",
            ("qwen", "--acp"),
            description="Qwen Code in ACP mode",
            install="npm install -g @qwen-code/qwen-code",
        ),
        AgentSpec(
            "opencode",
            ("opencode", "acp"),
            description="OpenCode in ACP mode",
            install="npm install -g opencode-ai",
        ),
    )
}


def resolve_agent(text: str, known: Mapping[str, AgentSpec] | None = None) -> AgentSpec:
    """An agent from ``--agent``: a known name, ``NAME=COMMAND``, or a command line."""
    table = dict(KNOWN_AGENTS if known is None else known)
    table.setdefault(
        "demo",
        AgentSpec(
            "demo",
            _demo_command(),
            description="built-in rule-based demo agent (no model, no network)",
        ),
    )
    text = text.strip()
    if not text:
        raise UsageError("--agent needs a name or a command")
    if text in table:
        return table[text]
    label: str | None = None
    head, sep, rest = text.partition("=")
    if sep and head and " " not in head and "/" not in head:
        label, text = head, rest.strip()
        if text in table:
            spec = table[text]
            return AgentSpec(label, spec.command, spec.env, spec.description, spec.install)
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise UsageError(f"cannot parse agent command {text!r}: {e}") from e
    if not argv:
        raise UsageError("--agent needs a name or a command")
    return AgentSpec(label or _default_label(argv), argv)


def _default_label(argv: tuple[str, ...]) -> str:
    # "npx -y @scope/agent" reads best as the package name; "python -c CODE" as "python"
    words = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-c", "-m", "-e"):
            skip = arg != "-m"  # a module name is a fine label, inline code is not
        elif not arg.startswith("-"):
            words.append(arg)
    if words and words[0] in {"npx", "node", "python", "python3", "uvx", "bunx"} and len(words) > 1:
        return words[1].rsplit("/", 1)[-1]
    return words[0].rsplit("/", 1)[-1] if words else argv[0]
