"""A real agent in a step with a check: its first edit fails the check, the failure output
reaches the model in the same conversation, and it fixes the file in round 2.

Real ACP agents from npm against the scripted model server (see ``real_agents.py``): the
server plays round 2's scenario only for a conversation whose newest user message holds the
marker that the check's failure output carries, so the fix is proof the output arrived.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from real_agents import AGENTS, RealAgent, make_project, require_installed

from orchestrator.config import Config
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import run_pipeline
from orchestrator.testing.model_server import Edit, Read, Reply, Scenario, open_model_server

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

LIMIT = 240.0  # seconds: a real agent's start-up and two rounds of scripted turns
#: the round 2 marker, only in the check's failure output
FIX = "RA-ROUND-FIX"
CHECK = (
    f"grep -q '\"Hi, \"' greet.py "
    f"|| {{ echo '{FIX}: greet.py must say Hi, it says:'; cat greet.py; exit 1; }}"
)
WRONG = 'def greet(name):\n    return "Hey, " + name\n'

SCENARIOS = [
    Scenario(
        "RA-ROUND-ONE",
        (Read("greet.py"), Edit("greet.py", '"Hello, "', '"Hey, "'), Reply("Greeting changed.")),
    ),
    Scenario(
        FIX,
        (Read("greet.py"), Edit("greet.py", '"Hey, "', '"Hi, "'), Reply("Fixed the greeting.")),
    ),
]


@pytest.fixture(params=AGENTS, ids=[a.name for a in AGENTS])
def agent(request: pytest.FixtureRequest) -> RealAgent:
    """Each real agent, skipped (or failed under CI) when it is not installed."""
    real: RealAgent = request.param
    require_installed(real)
    return real


async def test_real_agent_fixes_its_work_in_round_two(
    agent: RealAgent, tmp_path: Path, state_dir: Path
) -> None:
    """Round 1's edit fails the project's check; the model receives the check's output in the
    next prompt of the same session and fixes the file; the step succeeds after two rounds."""
    project = make_project(tmp_path / "project")
    before = project.snapshot()

    @step(agent=agent.name, check=CHECK, rounds=3)
    def greet() -> str:
        return "Please do RA-ROUND-ONE in this project."

    async with open_model_server(SCENARIOS) as server:
        spec = agent.spec(server, tmp_path / "home")
        with trio.fail_after(LIMIT):
            outcome = await run_pipeline(
                Pipeline.from_steps([greet], name="rounds"),
                {},
                cwd=project.root,
                policy="edit",
                config=Config(agents={agent.name: spec}),
                state_dir=state_dir,
            )
    one = outcome.result["steps"]["greet"]["instances"]["greet"]
    assert outcome.status == "succeeded", one["error"]
    checks = [r["check"] for r in one["rounds"]]
    assert [(c["passed"], c["exitCode"]) for c in checks] == [(False, 1), (True, 0)]
    assert checks[0]["output"] == f"{FIX}: greet.py must say Hi, it says:\n{WRONG.rstrip()}"
    # the model server played the fix only for a conversation holding the check's output,
    # after round 1's in the same conversation
    fixes = [r for r in server.requests if r.scenario == FIX]
    assert fixes, "the check's output never reached the model"
    users = fixes[0].user_texts()
    assert any("RA-ROUND-ONE" in text for text in users[:-1])
    assert f"{FIX}: greet.py must say Hi" in users[-1]
    assert WRONG.splitlines()[1] in users[-1]
    assert '+    return "Hi, " + name' in one["diff"]
    assert [c["path"] for c in one["changes"]] == ["greet.py"]
    assert project.snapshot() == before, "the workspace changed without apply"
