"""Resume: a recorded run again, finished instances reused with their branches."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import trio
from attrs import field, frozen

from .._log import get_logger
from ..agent.client import ClientOptions
from ..agent.permissions import Escalate
from ..agent.services import ClientServices
from ..agents import AgentSpec
from ..cluster._connect import ClusterSpec
from ..cluster._driver import ClusterSession
from ..config import Config
from ..errors import ResumeConflict, UsageError
from ..mcp import McpServer
from ..pipeline import Pipeline, load_pipeline
from ..pipeline._budget import RunBudget
from ..pipeline.branches import FINAL
from ..pipeline.results import RunEvent
from ..pipeline.runner import AgentPool
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import SandboxChoice
from ..state import state_directory
from ..store import ApplyRecord, RunRecord, open_run_store
from ..supervisor import Connector
from ._face import check_trio_face
from .apply import _when, workspace_applies
from .compare import _compare_config, _compare_pipeline
from .prompt import prompt_pipeline, prompt_result
from .run import RunOutcome, run_pipeline
from .settings import Restored, file_size_option, restore_settings

log = get_logger(__name__)

__all__ = ["RebuiltRun", "RecordedRun", "rebuild_run", "resume_run"]

RunKind = Literal["prompt", "pipeline", "compare"]


@frozen
class RecordedRun:
    """What rebuilding a recorded run needs of its record: the run store's
    (:meth:`of`), or a replay record's ``run`` (:meth:`from_json`)."""

    run_id: str
    #: prompt, pipeline or compare
    kind: str
    #: the workspace it ran on
    cwd: str
    #: the pipeline file, for a pipeline run (None: built in code)
    pipeline: str | None = None
    pipeline_digest: str | None = None
    #: the pipeline file's text as the run loaded it (None: not recorded)
    pipeline_source: str | None = None
    inputs: Mapping[str, Any] = field(factory=dict)
    #: the options recorded with the run (its settings, verify commands, prompt, compare)
    options: Mapping[str, Any] = field(factory=dict)

    @classmethod
    def of(cls, record: RunRecord, *, source: str | None = None) -> RecordedRun:
        """The run store's ``record`` (``source``: its pipeline's text, when read)."""
        return cls(
            record.run_id,
            record.kind,
            record.cwd,
            record.pipeline,
            record.pipeline_digest,
            source,
            dict(record.inputs),
            dict(record.options),
        )

    @classmethod
    def from_json(cls, run: Mapping[str, Any]) -> RecordedRun:
        """A replay record's ``run`` object (runId, kind, cwd, pipeline, ...)."""

        def text(key: str) -> str | None:
            value = run.get(key)
            return value if isinstance(value, str) else None

        inputs, options = run.get("inputs"), run.get("options")
        return cls(
            str(run.get("runId") or ""),
            str(run.get("kind") or ""),
            str(run.get("cwd") or ""),
            text("pipeline"),
            text("pipelineDigest"),
            text("pipelineSource"),
            dict(inputs) if isinstance(inputs, Mapping) else {},
            dict(options) if isinstance(options, Mapping) else {},
        )


@frozen
class RebuiltRun:
    """A recorded run made ready to run again (by :func:`rebuild_run`)."""

    #: the pipeline to run: the recorded one (or the one given), a prompt's or comparison's
    #: one-step pipeline rebuilt from its recorded options
    pipeline: Pipeline
    #: the kind the new run is recorded as
    kind: RunKind
    #: the config the run starts from (its recorded settings are in :attr:`restored`)
    config: Config
    #: the recorded settings, with what the caller's options replaced
    restored: Restored
    #: the verify commands: the ones given, else the recorded ones
    verify: dict[str, str]
    #: a prompt's agent (its result reads like a prompt's again); None for other runs
    prompt_agent: AgentSpec | None = None


def load_recorded_file(recorded: RecordedRun) -> Pipeline:
    """The recorded pipeline file as it is now (what a resume runs by default)."""
    return load_pipeline(str(recorded.pipeline))


async def rebuild_run(
    recorded: RecordedRun,
    *,
    state: Path,
    doing: str,
    config: Config | None = None,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    max_sessions: int | None = None,
    max_file_size: int | str | None = None,
    sandbox: SandboxChoice = None,
    mcp_servers: Sequence[McpServer | str] | None = None,
    pipeline: Pipeline | str | os.PathLike[str] | None = None,
    verify: Mapping[str, str] | None = None,
    apply: bool = False,
    load_recorded: Callable[[RecordedRun], Pipeline] = load_recorded_file,
) -> RebuiltRun:
    """The pipeline, kind, config and settings to run ``recorded`` again with: the one path
    :func:`resume_run` and :func:`~orchestrator.runs.replay.replay_run` share.

    Its recorded settings are restored (``policy``, ``max_sessions``, ``max_file_size``,
    ``sandbox`` and ``mcp_servers`` replace theirs, see
    :func:`~orchestrator.runs.settings.restore_settings`). A comparison and a prompt get their
    one-step pipeline back from their recorded options; a pipeline run gets ``pipeline`` if
    given, else ``load_recorded(recorded)`` (a resume: the recorded file as it is now).
    ``doing`` (``resume``, ``replay``) is the verb of the errors: a comparison cannot be asked
    to apply (its agents' branches are alternatives), and a pipeline built in code must be
    given again.
    """
    base = (
        config
        if config is not None
        else await trio.to_thread.run_sync(
            functools.partial(Config.load, recorded.cwd, state_dir=state)
        )
    )
    options = dict(recorded.options)
    restored = restore_settings(
        options.get("settings"),
        base,
        policy=policy,
        max_sessions=max_sessions,
        max_file_size=file_size_option(max_file_size),
        sandbox=sandbox,
        mcp_servers=(
            None if mcp_servers is None else [base.mcp_server(item) for item in mcp_servers]
        ),
    )
    spec: AgentSpec | None = None  # a prompt's agent
    kind: RunKind = "pipeline"
    if recorded.kind == "compare":
        kind = "compare"
        info = options.get("compare") or {}
        names = list(info.get("agents") or [])
        if apply:
            # the agents' branches are alternatives: which one to apply is a choice
            choices = ", ".join(f"compare[{name}]" for name in names)
            raise UsageError(
                f"run {recorded.run_id} is a comparison: {doing} it without applying, then "
                f"apply one agent's changes ({choices})"
            )
        # with rounds, the verify command (as recorded, or the one given) checks each round:
        # an agent that failed them all starts a new loop on its branch, as a step would
        checked = (verify if verify is not None else options.get("verify") or {}).get("compare")
        pipe = _compare_pipeline(
            str(info.get("task", "")),
            names,
            info.get("timeout"),
            info.get("idle_timeout"),
            info.get("model"),
            info.get("mode"),
            checked,
            int(info.get("rounds") or 1) if checked else 1,
        )
        if "settings" not in options:  # recorded before settings were kept
            base = _compare_config(recorded.cwd, names, info.get("commands") or {}, state_dir=state)
    elif recorded.kind == "prompt":
        kind = "prompt"
        info = options.get("prompt") or {}
        if not info.get("agent"):
            raise UsageError(f"run {recorded.run_id} does not record its agent")
        agent = str(info["agent"])
        pipe = prompt_pipeline(
            agent, info.get("timeout"), info.get("idleTimeout"), info.get("model"), info.get("mode")
        )
        spec = restored.settings.agents.get(agent) or base.resolve_agent(agent)
    elif recorded.kind == "pipeline":
        if pipeline is None and not recorded.pipeline and not recorded.pipeline_source:
            raise UsageError(
                f"run {recorded.run_id} ran a pipeline built in code, which no file holds: "
                f"give that pipeline to {doing} it"
            )
        if isinstance(pipeline, Pipeline):
            pipe = pipeline
        elif pipeline is not None:
            pipe = load_pipeline(pipeline)
        else:
            pipe = load_recorded(recorded)
        if pipe.digest != recorded.pipeline_digest:
            log.warning("the pipeline changed since the run", pipeline=pipe.path or pipe.name)
    else:  # a batch, or a record of no known kind
        raise UsageError(
            f"run {recorded.run_id} is of kind {recorded.kind or 'unknown'}: only a prompt, a "
            f"pipeline run or a comparison can be given to {doing}"
        )
    if verify is None:  # the verify commands the run was started with
        verify = dict(options.get("verify") or {})
    return RebuiltRun(pipe, kind, base, restored, dict(verify), spec)


async def resume_run(
    run_id: str,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    max_sessions: int | None = None,
    max_file_size: int | str | None = None,
    config: Config | None = None,
    sandbox: SandboxChoice = None,
    pipeline: Pipeline | str | os.PathLike[str] | None = None,
    escalate: Escalate | None = None,
    apply: bool = False,
    on_event: Callable[[RunEvent], None] | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    transcript: str | os.PathLike[str] | None = None,
    connector: Connector | None = None,
    pool: AgentPool | None = None,
    verify: Mapping[str, str] | None = None,
    options: ClientOptions | None = None,
    services: ClientServices | None = None,
    record_transcripts: bool | None = None,
    mcp_servers: Sequence[McpServer | str] | None = None,
    _budget: RunBudget | None = None,
    _slots: trio.Semaphore | None = None,
    cluster: str | ClusterSpec | None = None,
    _cluster: ClusterSession | None = None,
) -> RunOutcome:
    """Run ``run_id`` again: finished instances are reused with their branches, the rest re-run.

    The run goes on as it was started: its recorded policy (rules, not a name to look up
    again), session limit and agent table are restored (secret environment values are read
    again from the config or the environment). ``policy``, ``max_sessions`` and
    ``max_file_size`` replace the recorded ones; the result's ``restored`` says what was
    restored and what was replaced. A run that was confined (``sandbox``) stays confined;
    ``sandbox`` confines one that was not, or gives it other rules. The run's MCP servers are
    kept, a redacted environment value read again from the environment; a secret that cannot
    be read again (a header, a URL's credentials or query, a variable not set) is left out of
    this attempt, named in a warning (logged, and in the result's ``warnings`` and
    ``restored.missingSecrets``), and kept in the record for a later resume;
    ``mcp_servers`` replaces them.
    Refused (:class:`~orchestrator.errors.ResumeConflict`) if the workspace changed since in
    files the finished steps changed, and (:class:`~orchestrator.errors.UsageError`) for a run
    that succeeded and whose changes were applied to the workspace: nothing is left to run.
    ``apply=True`` applies the run's final changes at its end (not for a comparison: apply
    one agent's afterwards).

    A pipeline run is resumed from its recorded file; ``pipeline`` gives it instead (a file,
    or the :class:`~orchestrator.pipeline.Pipeline` a program built in code, which has no
    file to read again). ``verify`` replaces the recorded verify commands;
    ``record_transcripts=False`` declines keeping this attempt's wire transcripts (kept by
    default, as every run's are: a replay plays them). ``cluster`` runs this attempt on a
    cluster, whatever the first one ran on.
    The other keyword arguments are :func:`~orchestrator.runs.run_pipeline`'s.
    """
    check_trio_face("resume_run")  # before anything starts
    state = state_directory(state_dir)
    async with open_run_store(state) as store:
        record = await store.get_run(run_id)
        applies = await store.applies(record.run_id)
    applied = _applied_whole(record, applies)
    if applied is not None:
        # the workspace holds the run's changes now: a resume would take them for edits of
        # the files it changed, and there is nothing left to run
        raise UsageError(
            f"run {record.run_id} succeeded and its changes were applied to the workspace at "
            f"{_when(applied)}: there is nothing to resume"
        )
    if record.kind == "batch":
        raise UsageError(
            f"run {record.run_id} is a batch: resume_batch resumes it (the repositories that "
            "did not succeed)"
        )
    replayed = dict(record.options).get("replay")
    if isinstance(replayed, Mapping):
        # a resume would start the real agents where the replay played them back
        raise UsageError(
            f"run {record.run_id} is a replay of run {replayed.get('of')}: replay that run "
            "again instead of resuming this one"
        )
    rebuilt = await rebuild_run(
        RecordedRun.of(record),
        state=state,
        doing="resume",
        config=config,
        policy=policy,
        max_sessions=max_sessions,
        max_file_size=max_file_size,
        sandbox=sandbox,
        mcp_servers=mcp_servers,
        pipeline=pipeline,
        verify=verify,
        apply=apply,
    )
    restored, spec, base = rebuilt.restored, rebuilt.prompt_agent, rebuilt.config
    if record_transcripts is None:
        # every run keeps its wire transcripts (what a replay of it plays)
        record_transcripts = True
    said = restored.to_json()
    started = time.monotonic()

    def finish(outcome: RunOutcome) -> Mapping[str, Any]:
        result = dict(outcome.result)
        if spec is not None:  # a prompt reads like a prompt again
            result = prompt_result(outcome, spec, time.monotonic() - started)
        if restored.warning is not None:  # the attempt ran without some of the run's secrets
            result["warnings"] = [*result.get("warnings", ()), restored.warning]
        return {**result, "restored": said}

    if restored.restored or restored.overridden:
        log.info("resume settings", **said)
    try:
        return await run_pipeline(
            rebuilt.pipeline,
            dict(record.inputs),
            cwd=record.cwd,
            state_dir=state,
            config=base,
            _kind=rebuilt.kind,
            _resume=record.run_id,
            _settings_restored=restored.settings,
            _finish_result=finish,
            escalate=escalate,
            apply=apply,
            on_event=on_event,
            on_update=on_update,
            transcript=transcript,
            connector=connector,
            pool=pool,
            verify=rebuilt.verify,
            options=options,
            services=services,
            record_transcripts=record_transcripts,
            _budget=_budget,
            _slots=_slots,
            cluster=cluster,
            _cluster=_cluster,
        )
    except ResumeConflict as e:
        raise ResumeConflict(e.paths, record.run_id) from None


def _applied_whole(record: RunRecord, applies: Sequence[ApplyRecord]) -> float | None:
    """When the final changes of ``record``, a succeeded run, were written to its workspace
    (not to a git branch); None if they were not (or it did not succeed, or it is a
    comparison, whose agents are applied one by one)."""
    if record.status != "succeeded" or record.kind in ("compare", "batch"):
        return None
    for a in workspace_applies(record, applies):
        # keys not recorded: the whole run's (a step applied alone names its keys)
        if a.keys is None or FINAL in a.keys:
            return a.at
    return None
