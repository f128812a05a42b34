"""Declaring a step: :class:`Step` and the :func:`step` decorator.

A step's name is its function's name; its parameter names are what it depends on. Everything a
single declaration can get wrong is refused here, at decoration time; what is wrong between steps
is found when they form a :class:`~orchestrator.pipeline.Pipeline` (see ``_graph``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, cast, overload

from attrs import field, frozen

from ..errors import UsageError
from ..mcp import McpServer, parse_mcp_server
from ..sandbox import SandboxChoice, sandbox_choice
from ._values import (
    MERGE_STRATEGIES,
    RESERVED_PARAMS,
    AgentInput,
    Budget,
    MergeStrategy,
    agents_from,
    check_size,
    check_text,
    check_timeout,
    first_doc_line,
    is_identifier,
    named_params,
)

__all__ = ["Step", "collect_steps", "step"]

#: the most rounds a step with a check may have (each is a turn of an agent)
MAX_ROUNDS = 100

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
    #: the agents that run the step, one branch each; empty for a Python step, and for a step
    #: whose agents a run input names until the pipeline is bound to its inputs
    #: (:meth:`~orchestrator.pipeline.Pipeline.with_agents`)
    agents: tuple[str, ...] = ()
    #: the run input that names the step's agents (``agent=agent_input(...)``), if one does
    agents_input: AgentInput | None = None
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
    #: key its instances by agent even when one agent runs it (a comparison of one agent
    #: still names its instance after the agent)
    keyed_by_agent: bool = False
    #: confine its agents (and their terminal and verify commands) with Landlock: these rules,
    #: or ``True`` for the agent's or the run's rules; ``False``/None: only if they ask
    sandbox: SandboxChoice = None
    #: the largest content (bytes) a file its branch changes may have; None: the run's limit
    max_file_size: int | None = None
    #: MCP servers its agents' sessions get, besides the run's and the agent's; a name stands
    #: for a config file's ``[mcp_servers.NAME]``
    mcp_servers: tuple[McpServer | str, ...] = ()
    #: what decides whether the agent's work is done, run on its branch after each turn: a
    #: shell command (exit 0: passed) or a function of (branch directory, result) returning
    #: a bool, a ``(passed, message)`` pair or a
    #: :class:`~orchestrator.pipeline.results.CheckResult`; None: the turn's end decides
    check: str | Callable[..., Any] | None = None
    #: the most turns the agent gets to make the check pass (the first one included)
    rounds: int = 1
    #: builds the prompt of the next round from the failed check's result and the round's
    #: number; None: :func:`~orchestrator.pipeline.default_feedback`
    feedback: Callable[..., Any] | None = None

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        agent: str | Sequence[str] | AgentInput | None = None,
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
        sandbox: SandboxChoice = None,
        max_file_size: int | str | None = None,
        mcp_servers: Sequence[McpServer | str] = (),
        check: str | Callable[..., Any] | None = None,
        rounds: int = 1,
        feedback: Callable[..., Any] | None = None,
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
        if not is_identifier(name):
            raise UsageError(f"{what}: a step needs a function defined with def, not a lambda")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise UsageError(f"{what}: a step returns its result; generators are not supported")
        params, defaults = named_params(fn, what)
        marker = agent if isinstance(agent, AgentInput) else None
        agents = () if marker is not None else agents_from(cast(Any, agent), what)
        if over is not None:
            if not isinstance(over, str):
                raise TypeError(f"{what}: over must be a step or input name (a string)")
            if not is_identifier(over) or over in RESERVED_PARAMS:
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
            when_params, _ = named_params(when, f"{what}: when")
        try:
            checked_budget = None if budget is None else Budget.from_value(budget)
        except (TypeError, UsageError) as e:
            raise type(e)(f"{what}: {e}") from None
        checked_size = check_size(max_file_size, "max_file_size", what)
        checked_policy = check_text(policy, "policy", what)
        checked_idle = check_timeout(idle_timeout, "idle_timeout", what)
        checked_mode = check_text(mode, "mode", what)
        checked_model = check_text(model, "model", what)
        checked_sandbox = sandbox_choice(sandbox, what)
        checked_mcp = _mcp_servers(mcp_servers, what)
        checked_check = _check(check, what)
        if not isinstance(rounds, int) or isinstance(rounds, bool):
            raise TypeError(f"{what}: rounds must be an int, not {type(rounds).__name__}")
        if rounds < 1:
            raise UsageError(f"{what}: rounds must be 1 or more, not {rounds}")
        if rounds > MAX_ROUNDS:
            raise UsageError(f"{what}: rounds must be at most {MAX_ROUNDS}, not {rounds}")
        if feedback is not None and not callable(feedback):
            raise TypeError(f"{what}: feedback must be callable, not {type(feedback).__name__}")
        if checked_check is None and (rounds > 1 or feedback is not None):
            given_loop = "rounds" if rounds > 1 else "feedback"
            raise UsageError(f"{what}: {given_loop} needs a check (give check=...)")
        if not agents and marker is None:
            agent_only = {
                "policy": checked_policy,
                "idle_timeout": checked_idle,
                "budget": checked_budget,
                "mode": checked_mode,
                "model": checked_model,
                # a Python step runs in this process: nothing to confine
                "sandbox": checked_sandbox or None,
                "mcp_servers": checked_mcp or None,
                "check": checked_check,
            }
            given = [option for option, value in agent_only.items() if value is not None]
            if given:
                verb = "applies" if len(given) == 1 else "apply"
                raise UsageError(
                    f"{what}: {', '.join(given)} only {verb} to agent steps (give agent=...)"
                )
        return cls(
            name=name,
            fn=fn,
            params=params,
            defaults=MappingProxyType(defaults),
            agents=agents,
            agents_input=marker,
            over=over,
            merge=cast(MergeStrategy, merge),
            policy=checked_policy,
            timeout=check_timeout(timeout, "timeout", what),
            idle_timeout=checked_idle,
            retries=retries,
            when=when,
            when_params=when_params,
            budget=checked_budget,
            mode=checked_mode,
            model=checked_model,
            description=(
                check_text(description, "description", what)
                if description is not None
                else first_doc_line(fn)
            ),
            is_async=inspect.iscoroutinefunction(fn),
            sandbox=checked_sandbox,
            max_file_size=checked_size,
            mcp_servers=checked_mcp,
            check=checked_check,
            rounds=rounds,
            feedback=feedback,
            # a list of agents from an input is a fan-out whatever its length: the step's
            # value is Results keyed by agent, also when the input names one agent
            keyed_by_agent=marker is not None and marker.many,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function, exactly as if it were not decorated."""
        return self.fn(*args, **kwargs)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # Lets inspect.signature() and friends see the function's own signature.
        return self.fn

    def __repr__(self) -> str:
        if self.agents_input is not None and not self.agents:
            kind = f"agents from input {self.agents_input.name!r}"
        else:
            kind = f"agents={list(self.agents)!r}" if self.agents else "python"
        over = f", over={self.over!r}" if self.over else ""
        return f"<Step {self.name!r} {kind}{over}>"

    @property
    def is_agent_step(self) -> bool:
        """Whether agents run this step (its function returns their prompt)."""
        return bool(self.agents) or self.agents_input is not None

    @property
    def needs_agents(self) -> bool:
        """Whether the step's agents come from a run input not bound yet."""
        return self.agents_input is not None and not self.agents

    @property
    def fans_out(self) -> bool:
        """Whether the step runs as several branches (several agents, or over items)."""
        return len(self.agents) > 1 or self.over is not None or self.keyed_by_agent

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


def _mcp_servers(value: Any, what: str) -> tuple[McpServer | str, ...]:
    """The step's MCP servers, the command-line forms parsed now; bare names (a config's
    servers) are looked up when the run starts."""
    if isinstance(value, str | McpServer) or not isinstance(value, Sequence):
        raise TypeError(f"{what}: mcp_servers must be a list of MCP servers")
    out: list[McpServer | str] = []
    for item in value:
        if isinstance(item, McpServer):
            out.append(item)
        elif isinstance(item, str):
            try:
                out.append(parse_mcp_server(item) if "=" in item else item)
            except UsageError as e:
                raise UsageError(f"{what}: {e}") from None
        else:
            raise TypeError(f"{what}: mcp_servers holds {type(item).__name__}, not McpServer")
    return tuple(out)


def _check(value: object, what: str) -> str | Callable[..., Any] | None:
    """A step's check: a shell command line or a callable (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise UsageError(f"{what}: check is an empty command")
        return value
    if not callable(value):
        raise TypeError(
            f"{what}: check must be a shell command or a callable, not {type(value).__name__}"
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # a builtin without one: its call will say
        return value
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"{what}: check must take two positional arguments (workdir, result), not {signature}"
        ) from None
    return value


@overload
def step(fn: Callable[..., Any], /) -> Step: ...


@overload
def step(
    *,
    agent: str | Sequence[str] | AgentInput | None = None,
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
    sandbox: SandboxChoice = None,
    max_file_size: int | str | None = None,
    mcp_servers: Sequence[McpServer | str] = (),
    check: str | Callable[..., Any] | None = None,
    rounds: int = 1,
    feedback: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Step]: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    agent: str | Sequence[str] | AgentInput | None = None,
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
    sandbox: SandboxChoice = None,
    max_file_size: int | str | None = None,
    mcp_servers: Sequence[McpServer | str] = (),
    check: str | Callable[..., Any] | None = None,
    rounds: int = 1,
    feedback: Callable[..., Any] | None = None,
) -> Step | Callable[[Callable[..., Any]], Step]:
    """Declare a pipeline step; use as ``@step`` or ``@step(...)``.

    The function's name is the step's name and its parameter names are its dependencies
    (steps or run inputs; a default on a run input is the input's default). The reserved
    names ``item``, ``workdir`` and ``ctx`` are filled in by the runner.

    - ``agent``: an agent name, or several for one branch per agent; or a run input that
      names them, :func:`agent_input` (one agent) or :func:`agents_input` (one branch per
      agent it lists), with a default. Without it, the step is plain Python and its return
      value is its result; with it, the function returns the prompt (a string or a list of
      content-block dicts).
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
    - ``sandbox``: confine the step's agents, their terminal commands and the run's verify
      command with Landlock (:class:`~orchestrator.sandbox.Sandbox` rules, or ``True`` for the
      agent's or the run's rules). ``False`` does not turn off a sandbox the run or the agent
      asks for.
    - ``max_file_size``: the largest file the step's branch may change, in bytes or as
      ``"500M"``; replaces the run's limit (default 100 MiB) for this step. A file over it
      fails the instance (see the README, "Limits").
    - ``mcp_servers``: MCP servers the step's agent sessions get (:class:`~orchestrator.mcp.
      McpServer` values, the command line's ``NAME=COMMAND``/``NAME=URL`` forms, or names of
      a config file's ``[mcp_servers]``), after the agent's and the run's.
    - ``check``: what decides that the agent's work is done, run on its branch directory after
      each turn (what it writes there is discarded): a shell command (exit 0: passed; its
      output's tail is kept) or a function ``check(workdir, result)`` (sync or ``async``) of
      the directory and the round's :class:`~orchestrator.pipeline.results.StepResult`,
      returning a bool, a ``(passed, message)`` pair or a
      :class:`~orchestrator.pipeline.results.CheckResult`. ``rounds``: how many turns the
      agent gets to make it pass (default 1, at most 100): after a failed check the same
      session gets a follow-up prompt made by ``feedback(check_result, round)`` (default:
      :func:`~orchestrator.pipeline.default_feedback`). The instance fails with the last
      check's output when no round passes; ``retries`` start the whole loop over. The
      step's ``timeout`` spans the checks and feedback too; a sync check or feedback runs in
      a worker thread that a timeout or Ctrl-C abandons (Python cannot stop it: it finishes
      in the background, its result ignored).

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
        "sandbox": sandbox,
        "max_file_size": max_file_size,
        "mcp_servers": mcp_servers,
        "check": check,
        "rounds": rounds,
        "feedback": feedback,
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
