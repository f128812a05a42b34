"""Replay with real ACP agents: a run recorded against the scripted model server, replayed
with the server stopped (same changes, same audit), under a stricter policy (the rejections
where they would have been) and with an edited prompt step (divergence; strict stops there).

Real agents from npm (see ``real_agents.py``); skipped with the reason when one is missing
(under ``$CI`` with npm present, a failure instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from real_agents import AGENTS, RealAgent, make_project, require_installed, task_scenario

from orchestrator.config import Config
from orchestrator.runs import replay_run, run_pipeline
from orchestrator.store import open_run_store
from orchestrator.testing.model_server import open_model_server

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

LIMIT = 240.0  # seconds: a real agent's start-up and the scripted task
MARKER = "RA-REPLAY"

PIPELINE = '''\
"""One real agent step: the scripted task."""

from orchestrator import step


@step(agent="{agent}")
def task() -> str:
    """The task the scripted model plays."""
    return "{prompt}"
'''


@pytest.fixture(params=AGENTS, ids=[a.name for a in AGENTS])
def agent(request: pytest.FixtureRequest) -> RealAgent:
    """Each real agent, skipped (or failed under CI) when it is not installed."""
    real: RealAgent = request.param
    require_installed(real)
    return real


def audit(result: Mapping[str, Any]) -> list[tuple[str, Any, Any, Any, Any]]:
    """The permission decisions per step instance, without times, sessions or paths (the
    branch directories differ between runs)."""
    rows = []
    for name, one in result["steps"].items():
        for key, instance in (one.get("instances") or {}).items():
            for record in instance.get("permissions") or []:
                rows.append(
                    (
                        f"{name}[{key}]",
                        record["kind"],
                        record["title"],
                        record["verdict"],
                        record["rule"],
                    )
                )
    return rows


async def updates(state_dir: Path, run_id: str) -> Counter[str]:
    """The kinds of session updates the agent sent in a run, counted."""
    async with open_run_store(state_dir) as store:
        lines = await store.transcript(run_id)
    return Counter(
        str(line["msg"]["params"]["update"].get("sessionUpdate"))
        for line in lines
        if line.get("dir") == "recv"
        and isinstance(line.get("msg"), dict)
        and line["msg"].get("method") == "session/update"
    )


def final_diff(outcome: Any) -> str:
    """The run's final diff against its workspace."""
    return str(outcome.result["diff"])


async def test_a_real_agents_run_replays_offline(
    agent: RealAgent, tmp_path: Path, state_dir: Path
) -> None:
    """Recorded with the model server, replayed with it stopped: the same changes and the same
    audit, no divergence; deny-all shows the rejections; an edited prompt diverges."""
    project = make_project(tmp_path / "project")
    before = project.snapshot()
    pipeline = tmp_path / "task.py"
    pipeline.write_text(PIPELINE.format(agent=agent.name, prompt=f"Please do {MARKER} here."))

    async with open_model_server([task_scenario(MARKER)]) as server:
        spec = agent.spec(server, tmp_path / "home")
        with trio.fail_after(LIMIT):
            recorded = await run_pipeline(
                pipeline,
                {},
                cwd=project.root,
                policy="edit",
                config=Config(agents={agent.name: spec}),
                state_dir=state_dir,
            )
    assert recorded.status == "succeeded", recorded.result
    assert "greet.py" in final_diff(recorded)

    # the model server is gone: only the record can serve the agent now
    with trio.fail_after(60):
        again = await replay_run(recorded.run_id, state_dir=state_dir)
    assert again.status == "succeeded", again.result
    assert again.result["replay"]["divergences"] == []
    assert final_diff(again) == final_diff(recorded)
    assert audit(again.result) == audit(recorded.result)
    assert audit(recorded.result), "the recorded run asked no permission"
    # the agent's updates came again, every one (its commands, sent before the first prompt,
    # come with it)
    assert await updates(state_dir, again.run_id) == await updates(state_dir, recorded.run_id)

    # a stricter policy: every permission the record shows granted is refused now
    with trio.fail_after(60):
        denied = await replay_run(recorded.run_id, state_dir=state_dir, policy="deny-all")
    kinds = {d["kind"] for d in denied.result["replay"]["divergences"]}
    assert "permission" in kinds
    verdicts = {row[3] for row in audit(denied.result)}
    assert verdicts == {"reject"}
    assert "greet.py" not in final_diff(denied)

    # the prompt step edited: the divergence is reported; strict stops the step there
    edited = tmp_path / "edited.py"
    edited.write_text(PIPELINE.format(agent=agent.name, prompt=f"Please do {MARKER} now."))
    with trio.fail_after(60):
        lenient = await replay_run(recorded.run_id, edited, state_dir=state_dir)
    [prompt] = [d for d in lenient.result["replay"]["divergences"] if d["kind"] == "prompt"]
    assert prompt["step"] == "task"
    with trio.fail_after(60):
        strict = await replay_run(recorded.run_id, edited, state_dir=state_dir, strict=True)
    assert strict.status == "failed"
    task = strict.result["steps"]["task"]["instances"]["task"]
    assert task["status"] == "failed"
    assert "diverged" in task["error"]
    assert not task.get("changes")
    assert project.snapshot() == before, "the workspace changed without apply"
