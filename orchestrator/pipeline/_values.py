"""The values a step declaration takes, and the checks ``@step`` runs on them.

Leaf of the pipeline package: the merge strategies, the reserved parameter names, :class:`Budget`
and the helpers that read a function's parameters and check option values (each error names the
step it is about).
"""

from __future__ import annotations

import inspect
import json
import keyword
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

from attrs import field, frozen

from .._sizes import parse_size
from ..errors import UsageError

__all__ = [
    "MERGE_STRATEGIES",
    "RESERVED_PARAMS",
    "AgentInput",
    "Budget",
    "MergeStrategy",
    "agent_input",
    "agents_from",
    "agents_input",
    "check_size",
    "check_text",
    "check_timeout",
    "first_doc_line",
    "is_identifier",
    "named_params",
]

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


def is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def named_params(fn: Callable[..., Any], what: str) -> tuple[tuple[str, ...], dict[str, Any]]:
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


def agents_from(value: str | Sequence[str] | None, what: str) -> tuple[str, ...]:
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


_NO_DEFAULT = object()


@frozen
class AgentInput:
    """A step's agents named by a run input: ``@step(agent=agent_input("reviewer", ...))``.

    Made by :func:`agent_input` (one agent) or :func:`agents_input` (a fan-out: one branch per
    agent). The input is a run input like any other (``--set NAME=VALUE``, the ``inputs`` of
    :func:`~orchestrator.runs.run_pipeline`); its value is checked before any agent starts.
    """

    #: the run input that names the agents
    name: str
    #: whether the input is a list of agents (a fan-out, keyed by agent) or one agent
    many: bool
    #: the agents when the input is not given (empty: the input must be given)
    default: tuple[str, ...] = ()

    @property
    def has_default(self) -> bool:
        """Whether the input may be left out."""
        return bool(self.default)

    @property
    def default_value(self) -> str | list[str] | None:
        """The default as the input's value: a name, a list of names, or None."""
        if not self.default:
            return None
        return list(self.default) if self.many else self.default[0]

    def agents(self, value: object) -> tuple[str, ...]:
        """The agents ``value`` (the input's value) names; TypeError or UsageError if none.

        One agent is a string; a list input takes a list of strings, or one string for a
        single agent. Messages say what was expected, not which input (the caller names it).
        """
        if self.many:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list | tuple):
                raise TypeError(
                    f"expected an agent name or a list of agent names, got {_kind(value)}"
                )
            if not value:
                raise UsageError("names no agent: give at least one")
        elif not isinstance(value, str):
            raise TypeError(f"expected one agent name (a string), got {_kind(value)}")
        else:
            value = [value]
        for item in value:
            if not isinstance(item, str):
                raise TypeError(f"agent names are strings, not {_kind(item)}")
            if not item.strip():
                raise UsageError("an agent name is empty")
        names = tuple(value)
        for i, name in enumerate(names):
            if name in names[:i]:
                raise UsageError(
                    f"agent {name!r} is listed twice; branches are keyed by agent name "
                    "(label a second one with NAME=COMMAND)"
                )
        return names


def _kind(value: object) -> str:
    """``value`` for a type error: what it is, and short values as JSON (``a number (3)``)."""
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "a list"
    kinds = {bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    kind = kinds.get(type(value))
    if kind is None:
        return type(value).__name__
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        return kind
    return f"{kind} ({shown})" if len(shown) <= 40 else kind


def _agent_input(name: object, many: bool, default: object) -> AgentInput:
    which = "agents_input" if many else "agent_input"
    if not isinstance(name, str):
        raise TypeError(f"{which}: the input name is a string, not {type(name).__name__}")
    if not is_identifier(name) or name in RESERVED_PARAMS:
        raise UsageError(f"{which}: {name!r} cannot name a run input (a Python identifier)")
    marker = AgentInput(name=name, many=many)
    if default is _NO_DEFAULT or default is None:
        return marker
    try:
        agents = marker.agents(list(default) if isinstance(default, tuple) else default)
    except (TypeError, UsageError) as e:
        raise type(e)(f"{which}({name!r}): default: {e}") from None
    return AgentInput(name=name, many=many, default=agents)


def agent_input(name: str, *, default: str | None = None) -> AgentInput:
    """One agent, named by the run input ``name`` (default: ``default``; None: required).

    ``@step(agent=agent_input("reviewer", default="claude"))`` runs the step with the agent
    the input names (``--set reviewer=codex``); the value is an agent name as ``--agent``
    takes it (a known name, ``NAME=COMMAND`` or a command line).
    """
    return _agent_input(name, False, default)


def agents_input(name: str, *, default: Sequence[str] | None = None) -> AgentInput:
    """A fan-out over the agents the run input ``name`` lists: one branch per agent.

    ``@step(agent=agents_input("agents", default=["claude", "codex"]))`` runs one branch per
    agent of the input (``--set agents='["claude", "gemini"]'``, or one name: ``--set
    agents=demo``). The step's value is a :class:`~orchestrator.pipeline.results.Results`
    keyed by agent, however many agents are given.
    """
    return _agent_input(name, True, default)


def check_timeout(value: object, name: str, what: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be a number of seconds, not {type(value).__name__}")
    if not value > 0:
        raise UsageError(f"{what}: {name} must be positive, not {value}")
    return float(value)


def check_size(value: object, name: str, what: str) -> int | None:
    """A size in bytes from an int or a string such as ``"500M"`` (None stays None)."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except TypeError as e:
        raise TypeError(f"{what}: {name}: {e}") from None
    except ValueError as e:
        raise UsageError(f"{what}: {name}: {e}") from None


def check_text(value: object, name: str, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what}: {name} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise UsageError(f"{what}: {name} is empty")
    return value


def first_doc_line(fn: Callable[..., Any]) -> str | None:
    doc = inspect.getdoc(fn)
    if not doc:
        return None
    first = doc.strip().splitlines()[0].strip()
    return first or None
