"""A step's policy decides every request of the step, whichever way the step fans out.

A step with several agents, or with ``over=``, runs instances keyed ``plan[a]``, ``work[0]``,
``work[a/0]``; a policy given to the step (``policy="deny-all"``), or a policy file's
``[steps.NAME]`` table and its ``[[elicitation]]`` rules with ``steps``, are scoped by the
step's name and apply to each of them, retried attempts included, as to a step of one agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_helpers import CLI, as_json, configure, record_events, run_cli, write_agent

from orchestrator.testing import Say, Turn
from orchestrator.testing.script import Request

through_cli = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")

#: the demo agent asks to create a file, then to run a command
ASKS = 'create PLAN.md with "x"\nrun touch pwned.txt\n'

#: the ways a step named ``plan`` fans out, as the arguments of its ``@step``
SHAPES = {
    "agents": 'agent=["a=demo", "b=demo"]',
    "a name and a label": 'agent=["demo", "b=demo"]',
    "items": 'agent="demo", over="xs"',
    "agents and items": 'agent=["a=demo", "b=demo"], over="xs"',
}

PIPELINE = """\
from orchestrator import step


@step()
def xs() -> list[str]:
    return ["one", "two"]


@step({shape}{policy}, retries=1)
def plan(xs: object, ctx: object) -> str:
    if ctx.attempt == 1 and {fail_first}:
        raise RuntimeError("the first attempt fails")
    return {asks!r}
"""


def pipeline(directory: Path, shape: str, policy: str | None, *, fail_first: bool = False) -> Path:
    """A pipeline file whose step ``plan`` fans out as ``shape`` under ``policy``."""
    path = directory / "fanout.py"
    given = f", policy={policy!r}" if policy else ""
    path.write_text(
        PIPELINE.format(shape=SHAPES[shape], policy=given, fail_first=fail_first, asks=ASKS)
    )
    return path


def decisions(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(instance, verdict, rule) of every permission decision of step ``plan``."""
    instances = result["steps"]["plan"]["instances"]
    return [
        (name, p["verdict"], p["rule"])
        for name, instance in instances.items()
        for p in instance["permissions"]
    ]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project directory."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("a project\n")
    return root


@pytest.mark.slow
@through_cli
@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_step_preset_narrows_a_trusted_run_in_every_fan_out(
    shape: str, project: Path, state_dir: Path
) -> None:
    """policy="deny-all" on a fanned-out step rejects every request a trusted run would allow."""
    path = pipeline(project.parent, shape, "deny-all", fail_first=True)
    done = await run_cli(
        "run", str(path), "--policy", "trusted", "--json", cwd=project, state=state_dir
    )
    assert done.returncode == 0, done.stderr
    result = as_json(done)
    found = decisions(result)
    assert len(found) == 2 * len(result["steps"]["plan"]["instances"]) >= 4
    assert {(v, r) for _, v, r in found} == {("reject", "step:plan/deny-all: everything else")}
    assert all(
        i["diff"] == "" and i["attempt"] == 2 for i in result["steps"]["plan"]["instances"].values()
    )


@pytest.mark.slow
@through_cli
@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_step_preset_decides_without_a_run_policy(
    shape: str, project: Path, state_dir: Path
) -> None:
    """policy="edit" on a fanned-out step of a run without a policy allows its edits, and
    nothing is counted as rejected by the default policy."""
    path = pipeline(project.parent, shape, "edit")
    done = await run_cli("run", str(path), "--json", cwd=project, state=state_dir)
    assert done.returncode == 0, done.stderr
    result = as_json(done)
    found = decisions(result)
    assert len(found) >= 4
    for _, verdict, rule in found:
        assert (verdict, rule) in {
            ("allow", "step:plan/edit: edit in workspace"),
            ("reject", "step:plan/edit: everything else"),
        }
    assert result["defaultRejections"]["count"] == 0
    done = await run_cli("run", str(path), "--no-progress", cwd=project, state=state_dir)
    assert done.returncode == 0, done.stderr
    assert b"default policy" not in done.stdout + done.stderr


@pytest.mark.slow
@through_cli
async def test_policy_file_step_table_applies_to_every_instance(
    project: Path, state_dir: Path
) -> None:
    """A policy file's [steps.plan] table decides the requests of each of plan's instances."""
    path = pipeline(project.parent, "agents and items", None)
    rules = project.parent / "steps.toml"
    rules.write_text('preset = "trusted"\n\n[steps.plan]\npreset = "read-only"\n')
    done = await run_cli(
        "run", str(path), "--policy", str(rules), "--json", cwd=project, state=state_dir
    )
    assert done.returncode == 0, done.stderr
    found = decisions(as_json(done))
    assert len(found) == 8
    assert {(v, r) for _, v, r in found} == {("reject", "step:plan/read-only: everything else")}


@pytest.mark.slow
@through_cli
async def test_elicitation_rules_of_a_step_answer_every_instance(
    project: Path, state_dir: Path
) -> None:
    """An [[elicitation]] rule with steps = ["plan"] answers the agents of a fanned-out plan."""
    question = {
        "sessionId": "sess-1",
        "mode": "form",
        "message": "Which branch?",
        "requestedSchema": {"type": "object", "properties": {"branch": {"type": "string"}}},
    }
    scripts = {
        name: write_agent(
            project.parent / f"{name}.json",
            Turn((Request("elicitation/create", question), Say("ok"))),
        )
        for name in ("a", "b")
    }
    configure(project, **scripts)
    path = project.parent / "ask.py"
    path.write_text(
        'from orchestrator import step\n\n\n@step(agent=["a", "b"])\n'
        'def plan() -> str:\n    return "go"\n'
    )
    rules = project.parent / "answers.toml"
    rules.write_text(
        '[[elicitation]]\nsteps = ["plan"]\naction = "accept"\nvalues = { branch = "main" }\n'
    )
    done = await run_cli(
        "run", str(path), "--policy", str(rules), "--json", cwd=project, state=state_dir
    )
    assert done.returncode == 0, done.stderr
    for script in scripts.values():
        (answer,) = [
            e for e in record_events(script.with_suffix(".jsonl")) if e["event"] == "request"
        ]
        assert answer["result"] == {"action": "accept", "content": {"branch": "main"}}
