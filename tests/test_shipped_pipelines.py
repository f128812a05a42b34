"""The pipelines in ``pipelines/`` run offline through the console script, on the demo agent.

Each shipped pipeline takes its agents as run inputs; here they are set to the built-in demo
agent (``orchestrator.demo``: rule-based, one instruction per line of the prompt, see
``orchestrator/demo/instructions.py``), so the runs do real edits without a model. A few
tests run a small pipeline of ``tests/pipelines`` to check agent inputs themselves: refusals
before any agent starts, defaults, and a resume that keeps the agents the first attempt had.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_helpers import CLI, as_json, run_cli, snapshot

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"
AGENT_INPUTS = Path(__file__).resolve().parent / "pipelines" / "agent_inputs.py"


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A workspace of two Markdown files spelling "colour", and a Python file that does not."""
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("The colour red.\n")
    (root / "docs" / "b.md").write_text("A colour chart.\n")
    (root / "tool.py").write_text("colour = 'red'\n")
    return root


def _instances(result: dict[str, Any], step: str) -> dict[str, Any]:
    instances: dict[str, Any] = result["steps"][step]["instances"]
    return instances


def _value(result: dict[str, Any], step: str) -> Any:
    return _instances(result, step)[step]["value"]


def _graph_agents(result: dict[str, Any]) -> dict[str, list[str]]:
    return {n["name"]: n["agents"] for n in result["graph"]["nodes"] if n["kind"] == "agent"}


async def test_batch_replace_on_the_demo_agent(docs: Path, state_dir: Path) -> None:
    """Each matched file gets its own demo session that edits only it; verify passes; applied."""
    before = snapshot(docs)
    done = await run_cli(
        "run",
        str(PIPELINES / "batch_replace.py"),
        "--set",
        "agent=demo",
        "--set",
        "pattern=docs/*.md",
        "--set",
        'change=replace "colour" with "color" in {file}',
        "--set",
        "verify=! grep -rq colour docs",
        "--policy",
        "edit",
        "--apply",
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "succeeded"
    assert result["inputs"]["agent"] == "demo"
    assert _graph_agents(result) == {"transform": ["demo"]}
    # one branch per file, each changing its own file only
    instances = _instances(result, "transform")
    assert sorted(instances) == ["docs/a.md", "docs/b.md"]
    for key, instance in instances.items():
        assert instance["agent"] == "demo"
        assert [c["path"] for c in instance["changes"]] == [key]
    assert result["steps"]["check"]["status"] == "succeeded"
    assert result["applied"] is True
    assert (docs / "docs" / "a.md").read_text() == "The color red.\n"
    assert (docs / "docs" / "b.md").read_text() == "A color chart.\n"
    assert (docs / "tool.py").read_bytes() == before["tool.py"]  # the glob did not match it


async def test_compare_agents_with_one_demo_agent(docs: Path, state_dir: Path) -> None:
    """``--set agents=demo``: one branch keyed by the agent, scored and summarised."""
    done = await run_cli(
        "run",
        str(PIPELINES / "compare_agents.py"),
        "--set",
        "agents=demo",
        "--set",
        'task=create NOTES.md with "compared"',
        "--policy",
        "edit",
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "succeeded"
    assert result["inputs"]["agents"] == ["demo"]
    assert _graph_agents(result) == {"implement": ["demo"]}
    assert list(_instances(result, "implement")) == ["demo"]
    assert _value(result, "scores") == {"demo": {"files": 1, "stopReason": "end_turn"}}
    assert _value(result, "summary") == "demo: {'files': 1, 'stopReason': 'end_turn'}"
    assert "+compared" in result["diff"]
    assert not (docs / "NOTES.md").exists()  # not applied


async def test_compare_agents_with_a_list_of_agents(docs: Path, state_dir: Path) -> None:
    """A JSON list on ``--set`` fans out: one branch per labelled agent, side by side."""
    done = await run_cli(
        "run",
        str(PIPELINES / "compare_agents.py"),
        "--set",
        'agents=["a=demo", "b=demo"]',
        "--set",
        'task=replace "colour" with "color" in docs/*.md',
        "--policy",
        "edit",
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert _graph_agents(result) == {"implement": ["a=demo", "b=demo"]}
    assert list(_instances(result, "implement")) == ["a", "b"]
    scored = {"files": 2, "stopReason": "end_turn"}
    assert _value(result, "scores") == {"a": scored, "b": scored}
    assert _value(result, "summary").splitlines() == [f"a: {scored}", f"b: {scored}"]


async def test_plan_implement_review_on_demo_agents(docs: Path, state_dir: Path) -> None:
    """Plan (read-only: its edits refused), two implementers, a reviewer over the union."""
    done = await run_cli(
        "run",
        str(PIPELINES / "plan_implement_review.py"),
        "--set",
        "planner=demo",
        "--set",
        'implementers=["a=demo", "b=demo"]',
        "--set",
        "reviewer=demo",
        "--set",
        'task=replace "colour" with "color" in docs/*.md',
        "--policy",
        "edit",
        "--apply",
        "--report",
        str(docs.parent / "report"),
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "succeeded"
    # the report's steps name the agents the inputs gave, not the pipeline's defaults
    report = (docs.parent / "report" / "report.md").read_text()
    assert "agents a=demo, b=demo" in report
    assert "claude" not in report
    assert _graph_agents(result) == {
        "plan": ["demo"],
        "implement": ["a=demo", "b=demo"],
        "review": ["demo"],
    }
    plan = _instances(result, "plan")["plan"]
    assert plan["changes"] == []  # read-only: the demo agent asked, and was refused
    assert "permission refused" in plan["text"]
    implementers = _instances(result, "implement")
    assert list(implementers) == ["a", "b"]
    for instance in implementers.values():
        assert sorted(c["path"] for c in instance["changes"]) == ["docs/a.md", "docs/b.md"]
    # the same edits merge cleanly; the reviewer found nothing left to change
    assert "nothing changed" in _instances(result, "review")["review"]["text"]
    assert result["applied"] is True
    assert (docs / "docs" / "a.md").read_text() == "The color red.\n"
    assert (docs / "docs" / "b.md").read_text() == "A color chart.\n"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("claud", "input 'agents': unknown agent 'claud'; did you mean 'claude'?"),
        ("no-such-agent", "input 'agents': agent no-such-agent: 'no-such-agent' not found"),
        ("3", "input 'agents': expected an agent name or a list of agent names, got a number (3)"),
        ('["demo", 2]', "input 'agents': agent names are strings, not a number (2)"),
        ("[]", "input 'agents': names no agent: give at least one"),
    ],
)
async def test_a_bad_agent_input_is_one_line_and_exit_2_before_anything_starts(
    docs: Path, state_dir: Path, value: str, message: str
) -> None:
    """An unknown agent or a value of the wrong type: exit 2, one line naming the input, no run."""
    done = await run_cli(
        "run",
        str(PIPELINES / "compare_agents.py"),
        "--set",
        f"agents={value}",
        "--set",
        "task=x",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_USAGE
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(message), lines[0]
    assert "Traceback" not in lines[0]
    runs = as_json(await run_cli("runs", "--json", cwd=docs, state=state_dir))["runs"]
    assert runs == []


async def test_a_list_input_given_for_one_agent_is_refused(docs: Path, state_dir: Path) -> None:
    """``planner`` names one agent: a list for it is a usage error naming it."""
    done = await run_cli(
        "run",
        str(PIPELINES / "plan_implement_review.py"),
        "--set",
        'planner=["demo"]',
        "--set",
        "task=x",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_USAGE
    assert (
        done.stderr.decode()
        .splitlines()[-1]
        .endswith("input 'planner': expected one agent name (a string), got a list")
    )


async def test_the_default_agents_are_used_when_not_set(docs: Path, state_dir: Path) -> None:
    """Without ``--set agents``, the marker's default agents run (here: the demo agent)."""
    flag = docs.parent / "ready"
    flag.touch()
    done = await run_cli(
        "run",
        str(AGENT_INPUTS),
        "--set",
        'task=create DONE.md with "done"',
        "--set",
        f"flag={flag}",
        "--policy",
        "edit",
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["inputs"]["agents"] == ["demo"]
    assert _graph_agents(result) == {"implement": ["demo"]}
    assert _value(result, "gate") == ["demo"]


async def test_resume_keeps_the_agents_the_inputs_named(docs: Path, state_dir: Path) -> None:
    """A resumed run goes on with the agents its first attempt resolved, not the defaults."""
    flag = docs.parent / "ready"
    first = await run_cli(
        "run",
        str(AGENT_INPUTS),
        "--set",
        'agents=["a=demo", "b=demo"]',
        "--set",
        'task=create DONE.md with "done"',
        "--set",
        f"flag={flag}",
        "--policy",
        "edit",
        "--json",
        "--no-progress",
        cwd=docs,
        state=state_dir,
    )
    assert first.returncode == EXIT_FAILED, first.stderr.decode()
    failed = as_json(first)
    assert failed["steps"]["gate"]["status"] == "failed"
    flag.touch()  # the cause, fixed
    resumed = await run_cli(
        "resume", failed["runId"], "--json", "--no-progress", cwd=docs, state=state_dir
    )
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    assert result["status"] == "succeeded"
    assert result["inputs"]["agents"] == ["a=demo", "b=demo"]
    assert sorted(result["reused"]) == ["implement[a]", "implement[b]"]
    assert _value(result, "gate") == ["a", "b"]
