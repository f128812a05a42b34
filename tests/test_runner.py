"""The pipeline runner end to end: scheduling, limits, failures, retries, watchdogs and merges.

Agents are scripted: real subprocesses where the process matters (concurrency across
processes, crashes, stalls, files written behind the client's back) and in-memory agents
(:func:`~orchestrator.testing.connector.memory_connector`) where it does not. Every run is
bounded by ``trio.fail_after``; ordering is shown by recorded times, never by sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from attrs import define

from orchestrator.agent.services import ClientServices
from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.results import Results, RunEvent, StepContext, StepResult
from orchestrator.runs import RunOutcome, run_pipeline
from orchestrator.supervisor import Lease, Supervisor, open_supervisor
from orchestrator.testing import (
    AgentScript,
    Crash,
    ErrorReply,
    Say,
    Sleep,
    Stall,
    Turn,
    WriteFile,
    scripted_agent_command,
)
from orchestrator.testing.connector import memory_connector

LIMIT = 30.0  # seconds any one run here may take (subprocess agents start a Python each)
SAY = AgentScript(turns=(Turn(steps=(Say("done"),)),))


# --------------------------------------------------------------------------- helpers


def spec_for(script: AgentScript, directory: Path, name: str) -> AgentSpec:
    """An agent named ``name`` that plays ``script`` as a real subprocess."""
    folder = directory / f"agent-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return AgentSpec(name, tuple(scripted_agent_command(script, folder)))


def mem_spec(name: str) -> AgentSpec:
    """An agent for the in-memory connector (its command is never run)."""
    return AgentSpec(name, ("unused-in-memory-agent",))


def config(*specs: AgentSpec) -> Config:
    """A config whose agent table holds exactly ``specs``."""
    return Config(agents={s.name: s for s in specs})


def workspace(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A workspace directory holding ``files``."""
    root = tmp_path / "ws"
    root.mkdir()
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    return root


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
    ) -> AsyncIterator[Lease]:
        async with self.inner.lease(spec, cwd=cwd, services=services, step=step) as lease:
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
    assert outcome.steps["review"]["instances"]["review"]["value"] == ["built"] * 3
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
    instances = outcome.steps["work"]["instances"]
    assert len(instances) == 50
    assert {i["status"] for i in instances.values()} == {"succeeded"}
    assert len(seen) == 1
    results = seen[0]
    assert isinstance(results, Results)
    assert set(results) == {f"file{n:02d}" for n in range(50)}
    assert all(isinstance(r, StepResult) and r.text == "ok" for r in results.values())
    assert outcome.steps["collect"]["instances"]["collect"]["value"] == 50


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
    assert steps["plan"]["status"] == "succeeded"
    assert steps["sibling"]["status"] == "succeeded"
    assert steps["broken"]["status"] == "failed"
    assert steps["broken"]["error"]
    if how == "error":
        assert "on fire" in steps["broken"]["error"]
    assert steps["after"]["status"] == "skipped"
    assert "broken" in steps["after"]["cause"]
    assert steps["last"]["status"] == "skipped"
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
    assert outcome.steps["last"]["status"] == "skipped"
    assert "broken" in outcome.steps["last"]["cause"]


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


async def test_crash_mid_turn_is_retried_on_a_fresh_process(tmp_path: Path) -> None:
    """With retries=1 a turn lost to a crash runs again on a new process and the step succeeds."""
    record = tmp_path / "crashy.jsonl"
    script = attrs.evolve(CRASH_FIRST, record_path=str(record))
    events: list[RunEvent] = []
    outcome = await run(
        attempt_pipeline(1),
        workspace(tmp_path),
        config(spec_for(script, tmp_path, "crashy")),
        on_event=events.append,
    )
    assert outcome.status == "succeeded"
    fix = outcome.steps["fix"]["instances"]["fix"]
    assert fix["text"] == "fixed"
    assert fix["attempt"] == 2
    retries = events_of(events, "step_retry", "fix")
    assert len(retries) == 1
    assert retries[0].data["attempt"] == 1
    entries = read_record(record)
    assert [e["event"] for e in entries].count("initialize") == 2  # two processes
    assert [e["text"] for e in entries if e["event"] == "prompt"] == [
        "fix it, attempt 1",
        "fix it, attempt 2",
    ]
    assert any(e["event"] == "crash" for e in entries)


async def test_crash_mid_turn_without_retries_fails_the_step(tmp_path: Path) -> None:
    """With retries=0 the same crash fails the step and nothing is re-sent."""
    record = tmp_path / "crashy.jsonl"
    script = attrs.evolve(CRASH_FIRST, record_path=str(record))
    events: list[RunEvent] = []
    outcome = await run(
        attempt_pipeline(0),
        workspace(tmp_path),
        config(spec_for(script, tmp_path, "crashy")),
        on_event=events.append,
    )
    assert outcome.status == "failed"
    assert outcome.steps["fix"]["status"] == "failed"
    assert outcome.steps["fix"]["error"]
    assert not events_of(events, "step_retry")
    prompts = [e for e in read_record(record) if e["event"] == "prompt"]
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
    error = outcome.steps["wait"]["error"]
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


async def test_merge_conflict_with_fail_strategy_fails_the_dependent_step(tmp_path: Path) -> None:
    """Same line changed twice: merge='fail' fails the join; the run ends in conflicts (3)."""
    ws = workspace(tmp_path, {"shared.txt": "original\n"})
    events: list[RunEvent] = []
    outcome = await run(
        conflict_pipeline("fail"),
        ws,
        config(mem_spec("left"), mem_spec("right")),
        inputs={"task": "edit"},
        connector=memory_connector(editor_script),
        on_event=events.append,
    )
    assert outcome.status == "conflicts"
    assert outcome.exit_code == 3
    assert outcome.steps["edit"]["status"] == "succeeded"
    assert outcome.steps["join"]["status"] == "failed"
    assert "merge conflict in shared.txt" in outcome.steps["join"]["error"]
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
    ws = workspace(tmp_path, {"shared.txt": "original\n"})
    outcome = await run(
        conflict_pipeline("ours"),
        ws,
        config(mem_spec("left"), mem_spec("right")),
        inputs={"task": "edit"},
        connector=memory_connector(editor_script),
    )
    assert outcome.status == "succeeded"
    assert outcome.exit_code == 0
    conflicts = outcome.result["conflicts"]
    assert [(c["path"], c["resolution"]) for c in conflicts] == [("shared.txt", "ours")]
    joined = outcome.steps["join"]["instances"]["join"]["value"]
    # branches merge in fan-out order, so "ours" is the first agent's side
    assert joined == conflicts[0]["ours"] == "edited by left\n"
    assert conflicts[0]["theirs"] == "edited by right\n"


# --------------------------------------------------------------------------- conditions, workdir


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
    assert outcome.steps["fix"]["status"] == "skipped"
    assert outcome.steps["fix"]["cause"] == "its condition was false"
    assert outcome.steps["report"]["status"] == "skipped"
    assert "fix" in outcome.steps["report"]["cause"]
    assert outcome.steps["other"]["status"] == "succeeded"
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
    seen = outcome.steps["check"]["instances"]["check"]["value"]
    assert seen == {"back.txt": "from back\n", "base.txt": "base\n", "front.txt": "from front\n"}
    assert sorted(p.name for p in ws.iterdir()) == ["base.txt"]
