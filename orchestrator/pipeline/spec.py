"""Declaring pipeline steps, and the validated graph they form.

A pipeline is a set of functions decorated with :func:`step`. A step's name is its function's
name; its parameter names are what it depends on: other steps, or *run inputs* (names no step
defines, given when the pipeline runs). :meth:`Pipeline.from_steps` checks the whole graph at
once and reports every problem in one :class:`~orchestrator.errors.PipelineError`.

Nothing here runs a step: this layer only describes (see ``pipeline/runner.py`` for that).
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import keyword
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, Literal, cast, get_args, overload

import networkx as nx
import structlog
from attrs import field, frozen

from ..errors import PipelineError, UsageError

__all__ = [
    "MERGE_STRATEGIES",
    "RESERVED_PARAMS",
    "Budget",
    "InputSpec",
    "MergeStrategy",
    "Pipeline",
    "Step",
    "collect_steps",
    "step",
]

log = structlog.get_logger(__name__)

#: How conflicting parent branches are merged before a step's branch forks from them: stop
#: (``fail``), give conflicting hunks the earlier parent's side (``ours``) or the later one's
#: (``theirs``), or keep both sides' lines (``union``).
MergeStrategy = Literal["fail", "ours", "theirs", "union"]

#: The names :data:`MergeStrategy` allows.
MERGE_STRATEGIES: frozenset[str] = frozenset(get_args(MergeStrategy))

#: Parameter names the runner fills in itself; they never name a step or a run input.
#: ``item`` is the element of a fan-out over items, ``workdir`` a directory holding the merged
#: parents' files, ``ctx`` the step's context.
RESERVED_PARAMS: frozenset[str] = frozenset({"item", "workdir", "ctx"})

# Steps created while a loader executes a pipeline file land here too, so that a second
# ``def`` with the same name cannot hide the first one.
_collector: ContextVar[list[Step] | None] = ContextVar(
    "orchestrator_pipeline_collector", default=None
)


@contextmanager
def collect_steps() -> Iterator[list[Step]]:
    """Collect every :class:`Step` that :func:`step` creates inside the ``with`` block.

    Used by the loader; collectors nest (the innermost one collects).
    """
    steps: list[Step] = []
    token = _collector.set(steps)
    try:
        yield steps
    finally:
        _collector.reset(token)


# --------------------------------------------------------------------------- values


def _positive_int_or_none(_: object, attribute: Any, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise UsageError(f"{attribute.name} must be positive, not {value}")


def _positive_number_or_none(_: object, attribute: Any, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be a number, not {type(value).__name__}")
    if not value > 0:
        raise UsageError(f"{attribute.name} must be positive, not {value}")


@frozen
class Budget:
    """Limits on what one agent step may spend (the runner enforces them)."""

    #: tokens the step may use (input and output)
    max_tokens: int | None = field(default=None, validator=_positive_int_or_none)
    #: wall-clock seconds the step's agent work may take
    max_seconds: float | None = field(default=None, validator=_positive_number_or_none)

    @classmethod
    def from_value(cls, value: Budget | int) -> Budget:
        """A budget from what ``@step(budget=...)`` accepts: a :class:`Budget` or max tokens."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(max_tokens=value)
        raise TypeError(f"budget must be a Budget or an int, not {type(value).__name__}")


def _is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _named_params(fn: Callable[..., Any], what: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The parameter names of ``fn`` and the defaults among them, refusing what can't be named."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what}: cannot read the parameters of {fn!r}") from e
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise UsageError(
                f"{what}: parameters name dependencies, so {stars}{param.name} is not allowed"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise UsageError(
                f"{what}: values are passed by name, so {param.name!r} cannot be positional-only"
            )
        names.append(param.name)
        if param.default is not param.empty:
            defaults[param.name] = param.default
    return tuple(names), defaults


def _agents_from(value: str | Sequence[str] | None, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items: tuple[object, ...] = (value,) if isinstance(value, str) else tuple(value)
    if not items:
        raise UsageError(f"{what}: agent=[] names no agent; leave it out for a Python step")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{what}: agent names are strings, not {type(item).__name__}")
        if not item.strip():
            raise UsageError(f"{what}: an agent name is empty")
    agents = tuple(str(item) for item in items)
    for i, agent in enumerate(agents):
        if agent in agents[:i]:
            raise UsageError(
                f"{what}: agent {agent!r} is listed twice; branches are keyed by agent name "
                f"(label a second one with NAME=COMMAND)"
            )
    return agents


def _check_timeout(value: object, name: str, what: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be a number of seconds, not {type(value).__name__}")
    if not value > 0:
        raise UsageError(f"{what}: {name} must be positive, not {value}")
    return float(value)


def _check_text(value: object, name: str, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what}: {name} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise UsageError(f"{what}: {name} is empty")
    return value


def _first_doc_line(fn: Callable[..., Any]) -> str | None:
    doc = inspect.getdoc(fn)
    if not doc:
        return None
    first = doc.strip().splitlines()[0].strip()
    return first or None


@frozen(eq=False, repr=False)
class Step:
    """One step of a pipeline: a function plus how to run it.

    Made by :func:`step` (or :meth:`from_function`). Calling a step calls its function, so step
    functions can be unit-tested directly. Steps compare by identity, like functions.
    """

    #: the function's name; other steps depend on it by naming a parameter so
    name: str
    #: the decorated function: a Python step's result, or an agent step's prompt
    fn: Callable[..., Any]
    #: every parameter name of ``fn``, in order (dependencies, run inputs and reserved names)
    params: tuple[str, ...]
    #: the parameters that have defaults (a default on a run input is that input's default)
    defaults: Mapping[str, Any] = field(factory=lambda: MappingProxyType({}))
    #: the agents that run the step, one branch each; empty for a Python step
    agents: tuple[str, ...] = ()
    #: a dependency whose value is iterated: one branch per element, passed as ``item``
    over: str | None = None
    #: how the parents' branches are merged before this step's branch forks from them
    merge: MergeStrategy = "fail"
    #: the permission policy for the agent (a preset name or a file); None: the run's
    policy: str | None = None
    #: seconds a branch may take in all
    timeout: float | None = None
    #: seconds an agent may go without sending an update
    idle_timeout: float | None = None
    #: how many times a failed branch is tried again
    retries: int = 0
    #: the step runs only if this returns true; called with the values its parameters name
    when: Callable[..., bool] | None = None
    #: the parameter names of ``when``
    when_params: tuple[str, ...] = ()
    #: limits on what the agent may spend
    budget: Budget | None = None
    #: the session mode to ask the agent for (such as ``plan``)
    mode: str | None = None
    #: the model to ask the agent for
    model: str | None = None
    #: one line for reports; defaults to the first line of the docstring
    description: str | None = None
    #: whether ``fn`` is a coroutine function (the runner awaits it)
    is_async: bool = False

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        agent: str | Sequence[str] | None = None,
        over: str | None = None,
        merge: str = "fail",
        policy: str | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        retries: int = 0,
        when: Callable[..., bool] | None = None,
        budget: Budget | int | None = None,
        mode: str | None = None,
        model: str | None = None,
        description: str | None = None,
    ) -> Step:
        """A step wrapping ``fn``, with every argument checked now (see :func:`step`).

        Raises :class:`TypeError` for a value of the wrong type and
        :class:`~orchestrator.errors.UsageError` for a wrong value; both name the step.
        Problems between steps (cycles, unknown names) are found by :meth:`Pipeline.from_steps`.
        """
        if isinstance(fn, Step):
            raise TypeError(f"step {fn.name!r} is decorated with @step twice")
        if not callable(fn):
            raise TypeError(f"@step decorates a function, not {type(fn).__name__}")
        name = getattr(fn, "__name__", None)
        if not isinstance(name, str):
            raise TypeError(f"@step needs a named function (def name(...)), not {fn!r}")
        what = f"step {name!r}"
        if not _is_identifier(name):
            raise UsageError(f"{what}: a step needs a function defined with def, not a lambda")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise UsageError(f"{what}: a step returns its result; generators are not supported")
        params, defaults = _named_params(fn, what)
        agents = _agents_from(agent, what)
        if over is not None:
            if not isinstance(over, str):
                raise TypeError(f"{what}: over must be a step or input name (a string)")
            if not _is_identifier(over) or over in RESERVED_PARAMS:
                raise UsageError(f"{what}: over={over!r} is not a step or input name")
        if not isinstance(merge, str):
            raise TypeError(f"{what}: merge must be a string")
        if merge not in MERGE_STRATEGIES:
            choices = ", ".join(sorted(MERGE_STRATEGIES))
            raise UsageError(f"{what}: merge={merge!r} is not one of {choices}")
        if not isinstance(retries, int) or isinstance(retries, bool):
            raise TypeError(f"{what}: retries must be an int, not {type(retries).__name__}")
        if retries < 0:
            raise UsageError(f"{what}: retries must be 0 or more, not {retries}")
        when_params: tuple[str, ...] = ()
        if when is not None:
            if not callable(when):
                raise TypeError(f"{what}: when must be callable, not {type(when).__name__}")
            when_params, _ = _named_params(when, f"{what}: when")
        try:
            checked_budget = None if budget is None else Budget.from_value(budget)
        except (TypeError, UsageError) as e:
            raise type(e)(f"{what}: {e}") from None
        checked_policy = _check_text(policy, "policy", what)
        checked_idle = _check_timeout(idle_timeout, "idle_timeout", what)
        checked_mode = _check_text(mode, "mode", what)
        checked_model = _check_text(model, "model", what)
        if not agents:
            agent_only = {
                "policy": checked_policy,
                "idle_timeout": checked_idle,
                "budget": checked_budget,
                "mode": checked_mode,
                "model": checked_model,
            }
            given = [option for option, value in agent_only.items() if value is not None]
            if given:
                raise UsageError(
                    f"{what}: {', '.join(given)} only apply to agent steps (give agent=...)"
                )
        return cls(
            name=name,
            fn=fn,
            params=params,
            defaults=MappingProxyType(defaults),
            agents=agents,
            over=over,
            merge=cast(MergeStrategy, merge),
            policy=checked_policy,
            timeout=_check_timeout(timeout, "timeout", what),
            idle_timeout=checked_idle,
            retries=retries,
            when=when,
            when_params=when_params,
            budget=checked_budget,
            mode=checked_mode,
            model=checked_model,
            description=(
                _check_text(description, "description", what)
                if description is not None
                else _first_doc_line(fn)
            ),
            is_async=inspect.iscoroutinefunction(fn),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function, exactly as if it were not decorated."""
        return self.fn(*args, **kwargs)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # Lets inspect.signature() and friends see the function's own signature.
        return self.fn

    def __repr__(self) -> str:
        kind = f"agents={list(self.agents)!r}" if self.agents else "python"
        over = f", over={self.over!r}" if self.over else ""
        return f"<Step {self.name!r} {kind}{over}>"

    @property
    def is_agent_step(self) -> bool:
        """Whether agents run this step (its function returns their prompt)."""
        return bool(self.agents)

    @property
    def fans_out(self) -> bool:
        """Whether the step runs as several branches (several agents, or over items)."""
        return len(self.agents) > 1 or self.over is not None

    @property
    def wants_workdir(self) -> bool:
        """Whether the function takes ``workdir``, a directory of its parents' merged files."""
        return "workdir" in self.params

    @property
    def dependencies(self) -> tuple[str, ...]:
        """The steps and run inputs this step needs: its parameters, ``when``'s and ``over``."""
        names = [*self.params, *self.when_params]
        if self.over is not None:
            names.append(self.over)
        return tuple(dict.fromkeys(n for n in names if n not in RESERVED_PARAMS))


@overload
def step(fn: Callable[..., Any], /) -> Step: ...


@overload
def step(
    *,
    agent: str | Sequence[str] | None = None,
    over: str | None = None,
    merge: str = "fail",
    policy: str | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    retries: int = 0,
    when: Callable[..., bool] | None = None,
    budget: Budget | int | None = None,
    mode: str | None = None,
    model: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Step]: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    agent: str | Sequence[str] | None = None,
    over: str | None = None,
    merge: str = "fail",
    policy: str | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    retries: int = 0,
    when: Callable[..., bool] | None = None,
    budget: Budget | int | None = None,
    mode: str | None = None,
    model: str | None = None,
    description: str | None = None,
) -> Step | Callable[[Callable[..., Any]], Step]:
    """Declare a pipeline step; use as ``@step`` or ``@step(...)``.

    The function's name is the step's name and its parameter names are its dependencies
    (steps or run inputs; a default on a run input is the input's default). The reserved
    names ``item``, ``workdir`` and ``ctx`` are filled in by the runner.

    - ``agent``: an agent name, or several for one branch per agent. Without it, the step is
      plain Python and its return value is its result; with it, the function returns the prompt
      (a string or a list of content-block dicts).
    - ``over``: a step or run input whose value is iterated, one branch per element, which the
      function receives as ``item``.
    - ``merge``: how conflicting parent branches merge before this step forks its own:
      ``fail`` (default), ``ours``, ``theirs`` or ``union``.
    - ``policy``, ``mode``, ``model``: for the agent session; ``timeout`` and ``idle_timeout``
      in seconds; ``retries``: extra tries of a failed branch; ``budget``: a :class:`Budget`
      or a maximum number of tokens.
    - ``when``: a predicate over dependencies and run inputs (named by its parameters); the
      step (and so everything after it) is skipped unless it returns true.
    - ``description``: one line for reports (default: the docstring's first line).

    Arguments are checked at once (TypeError or UsageError naming the step).
    """
    options: dict[str, Any] = {
        "agent": agent,
        "over": over,
        "merge": merge,
        "policy": policy,
        "timeout": timeout,
        "idle_timeout": idle_timeout,
        "retries": retries,
        "when": when,
        "budget": budget,
        "mode": mode,
        "model": model,
        "description": description,
    }

    def decorate(function: Callable[..., Any]) -> Step:
        made = Step.from_function(function, **options)
        collected = _collector.get()
        if collected is not None:
            collected.append(made)
        return made

    if isinstance(fn, str):
        raise TypeError(
            f"step options are keyword arguments: @step(agent={fn!r}), not @step({fn!r})"
        )
    if fn is not None:
        return decorate(fn)
    return decorate


# --------------------------------------------------------------------------- the graph


@frozen
class InputSpec:
    """A run input: a name that steps depend on but no step defines."""

    name: str
    #: the default (meaningful only when ``has_default``)
    default: Any = None
    has_default: bool = False
    #: the steps that depend on it, in definition order
    used_by: tuple[str, ...] = ()


def _jsonable(value: Any) -> Any:
    """``value`` if JSON can hold it as it is, else its repr (defaults may be any object)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    return repr(value)


def _differ(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # objects whose != raises or is ambiguous: treat as different
        return a is not b


@frozen(eq=False)
class Pipeline:
    """A validated graph of steps: no cycles, no duplicates, every name accounted for.

    Build one with :meth:`from_steps` or :func:`~orchestrator.pipeline.load_pipeline`.
    """

    name: str
    #: the file it was loaded from, if any
    path: str | None
    #: the steps by name, in definition order
    steps: Mapping[str, Step]
    #: the run inputs by name, in order of first use
    inputs: Mapping[str, InputSpec]
    #: an edge ``a -> b`` for every step ``b`` that depends on step ``a``; node attribute
    #: ``step`` holds the :class:`Step`
    graph: nx.DiGraph[str]
    #: sha256 of the pipeline file's text (or of the step names when built from steps)
    digest: str

    @classmethod
    def from_steps(
        cls,
        steps: Iterable[Step],
        *,
        name: str = "pipeline",
        path: str | None = None,
        text: str | bytes | None = None,
    ) -> Pipeline:
        """Check the steps as a whole and build the pipeline.

        Every problem found (no steps, duplicate names, reserved or misused names, a step that
        depends on itself, cycles, conflicting input defaults) is collected into one
        :class:`~orchestrator.errors.PipelineError`.
        """
        given = list(steps)
        for s in given:
            if not isinstance(s, Step):
                raise TypeError(f"a pipeline is made of steps, not {type(s).__name__}")
        problems: list[str] = []
        if not given:
            problems.append("no steps: decorate functions with @step")

        by_name: dict[str, Step] = {}
        counts: dict[str, int] = {}
        for s in given:
            counts[s.name] = counts.get(s.name, 0) + 1
            by_name.setdefault(s.name, s)
        for step_name, count in counts.items():
            if count > 1:
                problems.append(f"duplicate step {step_name!r}: defined {count} times")

        for s in by_name.values():
            problems.extend(_step_problems(s))

        index = {step_name: i for i, step_name in enumerate(by_name)}
        graph: nx.DiGraph[str] = nx.DiGraph()
        for s in by_name.values():
            graph.add_node(s.name, step=s)
        for s in by_name.values():
            for dep in s.dependencies:
                if dep in by_name and dep != s.name:
                    graph.add_edge(dep, s.name)
        problems.extend(_cycle_problems(graph, index))

        inputs, input_problems = _collect_inputs(by_name)
        problems.extend(input_problems)

        source = path or name
        if problems:
            raise PipelineError(problems, source)
        if text is None:
            data = "\n".join(by_name).encode()
        else:
            data = text.encode() if isinstance(text, str) else text
        pipeline = cls(
            name=name,
            path=path,
            steps=MappingProxyType(by_name),
            inputs=MappingProxyType(inputs),
            graph=graph,
            digest=hashlib.sha256(data).hexdigest(),
        )
        log.debug("pipeline built", pipeline=name, steps=len(by_name), inputs=list(inputs))
        return pipeline

    # ---------------------------------------------------------------- order and neighbours

    def _index(self, step_name: str) -> int:
        return list(self.steps).index(step_name)

    def _require(self, step_name: str) -> None:
        if step_name not in self.steps:
            known = ", ".join(self.steps)
            raise UsageError(
                f"pipeline {self.name!r} has no step {step_name!r} (its steps: {known})"
            )

    def _in_definition_order(self, names: Iterable[str]) -> list[str]:
        wanted = set(names)
        return [n for n in self.steps if n in wanted]

    def order(self) -> list[str]:
        """The steps in an order that runs every dependency first; ties in definition order."""
        index = {n: i for i, n in enumerate(self.steps)}
        return list(nx.lexicographical_topological_sort(self.graph, key=index.__getitem__))

    def generations(self) -> list[list[str]]:
        """The steps in layers: each needs only steps of earlier layers (definition order)."""
        return [self._in_definition_order(g) for g in nx.topological_generations(self.graph)]

    def parents(self, step_name: str) -> list[str]:
        """The steps that ``step_name`` depends on directly, in definition order."""
        self._require(step_name)
        return self._in_definition_order(self.graph.predecessors(step_name))

    def children(self, step_name: str) -> list[str]:
        """The steps that depend directly on ``step_name``, in definition order."""
        self._require(step_name)
        return self._in_definition_order(self.graph.successors(step_name))

    def descendants(self, step_name: str) -> set[str]:
        """Every step that depends on ``step_name``, directly or not."""
        self._require(step_name)
        return set(nx.descendants(self.graph, step_name))

    def sinks(self) -> list[str]:
        """The steps nothing depends on (the pipeline's final results), in definition order."""
        return [n for n in self.steps if self.graph.out_degree(n) == 0]

    # ---------------------------------------------------------------- checks before a run

    def check_inputs(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The run inputs: ``values`` plus the defaults of those not given.

        Raises :class:`~orchestrator.errors.PipelineError` naming every missing input and every
        unknown name given.
        """
        problems: list[str] = []
        for key in values:
            if key in self.inputs:
                continue
            if key in self.steps:
                problems.append(f"{key!r} is a step, not a run input")
            else:
                problems.append(f"unknown input {key!r}{self._inputs_hint()}")
        result: dict[str, Any] = {}
        for spec in self.inputs.values():
            if spec.name in values:
                result[spec.name] = values[spec.name]
            elif spec.has_default:
                result[spec.name] = spec.default
            else:
                users = ", ".join(spec.used_by)
                problems.append(
                    f"missing input {spec.name!r} (needed by {users}){self._step_hint(spec.name)}"
                )
        if problems:
            raise PipelineError(problems, self.path or self.name)
        return result

    def _step_hint(self, input_name: str) -> str:
        # A misspelt step name in a parameter list turns into a run input: say so.
        close = difflib.get_close_matches(input_name, list(self.steps), n=1)
        return f"; did you mean the step {close[0]!r}?" if close else ""

    def _inputs_hint(self) -> str:
        if not self.inputs:
            return "; this pipeline takes no inputs"
        return f"; its inputs: {', '.join(self.inputs)}"

    def check_agents(self, known: Callable[[str], object]) -> None:
        """Call ``known(name)`` for every agent the steps use; report all its refusals at once.

        ``known`` raises :class:`~orchestrator.errors.UsageError` for a name it cannot launch
        (:func:`orchestrator.agents.resolve_agent` does); other exceptions propagate.
        """
        users: dict[str, list[str]] = {}
        for s in self.steps.values():
            for agent in s.agents:
                users.setdefault(agent, []).append(s.name)
        problems: list[str] = []
        for agent, step_names in users.items():
            try:
                known(agent)
            except UsageError as e:
                label = "step" if len(step_names) == 1 else "steps"
                problems.append(f"{label} {', '.join(step_names)}: {e}")
        if problems:
            raise PipelineError(problems, self.path or self.name)

    # ---------------------------------------------------------------- description

    def to_json(self) -> dict[str, Any]:
        """The graph as JSON-ready data: nodes, edges and inputs (for reports and ``--json``).

        An input default JSON cannot hold as it is appears as its ``repr``.
        """
        index = {n: i for i, n in enumerate(self.steps)}
        edges = sorted(self.graph.edges, key=lambda e: (index[e[1]], index[e[0]]))
        return {
            "name": self.name,
            "nodes": [
                {
                    "name": s.name,
                    "kind": "agent" if s.is_agent_step else "python",
                    "agents": list(s.agents),
                    "over": s.over,
                    "merge": s.merge,
                    "description": s.description,
                }
                for s in self.steps.values()
            ],
            "edges": [[a, b] for a, b in edges],
            "inputs": {
                spec.name: _jsonable(spec.default) if spec.has_default else None
                for spec in self.inputs.values()
            },
        }


def _step_problems(s: Step) -> list[str]:
    """What is wrong with one step's names, judged without the other steps."""
    what = f"step {s.name!r}"
    problems: list[str] = []
    if s.name in RESERVED_PARAMS:
        problems.append(f"{what}: {s.name!r} is a reserved name; rename the function")
    if "item" in s.params and s.over is None:
        problems.append(f"{what}: parameter 'item' needs over=... naming what to iterate")
    if s.over == s.name:
        problems.append(f"{what}: over={s.over!r} names the step itself")
    elif s.name in s.params or s.name in s.when_params:
        problems.append(f"{what}: depends on itself (a parameter is named {s.name!r})")
    reserved = [p for p in s.when_params if p in RESERVED_PARAMS]
    if reserved:
        problems.append(
            f"{what}: when's parameters must be steps or run inputs, "
            f"not {', '.join(repr(p) for p in reserved)}"
        )
    return problems


def _cycle_problems(graph: nx.DiGraph[str], index: Mapping[str, int]) -> list[str]:
    """One ``cycle: a -> b -> a`` problem per strongly connected group of steps."""
    problems: list[str] = []
    groups = [g for g in nx.strongly_connected_components(graph) if len(g) > 1]
    for group in sorted(groups, key=lambda g: min(index[n] for n in g)):
        start = min(group, key=index.__getitem__)
        edges = nx.find_cycle(graph.subgraph(group), source=start)
        path = [str(edge[0]) for edge in edges]
        # Start the message at the earliest-defined step of the cycle.
        first = min(range(len(path)), key=lambda i: index[path[i]])
        path = path[first:] + path[:first]
        problems.append("cycle: " + " -> ".join([*path, path[0]]))
    return problems


def _collect_inputs(by_name: Mapping[str, Step]) -> tuple[dict[str, InputSpec], list[str]]:
    """The run inputs (dependencies that are not steps), and conflicting defaults."""
    users: dict[str, list[str]] = {}
    defaults: dict[str, list[tuple[str, Any]]] = {}
    for s in by_name.values():
        when_defaults: Mapping[str, Any] = {}
        if s.when is not None:
            when_defaults = _named_params(s.when, f"step {s.name!r}: when")[1]
        for dep in s.dependencies:
            if dep in by_name:
                continue
            users.setdefault(dep, []).append(s.name)
            for source in (s.defaults, when_defaults):
                if dep in source:
                    defaults.setdefault(dep, []).append((s.name, source[dep]))
                    break
    problems: list[str] = []
    inputs: dict[str, InputSpec] = {}
    for input_name, used_by in users.items():
        given = defaults.get(input_name, [])
        if any(_differ(given[0][1], value) for _, value in given[1:]):
            listed = ", ".join(f"{value!r} in {where}" for where, value in given)
            problems.append(f"input {input_name!r} has different defaults: {listed}")
        inputs[input_name] = InputSpec(
            name=input_name,
            default=given[0][1] if given else None,
            has_default=bool(given),
            used_by=tuple(used_by),
        )
    return inputs, problems
