"""A budget shared by runs (:mod:`orchestrator.pipeline._budget`): its arithmetic, what it says
once spent, and waiting for it on trio's clock (a mock one, jumping ahead when all tasks wait)."""

from __future__ import annotations

import math

import pytest
import trio

from orchestrator.errors import UsageError
from orchestrator.pipeline._budget import NotStarted, RunBudget, UsageMeter


def test_a_meter_counts_each_session_once_with_its_highest_report() -> None:
    """Cumulative reports of a session replace each other; sessions add up; a lower report
    (a context window compacted) gives nothing back."""
    meter = UsageMeter()
    assert meter.to_json() == {"tokens": None, "cost": None}
    a, b = object(), object()
    meter.observe(a, 100, None)
    meter.observe(a, 250, None)
    meter.observe(b, 40, 0.5)
    assert meter.tokens == 290
    assert meter.cost == 0.5
    meter.observe(a, 120, 0.25)  # lower tokens: ignored; first cost of a
    assert meter.to_json() == {"tokens": 290, "cost": 0.75}


def test_a_meter_sums_costs_exactly() -> None:
    """Ten sessions of 0.1 each cost 1.0 exactly (a running float sum says 0.9999999999999999)."""
    meter = UsageMeter()
    for _ in range(10):
        meter.observe(object(), None, 0.1)
    assert meter.cost == 1.0
    assert meter.tokens is None


def test_a_meter_ignores_reports_no_agent_should_send() -> None:
    """Negative tokens, a negative, infinite or NaN cost, and booleans are not counted."""
    meter = UsageMeter()
    s = object()
    meter.observe(s, -5, -1.0)
    meter.observe(s, True, math.nan)
    meter.observe(s, None, math.inf)
    assert meter.to_json() == {"tokens": None, "cost": None}
    meter.observe(s, 0, 0.0)
    assert meter.to_json() == {"tokens": 0, "cost": 0.0}


def test_a_settled_session_stays_counted_and_is_forgotten() -> None:
    """After settle the totals keep the session's figures; its entries are gone."""
    meter = UsageMeter()
    s = object()
    meter.observe(s, 70, 0.2)
    meter.settle(s)
    assert meter.to_json() == {"tokens": 70, "cost": 0.2}
    assert not meter._tokens and not meter._costs


def test_a_budget_is_spent_when_a_total_goes_over_its_limit() -> None:
    """Equal to the limit is within; over it is spent, and says by how much."""
    budget = RunBudget(max_tokens=100)
    budget.observe("s1", 60, None)
    budget.observe("s2", 40, None)
    assert budget.spent is None
    budget.observe("s2", 41, None)
    assert budget.spent == "tokens: 101 used of 100"
    budget.observe("s3", 9, None)  # later figures show in the line
    assert budget.spent == "tokens: 110 used of 100"


def test_a_cost_budget_says_its_amounts() -> None:
    """Cost lines have two decimals, more when two would hide the amounts."""
    budget = RunBudget(max_cost=1.0)
    budget.observe("s", None, 1.02)
    assert budget.spent == "cost: 1.02 of 1.00"
    small = RunBudget(max_cost=0.003)
    small.observe("s", None, 0.0034)
    assert small.spent == "cost: 0.0034 of 0.003"


def test_a_budget_stays_spent_and_names_the_limit_spent_first() -> None:
    """Cost went over first: later tokens over their limit do not change what it says."""
    budget = RunBudget(max_tokens=10, max_cost=0.5)
    budget.observe("s", 5, 0.6)
    assert budget.spent == "cost: 0.60 of 0.50"
    budget.observe("s", 50, 0.6)
    assert budget.spent == "cost: 0.60 of 0.50"
    assert budget.statistics() == {
        "maxTokens": 10,
        "maxCost": 0.5,
        "maxSeconds": None,
        "onSpent": "finish",
        "tokens": 50,
        "cost": 0.6,
        "seconds": None,
        "spent": "cost: 0.60 of 0.50",
    }


def test_a_budget_counts_each_runs_usage_apart() -> None:
    """usage(run) sums that run's sessions only; a run that reported nothing has None."""
    budget = RunBudget()
    budget.observe("a1", 10, 0.1, run="run-a")
    budget.observe("a2", 5, None, run="run-a")
    budget.observe("b1", 7, None, run="run-b")
    budget.settle("a1", run="run-a")
    budget.observe("a1", 3, None, run="run-a")  # a new report after settle: a new session
    assert budget.usage("run-a") == {"tokens": 18, "cost": 0.1}
    assert budget.usage("run-b") == {"tokens": 7, "cost": None}
    assert budget.usage("run-c") == {"tokens": None, "cost": None}
    assert budget.statistics()["tokens"] == 25
    assert budget.spent is None  # no limit: it only counts


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": -1}, "max_tokens must be a finite number, 0 or more, not -1"),
        ({"max_tokens": 1.5}, "max_tokens must be a whole number, not 1.5"),
        ({"max_cost": math.nan}, "max_cost must be a finite number, 0 or more, not nan"),
        ({"max_seconds": "60"}, "max_seconds must be a number, not '60'"),
        ({"on_spent": "stop"}, "on_spent must be 'finish' or 'cancel', not 'stop'"),
    ],
)
def test_a_budget_refuses_limits_that_are_not_limits(
    kwargs: dict[str, object], message: str
) -> None:
    """Each wrong limit is a one-line usage error naming it."""
    with pytest.raises(UsageError) as caught:
        RunBudget(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == f"a budget's {message}"


async def test_time_is_spent_max_seconds_after_start(autojump_clock: trio.abc.Clock) -> None:
    """The clock starts at the first start(); a later start() does not move it."""
    budget = RunBudget(max_seconds=60)
    await trio.sleep(100)  # not started: time does not count
    assert budget.spent is None
    budget.start()
    await trio.sleep(30)
    budget.start()
    assert budget.spent is None
    assert budget.statistics()["seconds"] == 30
    await trio.sleep(30)
    assert budget.spent == "time: 60 s of 60 s"
    with pytest.raises(NotStarted) as caught:
        budget.check_within()
    assert caught.value.spent == "time: 60 s of 60 s"


async def test_wait_spent_returns_at_the_deadline(autojump_clock: trio.abc.Clock) -> None:
    """A waiter started before start() wakes max_seconds after it, not before."""
    budget = RunBudget(max_seconds=60)
    woke: list[float] = []

    async def wait() -> None:
        await budget.wait_spent()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(10)
        budget.start()
        began = trio.current_time()
    assert woke == [began + 60]


async def test_wait_spent_returns_when_usage_spends_it(autojump_clock: trio.abc.Clock) -> None:
    """Every waiter wakes on the report that spends the budget, at that moment; one that
    comes after returns at once."""
    budget = RunBudget(max_tokens=100, max_seconds=3600)
    budget.start()
    woke: list[float] = []

    async def wait() -> None:
        await budget.wait_spent()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        nursery.start_soon(wait)
        await trio.sleep(5)
        budget.observe("s", 100, None)  # at the limit: within
        await trio.sleep(5)
        assert woke == []
        budget.observe("s", 101, None)
        spent_at = trio.current_time()
    assert woke == [spent_at, spent_at]
    with trio.fail_after(1):
        await budget.wait_spent()
    assert budget.spent == "tokens: 101 used of 100"
