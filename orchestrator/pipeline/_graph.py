"""The validated graph that steps form: :class:`Pipeline` and its run inputs.

:meth:`Pipeline.from_steps` checks the steps as a whole (duplicates, reserved names, cycles,
conflicting input defaults) and reports every problem in one
:class:`~orchestrator.errors.PipelineError`; the pipeline then answers questions about order and
neighbours, checks a run's inputs and agents, and describes itself as JSON.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import attrs
from attrs import field, frozen

from .._log import get_logger
from ..errors import PipelineError, UsageError
from ..sandbox import Sandbox
from ._step import Step
from ._values import RESERVED_PARAMS, AgentInput, named_params

if TYPE_CHECKING:  # networkx costs ~75 ms to import: a one-step run (a prompt) needs none
    import networkx as nx

__all__ = ["InputKind", "InputSpec", "Pipeline"]

log = get_logger(__name__)


#: What a run input holds: any value, one agent's name (``agent_input``), or a list of agent
#: names (``agents_input``); the last two are checked before any agent starts.
InputKind = Literal["value", "agent", "agents"]


@frozen
class InputSpec:
    """A run input: a name that steps depend on but no step defines."""

    name: str
    #: the default (meaningful only when ``has_default``)
    default: Any = None
    has_default: bool = False
    #: the steps that depend on it, in definition order
    used_by: tuple[str, ...] = ()
    #: what it holds: a value, or the agents of the steps that name it with a marker
    kind: InputKind = "value"


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


def _source_text(text: str | bytes) -> str:
    """A pipeline file's text as Python reads it (its coding declaration, else UTF-8); bytes
    Python could not read become U+FFFD (the digest keeps the exact bytes)."""
    if isinstance(text, str):
        return text
    try:
        return importlib.util.decode_source(text)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return text.decode("utf-8", "replace")


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
    #: an edge ``(a, b)`` for every step ``b`` that depends on step ``a``, in definition order
    edges: tuple[tuple[str, str], ...]
    #: sha256 of the pipeline file's text (or of the step names when built from steps)
    digest: str
    #: each step's parents, in definition order (built with the pipeline: O(1) lookups)
    _parents: Mapping[str, tuple[str, ...]] = field(factory=dict, repr=False)
    _children: Mapping[str, tuple[str, ...]] = field(factory=dict, repr=False)
    _graph: Any = field(default=None, repr=False)
    #: the pipeline file's text as it was loaded (what a run records, and a replay can load
    #: again); None when built in code without one
    source: str | None = field(default=None, repr=False)

    @property
    def graph(self) -> nx.DiGraph[str]:
        """The steps as a networkx graph: an edge ``a -> b`` for every step ``b`` that depends
        on step ``a``; node attribute ``step`` holds the :class:`Step` (built on first use)."""
        if self._graph is None:
            object.__setattr__(self, "_graph", _digraph(self.steps, self.edges))
        graph: nx.DiGraph[str] = self._graph
        return graph

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
        parents: dict[str, list[str]] = {n: [] for n in by_name}
        children: dict[str, list[str]] = {n: [] for n in by_name}
        for s in by_name.values():
            for dep in dict.fromkeys(s.dependencies):
                if dep in by_name and dep != s.name:
                    parents[s.name].append(dep)
                    children[dep].append(s.name)
        for names in (*parents.values(), *children.values()):
            names.sort(key=index.__getitem__)
        edges = tuple((a, b) for b in by_name for a in parents[b])
        graph = None
        if edges:  # a cycle needs an edge; without one, no graph is built (nor imported)
            graph = _digraph(by_name, edges)
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
            edges=edges,
            digest=hashlib.sha256(data).hexdigest(),
            parents=MappingProxyType({n: tuple(p) for n, p in parents.items()}),
            children=MappingProxyType({n: tuple(c) for n, c in children.items()}),
            graph=graph,
            source=None if text is None else _source_text(text),
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
        if not self.edges:
            return list(self.steps)
        import networkx as nx

        index = {n: i for i, n in enumerate(self.steps)}
        return list(nx.lexicographical_topological_sort(self.graph, key=index.__getitem__))

    def generations(self) -> list[list[str]]:
        """The steps in layers: each needs only steps of earlier layers (definition order)."""
        if not self.edges:
            return [list(self.steps)]
        import networkx as nx

        return [self._in_definition_order(g) for g in nx.topological_generations(self.graph)]

    def parents(self, step_name: str) -> list[str]:
        """The steps that ``step_name`` depends on directly, in definition order."""
        self._require(step_name)
        return list(self._parents[step_name])

    def children(self, step_name: str) -> list[str]:
        """The steps that depend directly on ``step_name``, in definition order."""
        self._require(step_name)
        return list(self._children[step_name])

    def descendants(self, step_name: str) -> set[str]:
        """Every step that depends on ``step_name``, directly or not."""
        self._require(step_name)
        seen: set[str] = set()
        todo = list(self._children[step_name])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self._children[name])
        return seen

    def sinks(self) -> list[str]:
        """The steps nothing depends on (the pipeline's final results), in definition order."""
        return [n for n in self.steps if not self._children[n]]

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
                continue
            if spec.kind != "value":
                marker = self._marker(spec.name)
                try:
                    agents = marker.agents(result[spec.name])
                except (TypeError, UsageError) as e:
                    problems.append(f"input {spec.name!r}: {e}")
                    continue
                # one shape whatever was given: a list input is a list (``demo`` -> ["demo"])
                result[spec.name] = list(agents) if marker.many else agents[0]
        if problems:
            raise PipelineError(problems, self.path or self.name)
        return result

    def _marker(self, input_name: str) -> AgentInput:
        return next(
            s.agents_input
            for s in self.steps.values()
            if s.agents_input is not None and s.agents_input.name == input_name
        )

    def with_agents(self, inputs: Mapping[str, Any]) -> Pipeline:
        """This pipeline with the agents its run inputs name, as :meth:`check_inputs` made them.

        Each step declared with ``agent=agent_input(...)`` or ``agents_input(...)`` gets the
        agents its input names (the graph, reports and the run see those); the others are
        kept. The pipeline itself when no step waits for its agents (none names them by an
        input, or they are bound already: binding is done once, by the run).
        """
        if not any(s.needs_agents for s in self.steps.values()):
            return self
        checked = self.check_inputs(inputs)
        steps: dict[str, Step] = {}
        for name, s in self.steps.items():
            marker = s.agents_input
            if marker is not None:
                s = attrs.evolve(s, agents=marker.agents(checked[marker.name]))
            steps[name] = s
        return attrs.evolve(self, steps=MappingProxyType(steps), graph=None)

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
        (:func:`orchestrator.agents.resolve_agent` does); other exceptions propagate. One agent
        that steps name, the only problem, is refused with ``known``'s own error (an unknown
        agent reads the same from a pipeline as from a prompt); several problems, or an agent a
        run input gave, make one :class:`~orchestrator.errors.PipelineError` naming where.
        """
        unbound = [s.name for s in self.steps.values() if s.needs_agents]
        if unbound:  # a programming error: the run binds its inputs first
            raise UsageError(
                f"steps {', '.join(unbound)} take their agents from run inputs: "
                "check them with with_agents(inputs) first"
            )
        # where each agent is named: the inputs that gave it, the steps that name it directly
        places: dict[str, tuple[list[str], list[str]]] = {}
        for s in self.steps.values():
            for agent in s.agents:
                inputs, steps = places.setdefault(agent, ([], []))
                if s.agents_input is None:
                    steps.append(s.name)
                elif s.agents_input.name not in inputs:
                    inputs.append(s.agents_input.name)
        problems: list[str] = []
        refused: list[UsageError] = []
        where = ""
        for agent, (inputs, steps) in places.items():
            try:
                known(agent)
            except UsageError as e:
                # an agent a run input gave is the input's problem: say which input
                parts = [f"input {name!r}" for name in inputs]
                if steps:
                    parts.append(f"{'step' if len(steps) == 1 else 'steps'} {', '.join(steps)}")
                where = ", ".join(parts)
                if not inputs:
                    refused.append(e)
                problems.append(f"{where}: {e}")
        if len(problems) == 1 and len(refused) == 1:
            refused[0].add_note(f"named by {where}")  # shown with a traceback, not in the message
            raise refused[0]
        if problems:
            raise PipelineError(problems, self.path or self.name)

    # ---------------------------------------------------------------- description

    def to_json(self) -> dict[str, Any]:
        """The graph as JSON-ready data: nodes, edges and inputs (for reports and ``--json``).

        An input default JSON cannot hold as it is appears as its ``repr``. A node whose agents
        a run input names says which (``agentsInput``), and ``agentInputs`` lists those inputs;
        bound (:meth:`with_agents`), its ``agents`` are the ones the input gave.
        """
        index = {n: i for i, n in enumerate(self.steps)}
        edges = sorted(self.edges, key=lambda e: (index[e[1]], index[e[0]]))
        data: dict[str, Any] = {
            "name": self.name,
            "nodes": [_node_json(s) for s in self.steps.values()],
            "edges": [[a, b] for a, b in edges],
            "inputs": {
                spec.name: _jsonable(spec.default) if spec.has_default else None
                for spec in self.inputs.values()
            },
        }
        # the inputs that name agents, and what each holds ("agent" or "agents"); only a
        # pipeline that has some says so
        named = {spec.name: spec.kind for spec in self.inputs.values() if spec.kind != "value"}
        if named:
            data["agentInputs"] = named
        return data


def _node_json(s: Step) -> dict[str, Any]:
    node: dict[str, Any] = {
        "name": s.name,
        "kind": "agent" if s.is_agent_step else "python",
        "agents": list(s.agents),
        "over": s.over,
        "merge": s.merge,
        "description": s.description,
    }
    if s.agents_input is not None:  # its agents are the input's (bound: as the run got them)
        node["agentsInput"] = s.agents_input.name
    if s.sandbox:  # only a step that asks says so
        node["sandbox"] = s.sandbox.to_json() if isinstance(s.sandbox, Sandbox) else True
    if s.max_file_size is not None:
        node["maxFileSize"] = s.max_file_size
    if s.check is not None:  # a step with a check: the command, or the function's name
        check = s.check
        node["check"] = check if isinstance(check, str) else getattr(check, "__qualname__", "")
        node["rounds"] = s.rounds
    if s.policy:  # the policy its agents' requests are answered by, before the run's
        node["policy"] = s.policy
    return node


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


def _digraph(steps: Mapping[str, Step], edges: Iterable[tuple[str, str]]) -> nx.DiGraph[str]:
    """The steps and their edges as a networkx graph (node attribute ``step``)."""
    import networkx as nx

    graph: nx.DiGraph[str] = nx.DiGraph()
    for s in steps.values():
        graph.add_node(s.name, step=s)
    graph.add_edges_from(edges)
    return graph


def _cycle_problems(graph: nx.DiGraph[str], index: Mapping[str, int]) -> list[str]:
    """One ``cycle: a -> b -> a`` problem per strongly connected group of steps."""
    import networkx as nx

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
    """The run inputs (dependencies that are not steps, and the inputs that name steps'
    agents), and what is wrong with them: conflicting defaults, conflicting kinds."""
    users: dict[str, list[str]] = {}
    defaults: dict[str, list[tuple[str, Any]]] = {}
    # the steps whose agents an input names, and whether each takes a list
    markers: dict[str, list[tuple[str, bool]]] = {}
    problems: list[str] = []
    for s in by_name.values():
        marker = s.agents_input
        if marker is not None:
            if marker.name in by_name:
                problems.append(
                    f"step {s.name!r}: its agents come from {marker.name!r}, which is a step, "
                    "not a run input"
                )
            else:
                users.setdefault(marker.name, []).append(s.name)
                markers.setdefault(marker.name, []).append((s.name, marker.many))
                if marker.has_default:
                    defaults.setdefault(marker.name, []).append((s.name, marker.default_value))
        when_defaults: Mapping[str, Any] = {}
        if s.when is not None:
            when_defaults = named_params(s.when, f"step {s.name!r}: when")[1]
        for dep in s.dependencies:
            if dep in by_name:
                continue
            if s.name not in users.setdefault(dep, []):
                users[dep].append(s.name)
            for source in (s.defaults, when_defaults):
                if dep in source:
                    defaults.setdefault(dep, []).append((s.name, source[dep]))
                    break
    inputs: dict[str, InputSpec] = {}
    for input_name, used_by in users.items():
        given = defaults.get(input_name, [])
        kind: InputKind = "value"
        named = markers.get(input_name, [])
        many = {m for _, m in named}
        if named:
            kind = "agents" if True in many else "agent"
        if len(many) > 1:  # its defaults differ too, of course: this says why
            one = ", ".join(n for n, m in named if not m)
            several = ", ".join(n for n, m in named if m)
            problems.append(
                f"input {input_name!r} names one agent for {one} (agent_input) but a list "
                f"of agents for {several} (agents_input)"
            )
        elif any(_differ(given[0][1], value) for _, value in given[1:]):
            listed = ", ".join(f"{value!r} in {where}" for where, value in given)
            problems.append(f"input {input_name!r} has different defaults: {listed}")
        inputs[input_name] = InputSpec(
            name=input_name,
            default=given[0][1] if given else None,
            has_default=bool(given),
            used_by=tuple(used_by),
            kind=kind,
        )
    return inputs, problems
