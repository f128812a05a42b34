"""Running a pipeline: the one engine behind every run (prompt, compare, run, resume).

Each function has an ``async`` form for trio code and a ``*_sync`` twin for scripts; the command
line calls the same functions::

    from orchestrator import run_pipeline_sync, apply_run_sync
    run = run_pipeline_sync("pipelines/batch_replace.py", {"change": "Use pathlib"}, cwd="proj")
    print(run.status, run.diff)
    apply_run_sync(run.run_id)          # later: write the run's changes to the workspace

Every run is recorded in the run store under the state directory: ``list_runs``, ``get_run_json``,
``resume_run``, ``apply_run`` and ``diff_run`` work from there (the read side lives in
:mod:`orchestrator.runs.recorded`).
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, closing, nullcontext
from pathlib import Path
from typing import Any, Literal

import attrs
import trio
from attrs import field, frozen

from .._log import get_logger
from .._names import display_name, display_names, is_utf8
from .._sizes import DEFAULT_MAX_FILE_SIZE
from .._util import plain_cancelled
from ..agent.client import ClientOptions
from ..agent.permissions import Escalate
from ..agent.services import ClientServices
from ..agent.transcript import TranscriptFile, flushing_transcript_file
from ..agents import AgentSpec
from ..cluster._connect import ClusterSpec, cluster_spec
from ..cluster._driver import ClusterSession, ClusterTurns, open_cluster, rate_keys_of
from ..cluster._node import RunHostConfig
from ..config import Config
from ..errors import (
    AgentNotFound,
    AlreadyApplied,
    ApplyRefused,
    StoreError,
    UsageError,
)
from ..mcp import McpServer, merge_mcp_servers
from ..pipeline import Pipeline, load_pipeline
from ..pipeline._branchio import TRASH
from ..pipeline._budget import RunBudget
from ..pipeline._calls import safe
from ..pipeline._recording import notify
from ..pipeline._writer import open_store_writer
from ..pipeline.branches import (
    FINAL,
    conflict_json,
    diff_of,
    patch_left_out,
    patch_of,
    rebuild_branch,
    stored_changes,
    workspace_moved,
)
from ..pipeline.results import RunEvent
from ..pipeline.runner import AgentPool, PipelineRunner, label_run_agents
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import (
    DEVICES,
    Sandbox,
    SandboxChoice,
    build_ruleset,
    choose_sandbox,
    kernel_abi,
    rights_json,
)
from ..state import resolves_inside, state_directory
from ..store import RunRecord, RunStore, StepRecord, open_run_store
from ..supervisor import Connector, Limits, open_supervisor
from ..vfs import (
    Branch,
    PathRefused,
    Snapshot,
    Workspace,
    merge_branches,
    remove_tree,
)
from ..vfs.pool import reuse_enabled_by_env
from ._face import check_trio_face
from ._lock import hold_run_lock, move_leftovers
from .apply import apply_recorded, recover
from .default_policy import DefaultRejections
from .outcomes import (
    AgentOutcome,
    BranchUsage,
    FileChange,
    StepOutcome,
    read_agents,
    read_branches,
    read_steps,
)
from .recorded import compare_verdict, finished_run_json, rebuild_run_json
from .settings import RunSettings, configured_limits, file_size_option, policy_source
from .verdict import Verdict, judge

__all__ = ["RunOutcome", "run_pipeline", "workspace_root"]

log = get_logger(__name__)

RunStatus = Literal["succeeded", "failed", "conflicts", "interrupted"]
RunKind = Literal["prompt", "pipeline", "compare"]


@frozen
class RunOutcome:
    """How a run ended.

    :attr:`result` is the run's ``--json`` object as it is (a plain mapping, see the README);
    :attr:`steps`, :attr:`agents`, :attr:`verdict`, :attr:`winner` and :attr:`changes` read
    it as typed values (:mod:`orchestrator.runs.outcomes`) whose ``to_json()`` gives its parts
    back exactly.
    """

    run_id: str
    status: RunStatus
    #: the raw ``--json`` object: steps, agents, conflicts, changes, diff, ... (JSON values)
    result: Mapping[str, Any]
    #: the run's directory in the state directory
    run_dir: str
    #: files the run changed that changed in the workspace during the run too: asked to apply,
    #: the run wrote nothing (its changes stay in the run store, to apply later); where
    #: branches merged such a file they found no base for it (see ``MergeResult.base_gone``).
    #: Never raised: the run ends with this outcome
    workspace_changed: tuple[str, ...] = ()
    #: the run asked for permissions, every one was refused, and it changed nothing: it may
    #: have succeeded, but did none of its work (see :attr:`warnings`)
    did_nothing: bool = False
    #: what a caller should know although the run did not fail, one sentence each
    warnings: tuple[str, ...] = ()
    #: whether the run was asked to apply its changes (``apply=True``)
    apply_asked: bool = False
    #: each succeeded step's value as this process saw it (a :class:`StepResult`, a
    #: :class:`Results` of a fanned-out step, a Python step's return value); not recorded
    values: Mapping[str, Any] = field(factory=dict, eq=False, repr=False)
    #: each step's instances' last outcomes in this process, failed ones too: by step, then
    #: by instance key (None for a step that does not fan out), a result, value or exception
    outcomes: Mapping[str, Mapping[str | None, Any]] = field(factory=dict, eq=False, repr=False)

    @property
    def exit_code(self) -> int:
        """0 done, 1 a step failed, 3 asked to apply, left unapplied because the workspace
        changed, 4 merge conflicts between branches, 130 interrupted."""
        if self.status == "succeeded" and self.workspace_changed and self.apply_asked:
            return 3
        return {"succeeded": 0, "failed": 1, "conflicts": 4, "interrupted": 130}[self.status]

    @property
    def diff(self) -> str:
        return str(self.result.get("diff") or "")

    @property
    def default_rejections(self) -> DefaultRejections:
        """The permission requests rejected because no policy was given (its ``message`` says
        so, for people); none when a policy was given."""
        return DefaultRejections.from_json(self.result.get("defaultRejections"))

    @functools.cached_property
    def steps(self) -> Mapping[str, StepOutcome]:
        """A pipeline's steps by name, typed (read from :attr:`result`'s ``steps``); empty for
        a comparison."""
        return read_steps(self.result)

    @functools.cached_property
    def agents(self) -> tuple[AgentOutcome, ...]:
        """A comparison's agents in the order given, typed (read from :attr:`result`'s
        ``agents``); empty for other runs."""
        return read_agents(self.result)

    @property
    def verdict(self) -> Verdict | None:
        """A comparison's verdict: the agents that succeeded and the winner (None when none
        did), and why it won; None for other runs."""
        if self.result.get("kind") != "compare":
            return None
        return judge([a for a in self.result.get("agents") or () if isinstance(a, Mapping)])

    @property
    def winner(self) -> str | None:
        """The label of a comparison's winning agent; None when none succeeded, or for other
        runs."""
        verdict = self.verdict
        return verdict.winner if verdict is not None else None

    @functools.cached_property
    def branches(self) -> BranchUsage | None:
        """What the run's branch directories cost: made, reused, bytes copied, peak disk (read
        from :attr:`result`'s ``branches``); None for a run no process took to its end."""
        return read_branches(self.result)

    @functools.cached_property
    def changes(self) -> tuple[FileChange, ...]:
        """The files the run changed, typed (read from :attr:`result`'s ``changes``); empty for a
        comparison, whose agents' branches are alternatives, never merged (each agent's are in
        :attr:`agents`)."""
        raw = self.result.get("changes")
        if not isinstance(raw, list):
            return ()
        return tuple(FileChange.from_json(c) for c in raw if isinstance(c, Mapping))


def launchable(spec: AgentSpec) -> AgentSpec:
    """``spec``, if its program can be found; else :class:`AgentNotFound` saying how to
    install it."""
    if not spec.resolved(os.getcwd()).executable_found():
        raise AgentNotFound(spec.name, spec.command[0], spec.install or None)
    return spec


def workspace_root(cwd: str | os.PathLike[str]) -> Path:
    """``cwd`` as an absolute path, if it is a directory (the workspace of a run) named in UTF-8.

    A workspace path that is not UTF-8 is refused: runs record it as text, and agents are given
    it as their session's ``cwd``, a JSON string.
    """
    root = Path(cwd).absolute()
    if not is_utf8(str(root)):
        raise UsageError(
            f"workspace {display_name(str(root))} is not a UTF-8 path: agents are given it as "
            "JSON text; work in a directory whose path is UTF-8"
        )
    if not root.is_dir():
        raise UsageError(f"workspace {root} is not a directory")
    return root


def _settings(
    pipe: Pipeline,
    agents: Mapping[str, AgentSpec],
    policy: str | os.PathLike[str] | PolicySet | None,
    max_sessions: int | None,
    max_file_size: int | None,
    restored: RunSettings | None,
    cfg: Config,
    sandbox: SandboxChoice,
    mcp_servers: Sequence[McpServer | str] | None = None,
) -> RunSettings:
    """The run's settings, resolved once before any agent starts (or as a resume restored
    them): the policy, the policies its steps and agents name, the limits, the agent table,
    the run's sandbox."""
    if restored is None:
        base = RunSettings(
            policy=PolicySet.resolve(policy),
            policy_source=policy_source(policy),
            max_sessions=max_sessions or cfg.max_sessions or 8,
            max_file_size=max_file_size or cfg.max_file_size or DEFAULT_MAX_FILE_SIZE,
            sandbox=choose_sandbox(sandbox, cfg.sandboxed, rules=cfg.sandbox),
            limits=configured_limits(cfg),
            mcp_servers=_run_mcp_servers(cfg, mcp_servers or ()),
        )
    else:
        base = restored
        if mcp_servers is not None:
            base = attrs.evolve(
                base, mcp_servers=_run_mcp_servers(cfg, mcp_servers), mcp_record=None
            )
    names = [s.policy for s in pipe.steps.values() if s.policy]
    names += [spec.policy for spec in agents.values() if spec.policy]
    named = {name: base.load_policy(name) for name in dict.fromkeys(names)}
    return attrs.evolve(base, named_policies=named, agents={**base.agents, **agents})


def _run_mcp_servers(cfg: Config, given: Sequence[McpServer | str]) -> tuple[McpServer, ...]:
    """The run's MCP servers (``--mcp-server``): names looked up in the config, programs made
    absolute against where the command was given."""
    servers = merge_mcp_servers(cfg.mcp_server(item) for item in given)
    return tuple(server.resolved(os.getcwd()) for server in servers)


def _sessions_mcp_servers(
    pipe: Pipeline, agents: Mapping[str, AgentSpec], settings: RunSettings, cfg: Config
) -> dict[tuple[str, str], tuple[McpServer, ...]]:
    """The MCP servers of each (step, agent label) whose sessions get some: the agent's, then
    the run's, then the step's; a later one replaces an earlier one of its name. Programs are
    made absolute (a config file's relative paths are already its directory's)."""
    base = os.getcwd()
    out: dict[tuple[str, str], tuple[McpServer, ...]] = {}
    for s in pipe.steps.values():
        own = [cfg.mcp_server(item) for item in s.mcp_servers]
        for text in s.agents:
            spec = agents[text]
            servers = merge_mcp_servers(spec.mcp_servers, settings.mcp_servers, own)
            if servers:
                out[(s.name, spec.name)] = tuple(server.resolved(base) for server in servers)
    return out


def _mcp_json(
    servers: Mapping[tuple[str, str], tuple[McpServer, ...]],
) -> dict[str, dict[str, list[dict[str, Any]]]] | None:
    """What MCP servers each session had, as recorded: secrets redacted."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (step, agent), given in servers.items():
        out.setdefault(step, {})[agent] = [server.to_json() for server in given]
    return out or None


def _confinement(
    pipe: Pipeline,
    agents: Mapping[str, AgentSpec],
    settings: RunSettings,
    rules: Sandbox | None,
    state: Path,
) -> dict[tuple[str, str], Sandbox]:
    """The sandbox of each (step, agent label) whose agent runs confined, home included.

    The step's word first, then the agent's, then the run's (:func:`choose_sandbox`). An agent
    whose rules name no home keeps the ``HOME`` its settings give it, else gets one of its own
    under the state directory, kept between runs (its caches, its logins).
    """
    out: dict[tuple[str, str], Sandbox] = {}
    for s in pipe.steps.values():
        for text in s.agents:
            spec = agents[text]
            chosen = choose_sandbox(s.sandbox, spec.sandbox, settings.sandbox, rules=rules)
            if chosen is None:
                continue
            if chosen.home is None:
                home = spec.env.get("HOME") or ""
                if not os.path.isabs(home):
                    home = str(state / "sandbox" / safe(spec.name) / "home")
                chosen = chosen.with_home(home)
            out[(s.name, spec.name)] = chosen
    return out


def _check_sandboxes(sandboxes: Mapping[tuple[str, str], Sandbox]) -> dict[str, Any] | None:
    """What confines the run's agents, as recorded; SandboxUnavailable if the kernel cannot."""
    if not sandboxes:
        return None
    abi = kernel_abi()
    confined: dict[str, dict[str, Any]] = {}
    for (step, agent), sandbox in sandboxes.items():
        build_ruleset(sandbox, abi=abi, writable=())  # the rules this kernel cannot enforce
        confined.setdefault(step, {})[agent] = sandbox.to_json()
    return {**rights_json(abi), "devices": list(DEVICES), "confined": confined}


@plain_cancelled
async def run_pipeline(
    pipeline: Pipeline | str | os.PathLike[str],
    inputs: Mapping[str, Any] | None = None,
    *,
    cwd: str | os.PathLike[str] = ".",
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    config: Config | None = None,
    max_sessions: int | None = None,
    max_file_size: int | str | None = None,
    reuse_dirs: bool = True,
    apply: bool = False,
    on_event: Callable[[RunEvent], None] | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    transcript: str | os.PathLike[str] | None = None,
    connector: Connector | None = None,
    pool: AgentPool | None = None,
    verify: Mapping[str, str] | None = None,
    options: ClientOptions | None = None,
    services: ClientServices | None = None,
    record_transcripts: bool = True,
    _kind: RunKind = "pipeline",
    _resume: str | None = None,
    _settings_restored: RunSettings | None = None,
    sandbox: SandboxChoice = None,
    mcp_servers: Sequence[McpServer | str] | None = None,
    _extra_options: Mapping[str, Any] | None = None,
    _finish_result: Callable[[RunOutcome], Mapping[str, Any]] | None = None,
    _budget: RunBudget | None = None,
    _slots: trio.Semaphore | None = None,
    _parent: str | None = None,
    cluster: str | ClusterSpec | None = None,
    _cluster: ClusterSession | None = None,
    _apply_gate: Callable[[], bool] | None = None,
) -> RunOutcome:
    """Run ``pipeline`` (a file or a :class:`Pipeline`) on branches of ``cwd``.

    This is the one way every run goes (a prompt and a comparison are one-step pipelines):
    the whole graph, its inputs, its agents and its policies are checked, and the run store
    opened and checked, before any agent starts; the settings are recorded with the run.
    Steps run as soon as their dependencies are done, within ``max_sessions`` live sessions
    (default: the config's, else 8), each agent through the supervisor, each session with the
    services of its branch. Permission requests are answered by ``policy`` (a preset name, a
    TOML file or a :class:`PolicySet`; default: reject everything), ``escalate`` answering its
    ``ask`` verdicts; ``services`` replaces the sessions' permission, terminal and elicitation
    services. ``on_event`` sees the run's events, ``on_update`` every session update.
    ``record_transcripts`` keeps every agent process's wire transcript in the run store (always
    when ``transcript`` names a file; that file gets their lines appended as they come, each
    within about 0.1 s).

    ``sandbox`` (``True``, or :class:`~orchestrator.sandbox.Sandbox` rules) runs every agent,
    its terminal commands and the verify commands confined by Landlock: each agent process
    serves one session and may write only to its branch directory, its home and a private
    temp directory (see :mod:`orchestrator.sandbox`). The config, an agent's spec or a step may
    ask for it too; nothing turns off what one of them asked for. Where the kernel cannot
    confine them, the run is refused before it is recorded and any agent starts
    (:class:`~orchestrator.errors.SandboxUnavailable`); the result's ``sandbox`` says what
    confined which agent.

    ``mcp_servers`` (:class:`~orchestrator.mcp.McpServer` values, the command line's
    ``NAME=COMMAND`` / ``NAME=URL`` / ``NAME=sse+URL`` forms, or names of the config's
    ``[mcp_servers]``) are given to every agent session of the run, after the agent's own
    (``[agents.NAME] mcp_servers``) and before a step's (``@step(mcp_servers=...)``). An agent
    whose ``mcpCapabilities`` do not allow a server's kind (``http``, ``sse``) fails its
    instance before any session starts, with
    :class:`~orchestrator.errors.McpServerUnsupported`. What each session had is recorded
    (``mcpServers`` in the run's options), secret values redacted.

    A step instance that leaves a file larger than ``max_file_size`` bytes in its branch (an
    int, or ``"100M"``; default: the config's, else 100 MiB; a step's own ``max_file_size``
    replaces it) fails, naming the file, its size and the limit; an ``fs/write_text_file``
    over it is refused to the agent (-32602) before anything is written.

    A finished instance's branch directory is reset and reused for the next instance forked
    from the same tree (see :mod:`orchestrator.vfs.pool`); ``reuse_dirs=False`` (or the
    environment variable ``ORCHESTRATOR_REUSE_DIRS=0``) makes every one fresh; a value of it
    that is neither a yes nor a no raises :class:`~orchestrator.errors.UsageError`.

    The run's changes are recorded before anything is applied. Nothing is written to ``cwd``
    unless ``apply`` is true and the run succeeded, which it never does when recording its
    changes failed: the run is then recorded failed with the reason (if the store still takes
    that) and the :class:`~orchestrator.errors.StoreError` is raised. The changes stay in the
    run store for :func:`~orchestrator.runs.apply_run`. An apply refused because the changes
    would make a symlink leading outside the workspace raises
    :class:`~orchestrator.errors.SymlinkRefused` once the run is recorded.

    ``cluster`` (``"ray:HOST:PORT"``, ``"auto"``, a :class:`~orchestrator.cluster.ClusterSpec`
    with request rates; default: ``$ORCHESTRATOR_CLUSTER``; ``"local"``: this machine) runs
    every agent turn on a node of that Ray cluster, the rest here (see
    :mod:`orchestrator.cluster`); without ``max_sessions``, as many turns at once as the
    cluster has agent slots. A cluster that cannot be reached raises
    :class:`~orchestrator.errors.ClusterError` before anything is recorded; ``pool``,
    ``connector`` and ``services`` cannot be given with one. A batch gives its child runs its
    cluster session (``_cluster``).

    A batch runs its repositories' runs in one trio run and gives each the same private
    ``_budget`` (a :class:`~orchestrator.pipeline._budget.RunBudget`: its clock starts with
    the first run; once spent, no instance starts) and ``_slots`` (held by each running
    instance in place of the run's own ``max_sessions`` slots); ``_parent`` is the batch's
    run id, recorded as the run's parent.
    """
    check_trio_face("run_pipeline")  # before anything starts
    # the environment's word on directory reuse (a bad value refused before anything starts)
    reuse_dirs = reuse_dirs and reuse_enabled_by_env()
    if _kind == "prompt":  # its caller reads the typed turn, which stays on a node
        if cluster is not None and cluster_spec(cluster) is not None:
            raise UsageError("a prompt runs on this machine, never on a cluster")
        cluster = "local"  # whatever the environment says
    if _cluster is None:
        spec = cluster_spec(cluster)
        if spec is not None:
            args = {k: v for k, v in locals().items() if k in _RUN_PARAMETERS}
            async with open_cluster(spec, budget=_budget) as session:
                return await run_pipeline(**{**args, "cluster": None, "_cluster": session})
    else:
        if pool is not None or connector is not None or services is not None:
            raise UsageError(
                "a run on a cluster starts its agents on the cluster's nodes, with their own "
                "services: no pool, connector or services may be given"
            )
        if max_sessions is None and _settings_restored is None:
            # as many live sessions as the cluster has agent slots
            max_sessions = _cluster.slots
    root = workspace_root(cwd)
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    values = pipe.check_inputs(inputs or {})
    # the agents that run inputs name, from here on as if the file had named them
    pipe = pipe.with_agents(values)
    cfg = config if config is not None else Config.load(root, state_dir=state_dir)
    if _settings_restored is not None:
        cfg = _settings_restored.config(cfg)
    if pool is None and connector is None:
        pipe.check_agents(lambda name: launchable(cfg.resolve_agent(name)))
    else:  # agents come from elsewhere: only their names must resolve
        pipe.check_agents(cfg.resolve_agent)
    # labels for the whole run, before anything starts: relative paths as typed here, like
    # prompt and compare; different agents never share a label
    agents = label_run_agents(pipe, cfg.resolve_agent, base=os.getcwd())
    # the request rates of the cluster's agents, by label (before anything is recorded)
    rate_keys = (
        rate_keys_of(
            _cluster.spec.rates, agents.values(), cfg.resolve_agent, strict=_parent is None
        )
        if _cluster is not None
        else {}
    )
    file_limit = file_size_option(max_file_size)
    settings = _settings(
        pipe,
        agents,
        policy,
        max_sessions,
        file_limit,
        _settings_restored,
        cfg,
        sandbox,
        mcp_servers,
    )
    cfg = settings.config(cfg)
    sessions_mcp = _sessions_mcp_servers(pipe, agents, settings, cfg)
    state = state_directory(state_dir, workspace=root)
    sandboxes = _confinement(pipe, agents, settings, cfg.sandbox, state)
    if sandboxes and services is not None and services.terminal is not None:
        raise UsageError(
            "a confined run starts its terminal commands itself, confined: the services given "
            "must not replace the terminal service"
        )
    # before anything is recorded or started: a kernel that cannot confine refuses the run
    confinement = await trio.to_thread.run_sync(_check_sandboxes, sandboxes)
    await recover(state)
    # opened once, here, before the run is recorded or any agent starts: what is checked is
    # what is written to, and a file that cannot be is a usage error now, not a warning later
    live = open_transcript(transcript, workspace=root, state=state)
    run_id = _resume if _resume is not None else uuid.uuid4().hex[:12]
    run_dir = state / "runs" / run_id
    # one process per run: a resume of a run still running elsewhere is refused before the
    # record is touched (the lock goes with the process: a crashed run's is free)
    record_transcripts = record_transcripts or transcript is not None
    limit = settings.max_sessions
    with (
        closing(live) if live is not None else nullcontext(),
        hold_run_lock(run_dir, run_id, doing="resume"),
    ):
        async with open_run_store(state) as store:
            reused: dict[str, tuple[StepRecord, Branch]] = {}
            continued: dict[str, tuple[StepRecord, Branch]] = {}
            try:
                snapshot = await trio.to_thread.run_sync(Workspace.open(root).snapshot)
            except PathRefused as e:
                if _resume is None:  # nothing of the new run is left behind
                    await trio.to_thread.run_sync(remove_tree, str(run_dir))
                raise UsageError(f"workspace {root}: {e}") from e
            if _resume is None:
                record = RunRecord(
                    run_id=run_id,
                    kind=_kind,
                    status="running",
                    created=time.time(),
                    cwd=str(root),
                    pipeline=pipe.path,
                    pipeline_digest=pipe.digest,
                    inputs=_json_inputs(values),
                    options={
                        "graph": pipe.to_json(),
                        "policy": settings.policy_source,
                        "verify": dict(verify or {}),
                        "maxSessions": limit,
                        "settings": settings.to_json(),
                        "sandbox": confinement,
                        "mcpServers": _mcp_json(sessions_mcp),
                        **({"cluster": _cluster.spec.address} if _cluster is not None else {}),
                        **dict(_extra_options or {}),
                    },
                    parent=_parent,
                )
                await store.create_run(record, pipeline_source=pipe.source)
            else:
                if (await store.get_run(run_id)).status == "running":
                    # its lock was free: the process that ran it is gone (killed, crashed)
                    log.warning("the run's process is gone; resuming it", run=run_id)
                # what an earlier attempt left in the run directory is nobody's now (the lock is
                # ours): branch directories of a killed process would block the steps' new ones;
                # moved into the trash, which the runner deletes in the background
                await trio.to_thread.run_sync(_trash_branches, run_dir)
                reused = await _reusable(store, run_id, snapshot)
                continued = await _continued(store, run_id, snapshot)
                recorded = dict((await store.get_run(run_id)).options)
                # what confines this attempt, and what a later resume keeps
                recorded["sandbox"] = confinement
                recorded["mcpServers"] = _mcp_json(sessions_mcp)
                # this attempt's policy, and when it began: the instances recorded before
                # were decided by the earlier attempts' (see count_default_rejections)
                recorded["attempt"] = {"started": time.time(), "policy": settings.policy_source}
                recorded["settings"] = {
                    **dict(recorded.get("settings") or {}),
                    "sandbox": settings.to_json()["sandbox"],
                    "mcpServers": settings.to_json()["mcpServers"],
                }
                await store.update_run(
                    run_id, status="running", finished=None, error=None, options=recorded
                )
                # this attempt merges again what it reaches, reused branches too, and records
                # the conflicts as they stand now (the merge strategy may have changed since)
                await store.clear_conflicts(run_id)
            # the copies left by runs that were killed are deleted by this one, in the background
            await trio.to_thread.run_sync(move_leftovers, state / "runs", run_dir / TRASH)
            log.info("run started", run=run_id, pipeline=pipe.name, steps=len(pipe.steps))
            started = time.monotonic()
            status: RunStatus = "interrupted"
            unapplied: tuple[str, ...] = ()
            refused: ApplyRefused | None = None
            left_out: tuple[str, ...] = ()
            crash: Exception | None = None
            imported = False
            try:
                async with (
                    _live_copy(live) as copy,
                    open_store_writer(store) as writer,
                    open_supervisor(
                        Limits(
                            max_sessions=limit,
                            max_turn_transcript_bytes=settings.max_turn_record_bytes,
                        ),
                        connector=connector,
                        options=settings.client_options(options),
                        transcripts=run_dir / "transcripts" if record_transcripts else None,
                        transcript_copy=copy,
                        workdir=run_dir,
                    ) as supervisor,
                    _hosted(
                        _cluster,
                        RunHostConfig(
                            run_id=run_id,
                            options=settings.client_options(options),
                            max_turn_transcript_bytes=settings.max_turn_record_bytes,
                            max_file_size=settings.max_file_size,
                            on_spent=_budget.on_spent if _budget is not None else None,
                            reuse_dirs=reuse_dirs,
                        ),
                        run_dir / "transcripts" if record_transcripts else None,
                        copy,
                        rate_keys,
                    ) as remote,
                ):
                    runner = PipelineRunner(
                        pipeline=pipe,
                        inputs=values,
                        run_id=run_id,
                        workspace=root,
                        snapshot=snapshot,
                        writer=writer,
                        pool=pool or supervisor,
                        resolve_agent=cfg.resolve_agent,
                        run_dir=run_dir,
                        policy=settings.policy,
                        load_policy=settings.load_policy,
                        escalate=escalate,
                        on_event=on_event,
                        on_update=on_update,
                        services=services,
                        verify=dict(verify or {}),
                        reused=reused,
                        continued=continued,
                        parallel=limit,
                        agents=agents,
                        sandboxes=sandboxes,
                        mcp_servers=sessions_mcp,
                        max_file_size=settings.max_file_size,
                        max_turn_record_bytes=settings.max_turn_record_bytes,
                        reuse_dirs=reuse_dirs,
                        budget=_budget,
                        slots=_slots,
                        remote=remote,
                    )
                    if _budget is not None:
                        _budget.start()  # the first run that shares it starts its clock
                    await runner.emit(
                        RunEvent("run_started", run_id, data={"pipeline": pipe.name, "kind": _kind})
                    )
                    await runner.run()
                # the run's record is whole, its transcripts too, before anything is applied
                with trio.CancelScope(shield=True):
                    imported = True
                    await _import_transcripts(store, run_id, run_dir)
                if apply and _apply_gate is not None and not _apply_gate():
                    apply = False  # the caller's last word (a replay that diverged)
                status, unapplied, left_out, refused = await _conclude(
                    store, runner, _kind, apply, state
                )
            except Exception as e:
                crash = e  # not an interruption: recorded as a failure with its error
                raise
            finally:
                with trio.CancelScope(shield=True):
                    if status == "interrupted":
                        await store.mark_interrupted(run_id)
                        if crash is not None:
                            error = f"{type(crash).__name__}: {crash}"
                            await store.update_run(run_id, status="failed", error=error)
                            log.error("run failed", run=run_id, error=error)
                        else:
                            # debug: the caller hears of it (Cancelled; the command line's
                            # last line says how to resume)
                            log.debug("run interrupted", run=run_id)
                    if not imported:
                        await _import_transcripts(store, run_id, run_dir)
            # past the point of no return (see _conclude): the outcome is the caller's, however
            # late a cancel comes; the object get_run_json gives back from the record, once kept
            # there (below)
            with trio.CancelScope(shield=True):
                rebuilt = await rebuild_run_json(run_id, store=store)
            result = finished_run_json(
                rebuilt,
                wall_seconds=time.monotonic() - started,
                reused=reused,
                workspace_changed=unapplied,
                patch_left_out=left_out,
                branches=runner.branch_costs.to_json(),
            )
            nothing, warnings = bool(result["didNothing"]), tuple(result["warnings"])
            outcome = RunOutcome(
                run_id,
                status,
                result,
                str(run_dir),
                unapplied,
                did_nothing=nothing,
                warnings=warnings,
                apply_asked=apply,
                values={
                    name: s.value() for name, s in runner.states.items() if s.status == "succeeded"
                },
                outcomes={name: dict(s.last) for name, s in runner.states.items()},
            )
            if _finish_result is not None:
                outcome = attrs.evolve(outcome, result=_finish_result(outcome))
            with trio.CancelScope(shield=True):
                await store.update_run(run_id, result=dict(outcome.result))
            notify(on_event, RunEvent("run_finished", run_id, data={"status": status}))
            if refused is not None:
                # the run is recorded (its changes too); the apply was refused or undone
                raise refused
            return outcome


#: the parameters of run_pipeline, passed on as they are when it opens a cluster
_RUN_PARAMETERS = frozenset(inspect.signature(run_pipeline).parameters)


async def _conclude(
    store: RunStore, runner: PipelineRunner, kind: str, apply: bool, state: Path
) -> tuple[RunStatus, tuple[str, ...], tuple[str, ...], ApplyRefused | None]:
    """Merge the sinks, record the run's final changes, apply them when asked.

    Returns the status; when the apply found files changed in the workspace during the run,
    those files (the run still succeeded; its changes stay recorded, to apply later); the
    changed files that ``changes.patch`` leaves out (their base content is gone); and the
    refusal of an apply (symlinks the workspace cannot take, or a write that failed and was
    undone), raised once the run is recorded.
    """
    states = runner.states
    failed = [s for s in states.values() if s.status == "failed"]
    conflicted = [s for s in failed if s.error_kind == "conflict"]
    status: RunStatus = "succeeded"
    if failed:
        status = "conflicts" if len(conflicted) == len(failed) else "failed"
    if kind == "compare":
        # a comparison exists to pick one: its status is its verdict's (runs/verdict.py)
        status = (await compare_verdict(runner.run_id, store=store)).status
    final: Branch | None = None
    left_out: tuple[str, ...] = ()
    if kind != "compare":  # a comparison's branches are alternatives, never merged
        sinks = [b for name in runner.pipeline.sinks() for b in states[name].branches]
        if len(sinks) == 1:
            final = sinks[0]
        elif sinks:
            merged = await trio.to_thread.run_sync(lambda: merge_branches(sinks, strategy="fail"))
            runner.base_gone.update(merged.base_gone)
            if merged.conflicts:
                await store.add_conflicts(
                    runner.run_id,
                    FINAL,
                    [conflict_json(FINAL, c, "fail") for c in merged.conflicts],
                )
                if status == "succeeded":
                    status = "conflicts"
            final = merged.fork(FINAL, allow_conflicts=True)
    if final is not None:
        net = final.net_changes()
        # recorded before anything is applied: the apply reads them from the store, and a run
        # whose changes could not be recorded fails (raised: recorded as failed with it)
        stored = stored_changes(runner.snapshot, net)
        # the files it changed that the workspace changed too, before or after the run kept
        # them: named in the outcome whether or not it applies (an apply would refuse them)
        runner.base_gone.update(
            await trio.to_thread.run_sync(workspace_moved, str(runner.workspace), stored)
        )
        try:
            await store.put_changes(runner.run_id, FINAL, stored, diff=diff_of(final, net))
        except StoreError as e:
            raise StoreError(f"recording the run's changes failed: {e}") from e
        left_out = tuple(await trio.to_thread.run_sync(lambda: patch_left_out(final.root, net)))
        patch = await trio.to_thread.run_sync(lambda: patch_of(final.root, net))
        await trio.to_thread.run_sync((runner.run_dir / "changes.patch").write_bytes, patch)
    # the point of no return: a cancel that comes before it interrupts the run (nothing
    # recorded final, nothing applied); past it, recording the status and the apply asked for
    # go through together, and the caller gets the run's outcome (a cancel is then too late)
    await trio.lowlevel.checkpoint_if_cancelled()
    with trio.CancelScope(shield=True):
        await store.update_run(runner.run_id, status=status, finished=time.time())
        # files both the run and the workspace changed, found by its merges: named as an
        # apply would name them (the outcome says so; the run is not refused for it)
        moved = tuple(sorted(runner.base_gone))
        if not (apply and status == "succeeded"):
            return status, moved, left_out, None
        try:
            outcome = await apply_recorded(store, runner.run_id, state=state)
        except AlreadyApplied as e:  # a resume of a run applied before
            log.warning("not applied again", run=runner.run_id, reason=str(e))
            return status, moved, left_out, None
        except ApplyRefused as e:  # symlinks it cannot take, a write that failed (undone)
            return status, moved, left_out, e
    if outcome.workspace_changed:
        log.warning(
            "nothing applied: paths the run changed cannot take its changes",
            files=display_names(outcome.workspace_changed),
        )
    return status, tuple(sorted({*moved, *outcome.workspace_changed})), left_out, None


async def _reusable(
    store: RunStore, run_id: str, snapshot: Snapshot
) -> dict[str, tuple[StepRecord, Branch]]:
    """The instances of ``run_id`` that succeeded, with their branches rebuilt."""
    out: dict[str, tuple[StepRecord, Branch]] = {}
    for record in await store.steps(run_id):
        if record.status != "succeeded" or record.key == FINAL:
            continue
        if record.result is None and not record.value_stored:
            continue  # a value that could not be stored: the step runs again
        changes = await store.changes(run_id, record.key)
        branch = rebuild_branch(snapshot, record.key, changes)
        branch.close()
        out[record.key] = (record, branch)
    return out


async def _continued(
    store: RunStore, run_id: str, snapshot: Snapshot
) -> dict[str, tuple[StepRecord, Branch]]:
    """The instances of ``run_id`` that failed their check in every round, with their branches
    rebuilt: a resume starts a new loop of rounds on each (see ``_instance``)."""
    out: dict[str, tuple[StepRecord, Branch]] = {}
    for record in await store.steps(run_id):
        result = record.result
        if record.status != "failed" or record.error_kind != "check" or result is None:
            continue
        if not result.get("rounds"):
            continue
        changes = await store.changes(run_id, record.key)
        branch = rebuild_branch(snapshot, record.key, changes)
        branch.close()
        out[record.key] = (record, branch)
    return out


def _trash_branches(run_dir: Path) -> None:
    """Move the branch directories of an earlier attempt of the run into its trash."""
    branches, trash = run_dir / "branches", run_dir / TRASH
    if branches.is_dir():
        trash.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(branches, trash / f"branches.{uuid.uuid4().hex[:8]}")
        except OSError:
            remove_tree(str(branches))


@asynccontextmanager
async def _hosted(
    session: ClusterSession | None,
    config: RunHostConfig,
    transcripts: Path | None,
    copy: TranscriptFile | None,
    rate_keys: Mapping[str, str],
) -> AsyncIterator[ClusterTurns | None]:
    """The run's turns on the cluster's nodes for the block (None: in this process)."""
    if session is None:
        yield None
        return
    async with session.open_run(config, transcripts, copy) as turns:
        turns.rate_keys = dict(rate_keys)
        yield turns


async def _import_transcripts(store: RunStore, run_id: str, run_dir: Path) -> None:
    """Move the per-process wire transcripts into the store."""
    directory = run_dir / "transcripts"
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    for path in files:
        data = await trio.to_thread.run_sync(path.read_bytes)
        # whole: the store splits it into lines in its own thread
        await store.add_transcript(run_id, path.stem, [data])
    await trio.to_thread.run_sync(remove_tree, str(directory))


@asynccontextmanager
async def _live_copy(out: TranscriptFile | None) -> AsyncIterator[TranscriptFile | None]:
    """The ``transcript`` file every process's transcript lines are appended to as they come
    (None without one), written on time for the block. A file that fails later (disk full) is
    reported once and the run goes on: the store keeps the transcripts all the same."""
    if out is None:
        yield None
        return
    async with flushing_transcript_file(out) as copy:
        yield copy


def open_transcript(
    path: str | os.PathLike[str] | None, *, workspace: Path, state: Path
) -> TranscriptFile | None:
    """The ``transcript`` file, opened for appending (None without one), or a usage error.

    It may not be in the workspace (its lines would become part of what the run copies and
    changes) nor in the state directory (the run store's own files), symlinks resolved. It is
    opened without waiting: a FIFO no process reads fails at once instead of blocking the
    run; one that is read (``>(cat)``) is written to like a file.
    """
    if path is None:
        return None
    shown = os.fspath(path)
    if not shown:
        raise UsageError("transcript: the path is empty")
    for root, what in ((workspace, "the workspace"), (state, "the state directory")):
        if resolves_inside(shown, root):
            raise UsageError(
                f"transcript {shown}: it is inside {what} {root}; choose a file outside it"
            )
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(shown, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise UsageError(f"transcript {shown}: no process is reading the FIFO") from e
        if e.errno == errno.ENOENT:  # a missing directory, or a link to nowhere
            raise UsageError(f"transcript {shown}: where it leads does not exist") from e
        raise UsageError(f"transcript {shown}: {e.strerror or e}") from e
    # writes wait for a slow reader like they do for a slow disk (the buffer is bounded)
    os.set_blocking(fd, True)
    return TranscriptFile(shown, append=True, fd=fd)


def _json_inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    import orjson

    try:
        return dict(orjson.loads(orjson.dumps(dict(values))))
    except TypeError:
        return {k: repr(v) for k, v in values.items()}
