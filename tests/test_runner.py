"""The pipeline runner end to end: scheduling, limits, failures, retries, watchdogs and merges.

Agents are scripted: real subprocesses where the process matters (concurrency across
processes, crashes, stalls, files written behind the client's back) and in-memory agents
(:func:`~orchestrator.testing.connector.memory_connector`) where it does not. Every run is
bounded by ``trio.fail_after``; ordering is shown by recorded times, never by sleeping.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from attrs import define
from run_helpers import config, spec_for, workspace

from orchestrator.agent.services import ClientServices
from orchestrator.agents import AgentSpec, builtin_agents
from orchestrator.config import Config
from orchestrator.errors import UsageError
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline._branchio import BranchDirs
from orchestrator.pipeline.results import Results, RunEvent, StepContext, StepResult
from orchestrator.pipeline.runner import BranchIO, PipelineRunner
from orchestrator.protocol import types as t
from orchestrator.runs import RunOutcome, diff_run, run_pipeline
from orchestrator.supervisor import Lease, Supervisor, open_supervisor
from orchestrator.testing import (
    AgentScript,
    Crash,
    ErrorReply,
    Say,
    Sleep,
    Stall,
    Turn,
    Usage,
    WriteFile,
)
from orchestrator.testing.connector import memory_connector
from orchestrator.vfs import Branch, Workspace

LIMIT = 30.0  # seconds any one run here may take (subprocess agents start a Python each)
SAY = AgentScript(turns=(Turn(steps=(Say("done"),)),))


# --------------------------------------------------------------------------- helpers


def mem_spec(name: str) -> AgentSpec:
    """An agent for the in-memory connector (its command is never run)."""
    return AgentSpec(name, ("unused-in-memory-agent",))


def read_record(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines record a subprocess agent wrote (empty if it never started)."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def events_of(events: list[RunEvent], kind: str, step_name: str | None = None) -> list[RunEvent]:
    """The events of one type (for one step)."""
    return [e for e in events if e.type == kind and (step_name is None or e.step == step_name)]


async def run(pipe: Pipeline, ws: Path, cfg: Config, **kwargs: Any) -> RunOutcome:
    """Run ``pipe`` on ``ws`` within the time limit."""
    with trio.fail_after(LIMIT):
        return await run_pipeline(pipe, kwargs.pop("inputs", {}), cwd=ws, config=cfg, **kwargs)


@define
class CountingPool:
    """An :class:`~orchestrator.pipeline.runner.AgentPool` that counts the leases held at once."""

    inner: Supervisor
    #: leases held now, the most held at once, and all leases granted
    live: int = 0
    peak: int = 0
    leases: int = 0

    @asynccontextmanager
    async def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: Any,
        services: ClientServices | None = None,
        step: str | None = None,
        mcp_servers: Sequence[t.McpServer] = (),
        instance: str | None = None,
    ) -> AsyncIterator[Lease]:
        async with self.inner.lease(
            spec,
            cwd=cwd,
            services=services,
            step=step,
            mcp_servers=mcp_servers,
            instance=instance,
        ) as lease:
            self.live += 1
            self.leases += 1
            self.peak = max(self.peak, self.live)
            try:
                yield lease
            finally:
                self.live -= 1


# --------------------------------------------------------------------------- scheduling


async def test_diamond_runs_its_three_implementers_concurrently(tmp_path: Path) -> None:
    """plan -> three implementers (three processes) -> review: all start before any ends."""
    slow = AgentScript(turns=(Turn(steps=(Sleep(0.3), Say("built"))),))
    specs = [spec_for(SAY, tmp_path, "planner")] + [
        spec_for(slow, tmp_path, f"impl{n}") for n in range(3)
    ]

    @step(agent="planner")
    def plan(task: str) -> str:
        return f"plan {task}"

    @step(agent="impl0")
    def one(plan: StepResult) -> str:
        return f"part one of {plan.text}"

    @step(agent="impl1")
    def two(plan: StepResult) -> str:
        return f"part two of {plan.text}"

    @step(agent="impl2")
    def three(plan: StepResult) -> str:
        return f"part three of {plan.text}"

    @step
    def review(one: StepResult, two: StepResult, three: StepResult) -> list[str]:
        return [one.text, two.text, three.text]

    events: list[RunEvent] = []
    pipe = Pipeline.from_steps([plan, one, two, three, review], name="diamond")
    outcome = await run(
        pipe, workspace(tmp_path), config(*specs), inputs={"task": "x"}, on_event=events.append
    )
    assert outcome.status == "succeeded"
    assert outcome.steps["review"].instances["review"].value == ["built"] * 3
    implementers = ("one", "two", "three")
    started = {e.step: e.time for e in events_of(events, "step_started") if e.step in implementers}
    finished = {
        e.step: e.time for e in events_of(events, "step_finished") if e.step in implementers
    }
    assert set(started) == set(finished) == set(implementers)
    assert max(started.values()) < min(finished.values())
    # the plan finished before any implementer started, and review started after all finished
    plan_done = events_of(events, "step_finished", "plan")[0].time
    review_start = events_of(events, "step_started", "review")[0].time
    assert plan_done <= min(started.values())
    assert max(finished.values()) <= review_start


def fan_out_pipeline(seen: list[Results]) -> Pipeline:
    """items (50) -> work (one agent branch per item) -> collect (fan-in)."""

    @step
    def items() -> list[str]:
        return [f"file{n:02d}" for n in range(50)]

    @step(agent="m", over="items")
    def work(item: str) -> str:
        return f"rewrite {item}"

    @step
    def collect(work: Results) -> int:
        seen.append(work)
        return len(work)

    return Pipeline.from_steps([items, work, collect], name="fifty")


async def test_fan_out_over_fifty_items_never_holds_more_than_max_sessions(
    tmp_path: Path,
) -> None:
    """50 branches, max_sessions=8: at most 8 sessions at once; fan-in gets 50 results."""
    script = AgentScript(turns=(Turn(steps=(Sleep(0.02), Say("ok"))),))
    seen: list[Results] = []
    with trio.fail_after(LIMIT):
        async with open_supervisor(connector=memory_connector(lambda _: script)) as sup:
            pool = CountingPool(sup)
            outcome = await run(
                fan_out_pipeline(seen),
                workspace(tmp_path),
                config(mem_spec("m")),
                max_sessions=8,
                pool=pool,
            )
            stats = sup.statistics()
    assert outcome.status == "succeeded"
    assert pool.leases == 50
    # never more than the limit; how close a run gets to it depends on timing
    assert 2 <= pool.peak <= 8
    assert 2 <= stats["peakSessions"] <= 8
    instances = outcome.steps["work"].instances
    assert len(instances) == 50
    assert {i.status for i in instances.values()} == {"succeeded"}
    assert len(seen) == 1
    results = seen[0]
    assert isinstance(results, Results)
    assert set(results) == {f"file{n:02d}" for n in range(50)}
    assert all(isinstance(r, StepResult) and r.text == "ok" for r in results.values())
    assert outcome.steps["collect"].instances["collect"].value == 50


async def test_fan_out_events_never_show_more_than_max_sessions_running(tmp_path: Path) -> None:
    """Counted from step_started/step_finished events, no more than 8 instances run at once."""
    script = AgentScript(turns=(Turn(steps=(Sleep(0.02), Say("ok"))),))
    events: list[RunEvent] = []
    outcome = await run(
        fan_out_pipeline([]),
        workspace(tmp_path),
        config(mem_spec("m")),
        max_sessions=8,
        connector=memory_connector(lambda _: script),
        on_event=events.append,
    )
    assert outcome.status == "succeeded"
    live = peak = 0
    for e in events:
        if e.step != "work":
            continue
        if e.type == "step_started":
            live += 1
            peak = max(peak, live)
        elif e.type in ("step_finished", "step_failed"):
            live -= 1
    assert peak <= 8


async def test_fan_in_results_keep_fan_out_order(tmp_path: Path) -> None:
    """A fan-in step's Results iterate in item order even when later items end first."""
    # the first item's turn takes longest, so completion order is the reverse of item order
    script = AgentScript(
        turns=(
            Turn(steps=(Sleep(0.3), Say("ok")), when_prompt_contains="file00"),
            Turn(steps=(Sleep(0.15), Say("ok")), when_prompt_contains="file01"),
            Turn(steps=(Say("ok"),)),
        )
    )
    seen: list[Results] = []

    @step
    def items() -> list[str]:
        return ["file00", "file01", "file02"]

    @step(agent="m", over="items")
    def work(item: str) -> str:
        return f"rewrite {item}"

    @step
    def collect(work: Results) -> list[str]:
        seen.append(work)
        return list(work)

    outcome = await run(
        Pipeline.from_steps([items, work, collect], name="ordered"),
        workspace(tmp_path),
        config(mem_spec("m")),
        connector=memory_connector(lambda _: script),
    )
    assert outcome.status == "succeeded"
    assert list(seen[0]) == ["file00", "file01", "file02"]


# --------------------------------------------------------------------------- failures


def failing_pipeline() -> Pipeline:
    """plan -> broken -> after -> last, and plan -> sibling (independent of broken)."""

    @step(agent="good")
    def plan(task: str) -> str:
        return f"plan {task}"

    @step(agent="bad")
    def broken(plan: StepResult) -> str:
        return f"break {plan.text}"

    @step
    def after(broken: StepResult) -> str:
        return broken.text

    @step
    def last(after: str) -> str:
        return after

    @step(agent="good")
    def sibling(plan: StepResult) -> str:
        return f"also {plan.text}"

    return Pipeline.from_steps([plan, broken, after, last, sibling], name="failing")


BAD_SCRIPTS = {
    "error": AgentScript(
        turns=(Turn(error=ErrorReply(-32603, "the model is on fire")),),
    ),
    "crash": AgentScript(turns=(Turn(steps=(Say("half"), Crash(exit_code=7))),)),
}


@pytest.mark.parametrize("how", sorted(BAD_SCRIPTS))
async def test_failed_step_skips_its_descendants_and_a_sibling_finishes(
    tmp_path: Path, how: str
) -> None:
    """An erroring or crashing step fails, its child is skipped naming it, a sibling ends."""
    specs = [spec_for(SAY, tmp_path, "good"), spec_for(BAD_SCRIPTS[how], tmp_path, "bad")]
    events: list[RunEvent] = []
    outcome = await run(
        failing_pipeline(),
        workspace(tmp_path),
        config(*specs),
        inputs={"task": "t"},
        on_event=events.append,
    )
    assert outcome.status == "failed"
    assert outcome.exit_code == 1
    steps = outcome.steps
    assert steps["plan"].status == "succeeded"
    assert steps["sibling"].status == "succeeded"
    assert steps["broken"].status == "failed"
    assert steps["broken"].error
    if how == "error":
        assert "on fire" in steps["broken"].error
    assert steps["after"].status == "skipped"
    assert "broken" in str(steps["after"].cause)
    assert steps["last"].status == "skipped"
    skipped = {e.step: e.data["cause"] for e in events_of(events, "step_skipped")}
    assert set(skipped) == {"after", "last"}
    assert "broken" in skipped["after"]
    # the skipped steps never ran
    assert not events_of(events, "step_started", "after")
    assert not events_of(events, "step_started", "last")


async def test_skip_cause_of_a_grandchild_names_the_failed_step(tmp_path: Path) -> None:
    """A descendant two levels below a failed step is skipped with a cause naming that step."""
    specs = [
        spec_for(SAY, tmp_path, "good"),
        spec_for(BAD_SCRIPTS["error"], tmp_path, "bad"),
    ]
    outcome = await run(
        failing_pipeline(), workspace(tmp_path), config(*specs), inputs={"task": "t"}
    )
    assert outcome.steps["last"].status == "skipped"
    assert "broken" in str(outcome.steps["last"].cause)


def attempt_pipeline(retries: int) -> Pipeline:
    """One agent step whose prompt names its attempt."""

    @step(agent="crashy", retries=retries)
    def fix(ctx: StepContext) -> str:
        return f"fix it, attempt {ctx.attempt}"

    return Pipeline.from_steps([fix], name="retrying")


CRASH_FIRST = AgentScript(
    turns=(
        Turn(
            steps=(Say("working"), Sleep(0.05), Crash(exit_code=9)),
            when_prompt_contains="attempt 1",
        ),
        Turn(steps=(Say("fixed"),)),
    ),
)


async def run_crash_first(
    tmp_path: Path, retries: int
) -> tuple[RunOutcome, list[RunEvent], list[dict[str, Any]]]:
    """Run :func:`attempt_pipeline` against :data:`CRASH_FIRST`: the outcome, events and record."""
    record = tmp_path / "crashy.jsonl"
    script = attrs.evolve(CRASH_FIRST, record_path=str(record))
    events: list[RunEvent] = []
    outcome = await run(
        attempt_pipeline(retries),
        workspace(tmp_path),
        config(spec_for(script, tmp_path, "crashy")),
        on_event=events.append,
    )
    return outcome, events, read_record(record)


async def test_crash_mid_turn_is_retried_on_a_fresh_process(tmp_path: Path) -> None:
    """With retries=1 a turn lost to a crash runs again on a new process and the step succeeds."""
    outcome, events, entries = await run_crash_first(tmp_path, retries=1)
    assert outcome.status == "succeeded"
    fix = outcome.steps["fix"].instances["fix"]
    assert fix.text == "fixed"
    assert fix.attempt == 2
    retries = events_of(events, "step_retry", "fix")
    assert len(retries) == 1
    assert retries[0].data["attempt"] == 1
    assert [e["event"] for e in entries].count("initialize") == 2  # two processes
    assert [e["text"] for e in entries if e["event"] == "prompt"] == [
        "fix it, attempt 1",
        "fix it, attempt 2",
    ]
    assert any(e["event"] == "crash" for e in entries)


async def test_crash_mid_turn_without_retries_fails_the_step(tmp_path: Path) -> None:
    """With retries=0 the same crash fails the step and nothing is re-sent."""
    outcome, events, entries = await run_crash_first(tmp_path, retries=0)
    assert outcome.status == "failed"
    assert outcome.steps["fix"].status == "failed"
    assert outcome.steps["fix"].error
    assert not events_of(events, "step_retry")
    prompts = [e for e in entries if e["event"] == "prompt"]
    assert len(prompts) == 1


async def test_idle_timeout_fails_a_stalled_step(tmp_path: Path) -> None:
    """An agent that goes silent longer than idle_timeout fails its step with a timeout error."""
    stalled = AgentScript(turns=(Turn(steps=(Say("thinking"), Stall())),))

    @step(agent="staller", idle_timeout=0.5)
    def wait() -> str:
        return "go"

    start = trio.current_time()
    outcome = await run(
        Pipeline.from_steps([wait], name="stall"),
        workspace(tmp_path),
        config(spec_for(stalled, tmp_path, "staller")),
    )
    assert outcome.status == "failed"
    error = str(outcome.steps["wait"].error)
    assert "idle timeout" in error
    assert trio.current_time() - start < LIMIT / 2


# --------------------------------------------------------------------------- merging


def conflict_pipeline(merge: str) -> Pipeline:
    """Two agents edit the same line of shared.txt; a Python step joins their branches."""

    @step(agent=["left", "right"])
    def edit(task: str) -> str:
        return task

    @step(merge=merge)
    def join(edit: Results, workdir: Path) -> str:
        return (workdir / "shared.txt").read_text()

    return Pipeline.from_steps([edit, join], name=f"conflict-{merge}")


def editor_script(spec: AgentSpec) -> AgentScript:
    """Each agent rewrites shared.txt with its own name."""
    return AgentScript(
        turns=(Turn(steps=(WriteFile("shared.txt", f"edited by {spec.name}\n"), Say("ok"))),)
    )


async def run_conflict(tmp_path: Path, merge: str) -> tuple[RunOutcome, list[RunEvent], Path]:
    """Run :func:`conflict_pipeline` on a workspace with shared.txt: outcome, events, workspace."""
    ws = workspace(tmp_path, {"shared.txt": "original\n"})
    events: list[RunEvent] = []
    outcome = await run(
        conflict_pipeline(merge),
        ws,
        config(mem_spec("left"), mem_spec("right")),
        inputs={"task": "edit"},
        connector=memory_connector(editor_script),
        on_event=events.append,
    )
    return outcome, events, ws


async def test_merge_conflict_with_fail_strategy_fails_the_dependent_step(tmp_path: Path) -> None:
    """Same line changed twice: merge='fail' fails the join; the run ends in conflicts (4)."""
    outcome, events, ws = await run_conflict(tmp_path, "fail")
    assert outcome.status == "conflicts"
    assert outcome.exit_code == 4
    assert outcome.steps["edit"].status == "succeeded"
    assert outcome.steps["join"].status == "failed"
    assert "merge conflict in shared.txt" in str(outcome.steps["join"].error)
    conflicts = outcome.result["conflicts"]
    assert [c["path"] for c in conflicts] == ["shared.txt"]
    assert conflicts[0]["resolution"] == "fail"
    assert {conflicts[0]["ours"], conflicts[0]["theirs"]} == {
        "edited by left\n",
        "edited by right\n",
    }
    assert events_of(events, "conflict", "join")
    assert (ws / "shared.txt").read_text() == "original\n"


async def test_merge_conflict_with_ours_strategy_succeeds_and_reports_it(tmp_path: Path) -> None:
    """merge='ours' takes the first branch's side and reports the conflict as 'ours'."""
    outcome, _, _ = await run_conflict(tmp_path, "ours")
    assert outcome.status == "succeeded"
    assert outcome.exit_code == 0
    conflicts = outcome.result["conflicts"]
    assert [(c["path"], c["resolution"]) for c in conflicts] == [("shared.txt", "ours")]
    joined = outcome.steps["join"].instances["join"].value
    # branches merge in fan-out order, so "ours" is the first agent's side
    assert joined == conflicts[0]["ours"] == "edited by left\n"
    assert conflicts[0]["theirs"] == "edited by right\n"


# --------------------------------------------------------------------------- conditions, workdir


async def test_a_step_whose_set_up_fails_fails_alone(tmp_path: Path) -> None:
    """A fan-out source that cannot be iterated fails its step; siblings finish, the run fails."""
    spec = AgentSpec("m", ("sh", "-c", "exit 1"))

    @step
    def count() -> int:
        return 3

    @step(agent="m", over="count")
    def each(item: int) -> str:
        return f"do {item}"

    @step
    def report(each: object) -> int:
        return 1

    @step
    def other(count: int) -> int:
        return count + 1

    outcome = await run(
        Pipeline.from_steps([count, each, report, other], name="bad-source"),
        workspace(tmp_path),
        config(spec),
    )
    assert outcome.status == "failed"
    assert outcome.steps["each"].status == "failed"
    assert "TypeError" in str(outcome.steps["each"].error)
    assert outcome.steps["report"].status == "skipped"
    assert outcome.steps["other"].status == "succeeded"


async def test_false_condition_skips_the_step_and_its_descendants(tmp_path: Path) -> None:
    """A false when= skips the step and its descendants, with causes; no agent starts."""
    marker = tmp_path / "agent-started"
    spec = AgentSpec("m", ("sh", "-c", f"touch {marker}"))

    @step
    def count() -> int:
        return 0

    @step(agent="m", when=lambda count: count > 0)
    def fix(count: int) -> str:
        return f"fix {count}"

    @step
    def report(fix: StepResult) -> str:
        return fix.text

    @step
    def other(count: int) -> int:
        return count + 1

    events: list[RunEvent] = []
    outcome = await run(
        Pipeline.from_steps([count, fix, report, other], name="conditional"),
        workspace(tmp_path),
        config(spec),
        on_event=events.append,
    )
    assert outcome.status == "succeeded"
    assert outcome.steps["fix"].status == "skipped"
    assert outcome.steps["fix"].cause == "its condition was false"
    assert outcome.steps["report"].status == "skipped"
    assert "fix" in str(outcome.steps["report"].cause)
    assert outcome.steps["other"].status == "succeeded"
    assert {e.step for e in events_of(events, "step_skipped")} == {"fix", "report"}
    assert not marker.exists()


async def test_python_step_workdir_holds_its_parents_merged_files(tmp_path: Path) -> None:
    """A Python step's workdir holds both parents' files merged over the workspace."""
    ws = workspace(tmp_path, {"base.txt": "base\n"})

    def script_for(spec: AgentSpec) -> AgentScript:
        return AgentScript(
            turns=(Turn(steps=(WriteFile(f"{spec.name}.txt", f"from {spec.name}\n"),)),)
        )

    @step(agent="front")
    def frontend(task: str) -> str:
        return task

    @step(agent="back")
    def backend(task: str) -> str:
        return task

    @step
    def check(frontend: StepResult, backend: StepResult, workdir: Path) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(workdir.iterdir()) if p.is_file()}

    outcome = await run(
        Pipeline.from_steps([frontend, backend, check], name="workdir"),
        ws,
        config(mem_spec("front"), mem_spec("back")),
        inputs={"task": "write"},
        connector=memory_connector(script_for),
    )
    assert outcome.status == "succeeded"
    seen = outcome.steps["check"].instances["check"].value
    assert seen == {"back.txt": "from back\n", "base.txt": "base\n", "front.txt": "from front\n"}
    assert sorted(p.name for p in ws.iterdir()) == ["base.txt"]


# --------------------------------------------------------------------------- branch directories


async def test_each_attempt_gets_its_own_directory_and_none_is_left_after_the_run(
    tmp_path: Path,
) -> None:
    """Attempts use branches/<name>-<attempt>, one level deep; all are removed by the run's end."""
    seen: list[Path] = []

    @step(retries=1)
    def build(workdir: Path, ctx: StepContext) -> str:
        seen.append(workdir)
        assert workdir.is_dir()
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return "built"

    outcome = await run(Pipeline.from_steps([build], name="dirs"), workspace(tmp_path), config())
    assert outcome.status == "succeeded"
    branches = Path(outcome.run_dir) / "branches"
    assert [(p.parent, p.name) for p in seen] == [(branches, "build-1"), (branches, "build-2")]
    assert not any(p.exists() for p in seen)
    # the empty folders go too: no later run has anything to sweep
    assert not branches.exists() and not (branches.parent / "trash").exists()


async def test_branch_directories_are_removed_when_the_run_is_cancelled(tmp_path: Path) -> None:
    """A run cancelled mid-step still removes the branch directories it made."""
    seen: list[Path] = []
    started = trio.Event()

    @step
    async def hold(workdir: Path) -> str:
        seen.append(workdir)
        started.set()
        await trio.sleep_forever()
        return "never"

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                await run_pipeline(
                    Pipeline.from_steps([hold], name="cancelled"),
                    {},
                    cwd=workspace(tmp_path),
                    config=config(),
                    state_dir=tmp_path / "state",
                )

            nursery.start_soon(go)
            await started.wait()
            assert seen[0].is_dir()
            nursery.cancel_scope.cancel()
    assert not seen[0].exists()


@define
class UpdateRecordingPool:
    """An :class:`~orchestrator.pipeline.runner.AgentPool` noting what each turn was given."""

    inner: Supervisor
    #: for each turn: whether it got an ``on_update`` callback
    callbacks: list[bool] = attrs.field(factory=list)

    @asynccontextmanager
    async def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: Any,
        services: ClientServices | None = None,
        step: str | None = None,
        mcp_servers: Sequence[t.McpServer] = (),
        instance: str | None = None,
    ) -> AsyncIterator[Any]:
        async with self.inner.lease(
            spec,
            cwd=cwd,
            services=services,
            step=step,
            mcp_servers=mcp_servers,
            instance=instance,
        ) as lease:
            yield _RecordingLease(lease, self)


@define
class _RecordingLease:
    lease: Lease
    pool: UpdateRecordingPool

    @property
    def session(self) -> Any:
        return self.lease.session

    async def prompt(self, prompt: Any, **kwargs: Any) -> Any:
        self.pool.callbacks.append(kwargs.get("on_update") is not None)
        return await self.lease.prompt(prompt, **kwargs)


async def test_updates_reach_the_listener_and_are_skipped_without_one(tmp_path: Path) -> None:
    """A turn gets an update callback only when a listener (or a token budget) wants updates."""
    script = AgentScript(turns=(Turn(steps=(Say("hello"),)),))

    @step(agent="m")
    def talk(task: str) -> str:
        return task

    pipe = Pipeline.from_steps([talk], name="updates")
    events: list[RunEvent] = []
    ws = workspace(tmp_path)
    with trio.fail_after(LIMIT):
        async with open_supervisor(connector=memory_connector(lambda _: script)) as sup:
            pool = UpdateRecordingPool(sup)
            quiet = await run(pipe, ws, config(mem_spec("m")), inputs={"task": "x"}, pool=pool)
            heard = await run(
                pipe,
                ws,
                config(mem_spec("m")),
                inputs={"task": "x"},
                pool=pool,
                on_event=events.append,
            )
    assert quiet.status == heard.status == "succeeded"
    assert pool.callbacks == [False, True]
    assert [e.data["kind"] for e in events_of(events, "update")] == ["agent_message_chunk"]


async def test_token_budget_fails_the_step_that_exceeds_it(tmp_path: Path) -> None:
    """An agent that reports more tokens than the step's budget fails the step, naming both."""
    script = AgentScript(turns=(Turn(steps=(Usage(used=500, size=1000), Say("spent"))),))

    @step(agent="m", budget=100)
    def spend(task: str) -> str:
        return task

    @step(agent="m")
    def cheap(task: str) -> str:
        return task

    outcome = await run(
        Pipeline.from_steps([spend, cheap], name="budget"),
        workspace(tmp_path),
        config(mem_spec("m")),
        inputs={"task": "x"},
        connector=memory_connector(lambda _: script),
    )
    assert outcome.steps["spend"].status == "failed"
    assert "budget exceeded: 500 tokens > 100" in str(outcome.steps["spend"].error)
    assert outcome.steps["cheap"].status == "succeeded"


async def test_recorded_diffs_show_the_changes_against_the_workspace(tmp_path: Path) -> None:
    """A chain's second step records its cumulative diff; an untouched step records none."""
    ws = workspace(tmp_path, {"a.txt": "one\n"})

    def script_for(spec: AgentSpec) -> AgentScript:
        return AgentScript(turns=(Turn(steps=(WriteFile("a.txt", "two\n"),)),))

    @step(agent="w")
    def edit(task: str) -> str:
        return task

    @step
    def look(edit: StepResult) -> str:
        return edit.diff

    outcome = await run(
        Pipeline.from_steps([edit, look], name="diffs"),
        ws,
        config(mem_spec("w")),
        inputs={"task": "x"},
        connector=memory_connector(script_for),
    )
    assert outcome.status == "succeeded"
    diff = outcome.steps["look"].instances["look"].value
    assert "-one\n+two\n" in diff
    edit_result = outcome.steps["edit"].instances["edit"]
    assert edit_result.diff == diff
    assert [c.to_json() for c in edit_result.changes] == [{"path": "a.txt", "change": "modified"}]


def test_branch_io_counts_overlapping_waits_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps waiting on directory I/O at the same time add their union, not their sum."""
    clock = iter([0.0, 5.0, 10.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    io = BranchIO()
    io.wait_started()  # t=0
    io.wait_started()  # overlapping: no new clock reading
    io.wait_ended()
    io.wait_ended()  # t=5
    io.wait_started()  # t=10
    assert io.critical_seconds == 5.0
    io.add("materialize", 2, 0.5, 0.25)
    figures = io.to_json()
    assert figures["materialize_count"] == 2
    assert figures["materialize_seconds"] == 0.5
    assert figures["materialize_cpu_seconds"] == 0.25
    assert figures["remove_count"] == 0


async def test_trash_removes_queued_directories_off_the_loop(tmp_path: Path) -> None:
    """Removed workdirs leave their place at once (a small one deleted there, others renamed
    into the trash); drain() deletes the rest, and every one is counted."""
    snapshot = Workspace.open(workspace(tmp_path, {"f.txt": "x\n" * 100_000})).snapshot()
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdirs = [
            await dirs.materialize(Branch.from_tree(snapshot, f"b{i}"), "s", i) for i in range(5)
        ]
        for wd in workdirs:
            dirs.remove(wd)
            assert not Path(wd.root).exists()  # gone from its place at once
        await dirs.drain()
    assert list((tmp_path / "run" / "branches").iterdir()) == []
    trash = tmp_path / "run" / "trash"
    assert not trash.exists() or list(trash.iterdir()) == []
    assert io.counts["remove"] == 5
    # draining again (nothing queued) waits for nothing
    await dirs.drain()
    assert io.counts["remove"] == 5


def test_directory_names_stay_distinct_when_instance_names_look_alike(tmp_path: Path) -> None:
    """Instance names that become equal once made file-safe still get their own directories."""

    @step
    def s() -> int:
        return 1

    runner = PipelineRunner(
        pipeline=Pipeline.from_steps([s], name="names"),
        inputs={},
        run_id="r",
        workspace=tmp_path,
        snapshot=None,  # type: ignore[arg-type]
        writer=None,  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        resolve_agent=None,  # type: ignore[arg-type]
        run_dir=tmp_path,
    )
    names = [runner._dirs.directory(n, 1).name for n in ("s[a/b]", "s[a_b]", "s[a b]")]
    assert names == ["s_a_b_-1", "s_a_b_-1.2", "s_a_b_-1.3"]
    assert runner._dirs.directory("s[a/b]", 2).name == "s_a_b_-2"


def test_runner_knows_each_steps_parents_in_definition_order(tmp_path: Path) -> None:
    """The runner's table of parents matches Pipeline.parents for every step."""

    @step
    def a() -> int:
        return 1

    @step
    def b() -> int:
        return 2

    @step
    def c(b: int, a: int) -> int:
        return a + b

    pipe = Pipeline.from_steps([a, b, c], name="parents")
    runner = PipelineRunner(
        pipeline=pipe,
        inputs={},
        run_id="r",
        workspace=tmp_path,
        snapshot=None,  # type: ignore[arg-type]
        writer=None,  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        resolve_agent=None,  # type: ignore[arg-type]
        run_dir=tmp_path,
    )
    assert runner._parents == {name: pipe.parents(name) for name in pipe.steps}
    assert runner._parents["c"] == ["a", "b"]


async def test_a_chained_step_keeps_its_own_diff_and_stores_the_cumulative_one(
    tmp_path: Path,
) -> None:
    """The second of two editing steps reports only its edit; the store has both for it."""
    ws = workspace(tmp_path, {"a.txt": "one\n", "b.txt": "uno\n"})
    edits = {"first": ("a.txt", "two\n"), "second": ("b.txt", "dos\n")}

    def script_for(spec: AgentSpec) -> AgentScript:
        return AgentScript(turns=(Turn(steps=(WriteFile(*edits[spec.name]),)),))

    @step(agent="first")
    def one(task: str) -> str:
        return task

    @step(agent="second")
    def two(one: StepResult) -> str:
        return "next"

    state = tmp_path / "state"
    outcome = await run(
        Pipeline.from_steps([one, two], name="chain"),
        ws,
        config(mem_spec("first"), mem_spec("second")),
        inputs={"task": "x"},
        connector=memory_connector(script_for),
        state_dir=state,
    )
    assert outcome.status == "succeeded"
    own = str(outcome.steps["two"].instances["two"].diff)
    assert "+dos\n" in own and "a.txt" not in own
    stored = await diff_run(outcome.run_id, step="two", state_dir=state)
    assert "+two\n" in stored and "+dos\n" in stored


async def test_a_step_naming_one_agent_twice_is_refused_before_it_starts(
    tmp_path: Path, state_dir: Path
) -> None:
    """A step that lists an agent by name and by its command line would key two branches
    alike: a usage error, before any run is recorded."""
    demo = " ".join(builtin_agents()["demo"].command)

    @step(agent=["demo", demo])
    def twice() -> str:
        return "hello"

    pipe = Pipeline.from_steps([twice])
    with pytest.raises(UsageError, match=r"step twice: 'demo' and .* are the same agent \(demo\)"):
        await run(pipe, workspace(tmp_path), Config.builtin())
    assert not (state_dir / "runs").exists()
