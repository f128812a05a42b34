"""Tests of declaring steps and building the validated pipeline graph."""

from __future__ import annotations

import hashlib
import inspect
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import PipelineError, UsageError
from orchestrator.pipeline import (
    MERGE_STRATEGIES,
    RESERVED_PARAMS,
    Budget,
    InputSpec,
    Pipeline,
    Step,
    step,
)
from orchestrator.pipeline.spec import collect_steps


def problems_of(*steps: Step) -> tuple[str, ...]:
    """The problems from_steps reports for ``steps`` (failing if it accepts them)."""
    with pytest.raises(PipelineError) as info:
        Pipeline.from_steps(steps)
    return info.value.problems


# --------------------------------------------------------------------------- the decorator


def test_bare_decorator_makes_a_python_step() -> None:
    """@step without parentheses works and makes a Python step."""

    @step
    def files(pattern: str = "*.py") -> list[str]:
        return [pattern]

    assert isinstance(files, Step)
    assert files.name == "files"
    assert files.agents == ()
    assert not files.is_agent_step
    assert not files.fans_out


def test_decorator_with_parentheses_makes_a_step() -> None:
    """@step() with no options is the same as bare @step."""

    @step()
    def files() -> list[str]:
        return []

    assert isinstance(files, Step)
    assert files.params == ()
    assert files.merge == "fail"
    assert files.retries == 0


def test_a_step_is_called_like_its_function() -> None:
    """Calling a Step calls the function, with positional and keyword arguments."""

    @step(agent="claude", over="files")
    def transform(item: str, instructions: str) -> str:
        return f"In {item}: {instructions}"

    assert transform("a.py", "add types") == "In a.py: add types"
    assert transform(item="b.py", instructions="x") == "In b.py: x"
    assert inspect.signature(transform) == inspect.signature(transform.fn)


async def test_an_async_step_is_detected_and_still_awaitable() -> None:
    """An async def step is marked is_async, and calling it gives an awaitable."""

    @step
    async def fetch(url: str) -> str:
        return url.upper()

    @step
    def plain(url: str) -> str:
        return url

    assert fetch.is_async
    assert not plain.is_async
    assert await fetch("x") == "X"


def test_fields_describe_the_function() -> None:
    """Params, defaults, agents and the docstring's first line are taken from the function."""

    @step(agent=["claude", "codex"], timeout=600, idle_timeout=30, retries=2, budget=5000)
    def implement(plan: object, style: str = "terse", ctx: object = None) -> str:
        """Implement the plan.

        More words that are not the description.
        """
        return str(plan)

    assert implement.params == ("plan", "style", "ctx")
    assert dict(implement.defaults) == {"style": "terse", "ctx": None}
    assert implement.agents == ("claude", "codex")
    assert implement.description == "Implement the plan."
    assert implement.timeout == 600.0
    assert implement.idle_timeout == 30.0
    assert implement.retries == 2
    assert implement.budget == Budget(max_tokens=5000)
    assert implement.is_agent_step
    assert implement.fans_out
    assert implement.dependencies == ("plan", "style")


def test_explicit_description_wins_and_no_docstring_gives_none() -> None:
    """description= overrides the docstring; without either the description is None."""

    @step(description="Plan it")
    def plan() -> str:
        """Docstring."""
        return ""

    @step
    def bare() -> str:
        return ""

    assert plan.description == "Plan it"
    assert bare.description is None


def test_agent_options_are_kept() -> None:
    """policy, mode, model, merge and a Budget object are stored as given."""
    budget = Budget(max_tokens=100, max_seconds=2.5)

    @step(
        agent="claude", policy="read-only", mode="plan", model="opus", merge="union", budget=budget
    )
    def review(plan: object) -> str:
        return ""

    assert (review.policy, review.mode, review.model, review.merge) == (
        "read-only",
        "plan",
        "opus",
        "union",
    )
    assert review.budget is budget


def test_dependencies_skip_reserved_names_and_dedupe() -> None:
    """dependencies = params + when params + over, minus item/workdir/ctx, each once."""

    @step(agent="claude", over="files", when=lambda files, limit: len(files) < limit)
    def transform(item: str, workdir: str, ctx: object, instructions: str, files: object) -> str:
        return ""

    assert transform.when_params == ("files", "limit")
    assert transform.dependencies == ("instructions", "files", "limit")
    assert transform.wants_workdir
    assert transform.fans_out


def test_over_alone_is_a_dependency() -> None:
    """A step over `files` depends on `files` even without a parameter of that name."""

    @step(agent="claude", over="files")
    def transform(item: str) -> str:
        return item

    assert transform.dependencies == ("files",)
    assert not transform.wants_workdir


def test_step_repr_is_short() -> None:
    """A step's repr names it and its agents, not the whole function."""

    @step(agent="claude", over="files")
    def transform(item: str) -> str:
        return item

    assert repr(transform) == "<Step 'transform' agents=['claude'], over='files'>"


def test_constants_list_what_the_docs_promise() -> None:
    """The merge strategies and the reserved names are exactly the documented ones."""
    assert {"fail", "ours", "theirs", "union"} == MERGE_STRATEGIES
    assert {"item", "workdir", "ctx"} == RESERVED_PARAMS


def _fn(plan: object) -> str:
    return ""


def solo() -> str:
    """A step function with no parameters."""
    return ""


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"merge": "sometimes"}, UsageError, "merge='sometimes' is not one of"),
        ({"merge": 1}, TypeError, "merge must be a string"),
        ({"retries": -1}, UsageError, "retries must be 0 or more"),
        ({"retries": 1.5}, TypeError, "retries must be an int"),
        ({"retries": True}, TypeError, "retries must be an int"),
        ({"timeout": 0}, UsageError, "timeout must be positive"),
        ({"timeout": -3.0}, UsageError, "timeout must be positive"),
        ({"timeout": "10"}, TypeError, "timeout must be a number"),
        ({"agent": "claude", "idle_timeout": 0}, UsageError, "idle_timeout must be positive"),
        ({"agent": ""}, UsageError, "an agent name is empty"),
        ({"agent": ["claude", "  "]}, UsageError, "an agent name is empty"),
        ({"agent": []}, UsageError, "names no agent"),
        ({"agent": ["claude", "claude"]}, UsageError, "listed twice"),
        ({"agent": ["claude", 3]}, TypeError, "agent names are strings"),
        ({"over": "not valid"}, UsageError, "over='not valid' is not a step or input name"),
        ({"over": "class"}, UsageError, "is not a step or input name"),
        ({"over": "item"}, UsageError, "over='item' is not a step or input name"),
        ({"over": 3}, TypeError, "over must be"),
        ({"agent": "claude", "budget": 0}, UsageError, "max_tokens must be positive"),
        ({"agent": "claude", "budget": -5}, UsageError, "max_tokens must be positive"),
        ({"agent": "claude", "budget": True}, TypeError, "budget must be a Budget or an int"),
        ({"agent": "claude", "budget": "lots"}, TypeError, "budget must be a Budget or an int"),
        ({"when": True}, TypeError, "when must be callable"),
        ({"when": lambda *args: True}, UsageError, "is not allowed"),
        ({"model": "opus"}, UsageError, "model only applies to agent steps"),
        ({"policy": "trusted", "mode": "plan"}, UsageError, "policy, mode only apply"),
        ({"agent": "claude", "model": ""}, UsageError, "model is empty"),
        ({"agent": "claude", "mode": 1}, TypeError, "mode must be a string"),
        ({"description": 1}, TypeError, "description must be a string"),
    ],
)
def test_bad_options_are_refused_at_once_naming_the_step(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    """Every option is checked when the decorator runs, and the error names the step."""
    with pytest.raises(error) as info:
        step(**options)(_fn)
    assert "step '_fn'" in str(info.value)
    assert words in str(info.value)


def test_functions_whose_parameters_cannot_be_named_are_refused() -> None:
    """*args, **kwargs and positional-only parameters can't name dependencies."""

    def star(*plans: object) -> str:
        return ""

    def kw(**plans: object) -> str:
        return ""

    def positional(plan: object, /) -> str:
        return ""

    for fn, words in ((star, "*plans"), (kw, "**plans"), (positional, "positional-only")):
        with pytest.raises(UsageError) as e:
            step(fn)
        assert words in str(e.value)


def test_things_that_are_not_step_functions_are_refused() -> None:
    """Lambdas, generators, non-callables, steps and a positional agent name are refused."""

    def gen() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    with pytest.raises(UsageError, match="not a lambda"):
        step(lambda: 1)
    with pytest.raises(UsageError, match="generators are not supported"):
        step(gen)
    with pytest.raises(UsageError, match="generators are not supported"):
        step(agen)
    with pytest.raises(TypeError, match="decorates a function"):
        step(3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="twice"):
        step(step(_fn))
    with pytest.raises(TypeError, match=r"@step\(agent='claude'\)"):
        step("claude")  # type: ignore[call-overload]


def test_budget_from_an_int_or_a_budget() -> None:
    """An int budget means max tokens; a Budget is kept; its limits must be positive."""
    assert Budget.from_value(5000) == Budget(max_tokens=5000)
    assert Budget(max_seconds=1.5).max_seconds == 1.5
    with pytest.raises(UsageError, match="max_seconds must be positive"):
        Budget(max_seconds=0)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        Budget(max_tokens=1.5)  # type: ignore[arg-type]


def test_collect_steps_sees_every_step_made_inside_it() -> None:
    """Inside collect_steps every new step is recorded, even one whose name is rebound."""
    with collect_steps() as collected:

        @step
        def plan() -> str:
            return ""

        first = plan

        @step
        def plan() -> str:
            return ""

    assert collected == [first, plan]
    step(_fn)  # outside the block: not collected
    assert len(collected) == 2


# --------------------------------------------------------------------------- validation


def test_no_steps_is_a_problem() -> None:
    """An empty pipeline is refused."""
    assert problems_of() == ("no steps: decorate functions with @step",)


def test_duplicate_names_are_a_problem() -> None:
    """Two steps with one name are reported once, with the count."""
    first = step(_fn)
    second = step(_fn)
    assert problems_of(first, second) == ("duplicate step '_fn': defined 2 times",)


def test_a_cycle_is_named_in_order() -> None:
    """A cycle is reported as the path round it, starting at its first-defined step."""

    @step
    def start() -> str:
        return ""

    @step
    def plan(start: str, review: str) -> str:
        return ""

    @step
    def review(plan: str) -> str:
        return ""

    assert problems_of(start, plan, review) == ("cycle: plan -> review -> plan",)


def test_each_separate_cycle_is_reported() -> None:
    """Two independent cycles give two problems, each naming its own path."""

    @step
    def a(c: str) -> str:
        return ""

    @step
    def b(a: str) -> str:
        return ""

    @step
    def c(b: str) -> str:
        return ""

    @step
    def x(y: str) -> str:
        return ""

    @step
    def y(x: str) -> str:
        return ""

    assert problems_of(a, b, c, x, y) == ("cycle: a -> b -> c -> a", "cycle: x -> y -> x")


def test_a_cycle_through_over_and_when_is_found() -> None:
    """Dependencies through over= and when= count for cycles too."""

    @step(agent="claude", over="b")
    def a(item: str) -> str:
        return ""

    @step(when=lambda a: bool(a))
    def b() -> list[str]:
        return []

    assert problems_of(a, b) == ("cycle: a -> b -> a",)


def test_item_without_over_is_a_problem() -> None:
    """The reserved `item` needs over= naming what to iterate."""

    @step(agent="claude")
    def transform(item: str) -> str:
        return ""

    assert problems_of(transform) == (
        "step 'transform': parameter 'item' needs over=... naming what to iterate",
    )


def test_over_naming_the_step_itself_is_a_problem() -> None:
    """A step cannot iterate over its own result."""

    @step(agent="claude", over="transform")
    def transform(item: str) -> str:
        return ""

    assert problems_of(transform) == ("step 'transform': over='transform' names the step itself",)


def test_a_step_depending_on_itself_is_a_problem() -> None:
    """A parameter (or when parameter) named like its own step is a self-dependency."""

    @step
    def plan(plan: str) -> str:
        return ""

    @step(when=lambda review: True)
    def review() -> str:
        return ""

    assert problems_of(plan, review) == (
        "step 'plan': depends on itself (a parameter is named 'plan')",
        "step 'review': depends on itself (a parameter is named 'review')",
    )


def test_when_may_not_use_reserved_names() -> None:
    """when= sees dependencies and run inputs only, not item/workdir/ctx."""

    @step(agent="claude", over="files", when=lambda item, ctx: True)
    def transform(item: str) -> str:
        return ""

    assert problems_of(transform) == (
        "step 'transform': when's parameters must be steps or run inputs, not 'item', 'ctx'",
    )


def test_a_step_named_like_a_reserved_name_is_a_problem() -> None:
    """No step can be called workdir, item or ctx: nothing could depend on it."""

    @step
    def workdir() -> str:
        return ""

    assert problems_of(workdir) == (
        "step 'workdir': 'workdir' is a reserved name; rename the function",
    )


def test_conflicting_input_defaults_are_a_problem() -> None:
    """Two steps giving different defaults to one run input is reported with both values."""

    @step
    def a(pattern: str = "*.py") -> str:
        return ""

    @step
    def b(pattern: str = "*.md") -> str:
        return ""

    assert problems_of(a, b) == (
        "input 'pattern' has different defaults: '*.py' in a, '*.md' in b",
    )


def test_every_problem_is_reported_at_once() -> None:
    """Several problems in different steps all come back in one PipelineError."""

    @step
    def plan(review: str, item: str) -> str:
        return ""

    @step
    def review(plan: str) -> str:
        return ""

    @step
    def dup() -> str:
        return ""

    dup2 = step(dup.fn)

    with pytest.raises(PipelineError) as info:
        Pipeline.from_steps([plan, review, dup, dup2], name="demo")
    error = info.value
    assert error.problems == (
        "duplicate step 'dup': defined 2 times",
        "step 'plan': parameter 'item' needs over=... naming what to iterate",
        "cycle: plan -> review -> plan",
    )
    assert isinstance(error, UsageError)
    assert str(error).startswith("demo: 3 problems:\n  - duplicate step 'dup'")
    for problem in error.problems:
        assert problem in str(error)


def test_from_steps_refuses_things_that_are_not_steps() -> None:
    """Passing a plain function instead of a step is a TypeError."""
    with pytest.raises(TypeError, match="made of steps"):
        Pipeline.from_steps([_fn])  # type: ignore[list-item]


def test_pipeline_error_pickles_with_its_problems() -> None:
    """A PipelineError survives pickling with its problems and source."""
    error = PipelineError(["a", "b"], "p.py")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.problems == ("a", "b")
    assert copy.source == "p.py"
    assert str(copy) == str(error) == "p.py: 2 problems:\n  - a\n  - b"
    assert str(PipelineError("only")) == "only"


# --------------------------------------------------------------------------- the graph


def diamond() -> list[Step]:
    """plan -> (frontend, backend) -> report, with frontend defined before backend."""

    @step(agent="claude")
    def plan(task: str) -> str:
        return ""

    @step(agent="codex")
    def frontend(plan: object) -> str:
        return ""

    @step(agent="claude")
    def backend(plan: object) -> str:
        return ""

    @step
    def report(frontend: object, backend: object, workdir: str) -> str:
        return ""

    return [plan, frontend, backend, report]


def test_order_breaks_ties_in_definition_order() -> None:
    """Independent steps keep the order they were defined in, not alphabetical order."""
    pipeline = Pipeline.from_steps(diamond())
    assert pipeline.order() == ["plan", "frontend", "backend", "report"]
    assert pipeline.generations() == [["plan"], ["frontend", "backend"], ["report"]]
    assert list(pipeline.steps) == ["plan", "frontend", "backend", "report"]


def test_order_puts_dependencies_first_whatever_the_definition_order() -> None:
    """A step defined before its dependency still runs after it."""

    @step
    def late(early: str) -> str:
        return ""

    @step
    def other() -> str:
        return ""

    @step
    def early() -> str:
        return ""

    pipeline = Pipeline.from_steps([late, other, early])
    assert pipeline.order() == ["other", "early", "late"]
    assert pipeline.generations() == [["other", "early"], ["late"]]


def test_neighbours_and_sinks() -> None:
    """parents, children, descendants and sinks follow the step dependencies."""
    pipeline = Pipeline.from_steps(diamond())
    assert pipeline.parents("report") == ["frontend", "backend"]
    assert pipeline.parents("plan") == []
    assert pipeline.children("plan") == ["frontend", "backend"]
    assert pipeline.descendants("plan") == {"frontend", "backend", "report"}
    assert pipeline.descendants("report") == set()
    assert pipeline.sinks() == ["report"]
    for method in (pipeline.parents, pipeline.children, pipeline.descendants):
        with pytest.raises(UsageError, match="has no step 'nope'"):
            method("nope")


def test_graph_has_step_edges_only_and_the_steps_as_node_data() -> None:
    """Edges go dependency -> step between steps; inputs are not nodes."""
    steps = diamond()
    pipeline = Pipeline.from_steps(steps)
    assert set(pipeline.graph.edges) == {
        ("plan", "frontend"),
        ("plan", "backend"),
        ("frontend", "report"),
        ("backend", "report"),
    }
    assert "task" not in pipeline.graph
    assert pipeline.graph.nodes["plan"]["step"] is steps[0]


def test_inputs_collect_defaults_and_users() -> None:
    """Run inputs are the non-step dependencies, with their defaults and the steps using them."""

    @step
    def files(pattern: str = "*.py", root: str = ".") -> list[str]:
        return []

    @step(agent="claude", over="files", when=lambda limit=3: limit > 0)
    def transform(item: str, instructions: str, pattern: str = "*.py") -> str:
        return ""

    pipeline = Pipeline.from_steps([files, transform])
    assert dict(pipeline.inputs) == {
        "pattern": InputSpec("pattern", "*.py", True, ("files", "transform")),
        "root": InputSpec("root", ".", True, ("files",)),
        "instructions": InputSpec("instructions", None, False, ("transform",)),
        "limit": InputSpec("limit", 3, True, ("transform",)),
    }


def test_a_default_on_a_step_dependency_is_not_an_input() -> None:
    """A parameter naming a step is a dependency even when it has a default."""

    @step
    def plan() -> str:
        return ""

    @step
    def review(plan: str = "none") -> str:
        return ""

    pipeline = Pipeline.from_steps([plan, review])
    assert dict(pipeline.inputs) == {}
    assert pipeline.parents("review") == ["plan"]


def test_check_inputs_fills_in_defaults() -> None:
    """check_inputs returns the given values plus the defaults of those left out."""

    @step
    def files(instructions: str, pattern: str = "*.py") -> list[str]:
        return []

    pipeline = Pipeline.from_steps([files])
    assert pipeline.check_inputs({"instructions": "x"}) == {"instructions": "x", "pattern": "*.py"}
    assert pipeline.check_inputs({"instructions": "x", "pattern": "*.md"}) == {
        "instructions": "x",
        "pattern": "*.md",
    }


def test_check_inputs_reports_every_missing_and_unknown_name() -> None:
    """Missing inputs, unknown keys and step names given as inputs are all reported together."""

    @step(agent="claude")
    def plan(task: str, goal: str) -> str:
        return ""

    @step
    def implement(plann: object) -> str:
        return ""

    pipeline = Pipeline.from_steps([plan, implement], name="demo")
    with pytest.raises(PipelineError) as info:
        pipeline.check_inputs({"taks": "x", "plan": "y"})
    assert info.value.problems == (
        "unknown input 'taks'; its inputs: task, goal, plann",
        "'plan' is a step, not a run input",
        "missing input 'task' (needed by plan)",
        "missing input 'goal' (needed by plan)",
        "missing input 'plann' (needed by implement); did you mean the step 'plan'?",
    )
    assert info.value.source == "demo"


def test_check_inputs_on_a_pipeline_without_inputs() -> None:
    """A pipeline with no inputs says so when given one."""
    pipeline = Pipeline.from_steps([step(solo)])
    with pytest.raises(PipelineError, match="takes no inputs"):
        pipeline.check_inputs({"x": 1})
    assert pipeline.check_inputs({}) == {}


def test_check_agents_collects_every_refusal() -> None:
    """Each agent is checked once; every UsageError is collected, naming the steps."""
    called: list[str] = []

    def known(name: str) -> object:
        called.append(name)
        if name.startswith("bad"):
            raise UsageError(f"unknown agent {name!r}")
        return name

    @step(agent=["claude", "bad1"])
    def a() -> str:
        return ""

    @step(agent=["bad1", "bad2"])
    def b() -> str:
        return ""

    pipeline = Pipeline.from_steps([a, b])
    with pytest.raises(PipelineError) as info:
        pipeline.check_agents(known)
    assert called == ["claude", "bad1", "bad2"]
    assert info.value.problems == (
        "steps a, b: unknown agent 'bad1'",
        "step b: unknown agent 'bad2'",
    )
    Pipeline.from_steps([step(agent="claude")(solo)]).check_agents(known)


def test_check_agents_lets_other_errors_through() -> None:
    """Only UsageErrors are collected; a bug in `known` propagates as it is."""

    def known(name: str) -> object:
        raise RuntimeError("boom")

    pipeline = Pipeline.from_steps([step(agent="claude")(solo)])
    with pytest.raises(RuntimeError, match="boom"):
        pipeline.check_agents(known)


def test_to_json_describes_nodes_edges_and_inputs() -> None:
    """to_json gives plain data that json.dumps accepts, in definition order."""

    @step
    def files(pattern: str = "*.py", root: Path = Path("/x")) -> list[str]:
        """The files."""
        return []

    @step(agent=["claude", "codex"], over="files", merge="union")
    def transform(item: str, instructions: str) -> str:
        return ""

    data = Pipeline.from_steps([files, transform], name="demo").to_json()
    assert data == {
        "name": "demo",
        "nodes": [
            {
                "name": "files",
                "kind": "python",
                "agents": [],
                "over": None,
                "merge": "fail",
                "description": "The files.",
            },
            {
                "name": "transform",
                "kind": "agent",
                "agents": ["claude", "codex"],
                "over": "files",
                "merge": "union",
                "description": None,
            },
        ],
        "edges": [["files", "transform"]],
        "inputs": {"pattern": "*.py", "root": "PosixPath('/x')", "instructions": None},
    }
    assert json.loads(json.dumps(data)) == data


def test_digest_is_of_the_text_or_of_the_step_names() -> None:
    """The digest is the sha256 of the text given, else of the step names."""
    steps = diamond()
    by_names = Pipeline.from_steps(steps)
    assert by_names.digest == hashlib.sha256(b"plan\nfrontend\nbackend\nreport").hexdigest()
    by_text = Pipeline.from_steps(steps, text="source")
    assert by_text.digest == hashlib.sha256(b"source").hexdigest()
    assert Pipeline.from_steps(steps, text=b"source").digest == by_text.digest


def test_name_and_path_are_kept_and_errors_name_the_path() -> None:
    """name and path are stored; a PipelineError is prefixed with the path."""
    pipeline = Pipeline.from_steps(diamond(), name="d", path="/p/d.py")
    assert (pipeline.name, pipeline.path) == ("d", "/p/d.py")
    with pytest.raises(PipelineError) as info:
        Pipeline.from_steps([], name="d", path="/p/d.py")
    assert info.value.source == "/p/d.py"
    assert str(info.value) == "/p/d.py: no steps: decorate functions with @step"


def test_steps_and_inputs_cannot_be_changed() -> None:
    """The mappings of a built pipeline are read-only views."""
    pipeline = Pipeline.from_steps(diamond())
    with pytest.raises(TypeError):
        pipeline.steps["x"] = pipeline.steps["plan"]  # type: ignore[index]
    with pytest.raises(TypeError):
        pipeline.inputs["x"] = InputSpec("x")  # type: ignore[index]
