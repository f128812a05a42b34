"""Tests of agent specs: known names, command lines and NAME=COMMAND labels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.agents import KNOWN_AGENTS, AgentSpec, resolve_agent
from orchestrator.errors import UsageError


def test_known_name_gives_its_spec() -> None:
    """A known name resolves to the built-in launch command."""
    assert resolve_agent("claude") == KNOWN_AGENTS["claude"]


def test_demo_agent_runs_with_this_interpreter() -> None:
    """The built-in demo agent is always known and runs with the current Python."""
    spec = resolve_agent("demo")
    assert spec.command[0] == sys.executable
    assert spec.command[1:] == ("-m", "orchestrator.demo")


def test_command_line_is_split_without_a_shell() -> None:
    """A command line is split like a shell would, into an argv."""
    spec = resolve_agent("npx -y '@scope/some agent' --acp")
    assert spec.command == ("npx", "-y", "@scope/some agent", "--acp")
    assert spec.name == "some agent"


def test_label_equals_command() -> None:
    """NAME=COMMAND labels a command line, and can relabel a known agent."""
    assert resolve_agent("mine=python agent.py") == AgentSpec("mine", ("python", "agent.py"))
    relabelled = resolve_agent("fast=claude")
    assert relabelled.name == "fast"
    assert relabelled.command == KNOWN_AGENTS["claude"].command


def test_equals_inside_an_argument_is_not_a_label() -> None:
    """An '=' after a space or slash belongs to the command, not to a label."""
    spec = resolve_agent("/usr/bin/env FOO=1 agent")
    assert spec.command == ("/usr/bin/env", "FOO=1", "agent")


@pytest.mark.parametrize("text", ["", "   ", "bad 'quote"])
def test_bad_agent_text_is_a_usage_error(text: str) -> None:
    """Empty or unparsable --agent values are refused clearly."""
    with pytest.raises(UsageError):
        resolve_agent(text)


def test_relative_paths_in_the_command_are_made_absolute(tmp_path: Path) -> None:
    """An agent runs in its branch directory, so relative paths are resolved where typed."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "agent.py").write_text("")
    spec = resolve_agent("./venv/bin/python tools/agent.py --acp acp https://x/y missing/z")
    resolved = spec.resolved(tmp_path)
    assert resolved.command == (
        f"{tmp_path}/./venv/bin/python",
        f"{tmp_path}/tools/agent.py",
        "--acp",
        "acp",
        "https://x/y",
        "missing/z",
    )
    assert resolved.name == spec.name
    assert resolve_agent("claude").resolved(tmp_path) == KNOWN_AGENTS["claude"]
