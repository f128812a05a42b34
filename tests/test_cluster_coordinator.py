"""The cluster run's coordinator: one budget, request rates by agent, idempotency claims."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from orchestrator.cluster._connect import ClusterSpec, connect
from orchestrator.cluster._coordinator import Coordinator, Rate, parse_rate
from orchestrator.errors import UsageError


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("5/s", Rate(5, 1.0)),
        ("30/m", Rate(30, 60.0)),
        ("100/h", Rate(100, 3600.0)),
        ("2/10s", Rate(2, 10.0)),
        ("1/1.5m", Rate(1, 90.0)),
        (" 3/s ", Rate(3, 1.0)),
    ],
)
def test_parse_rate(text: str, rate: Rate) -> None:
    """COUNT/UNIT and COUNT/N UNIT give that many requests per that many seconds."""
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    "text", ["", "5", "5/", "/s", "0/s", "5/0s", "-1/s", "5/d", "5 / s", "5/s/s", "1.5/s", "5/1e3s"]
)
def test_bad_rates(text: str) -> None:
    """Anything else is a one-line usage error naming the text."""
    with pytest.raises(UsageError) as caught:
        parse_rate(text)
    assert repr(text) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("count", "per"), [(0, 1.0), (1, 0.0), (1, float("inf")), (True, 1.0)])
def test_bad_rate_values(count: int, per: float) -> None:
    """A rate built by hand with a count below 1 or a period not above 0 is refused."""
    with pytest.raises(UsageError):
        Rate(count, per)


def test_budget_tokens_spent_with_the_one_machine_text() -> None:
    """Tokens over the limit spend the budget; the text is RunBudget's; spent stays spent."""
    coordinator = Coordinator(max_tokens=100, clock=Clock())
    assert coordinator.observe("a", 60, None, run="r1") is None
    assert coordinator.observe("b", 40, None, run="r2") is None
    assert coordinator.observe("a", 61, None, run="r1") == "tokens: 101 used of 100"
    assert coordinator.spent() == "tokens: 101 used of 100"
    assert coordinator.usage("r1") == {"tokens": 61, "cost": None}
    assert coordinator.usage("r2") == {"tokens": 40, "cost": None}
    assert coordinator.usage("r3") == {"tokens": None, "cost": None}


def test_budget_counts_a_session_once_with_its_highest_figures() -> None:
    """Cumulative reports: a session counts with its highest figures, a lower one changes
    nothing, and a settled session stays counted."""
    coordinator = Coordinator(max_cost=1.0, clock=Clock())
    assert coordinator.observe("a", 10, 0.25) is None
    assert coordinator.observe("a", 5, 0.5) is None
    coordinator.settle("a")
    assert coordinator.observe("b", None, 0.75) == "cost: 1.25 of 1.00"
    assert coordinator.statistics()["tokens"] == 10


def test_budget_ignores_hostile_reports() -> None:
    """Negative, non-finite and non-number figures are ignored."""
    coordinator = Coordinator(max_tokens=0, max_cost=0.0, clock=Clock())
    for used, cost in [(-5, -1.0), (None, float("nan")), (None, float("inf")), (True, None)]:
        assert coordinator.observe("a", used, cost) is None
    assert coordinator.statistics()["tokens"] is None
    assert coordinator.statistics()["cost"] is None


def test_budget_time() -> None:
    """max_seconds counts from the first start(); a later start() does not move it."""
    clock = Clock()
    coordinator = Coordinator(max_seconds=60, clock=clock)
    clock.now += 1000
    assert coordinator.spent() is None  # not started: no time passes
    coordinator.start()
    clock.now += 30
    coordinator.start()
    assert coordinator.spent() is None
    assert coordinator.statistics()["seconds"] == 30
    clock.now += 30
    assert coordinator.spent() == "time: 60 s of 60 s"


def test_budget_limits_checked() -> None:
    """A negative or non-number limit is a usage error, as on one machine."""
    with pytest.raises(UsageError, match="max_tokens"):
        Coordinator(max_tokens=-1)
    with pytest.raises(UsageError, match="max_cost"):
        Coordinator(max_cost=float("nan"))
    with pytest.raises(UsageError, match="max_seconds"):
        Coordinator(max_seconds="60")  # type: ignore[arg-type]


def test_rate_spacing() -> None:
    """Grants are evenly spaced: the k-th no earlier than first + k * per / count, and a
    refusal says how long to wait and reserves nothing."""
    clock = Clock()
    coordinator = Coordinator(rates={"claude": Rate(4, 2.0)}, clock=clock)
    first = clock.now
    assert coordinator.take("claude") == 0.0
    assert coordinator.take("claude") == pytest.approx(0.5)
    clock.now += 0.2
    assert coordinator.take("claude") == pytest.approx(0.3)
    assert coordinator.take("claude") == pytest.approx(0.3)  # nothing reserved
    clock.now = first + 0.5
    assert coordinator.take("claude") == 0.0
    assert coordinator.take("claude") == pytest.approx(0.5)


def test_rate_callers_following_the_waits() -> None:
    """Callers that sleep what they are told get exactly count per period, one at a time."""
    clock = Clock()
    coordinator = Coordinator(rates={"a": Rate(5, 1.0)}, clock=clock)
    first = clock.now
    grants: list[float] = []
    waiting = [0.0, 0.0, 0.0]  # three callers, each the time it asks next
    while len(grants) < 20:
        caller = min(range(3), key=lambda i: waiting[i])
        clock.now = max(clock.now, waiting[caller])
        wait = coordinator.take("a")
        if wait == 0.0:
            grants.append(clock.now)
        waiting[caller] = clock.now + wait
    for k, granted in enumerate(grants):
        assert granted >= first + k * 0.2 - 1e-9
    assert grants[-1] == pytest.approx(first + 19 * 0.2)


def test_rate_no_burst_after_idle() -> None:
    """An idle agent saves up no burst: after a long pause, one grant, then spacing again."""
    clock = Clock()
    coordinator = Coordinator(rates={"a": Rate(2, 1.0)}, clock=clock)
    assert coordinator.take("a") == 0.0
    clock.now += 3600
    assert coordinator.take("a") == 0.0
    assert coordinator.take("a") == pytest.approx(0.5)


def test_rates_per_agent() -> None:
    """Each agent has its own rate; an agent without one is always granted."""
    clock = Clock()
    coordinator = Coordinator(rates={"a": Rate(1, 10.0), "b": Rate(1, 1.0)}, clock=clock)
    assert coordinator.take("a") == 0.0
    assert coordinator.take("b") == 0.0
    assert coordinator.take("a") == pytest.approx(10.0)
    assert coordinator.take("b") == pytest.approx(1.0)
    assert all(coordinator.take("c") == 0.0 for _ in range(100))
    rates = coordinator.statistics()["rates"]
    assert rates["a"] == {"rate": "1/10s", "granted": 1, "refused": 1}
    assert rates["c"] == {"rate": None, "granted": 100, "refused": 0}


def test_claims() -> None:
    """The first owner of a key holds it; the same owner again still does; another does not."""
    coordinator = Coordinator()
    assert coordinator.claim("run1/step/0/round1", "node-a")
    assert coordinator.claim("run1/step/0/round1", "node-a")
    assert not coordinator.claim("run1/step/0/round1", "node-b")
    assert coordinator.claim("run1/step/0/round2", "node-b")
    stats = coordinator.statistics()
    assert (stats["claims"], stats["claimsRefused"]) == (2, 1)


def test_picklable_for_an_actor() -> None:
    """Arguments and results cross process boundaries: the rates and the results pickle."""
    coordinator = Coordinator(max_tokens=5, rates={"a": parse_rate("5/s")})
    coordinator.observe("s", 9, 0.5, run="r")
    for value in (parse_rate("5/s"), coordinator.statistics(), coordinator.usage("r")):
        assert pickle.loads(pickle.dumps(value)) == value


@pytest.mark.ray
def test_one_coordinator_shared_by_both_nodes(ray_cluster: Any) -> None:
    """As a Ray actor, one coordinator is shared by tasks on both nodes: one claim wins, the
    usage both report adds up against one budget, and one rate spaces their grants."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def on_node(coordinator: Any, node: str) -> tuple[bool, str | None, float, str]:
        claimed = ray.get(coordinator.claim.remote("run/step/0/1", node))
        spent = ray.get(coordinator.observe.remote(node, 60, None, "run"))
        wait = ray.get(coordinator.take.remote("a"))
        return claimed, spent, wait, ray.get_runtime_context().get_node_id()

    with connect(ClusterSpec(ray_cluster.address)) as nodes:
        actor = ray.remote(Coordinator).options(max_restarts=0, max_task_retries=0)
        coordinator: Any = actor.remote(max_tokens=100, rates={"a": Rate(1, 3600.0)})
        task = ray.remote(on_node)
        refs = [
            task.options(
                num_cpus=0,
                resources={"agent_slots": 1},
                max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote(coordinator, node.node_id)
            for node in nodes
        ]
        results = ray.get(refs)
        assert {where for _, _, _, where in results} == {node.node_id for node in nodes}
        assert sorted(claimed for claimed, _, _, _ in results) == [False, True]
        assert sorted(str(spent) for _, spent, _, _ in results) == [
            "None",
            "tokens: 120 used of 100",
        ]
        waits = sorted(wait for _, _, wait, _ in results)
        assert waits[0] == 0.0
        assert waits[1] > 3000  # the second grant is an hour after the first
        assert ray.get(coordinator.usage.remote("run")) == {"tokens": 120, "cost": None}
        ray.kill(coordinator)
