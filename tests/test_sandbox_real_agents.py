"""Real ACP agents from npm (Qwen Code, Claude Code's adapter) confined by the sandbox, offline.

Each agent runs under Landlock with TCP allowed only to the scripted model server's port: it
still does the whole task (read, edit, write, run a command). Then it runs a script it wrote
into its branch that writes outside it: the kernel refuses (Qwen Code runs shell commands
inside its own process, Claude Code's adapter through the client's terminals: both are
confined), the model hears ``Permission denied`` and the turn goes on. Skipped, with the reason,
when node, an agent or Landlock is missing (``python tools/install_node_agents.py`` installs
the agents; under ``$CI`` with npm present a missing agent fails instead).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio
from real_agents import (
    AGENTS,
    EDIT_POLICY,
    Project,
    RealAgent,
    make_project,
    require_installed,
    tagged_processes,
    task_scenario,
)

from orchestrator.policy import PolicySet
from orchestrator.runs import prompt
from orchestrator.sandbox import Sandbox, kernel_abi
from orchestrator.testing.model_server import (
    ModelServer,
    Read,
    Reply,
    Scenario,
    Shell,
    Write,
    open_model_server,
)


def _landlock_missing() -> str | None:
    try:
        abi = kernel_abi()
    except Exception as e:
        return str(e)
    return None if abi >= 4 else f"TCP port rules need Landlock ABI 4, the kernel has {abi}"


pytestmark = [
    pytest.mark.real_agent,
    pytest.mark.slow,
    pytest.mark.skipif(_landlock_missing() is not None, reason=str(_landlock_missing())),
]

LIMIT = 180.0
TASK = "Please do RA-TASK in this project."
ESCAPE = "Please do RA-ESCAPE in this project."
#: what the escape script prints once the kernel has refused its write
REFUSED = "Permission denied"


@pytest.fixture(params=AGENTS, ids=[a.name for a in AGENTS])
def agent(request: pytest.FixtureRequest) -> RealAgent:
    """Each real agent, skipped (or failed under CI) when it is not installed."""
    real: RealAgent = request.param
    require_installed(real)
    return real


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """The small project the task runs on."""
    return make_project(tmp_path / "project")


def escape_scenario(outside: Path) -> Scenario:
    """Write a script into the branch that writes outside it, run it, answer."""
    script = f"echo escaped > {outside / 'escaped.txt'} || echo write-refused\n"
    return Scenario(
        "RA-ESCAPE",
        (
            Read("greet.py"),
            Write("escape.sh", script),
            Shell("sh escape.sh", "run the script"),
            Reply("Escape attempted."),
        ),
    )


def sandbox_for(server: ModelServer) -> Sandbox:
    """Default reads and writes, TCP only to the model server."""
    port = urlsplit(server.url).port
    assert port is not None
    return Sandbox(ports=(port,))


def policy() -> PolicySet:
    """The real-agent tests' edit policy, and ``sh`` for the escape script."""
    rules = [*EDIT_POLICY["rules"], {"name": "sh", "verdict": "allow", "command": ["sh"]}]  # type: ignore[misc]
    return PolicySet.from_mapping({**EDIT_POLICY, "rules": rules})


async def test_confined_agent_does_the_whole_task(
    agent: RealAgent, project: Project, tmp_path: Path, state_dir: Path
) -> None:
    """Confined, with TCP to the model's port only: read, edit, write, a command, all work."""
    tag = uuid.uuid4().hex
    async with open_model_server([task_scenario()]) as server:
        sandbox = sandbox_for(server)
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec, TASK, cwd=project.root, policy=policy(), state_dir=state_dir, sandbox=sandbox
            )
    assert run.turn.stop_reason == "end_turn", run.turn.text
    assert "Task complete." in run.turn.text
    assert {c.path: c.change for c in run.changes} == {
        "greet.py": "modified",
        Project.NEW_FILE: "added",
    }
    results = [r for req in server.requests for r in req.tool_results()]
    assert any(Project.OUTPUT in r for r in results), "the command's output never reached the model"
    assert run.sandbox is not None
    rules = run.sandbox["confined"]["prompt"][agent.name]
    assert rules["ports"] == list(sandbox.ports or ())
    # the agent's own HOME (its settings, prepared by the test) is its home in the sandbox
    assert rules["home"] == str(tmp_path / "home")
    assert tagged_processes(tag) == []


async def test_confined_agent_cannot_write_outside_its_branch(
    agent: RealAgent, project: Project, tmp_path: Path, state_dir: Path
) -> None:
    """A script the agent wrote and ran writes outside the branch: refused, the turn goes on."""
    outside = tmp_path / "outside"
    outside.mkdir()
    async with open_model_server([escape_scenario(outside)]) as server:
        spec = agent.spec(server, tmp_path / "home")
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec,
                ESCAPE,
                cwd=project.root,
                policy=policy(),
                state_dir=state_dir,
                sandbox=sandbox_for(server),
            )
    assert run.turn.stop_reason == "end_turn", run.turn.text
    assert "Escape attempted." in run.turn.text
    assert not (outside / "escaped.txt").exists()
    results = [r for req in server.requests for r in req.tool_results()]
    assert any(REFUSED in r and "write-refused" in r for r in results), results
    assert {c.path: c.change for c in run.changes} == {"escape.sh": "added"}
