"""Views over the JSON result objects: tolerant readers shared by the HTML and Markdown renderers.

A result is a plain dict from ``--json`` (or a run store); any key may be missing, null or of an
unexpected type. Each view reads what it can and leaves the rest as None, so the renderers only
decide how to show "unknown" (as ``-``) and never crash on a partial result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import frozen

from .._rejections import DefaultRejections
from .._sizes import MAX_TOOL_ERROR_CHARS, bounded_text
from ..errors import ReportError
from ._diff import FileDiff, count_lines, parse_diff

__all__ = [
    "AgentView",
    "CompareView",
    "ConflictView",
    "PermissionCounts",
    "PipelineView",
    "ReportError",
    "RunTimes",
    "StepView",
    "applied_text",
    "conflicts_text",
    "default_policy_text",
    "instance_label",
    "layers",
    "load",
    "tool_call_error",
]


# --------------------------------------------------------------------------- tolerant readers


def as_str(value: Any) -> str | None:
    """A string for strings and numbers; None for anything else (null, lists, objects)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None


def as_num(value: Any) -> float | None:
    """A number (bools are not numbers here); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_maps(value: Any) -> tuple[Mapping[str, Any], ...]:
    """The mappings in a list (other entries dropped); empty for anything but a list."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return ()
    return tuple(v for v in value if isinstance(v, Mapping))


def as_strs(value: Any) -> tuple[str, ...]:
    """The strings (and numbers, as strings) in a list; a lone string is a list of one."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        return ()
    return tuple(s for v in value if (s := as_str(v)) is not None)


def as_bool(value: Any) -> bool | None:
    """True/False for booleans, None otherwise."""
    return value if isinstance(value, bool) else None


# --------------------------------------------------------------------------- agents / instances


@frozen
class PermissionCounts:
    """How many permission requests there were, and how they were answered."""

    asked: int = 0
    allowed: int = 0
    rejected: int = 0
    cancelled: int = 0

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> PermissionCounts:
        """Count ``permissions`` records by their ``verdict``."""
        verdicts = [as_str(r.get("verdict")) for r in records]
        return cls(
            asked=len(records),
            allowed=sum(v == "allow" for v in verdicts),
            rejected=sum(v == "reject" for v in verdicts),
            cancelled=sum(v == "cancelled" for v in verdicts),
        )

    def __add__(self, other: PermissionCounts) -> PermissionCounts:
        return PermissionCounts(
            self.asked + other.asked,
            self.allowed + other.allowed,
            self.rejected + other.rejected,
            self.cancelled + other.cancelled,
        )


@frozen
class AgentView:
    """One agent of a compare run, or one instance of a pipeline step (same fields)."""

    name: str
    status: str | None
    error: str | None
    #: the configured agent (a pipeline instance's name is its key: an agent or an item)
    agent: str | None
    #: the name the agent reported about itself in ``initialize``
    reported_name: str | None
    version: str | None
    #: the ids of the agent quirks its ``initialize`` matched
    quirks: tuple[str, ...]
    session_id: str | None
    stop_reason: str | None
    text: str | None
    wall_seconds: float | None
    tool_calls: tuple[Mapping[str, Any], ...]
    permissions: tuple[Mapping[str, Any], ...]
    #: the notices the agent sent for the user: ``{severity, title, description?}``
    notices: tuple[Mapping[str, Any], ...]
    usage: Mapping[str, Any]
    changes: tuple[Mapping[str, Any], ...]
    diff: str
    files: tuple[FileDiff, ...]
    verify: Mapping[str, Any] | None
    applied: bool | None
    apply_conflicts: tuple[str, ...]
    #: the JSON value a python step returned (``has_value`` tells null from absent)
    value: Any
    has_value: bool
    #: the item a fan-out-over-items instance worked on (None when not such an instance)
    item: Any
    attempt: int | None
    #: the Python traceback of the exception that failed it, when the pipeline's code raised it
    traceback: str | None
    #: the rounds of a step with a check: ``{turn, stopReason, check}`` each
    rounds: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_json(
        cls, obj: Mapping[str, Any], default_name: str, *, key: str | None = None
    ) -> AgentView:
        """Read one agent (or instance) object.

        The name is ``key`` when given (a pipeline instance's key), else the object's ``name``,
        else its agent's name, else ``default_name``.
        """
        raw_agent = obj.get("agent")
        agent = raw_agent if isinstance(raw_agent, str) else as_str(as_map(raw_agent).get("name"))
        # "agentInfo" is what the agent reported in initialize; older shapes nest it in "agent"
        info = as_map(obj.get("agentInfo")) or as_map(raw_agent)
        name = key or as_str(obj.get("name")) or agent or as_str(info.get("name"))
        raw_diff = obj.get("diff")
        diff = raw_diff if isinstance(raw_diff, str) else ""
        verify = obj.get("verify")
        attempt = as_num(obj.get("attempt"))
        return cls(
            name=name or default_name,
            status=as_str(obj.get("status")),
            error=_error_text(obj.get("error")),
            agent=agent,
            reported_name=as_str(info.get("reportedName")) or as_str(info.get("name")),
            version=as_str(info.get("version")),
            # an instance keeps them beside agentInfo, a prompt or compare entry in its agent
            quirks=as_strs(obj.get("quirks") or as_map(raw_agent).get("quirks")),
            session_id=as_str(obj.get("sessionId")),
            stop_reason=as_str(obj.get("stopReason")),
            text=as_str(obj.get("text")),
            wall_seconds=as_num(obj.get("wallSeconds")),
            tool_calls=as_maps(obj.get("toolCalls")),
            permissions=as_maps(obj.get("permissions")),
            notices=as_maps(obj.get("notices")),
            usage=as_map(obj.get("usage")),
            changes=as_maps(obj.get("changes")),
            diff=diff,
            files=parse_diff(diff),
            verify=verify if isinstance(verify, Mapping) else None,
            applied=as_bool(obj.get("applied")),
            apply_conflicts=as_strs(obj.get("workspaceChanged") or obj.get("applyConflicts")),
            value=obj.get("value"),
            has_value="value" in obj,
            item=obj.get("item"),
            attempt=None if attempt is None else int(attempt),
            traceback=as_str(obj.get("traceback")),
            rounds=as_maps(obj.get("rounds")),
        )

    @property
    def identity(self) -> str | None:
        """What the agent said it is (``demo-agent 1.0.0``), without repeating its name."""
        reported = self.reported_name if self.reported_name != self.name else None
        text = " ".join(p for p in (reported, self.version) if p)
        if self.quirks:
            text = ", ".join(p for p in (text, f"quirks {', '.join(self.quirks)}") if p)
        return text or None

    @property
    def lines(self) -> tuple[int, int]:
        """(added, removed) lines in the diff."""
        return count_lines(self.files)

    @property
    def files_changed(self) -> int:
        """How many files changed: the ``changes`` list, else the files in the diff."""
        return len(self.changes) if self.changes else len(self.files)

    def change_counts(self) -> dict[str, int]:
        """Changed files by kind (added, modified, deleted, ...)."""
        counts: dict[str, int] = defaultdict(int)
        if self.changes:
            for c in self.changes:
                counts[as_str(c.get("change")) or "changed"] += 1
        else:
            for f in self.files:
                counts[f.change] += 1
        return dict(counts)

    def change_of(self, path: str) -> str | None:
        """The ``changes`` entry's kind for ``path``, if listed."""
        for c in self.changes:
            if as_str(c.get("path")) == path:
                return as_str(c.get("change"))
        return None

    @property
    def permission_counts(self) -> PermissionCounts:
        """Permission requests by verdict."""
        return PermissionCounts.from_records(self.permissions)

    @property
    def failed_tool_calls(self) -> int:
        """Tool calls whose status is ``failed``."""
        return sum(as_str(c.get("status")) == "failed" for c in self.tool_calls)

    @property
    def tokens(self) -> Mapping[str, Any]:
        """The token counts (``usage.tokens``), possibly empty."""
        return as_map(self.usage.get("tokens"))

    @property
    def total_tokens(self) -> float | None:
        """Total tokens: ``totalTokens``, else input + output; None when unknown."""
        total = as_num(self.tokens.get("totalTokens"))
        if total is not None:
            return total
        parts = [as_num(self.tokens.get(k)) for k in ("inputTokens", "outputTokens")]
        known = [p for p in parts if p is not None]
        return sum(known) if known else None

    @property
    def cost(self) -> tuple[float, str] | None:
        """(amount, currency) of ``usage.cost``, when known."""
        cost = as_map(self.usage.get("cost"))
        amount = as_num(cost.get("amount"))
        if amount is None:
            return None
        return amount, as_str(cost.get("currency")) or ""

    @property
    def verify_passed(self) -> bool | None:
        """Whether the verify command exited 0; None when it did not run or has no exit code."""
        if self.verify is None:
            return None
        code = as_num(self.verify.get("exitCode"))
        return None if code is None else code == 0


def tool_call_error(call: Mapping[str, Any]) -> str | None:
    """The error text a failed tool call carries (``error``), bounded; None when there is none."""
    if as_str(call.get("status")) != "failed":
        return None
    text = as_str(call.get("error"))
    # a result file is read as it is: bounded again here
    return bounded_text(text, MAX_TOOL_ERROR_CHARS) if text else None


def _error_text(value: Any) -> str | None:
    """An error as text: a string, or ``{type, message}`` as ``type: message``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        kind, message = as_str(value.get("type")), as_str(value.get("message"))
        if kind and message:
            return f"{kind}: {message}"
        return message or kind or None
    return as_str(value)


def sum_costs(agents: Sequence[AgentView]) -> dict[str, float]:
    """Total cost per currency."""
    totals: dict[str, float] = defaultdict(float)
    for a in agents:
        if a.cost is not None:
            totals[a.cost[1]] += a.cost[0]
    return dict(totals)


def sum_tokens(agents: Sequence[AgentView]) -> float | None:
    """Total tokens over agents that reported them; None when none did."""
    known = [t for a in agents if (t := a.total_tokens) is not None]
    return sum(known) if known else None


def applied_text(applied: str | bool | None) -> str:
    """``claude`` (the applied agent), ``yes``, or ``not applied``."""
    if isinstance(applied, str):
        return applied
    return "yes" if applied else "not applied"


def instance_label(step: StepView, instance: AgentView) -> str:
    """How an instance of ``step`` is named: ``STEP[KEY]``, or the step's name alone when its
    one instance is keyed by it (a step of one agent)."""
    return step.name if instance.name == step.name else f"{step.name}[{instance.name}]"


def conflicts_text(conflicts: Sequence[ConflictView]) -> str:
    """``2 (1 unresolved)`` or ``none``."""
    if not conflicts:
        return "none"
    unresolved = sum(not c.resolved for c in conflicts)
    return f"{len(conflicts)} ({unresolved} unresolved)"


def _default_rejections(result: Mapping[str, Any]) -> DefaultRejections:
    """The result's ``defaultRejections`` (none when missing or malformed)."""
    return DefaultRejections.from_json(result.get("defaultRejections"))


def default_policy_text(rejections: DefaultRejections) -> str | None:
    """The notice of a run whose permission requests the default policy rejected because no
    policy was given (the sentence the command line ends with); None when it rejected none."""
    said = rejections.message
    if said is None:
        return None
    # a policy given now decides only what the latest attempt asked (reused steps keep theirs)
    return (
        f"{said}; a policy (the edit preset, for one) allows edits."
        if rejections.fresh
        else said + "."
    )


# --------------------------------------------------------------------------- compare


@frozen
class CompareView:
    """A ``compare`` result (or a ``prompt`` result, as a compare of one agent)."""

    run_id: str | None
    task: str | None
    cwd: str | None
    status: str | None
    agents: tuple[AgentView, ...]
    winner: str | None
    #: the applied agent's name, or just whether the run was applied
    applied: str | bool | None
    conflicts: tuple[ConflictView, ...]
    times: RunTimes
    #: "compare" or "prompt"
    kind: str
    #: permission requests rejected by the default rule because no policy was given
    default_rejections: DefaultRejections = attrs.field(factory=DefaultRejections)

    @classmethod
    def from_json(cls, result: Mapping[str, Any]) -> CompareView:
        """Read a compare result."""
        agents = tuple(
            AgentView.from_json(a, f"agent {i + 1}")
            for i, a in enumerate(as_maps(result.get("agents")))
        )
        applied = result.get("applied")
        return cls(
            run_id=as_str(result.get("runId")),
            task=as_str(result.get("task")),
            cwd=as_str(result.get("cwd")),
            status=as_str(result.get("status")),
            agents=agents,
            winner=as_str(result.get("winner")),
            applied=applied if isinstance(applied, bool) else as_str(applied),
            conflicts=ConflictView.list_from_json(result.get("conflicts")),
            times=RunTimes.from_json(result),
            kind="compare",
            default_rejections=_default_rejections(result),
        )

    @classmethod
    def from_prompt(cls, result: Mapping[str, Any]) -> CompareView:
        """Read a ``prompt`` result (one agent's fields at the top level)."""
        agent = AgentView.from_json(result, "agent")
        if agent.status is None:
            agent = _with_status(agent, "failed" if agent.error else "succeeded")
        return cls(
            run_id=as_str(result.get("runId")),
            task=as_str(result.get("task")) or as_str(result.get("prompt")),
            cwd=as_str(result.get("cwd")),
            status=agent.status,
            agents=(agent,),
            winner=None,
            applied=agent.name if agent.applied else None,
            conflicts=(),
            times=RunTimes.from_json(result),
            kind="prompt",
            default_rejections=_default_rejections(result),
        )

    def applied_to(self, agent: AgentView) -> bool:
        """Whether ``agent``'s changes are the ones that were applied."""
        return bool(agent.applied) or (isinstance(self.applied, str) and agent.name == self.applied)


@frozen
class RunTimes:
    """When a run started and finished (epoch seconds), and how long it took."""

    created: float | None
    finished: float | None
    wall_seconds: float | None

    @classmethod
    def from_json(cls, result: Mapping[str, Any]) -> RunTimes:
        """Read ``created``, ``finished`` and ``wallSeconds`` (derived when only the ends are)."""
        created, finished = as_num(result.get("created")), as_num(result.get("finished"))
        wall = as_num(result.get("wallSeconds"))
        if wall is None and created is not None and finished is not None:
            wall = max(0.0, finished - created)
        return cls(created, finished, wall)


def _with_status(agent: AgentView, status: str) -> AgentView:
    return attrs.evolve(agent, status=status)


# --------------------------------------------------------------------------- pipeline


@frozen
class StepView:
    """One step of a pipeline: its node in the graph and its outcome."""

    name: str
    kind: str | None
    status: str | None
    wall_seconds: float | None
    error: str | None
    cause: str | None
    #: the traceback of the failure, if Python: its set-up's or its first failed instance's
    traceback: str | None
    agents: tuple[str, ...]
    over: str | None
    merge: str | None
    description: str | None
    instances: tuple[AgentView, ...]

    @property
    def own_traceback(self) -> str | None:
        """The traceback to show with the step itself: None when an instance shows it."""
        if any(i.traceback == self.traceback for i in self.instances):
            return None
        return self.traceback


@frozen
class ConflictView:
    """A merge conflict: one path, the branches that disagree, and their versions.

    ``ours`` is the merge so far in the fan-in's order (``ours_label`` names its instances),
    ``theirs`` the instance merged into it; ``also_changed`` holds (label, content) of instances
    merged after the conflict was left unresolved that changed the path too.
    """

    step: str | None
    path: str | None
    kind: str | None
    branches: tuple[str, ...]
    base: str | None
    ours: str | None
    theirs: str | None
    resolution: str | None
    ours_label: str = "ours"
    theirs_label: str = "theirs"
    also_changed: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ConflictView:
        """Read one conflict object (labels from ``oursLabel``/``theirsLabel``, else branches)."""
        branches = as_strs(obj.get("branches"))
        ours_label = as_str(obj.get("oursLabel")) or (branches[0] if branches else "ours")
        theirs_label = as_str(obj.get("theirsLabel")) or (
            branches[1] if len(branches) > 1 else "theirs"
        )
        also = tuple(
            (label, as_str(a.get("content")))
            for a in as_maps(obj.get("alsoChanged"))
            if (label := as_str(a.get("label"))) is not None
        )
        return cls(
            step=as_str(obj.get("step")),
            path=as_str(obj.get("path")),
            kind=as_str(obj.get("kind")),
            branches=branches,
            base=as_str(obj.get("base")),
            ours=as_str(obj.get("ours")),
            theirs=as_str(obj.get("theirs")),
            resolution=as_str(obj.get("resolution")),
            ours_label=ours_label,
            theirs_label=theirs_label,
            also_changed=also,
        )

    @classmethod
    def list_from_json(cls, value: Any) -> tuple[ConflictView, ...]:
        """Read a ``conflicts`` list: one entry per unresolved path and step.

        Results recorded before one conflict made one entry list an unresolved path again for
        each later branch that changed it (with the first entry's ours); those join the first.
        """
        out: list[ConflictView] = []
        open_at: dict[tuple[str | None, str | None], int] = {}
        for obj in as_maps(value):
            c = cls.from_json(obj)
            key = (c.step, c.path)
            if c.resolved or c.path is None:
                out.append(c)
                continue
            if key in open_at:
                i = open_at[key]
                joined = (*out[i].also_changed, (c.theirs_label, c.theirs), *c.also_changed)
                labels = tuple(dict.fromkeys((*out[i].branches, *(n for n, _ in joined))))
                out[i] = attrs.evolve(out[i], also_changed=joined, branches=labels)
                continue
            open_at[key] = len(out)
            out.append(c)
        return tuple(out)

    def missing_text(self, side: str) -> str:
        """What a null version means, from the conflict's kind (``side``: base, ours, theirs)."""
        if self.kind == "binary":
            return "(binary content)"
        if side == "base":
            return "(absent: the file is new)" if self.kind == "add-add" else "(absent)"
        if self.kind == "delete-modify":
            return "(deleted)"
        return "(absent)"

    @property
    def resolved(self) -> bool:
        """Whether a strategy other than ``fail`` settled it."""
        return self.resolution not in (None, "fail")


@frozen
class PipelineView:
    """A ``pipeline`` result."""

    run_id: str | None
    name: str | None
    pipeline: str | None
    status: str | None
    cwd: str | None
    inputs: Mapping[str, Any]
    times: RunTimes
    #: the steps in drawing order (by layer, then as the graph lists them)
    steps: tuple[StepView, ...]
    edges: tuple[tuple[str, str], ...]
    conflicts: tuple[ConflictView, ...]
    changes: tuple[Mapping[str, Any], ...]
    diff: str
    files: tuple[FileDiff, ...]
    #: the applied step instances (``apply RUN --step``), or just whether the run was applied
    applied: str | bool | None
    kind: str = "pipeline"
    #: permission requests rejected by the default rule because no policy was given
    default_rejections: DefaultRejections = attrs.field(factory=DefaultRejections)

    @classmethod
    def from_json(cls, result: Mapping[str, Any]) -> PipelineView:
        """Read a pipeline result: graph nodes, edges and step outcomes joined by step name."""
        graph = as_map(result.get("graph"))
        nodes = {
            name: n
            for n in as_maps(graph.get("nodes"))
            if (name := as_str(n.get("name"))) is not None
        }
        raw_edges = graph.get("edges")
        edges = tuple(
            (a, b)
            for e in (raw_edges if isinstance(raw_edges, list) else [])
            if isinstance(e, Sequence)
            and not isinstance(e, str)
            and len(e) == 2
            and (a := as_str(e[0])) is not None
            and (b := as_str(e[1])) is not None
        )
        outcomes = as_map(result.get("steps"))
        # every name that appears anywhere is a step: nodes, edge ends, outcomes
        names: list[str] = list(nodes)
        for a, b in edges:
            names.extend(n for n in (a, b) if n not in names)
        names.extend(str(n) for n in outcomes if str(n) not in names)
        order = [n for layer in layers(names, edges) for n in layer]
        steps = tuple(_step(n, as_map(nodes.get(n)), as_map(outcomes.get(n))) for n in order)
        diff = result.get("diff") if isinstance(result.get("diff"), str) else ""
        return cls(
            run_id=as_str(result.get("runId")),
            name=as_str(result.get("name")),
            pipeline=as_str(result.get("pipeline")),
            status=as_str(result.get("status")),
            cwd=as_str(result.get("cwd")),
            inputs=as_map(result.get("inputs")),
            times=RunTimes.from_json(result),
            steps=steps,
            edges=edges,
            conflicts=ConflictView.list_from_json(result.get("conflicts")),
            changes=as_maps(result.get("changes")),
            diff=diff or "",
            files=parse_diff(diff),
            applied=", ".join(as_strs(result.get("appliedSteps")))
            or as_bool(result.get("applied")),
            default_rejections=_default_rejections(result),
        )

    def instances(self) -> list[tuple[StepView, AgentView]]:
        """Every (step, instance) pair, in step order."""
        return [(s, i) for s in self.steps for i in s.instances]

    def status_counts(self) -> dict[str, int]:
        """Steps by status (no status as ``unknown``)."""
        counts: dict[str, int] = defaultdict(int)
        for s in self.steps:
            counts[s.status or "unknown"] += 1
        return dict(counts)


def _step(name: str, node: Mapping[str, Any], outcome: Mapping[str, Any]) -> StepView:
    instances = tuple(
        AgentView.from_json(as_map(obj), str(key), key=str(key))
        for key, obj in as_map(outcome.get("instances")).items()
    )
    wall = as_num(outcome.get("wallSeconds"))
    if wall is None:  # instances run side by side: the step took as long as the slowest
        wall = max((i.wall_seconds for i in instances if i.wall_seconds is not None), default=None)
    return StepView(
        name=name,
        kind=as_str(node.get("kind")),
        status=as_str(outcome.get("status")),
        wall_seconds=wall,
        error=_error_text(outcome.get("error")),
        cause=as_str(outcome.get("cause")),
        traceback=as_str(outcome.get("traceback")),
        agents=as_strs(node.get("agents")),
        over=as_str(node.get("over")),
        merge=as_str(node.get("merge")),
        description=as_str(node.get("description")),
        instances=instances,
    )


def layers(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[list[str]]:
    """Names grouped by generation: a node sits one layer after its deepest parent.

    Within a layer, nodes are ordered by the mean position of their parents (fewer crossing
    edges), ties keeping the order of ``names``. Nodes on a cycle (an invalid graph, but a report
    must still draw it) go to one extra layer at the end.
    """
    index = {n: i for i, n in enumerate(names)}
    parents: dict[str, list[str]] = {n: [] for n in names}
    children: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        if a in index and b in index and a != b and a not in parents[b]:
            parents[b].append(a)
            children[a].append(b)
    depth: dict[str, int] = {}
    waiting = {n: len(parents[n]) for n in names}
    ready = [n for n in names if waiting[n] == 0]
    while ready:
        n = ready.pop(0)
        depth[n] = max((depth[p] + 1 for p in parents[n]), default=0)
        for c in children[n]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    cyclic = [n for n in names if n not in depth]
    extra = max(depth.values(), default=-1) + 1
    for n in cyclic:
        depth[n] = extra
    grouped: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for n in names:
        grouped[depth[n]].append(n)
    position: dict[str, float] = {}

    def barycentre(n: str) -> tuple[float, int]:
        known = [position[p] for p in parents[n] if p in position]
        return (sum(known) / len(known) if known else float(index[n]), index[n])

    for layer in grouped:
        layer.sort(key=barycentre)
        for row, n in enumerate(layer):
            position[n] = float(row)
    return grouped


def load(result: Any) -> CompareView | PipelineView:
    """The view for a result object; ``kind`` picks it, else the keys it has.

    Raises :class:`ReportError` for anything that is not a result object.
    """
    if not isinstance(result, Mapping):
        raise ReportError(f"a report needs a result object (a dict), not {type(result).__name__}")
    kind = result.get("kind")
    if kind is None:  # older or hand-made results: guess from the shape
        if "steps" in result or "graph" in result:
            kind = "pipeline"
        elif "agents" in result:
            kind = "compare"
        elif "sessionId" in result or "stopReason" in result:
            kind = "prompt"
    if kind == "compare":
        return CompareView.from_json(result)
    if kind == "pipeline":
        return PipelineView.from_json(result)
    if kind == "prompt":
        return CompareView.from_prompt(result)
    raise ReportError(f"unknown result kind {kind!r}: expected 'compare', 'pipeline' or 'prompt'")
