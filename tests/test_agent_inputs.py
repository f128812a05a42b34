"""A step's agents named by a run input: ``agent_input`` and ``agents_input``.

The marker declares a run input like any other (a default, ``check_inputs``); the pipeline bound
to its inputs (``with_agents``) runs, checks and describes the agents the input gave.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from orchestrator import AgentInput, Pipeline, Results, agent_input, agents_input, step
from orchestrator.errors import PipelineError, UsageError


def _diamond() -> Pipeline:
    """plan (one agent from ``lead``) -> implement (a list from ``agents``) -> review (``lead``)."""

    @step(agent=agent_input("lead", default="claude"), policy="read-only")
    def plan(task: str) -> str:
        return task

    @step(agent=agents_input("agents", default=["claude", "codex"]))
    def implement(plan: object, task: str) -> str:
        return task

    @step(agent=agent_input("lead", default="claude"), merge="union")
    def review(implement: Results) -> str:
        return "review"

    return Pipeline.from_steps([plan, implement, review], name="diamond")


def _problems(pipe: Pipeline, values: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(PipelineError) as caught:
        pipe.check_inputs(values)
    return caught.value.problems


def test_marker_declares_a_run_input_with_its_default() -> None:
    """The marker's name is a run input of kind agent/agents, its default the marker's."""
    pipe = _diamond()
    lead, agents = pipe.inputs["lead"], pipe.inputs["agents"]
    assert (lead.kind, lead.default, lead.has_default) == ("agent", "claude", True)
    assert lead.used_by == ("plan", "review")
    assert (agents.kind, agents.default, agents.used_by) == (
        "agents",
        ["claude", "codex"],
        ("implement",),
    )
    assert pipe.inputs["task"].kind == "value"


def test_defaults_are_used_when_the_inputs_are_not_given() -> None:
    """Bound without agent inputs, each step runs the marker's default agents."""
    pipe = _diamond()
    bound = pipe.with_agents(pipe.check_inputs({"task": "t"}))
    assert {name: s.agents for name, s in bound.steps.items()} == {
        "plan": ("claude",),
        "implement": ("claude", "codex"),
        "review": ("claude",),
    }


def test_given_inputs_replace_the_defaults_everywhere_the_graph_is_described() -> None:
    """The bound pipeline's JSON shows the agents the inputs named, and which input named them."""
    pipe = _diamond()
    values = pipe.check_inputs({"task": "t", "lead": "demo", "agents": ["a=demo", "b=demo"]})
    data = pipe.with_agents(values).to_json()
    assert [(n["name"], n["agents"], n["agentsInput"]) for n in data["nodes"]] == [
        ("plan", ["demo"], "lead"),
        ("implement", ["a=demo", "b=demo"], "agents"),
        ("review", ["demo"], "lead"),
    ]
    assert data["agentInputs"] == {"lead": "agent", "agents": "agents"}


def test_one_name_for_a_list_input_is_a_list_of_one_and_still_keyed_by_agent() -> None:
    """``--set agents=demo`` gives ["demo"]; the step still fans out, so its value is Results."""
    pipe = _diamond()
    values = pipe.check_inputs({"task": "t", "agents": "demo"})
    assert values["agents"] == ["demo"]
    implement = pipe.with_agents(values).steps["implement"]
    assert implement.agents == ("demo",)
    assert implement.fans_out


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (
            "agents",
            3,
            "input 'agents': expected an agent name or a list of agent names, got a number (3)",
        ),
        (
            "agents",
            {"a": 1},
            "input 'agents': expected an agent name or a list of agent names, "
            'got an object ({"a": 1})',
        ),
        ("agents", [], "input 'agents': names no agent: give at least one"),
        ("agents", ["demo", 2], "input 'agents': agent names are strings, not a number (2)"),
        ("agents", ["demo", " "], "input 'agents': an agent name is empty"),
        ("lead", ["demo"], "input 'lead': expected one agent name (a string), got a list"),
        ("lead", None, "input 'lead': expected one agent name (a string), got null"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_input(
    name: str, value: object, expected: str
) -> None:
    """An agent input's value is checked with the other inputs; the problem names the input."""
    assert _problems(_diamond(), {"task": "t", name: value}) == (expected,)


def test_an_agent_listed_twice_is_refused() -> None:
    """Branches are keyed by agent: the same name twice is refused, with the way out."""
    (problem,) = _problems(_diamond(), {"task": "t", "agents": ["demo", "demo"]})
    assert problem.startswith("input 'agents': agent 'demo' is listed twice")
    assert "NAME=COMMAND" in problem


def test_a_required_agent_input_must_be_given() -> None:
    """A marker without a default is a required input, reported as missing like any other."""

    @step(agent=agents_input("agents"))
    def implement(task: str) -> str:
        return task

    pipe = Pipeline.from_steps([implement])
    assert _problems(pipe, {"task": "t"}) == ("missing input 'agents' (needed by implement)",)


def test_unknown_agents_are_reported_naming_the_input() -> None:
    """check_agents of a bound pipeline says which input gave an agent that cannot start."""
    pipe = _diamond()
    bound = pipe.with_agents(pipe.check_inputs({"task": "t", "agents": ["claud", "codex"]}))

    def known(name: str) -> None:
        if name != "claude" and name != "codex":
            raise UsageError(f"agent {name}: {name!r} not found")

    with pytest.raises(PipelineError) as caught:
        bound.check_agents(known)
    assert caught.value.problems == ("input 'agents': agent claud: 'claud' not found",)


def test_an_unbound_pipeline_cannot_be_checked_for_agents() -> None:
    """Its agents are not known before its inputs are: check_agents says to bind it first."""
    with pytest.raises(UsageError, match="with_agents"):
        _diamond().check_agents(lambda name: None)


def test_the_step_may_also_take_the_input_as_a_parameter() -> None:
    """A step function naming the input gets its checked value (a list for agents_input)."""

    @step(agent=agents_input("agents", default=["claude"]))
    def implement(task: str, agents: list[str]) -> str:
        return f"{task} by {', '.join(agents)}"

    pipe = Pipeline.from_steps([implement])
    values = pipe.check_inputs({"task": "t", "agents": "demo"})
    assert implement(**values) == "t by demo"


def test_one_input_cannot_name_one_agent_and_a_list() -> None:
    """agent_input and agents_input of one name in two steps is a pipeline problem."""

    @step(agent=agent_input("who", default="claude"))
    def a(task: str) -> str:
        return task

    @step(agent=agents_input("who", default=["claude"]))
    def b(a: object) -> str:
        return "b"

    with pytest.raises(PipelineError) as caught:
        Pipeline.from_steps([a, b])
    assert caught.value.problems == (
        "input 'who' names one agent for a (agent_input) but a list of agents for b (agents_input)",
    )


def test_defaults_of_one_input_must_agree() -> None:
    """Two markers of one input with different defaults are reported like other defaults."""

    @step(agent=agent_input("who", default="claude"))
    def a(task: str) -> str:
        return task

    @step(agent=agent_input("who", default="codex"))
    def b(a: object) -> str:
        return "b"

    with pytest.raises(PipelineError, match="input 'who' has different defaults"):
        Pipeline.from_steps([a, b])


def test_a_marker_cannot_name_a_step() -> None:
    """The agents come from a run input; a step's name is not one."""

    @step
    def lead() -> str:
        return "claude"

    @step(agent=agent_input("lead", default="claude"))
    def work(lead: str) -> str:
        return "x"

    with pytest.raises(PipelineError, match="its agents come from 'lead', which is a step"):
        Pipeline.from_steps([lead, work])


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: agent_input("lead", default=cast(Any, 3)),
            TypeError,
            "default: expected one agent name",
        ),
        (lambda: agents_input("agents", default=[]), UsageError, "default: names no agent"),
        (lambda: agents_input("agents", default=["a", "a"]), UsageError, "listed twice"),
        (lambda: agent_input("not a name"), UsageError, "cannot name a run input"),
        (lambda: agent_input("item"), UsageError, "cannot name a run input"),
        (lambda: agent_input(cast(Any, 3)), TypeError, "the input name is a string"),
    ],
)
def test_the_marker_is_checked_when_made(make: Any, error: type[Exception], message: str) -> None:
    """A bad default or input name fails where the marker is written."""
    with pytest.raises(error, match=message):
        make()


def test_agent_only_options_are_allowed_on_a_marker_step() -> None:
    """A step whose agents come from an input is an agent step (policy, model, ...)."""

    @step(agent=agent_input("lead", default="claude"), policy="read-only", model="m")
    def plan(task: str) -> str:
        return task

    assert plan.is_agent_step
    assert plan.needs_agents
    assert isinstance(plan.agents_input, AgentInput)
    assert repr(plan) == "<Step 'plan' agents from input 'lead'>"
