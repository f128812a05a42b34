"""What the runner records of each step: empty fan-outs, exceptions with tracebacks, attempts.

Each test runs a small pipeline through :func:`~orchestrator.runs.run_pipeline` and reads what
the run left behind: its outcome, the run store's records and the ``--json`` object rebuilt
from them (what ``orchestrator show`` prints).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from run_helpers import config, workspace

from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.results import Results, StepContext
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


def helper_that_raises(value: int) -> int:
    """A function a step calls: its frame is in the traceback the run keeps."""
    raise ValueError(f"bad value {value}")


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
        assert outcome.steps[name].status == "succeeded"
        assert outcome.steps[name].instances == {}
        assert outcome.steps[name].error is None
    assert outcome.steps["total"].instances["total"].value == 0
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


# --------------------------------------------------------------------------- tracebacks


async def test_python_step_exception_keeps_its_traceback(tmp_path: Path, state_dir: Path) -> None:
    """A failing Python step keeps its traceback in the store, on its instance and its step."""

    @step
    def compute() -> int:
        return helper_that_raises(7)

    @step
    def nums() -> list[int]:
        return [1, 2]

    @step(over="nums")
    def per_item(item: int) -> int:
        return helper_that_raises(item) if item == 2 else item

    outcome = await run(
        Pipeline.from_steps([compute, nums, per_item], name="tb"), workspace(tmp_path)
    )
    assert outcome.status == "failed"
    single = outcome.steps["compute"]
    instance = single.instances["compute"]
    assert instance.error == "ValueError: bad value 7"
    trace = str(instance.traceback)
    assert trace.startswith("Traceback (most recent call last):\n")
    assert trace.endswith("ValueError: bad value 7\n")
    assert "in compute\n" in trace and "in helper_that_raises\n" in trace
    # the frames that called the step function (the runner's, trio's) are left out
    assert set(re.findall(r'File "([^"]+)"', trace)) == {__file__}
    assert single.traceback == trace
    fanned = outcome.steps["per_item"]
    assert fanned.instances["1"].traceback is None
    assert "bad value 2" in str(fanned.instances["2"].traceback)
    assert fanned.traceback == fanned.instances["2"].traceback
    stored = await records(state_dir, outcome.run_id)
    assert stored["compute"].traceback == trace
    assert stored["per_item[2]"].traceback == fanned.instances["2"].traceback
    assert stored["nums"].traceback is None


class BrokenSource:
    """A value whose iteration fails: a fan-out over it fails while the step is set up."""

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("cannot list the items")


async def test_set_up_exceptions_keep_their_traceback(tmp_path: Path, state_dir: Path) -> None:
    """An exception in a when= condition or a fan-out source keeps its traceback on the step."""

    def never_ready(count: int) -> bool:
        return count / 0 > 1

    @step
    def count() -> int:
        return 3

    @step(when=never_ready)
    def guarded(count: int) -> int:
        return count

    @step
    def source() -> BrokenSource:
        return BrokenSource()

    @step(over="source")
    def each(item: int) -> int:
        return item

    outcome = await run(
        Pipeline.from_steps([count, guarded, source, each], name="set-up"), workspace(tmp_path)
    )
    assert outcome.status == "failed"
    guarded_json = outcome.steps["guarded"]
    assert guarded_json.status == "failed"
    assert guarded_json.error == "ZeroDivisionError: division by zero"
    assert "in never_ready\n" in str(guarded_json.traceback)
    assert str(guarded_json.traceback).endswith("ZeroDivisionError: division by zero\n")
    each_json = outcome.steps["each"]
    assert each_json.status == "failed"
    assert each_json.instances == {}, "no instance ran"
    assert "in __iter__\n" in str(each_json.traceback)
    assert str(each_json.traceback).endswith("RuntimeError: cannot list the items\n")
    stored = await records(state_dir, outcome.run_id)
    assert stored["each"].traceback == each_json.traceback
    assert stored["guarded"].traceback == guarded_json.traceback


async def test_agent_step_failure_has_no_traceback(tmp_path: Path) -> None:
    """An agent that fails is the agent's failure: its error is kept, its traceback is null."""
    spec = AgentSpec("m", ("sh", "-c", "exit 1"))

    @step(agent="m")
    def fix() -> str:
        return "fix it"

    outcome = await run(
        Pipeline.from_steps([fix], name="agent-fails"), workspace(tmp_path), config(spec)
    )
    assert outcome.status == "failed"
    instance = outcome.steps["fix"].instances["fix"]
    assert instance.status == "failed"
    assert instance.error
    assert instance.traceback is None
    assert outcome.steps["fix"].traceback is None


# --------------------------------------------------------------------------- attempts


async def test_every_instance_reports_its_attempt(tmp_path: Path, state_dir: Path) -> None:
    """Python and agent instances report their 1-based attempt, retried or not, failed or not."""
    spec = AgentSpec("m", ("sh", "-c", "exit 1"))

    @step(retries=2)
    def flaky(ctx: StepContext) -> int:
        if ctx.attempt < 2:
            raise OSError("not yet")
        return ctx.attempt

    @step(retries=1)
    def hopeless() -> int:
        raise OSError("never")

    @step
    def steady() -> int:
        return 1

    @step(agent="m")
    def agent_fails() -> str:
        return "fix it"

    outcome = await run(
        Pipeline.from_steps([flaky, hopeless, steady, agent_fails], name="attempts"),
        workspace(tmp_path),
        config(spec),
    )
    attempts = {
        name: (entry.instances[name].status, entry.instances[name].attempt)
        for name, entry in outcome.steps.items()
    }
    assert attempts == {
        "flaky": ("succeeded", 2),
        "hopeless": ("failed", 2),
        "steady": ("succeeded", 1),
        "agent_fails": ("failed", 1),
    }
    assert outcome.steps["flaky"].instances["flaky"].value == 2
    assert "OSError: never" in str(outcome.steps["hopeless"].instances["hopeless"].traceback)
    stored = await records(state_dir, outcome.run_id)
    assert (stored["flaky"].attempt, stored["hopeless"].attempt) == (2, 2)


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
    assert outcome.steps["after"].instances["after"].value == "made\n"
    assert outcome.result["changes"] == [{"path": "made.txt", "change": "added"}]
    assert "+made" in outcome.diff
