"""Runs that share a bound on live sessions and a budget, as a batch's runs do: several
``run_pipeline`` calls in one trio run, given the same ``_slots`` and ``_budget``.

The agent is the demo agent, a real subprocess: it reports its usage (``usage_update``) at the
end of each turn, and runs commands through the client's terminal. Orders that matter are made
by the agents' commands waiting for files another one writes, never by sleeping.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from attrs import define
from run_helpers import config, workspace

from orchestrator.agent.services import ClientServices
from orchestrator.agents import AgentSpec
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline._budget import RunBudget
from orchestrator.pipeline.results import RunEvent, StepResult
from orchestrator.protocol import types as t
from orchestrator.runs import RunOutcome, resume_run, run_pipeline
from orchestrator.store import open_run_store
from orchestrator.supervisor import Lease, Supervisor, open_supervisor

LIMIT = 60.0  # seconds any one test's runs may take (each agent is a Python subprocess)
ITEMS = ["a.txt", "b.txt", "c.txt"]
SPENT_TOKENS = re.compile(r"tokens: (\d+) used of 1")


@define
class CountingPool:
    """An agent pool over a supervisor that counts the sessions leased at once."""

    inner: Supervisor
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


def fan_out(name: str) -> Pipeline:
    """The demo agent edits each of the input ``files``; then a Python step counts them."""

    @step(agent="demo", over="files")
    def edit(item: str) -> str:
        return f'replace "todo" with "done" in {item}'

    @step
    def collect(edit: Any) -> int:
        return len(edit)

    return Pipeline.from_steps([edit, collect], name=name)


def two_steps(name: str) -> Pipeline:
    """The demo agent follows ``task``; then it creates after.txt."""

    @step(agent="demo")
    def work(task: str) -> str:
        return task

    @step(agent="demo")
    def after(work: StepResult) -> str:
        return 'create after.txt with "after"'

    return Pipeline.from_steps([work, after], name=name)


def projects(tmp_path: Path, *names: str) -> list[Path]:
    """One workspace per name, each holding ITEMS with ``todo`` in them."""
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        out.append(workspace(tmp_path / name, dict.fromkeys(ITEMS, "todo\n")))
    return out


def instances(outcome: RunOutcome, name: str) -> dict[str, Any]:
    """The instances of step ``name`` in the run's ``--json`` object."""
    found: dict[str, Any] = outcome.result["steps"][name]["instances"]
    return found


def wait_for(path: Path) -> str:
    """A shell line that returns once ``path`` exists."""
    return f"until [ -e {shlex.quote(str(path))} ]; do sleep 0.02; done"


def script(ws: Path, name: str, text: str) -> str:
    """The demo agent's instruction to run the shell script ``name``, written into ``ws``
    with ``text`` (the policy lets a command name no path outside the workspace; the
    script's lines may)."""
    (ws / name).write_text(text + "\n")
    return f"run sh {name}"


async def test_runs_sharing_one_slot_never_hold_two_sessions(
    tmp_path: Path, state_dir: Path
) -> None:
    """Two runs of three instances each, in one trio run, given one shared slot: six sessions,
    never two at once; each run records the parent it was given."""
    ws_a, ws_b = projects(tmp_path, "a", "b")
    slots = trio.Semaphore(1)
    outcomes: dict[str, RunOutcome] = {}
    with trio.fail_after(LIMIT):
        async with open_supervisor() as supervisor:
            pool = CountingPool(supervisor)

            async def one(label: str, ws: Path) -> None:
                outcomes[label] = await run_pipeline(
                    fan_out(label), {"files": ITEMS}, cwd=ws, config=config(), policy="edit",
                    pool=pool, _slots=slots, _parent="0123456789ab",
                )  # fmt: skip

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "a", ws_a)
                nursery.start_soon(one, "b", ws_b)
    assert pool.leases == 6
    assert pool.peak == 1
    for outcome in outcomes.values():
        assert outcome.status == "succeeded", outcome.result["steps"]
        assert {c["path"] for c in outcome.result["changes"]} == set(ITEMS)
    async with open_run_store(state_dir) as store:
        parents = {(await store.get_run(o.run_id)).parent for o in outcomes.values()}
    assert parents == {"0123456789ab"}


async def test_instances_after_a_shared_token_budget_is_spent_are_skipped(
    tmp_path: Path,
) -> None:
    """Two runs share one slot and a budget of one token: the first instance to run spends it
    and finishes; the five others are skipped (error kind ``budget``), both runs fail, and
    each run's usage is its own. A resume without the budget runs the skipped ones."""
    ws_a, ws_b = projects(tmp_path, "a", "b")
    budget = RunBudget(max_tokens=1)
    slots = trio.Semaphore(1)
    outcomes: dict[str, RunOutcome] = {}
    events: list[RunEvent] = []
    with trio.fail_after(LIMIT):

        async def one(label: str, ws: Path) -> None:
            outcomes[label] = await run_pipeline(
                fan_out(label), {"files": ITEMS}, cwd=ws, config=config(), policy="edit",
                on_event=events.append, _budget=budget, _slots=slots,
            )  # fmt: skip

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "a", ws_a)
            nursery.start_soon(one, "b", ws_b)
    ran = [
        (label, key, entry)
        for label, outcome in outcomes.items()
        for key, entry in instances(outcome, "edit").items()
        if entry["status"] != "skipped"
    ]
    assert len(ran) == 1
    first_run, first_key, first = ran[0]
    assert first["status"] == "succeeded"
    used = first["usage"]["used"]
    assert used > 1
    assert budget.spent == f"tokens: {used} used of 1"
    assert budget.statistics()["tokens"] == used
    skipped = [
        entry
        for outcome in outcomes.values()
        for entry in instances(outcome, "edit").values()
        if entry["status"] == "skipped"
    ]
    assert len(skipped) == 5
    for entry in skipped:
        assert entry["errorKind"] == "budget"
        assert entry["error"] == f"not started: the budget is spent (tokens: {used} used of 1)"
    said = [e for e in events if e.type == "step_skipped" and e.key is not None]
    assert len(said) == 5
    assert {e.data["errorKind"] for e in said} == {"budget"}
    for label, outcome in outcomes.items():
        assert outcome.status == "failed"
        assert outcome.exit_code == 1
        edit = outcome.result["steps"]["edit"]
        assert edit["status"] == "failed"
        assert edit["errorKind"] == "budget"
        assert outcome.result["steps"]["collect"]["status"] == "skipped"
        mine = {"tokens": used, "cost": None} if label == first_run else None
        assert budget.usage(outcome.run_id) == (mine or {"tokens": None, "cost": None})
    # a resume without the budget runs what was skipped, and reuses what ran
    with trio.fail_after(LIMIT):
        for label, outcome in outcomes.items():
            again = await resume_run(outcome.run_id, pipeline=fan_out(label))
            assert again.status == "succeeded", again.result["steps"]
            assert {c["path"] for c in again.result["changes"]} == set(ITEMS)
            reused = {f"edit[{first_key}]"} if label == first_run else set()
            assert set(again.result["reused"]) == reused
            assert again.result["steps"]["collect"]["status"] == "succeeded"


async def _fast_and_slow(
    tmp_path: Path, budget: RunBudget, slow_tail: str, *, release: Path | None = None
) -> tuple[RunOutcome, RunOutcome]:
    """Two runs sharing ``budget`` (one token): the slow one creates s.txt and starts a
    command (``slow_tail`` after it says it started); the fast one waits for that, creates
    f.txt and ends its turn, whose usage spends the budget. With ``release``, that file is
    created once the fast run's turn is recorded."""
    ws_fast, ws_slow = projects(tmp_path, "fast", "slow")
    started = tmp_path / "slow-started"
    slow_run = script(ws_slow, "slow.sh", f"touch {shlex.quote(str(started))}\n{slow_tail}")
    slow_task = f'create s.txt with "partial"\n{slow_run}'
    fast_task = f'{script(ws_fast, "fast.sh", wait_for(started))}\ncreate f.txt with "fast"'
    outcomes: dict[str, RunOutcome] = {}

    def on_fast(event: RunEvent) -> None:
        ended = event.type in ("step_finished", "step_failed")
        if release is not None and ended and event.step == "work":
            release.touch()

    async def one(label: str, ws: Path, task: str) -> None:
        outcomes[label] = await run_pipeline(
            two_steps(label), {"task": task}, cwd=ws, config=config(), policy="trusted",
            on_event=on_fast if label == "fast" else None, _budget=budget,
        )  # fmt: skip

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "slow", ws_slow, slow_task)
            nursery.start_soon(one, "fast", ws_fast, fast_task)
    return outcomes["fast"], outcomes["slow"]


async def test_a_spent_budget_lets_running_turns_finish(tmp_path: Path) -> None:
    """on_spent="finish": the slow run's turn, running when the fast one spends the budget,
    finishes and succeeds with its work; the step after it in each run is skipped."""
    release = tmp_path / "release"
    fast, slow = await _fast_and_slow(
        tmp_path, RunBudget(max_tokens=1), wait_for(release), release=release
    )
    for outcome, made in ((fast, "f.txt"), (slow, "s.txt")):
        work = instances(outcome, "work")["work"]
        assert work["status"] == "succeeded", work["error"]
        assert work["stopReason"] == "end_turn"
        assert [c["path"] for c in work["changes"]] == [made]
        after = instances(outcome, "after")["after"]
        assert after["status"] == "skipped"
        assert after["errorKind"] == "budget"
        assert SPENT_TOKENS.fullmatch(after["error"].split("(", 1)[1].rstrip(")"))
        assert outcome.status == "failed"
        assert outcome.exit_code == 1


async def test_a_spent_budget_cancels_running_turns(tmp_path: Path) -> None:
    """on_spent="cancel": the slow run's turn (a command of ten minutes) is cancelled the ACP
    way when the fast one spends the budget, and fails with kind ``budget``, its work so far
    kept; so does the turn whose usage spent it."""
    budget = RunBudget(max_tokens=1, on_spent="cancel")
    fast, slow = await _fast_and_slow(tmp_path, budget, "sleep 600")
    fast_work = instances(fast, "work")["work"]
    used = fast_work["usage"]["used"]
    assert fast_work["status"] == "failed"
    assert fast_work["errorKind"] == "budget"
    assert fast_work["error"] == f"cancelled: the budget is spent (tokens: {used} used of 1)"
    slow_work = instances(slow, "work")["work"]
    assert slow_work["status"] == "failed"
    assert slow_work["errorKind"] == "budget"
    assert slow_work["stopReason"] == "cancelled"
    assert slow_work["error"].startswith("cancelled: the budget is spent (tokens: ")
    assert [c["path"] for c in slow_work["changes"]] == ["s.txt"]
    for outcome in (fast, slow):
        assert outcome.status == "failed"
        assert outcome.result["steps"]["after"]["status"] == "skipped"
    assert budget.statistics()["tokens"] == used  # the slow turn reported nothing


@pytest.fixture
def steerable_clock() -> trio.testing.MockClock:
    """trio's clock at the real pace, which a test may move ahead at once."""
    return trio.testing.MockClock(rate=1.0)


async def test_max_seconds_cancels_a_turn_still_running_at_the_deadline(
    tmp_path: Path, steerable_clock: trio.testing.MockClock
) -> None:
    """A budget of an hour, on_spent="cancel": once the turn's command runs, the clock is
    moved an hour ahead; the turn is cancelled at once and fails (kind ``budget``) with the
    time it had, its work so far kept; the step after it does not run."""
    (ws,) = projects(tmp_path, "ws")
    budget = RunBudget(max_seconds=3600, on_spent="cancel")
    jumped: list[bool] = []

    def on_update(update: t.SessionUpdate) -> None:
        # the command runs: its terminal is in the tool call (a cancel kills it)
        running = isinstance(update, t.ToolCallUpdateSessionUpdate) and any(
            isinstance(c, t.Terminal) for c in update.content or ()
        )
        if running and not jumped:
            jumped.append(True)
            steerable_clock.jump(3600)

    task = 'create s.txt with "partial"\nrun sleep 600'
    with trio.fail_after(3600 + LIMIT):
        outcome = await run_pipeline(
            two_steps("timed"), {"task": task}, cwd=ws, config=config(), policy="trusted",
            on_update=on_update, _budget=budget,
        )  # fmt: skip
    assert jumped
    work = instances(outcome, "work")["work"]
    assert work["status"] == "failed"
    assert work["errorKind"] == "budget"
    assert work["stopReason"] == "cancelled"
    said = r"cancelled: the budget is spent \(time: 36\d\d(\.\d)? s of 3600 s\)"
    assert re.fullmatch(said, work["error"]), work["error"]
    assert [c["path"] for c in work["changes"]] == ["s.txt"]
    assert outcome.status == "failed"
    assert outcome.result["steps"]["after"]["status"] == "skipped"
    assert budget.statistics()["spent"].startswith("time: ")


async def test_no_new_round_of_a_check_starts_once_the_budget_is_spent(tmp_path: Path) -> None:
    """A check that never passes, five rounds allowed: round 1's usage spends the budget, so
    round 2 does not start; the instance fails with kind ``budget``, its round kept."""
    (ws,) = projects(tmp_path, "ws")

    @step(agent="demo", check="echo not yet; exit 1", rounds=5)
    def edit() -> str:
        return 'replace "todo" with "done" in a.txt'

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([edit], name="rounds"), {}, cwd=ws, config=config(),
            policy="edit", _budget=RunBudget(max_tokens=1),
        )  # fmt: skip
    one = instances(outcome, "edit")["edit"]
    used = one["usage"]["used"]
    assert one["status"] == "failed"
    assert one["errorKind"] == "budget"
    assert one["error"] == (
        "check failed (exit 1) after 1 round: not yet; round 2 not started: "
        f"the budget is spent (tokens: {used} used of 1)"
    )
    assert [r["turn"] for r in one["rounds"]] == [1]
    assert [c["path"] for c in one["changes"]] == ["a.txt"]
    assert outcome.status == "failed"


@define
class SpendingPool:
    """A pool whose every lease spends ``budget`` (another session's report) before the
    session is handed over: the instance got its slot while the budget was within."""

    inner: CountingPool
    budget: RunBudget

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
            self.budget.observe(object(), 2, None)
            yield lease


async def test_an_agent_is_not_prompted_once_the_budget_is_spent(tmp_path: Path) -> None:
    """The budget is spent after the instance took its slot, before its first turn: the
    prompt is never sent and the instance is recorded skipped, as one that got no slot."""
    (ws,) = projects(tmp_path, "ws")
    budget = RunBudget(max_tokens=1)

    @step(agent="demo")
    def edit() -> str:
        return 'replace "todo" with "done" in a.txt'

    prompts: list[t.SessionUpdate] = []
    with trio.fail_after(LIMIT):
        async with open_supervisor() as supervisor:
            counting = CountingPool(supervisor)
            pool = SpendingPool(counting, budget)
            outcome = await run_pipeline(
                Pipeline.from_steps([edit], name="late"), {}, cwd=ws, config=config(),
                policy="edit", pool=pool, on_update=prompts.append, _budget=budget,
            )  # fmt: skip
    assert counting.leases == 1
    assert prompts == []  # the agent said nothing: it was never prompted
    one = instances(outcome, "edit")["edit"]
    assert one["status"] == "skipped"
    assert one["errorKind"] == "budget"
    assert one["error"] == "not started: the budget is spent (tokens: 2 used of 1)"
    assert outcome.result["steps"]["edit"]["status"] == "failed"
    assert outcome.status == "failed"
    assert (ws / "a.txt").read_text() == "todo\n"


async def test_a_budget_spent_from_the_start_starts_nothing(tmp_path: Path) -> None:
    """A budget of no seconds is spent when the run starts: a Python step and an agent step
    are each recorded skipped (kind ``budget``), each step fails, no agent is prompted."""
    (ws,) = projects(tmp_path, "ws")

    @step
    def count() -> int:
        return 1

    @step(agent="demo")
    def edit() -> str:
        return 'replace "todo" with "done" in a.txt'

    updates: list[t.SessionUpdate] = []
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([count, edit], name="none"), {}, cwd=ws, config=config(),
            policy="edit", on_update=updates.append, _budget=RunBudget(max_seconds=0),
        )  # fmt: skip
    assert updates == []
    for name in ("count", "edit"):
        entry = outcome.result["steps"][name]
        assert entry["status"] == "failed"
        assert entry["errorKind"] == "budget"
        one = entry["instances"][name]
        assert one["status"] == "skipped"
        assert re.fullmatch(
            r"not started: the budget is spent \(time: [\d.]+ s of 0 s\)", one["error"]
        )
    assert outcome.status == "failed"
    assert outcome.exit_code == 1
