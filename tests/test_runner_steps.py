"""What the runner records of each step: empty fan-outs, exceptions with tracebacks, attempts.

Each test runs a small pipeline through :func:`~orchestrator.runs.run_pipeline` and reads what
the run left behind: its outcome, the run store's records and the ``--json`` object rebuilt
from them (what ``orchestrator show`` prints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from run_helpers import config, workspace

from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.results import Results
from orchestrator.runs import RunOutcome, get_run_json, run_pipeline
from orchestrator.store import StepRecord, open_run_store

LIMIT = 30.0  # seconds any one run here may take


async def run(pipe: Pipeline, ws: Path, cfg: Config | None = None) -> RunOutcome:
    """Run ``pipe`` on ``ws`` within the time limit."""
    with trio.fail_after(LIMIT):
        return await run_pipeline(pipe, {}, cwd=ws, config=cfg or config())


async def records(state_dir: Path, run_id: str) -> dict[str, StepRecord]:
    """The run store's step records of a run, by key."""
    async with open_run_store(state_dir) as store:
        return {r.key: r for r in await store.steps(run_id)}


# --------------------------------------------------------------------------- empty fan-out


@pytest.mark.parametrize("empty", [[], {}], ids=["list", "dict"])
async def test_fan_out_over_nothing_succeeds_and_its_dependents_run(
    tmp_path: Path, state_dir: Path, empty: Any
) -> None:
    """A fan-out over an empty source succeeds with no instances; dependents get empty Results."""
    marker = tmp_path / "agent-started"
    spec = AgentSpec("m", ("sh", "-c", f"touch {marker}"))
    seen: list[Any] = []

    @step
    def files() -> Any:
        return empty

    @step(over="files")
    def each(item: str) -> str:
        return item.upper()

    @step(agent="m", over="files")
    def edit(item: str) -> str:
        return f"edit {item}"

    @step
    def total(each: Results, edit: Results) -> int:
        seen.extend([each, edit])
        return len(each) + len(edit)

    outcome = await run(
        Pipeline.from_steps([files, each, edit, total], name="empty"),
        workspace(tmp_path),
        config(spec),
    )
    assert outcome.status == "succeeded"
    for name in ("each", "edit"):
        assert outcome.steps[name]["status"] == "succeeded"
        assert outcome.steps[name]["instances"] == {}
        assert outcome.steps[name]["error"] is None
    assert outcome.steps["total"]["instances"]["total"]["value"] == 0
    assert [(type(r), r.step, dict(r)) for r in seen] == [
        (Results, "each", {}),
        (Results, "edit", {}),
    ]
    assert not marker.exists(), "no agent starts for an empty fan-out"
    stored = await records(state_dir, outcome.run_id)
    assert {k: stored[k].status for k in ("each", "edit")} == {
        "each": "succeeded",
        "edit": "succeeded",
    }
    shown = await get_run_json(outcome.run_id)
    assert {k: shown["steps"][k]["status"] for k in shown["steps"]} == dict.fromkeys(
        ("files", "each", "edit", "total"), "succeeded"
    )
    assert shown["steps"]["each"]["instances"] == {}


async def test_changes_before_an_empty_fan_out_reach_its_dependents(tmp_path: Path) -> None:
    """What the steps before an empty fan-out changed reaches its dependents and the run's diff."""

    @step
    def write(workdir: Path) -> list[str]:
        (workdir / "made.txt").write_text("made\n")
        return []

    @step(over="write")
    def each(item: str) -> str:
        return item

    @step
    def after(each: Results, workdir: Path) -> str:
        return (workdir / "made.txt").read_text()

    outcome = await run(
        Pipeline.from_steps([write, each, after], name="through"), workspace(tmp_path)
    )
    assert outcome.status == "succeeded"
    assert outcome.steps["after"]["instances"]["after"]["value"] == "made\n"
    assert outcome.result["changes"] == [{"path": "made.txt", "change": "added"}]
    assert "+made" in outcome.diff
