"""Replay: a recorded run again, offline, every agent served by a replay agent playing its record.

:func:`replay_run` runs a recorded run (a run id, a replay record file, or a
:class:`~orchestrator.replay.ReplayRecord`) as a NEW run, recorded and reported like any other:
its pipeline (as recorded, or the file given as it is now), its inputs and settings (the policy
replaced when one is given), on its workspace. No agent of the record is started: each is
served by the replay agent (``python -m orchestrator.replay``, see
:mod:`orchestrator.replay.agent`), which answers as the recorded agent did and re-issues its
requests (file reads and writes, terminal commands, permission requests) against the new run's
branches, so the policy, the Python steps and the merges run for real. What differs from the
record comes back per step in the result's ``replay`` object.

:class:`ReplayAgents` is the connector that serves them: as real subprocesses (what
:func:`replay_run` uses), or in this process (``in_process=True``, what tests use through
:func:`orchestrator.testing.replay_connector`).
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import sys
import tempfile
import time
import tokenize
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson
import trio
from attrs import define, field

from .._log import get_logger
from ..agent.client import AgentConnection, open_agent
from ..agent.permissions import Escalate
from ..agents import AgentSpec
from ..config import Config
from ..errors import AgentStartError, UsageError
from ..pipeline import Pipeline, load_pipeline
from ..pipeline.results import RunEvent
from ..policy import PolicySet
from ..protocol import types as t
from ..replay._divergence import Divergence
from ..replay.record import ReplayRecord, load_record
from ..state import state_directory
from ._face import check_trio_face
from .prompt import prompt_result
from .resume import RecordedRun, rebuild_run
from .run import RunOutcome, run_pipeline

if TYPE_CHECKING:
    from ..supervisor import ConnectArgs

__all__ = [
    "RECORD_FILE",
    "ReplayAgents",
    "Timing",
    "load_replay_record",
    "names_a_file",
    "replay_run",
]

log = get_logger(__name__)

#: how the replay agent paces the recorded frames: at once, or at their recorded offsets
Timing = Literal["fast", "recorded"]

#: the replay record a replay run played, kept in its run directory
RECORD_FILE = "replay-record.json"


async def load_replay_record(
    run: str | os.PathLike[str] | ReplayRecord,
    *,
    state_dir: str | os.PathLike[str] | None = None,
) -> ReplayRecord:
    """``run`` as a replay record: itself, the record file it names, else the record of the
    run of that id (or unique prefix) in the run store.

    The one rule of what names a file (``python -m orchestrator.replay`` follows it too): a
    path object, an existing file, or a name a run id never is: one holding a path separator
    or ending in a record or transcript suffix. A file that is not there is said as such
    (:class:`~orchestrator.errors.UsageError`), never looked up as a run.
    """
    if isinstance(run, ReplayRecord):
        return run
    name = os.fspath(run)
    if not name:
        raise UsageError("replay: no run given (a run id or a replay record file)")
    if not isinstance(run, str) or names_a_file(name):
        return await trio.to_thread.run_sync(load_record, name)
    from .replay_record import replay_record

    return await replay_record(name, state_dir=state_dir)


#: what a record or transcript file's name ends in (a run id never does)
_FILE_SUFFIXES = (".json", ".jsonl", ".ndjson")


def names_a_file(name: str) -> bool:
    """Whether ``name`` given as a replay's source names a file rather than a run id."""
    separators = [os.sep] + ([os.altsep] if os.altsep else [])
    return (
        any(sep in name for sep in separators)
        or name.endswith(_FILE_SUFFIXES)
        or os.path.isfile(name)
    )


@define(eq=False)
class ReplayAgents:
    """A supervisor connector that serves every agent of a run from ``record``: the replay
    agent of the agent's label (its name in the run), never the agent itself.

    Every session it opens names its step instance (``ClientOptions.step_meta``), so that each
    gets the recorded session of that step and attempt. An agent the record does not hold
    cannot be started (:class:`~orchestrator.errors.AgentStartError`, its step fails).
    ``in_process`` serves them on in-memory streams in this process; else each is a real
    subprocess (``python -m orchestrator.replay``), confined like the agent it stands for
    when the run confines its agents. What each found different from the record is in
    :attr:`divergences` once its process ended (its JSON form, :meth:`Divergence.to_json`).
    """

    record: ReplayRecord
    #: stop a turn at its first divergence (its prompt is answered with an error)
    strict: bool = False
    timing: Timing = "fast"
    #: serve the agents in this process (no subprocess); they cannot be confined
    in_process: bool = False
    #: every divergence reported so far, as JSON objects, in the order reported
    divergences: list[dict[str, Any]] = field(factory=list)
    #: how many replay agents were started
    started: int = 0
    _workdir: Path | None = field(default=None, init=False)
    _record_file: Path | None = field(default=None, init=False)
    _numbers: Iterator[int] = field(factory=lambda: itertools.count(1), init=False)
    _lock: trio.Lock = field(factory=trio.Lock, init=False)

    def __call__(
        self, spec: AgentSpec, args: ConnectArgs
    ) -> AbstractAsyncContextManager[AgentConnection]:
        """Start the replay agent of ``spec`` (the supervisor's connector protocol)."""
        return self._connect(spec, args)

    def close(self) -> None:
        """Delete the files the subprocesses were given (the record, the divergence files)."""
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = self._record_file = None

    @asynccontextmanager
    async def _connect(self, spec: AgentSpec, args: ConnectArgs) -> AsyncIterator[AgentConnection]:
        label = spec.name
        if label not in self.record.agents:
            if args.transcript is not None:
                args.transcript.close()
            known = ", ".join(sorted(self.record.agents)) or "none"
            message = (
                f"agent {label} is not in the replay record of run {self.record.run_id or '?'}"
                f" (recorded agents: {known})"
            )
            # a step the record cannot serve: never passed off as replayed
            self.divergences.append(Divergence(None, 1, 0, "not-replayable", message).to_json())
            raise AgentStartError(message, agent=label)
        # the replay agent picks each session's record by the step instance it serves
        args = attrs.evolve(args, options=attrs.evolve(args.options, step_meta=True))
        self.started += 1
        if self.in_process:
            async with self._in_memory(label, args) as conn:
                yield conn
            return
        record_file, workdir = await self._files()
        heard = workdir / f"divergences-{next(self._numbers)}.jsonl"
        argv = [sys.executable, "-m", "orchestrator.replay", str(record_file), "--agent", label]
        argv += ["--divergences", str(heard), "--timing", self.timing]
        if self.strict:
            argv.append("--strict")
        sandbox = args.sandbox
        if sandbox is not None:
            # confined as the agent it stands for, and able to read its record and report
            sandbox = attrs.evolve(
                sandbox, read=(*sandbox.read, str(workdir)), write=(*sandbox.write, str(workdir))
            )
        try:
            async with open_agent(
                argv,
                name=args.label,
                cwd=args.cwd,
                services=args.services,
                options=args.options,
                transcript=args.transcript,
                sandbox=sandbox,
            ) as conn:
                yield conn
        finally:
            # the process is gone: what it reported is whole
            with trio.CancelScope(shield=True):
                found = await trio.to_thread.run_sync(_read_divergences, heard)
            self.divergences.extend(found)

    @asynccontextmanager
    async def _in_memory(self, label: str, args: ConnectArgs) -> AsyncIterator[AgentConnection]:
        from ..replay.agent import serve_replay_agent
        from ..testing.connector import _serve_in_memory

        def heard(divergence: Divergence) -> None:
            self.divergences.append(divergence.to_json())

        async def serve(stream: trio.abc.Stream) -> None:
            await serve_replay_agent(
                stream,
                self.record,
                label,
                strict=self.strict,
                timing=self.timing,
                divergences=heard,
            )

        async with _serve_in_memory(serve, args) as conn:
            yield conn

    async def _files(self) -> tuple[Path, Path]:
        """The record file the subprocesses read and the directory they report into, written
        once (every agent of the run plays the same record)."""
        async with self._lock:
            if self._record_file is None or self._workdir is None:
                workdir = Path(
                    await trio.to_thread.run_sync(
                        lambda: tempfile.mkdtemp(prefix="orchestrator-replay-")
                    )
                )
                record_file = workdir / RECORD_FILE
                await trio.to_thread.run_sync(self.record.dump, record_file)
                self._workdir, self._record_file = workdir, record_file
            return self._record_file, self._workdir


def _read_divergences(path: Path) -> list[dict[str, Any]]:
    """The divergences a replay agent appended to ``path`` (none if it wrote none)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in data.splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            # a line cut short by a process killed as it wrote: the rest is whole
            log.warning("a divergence line of a replay agent is not JSON", file=str(path))
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _recorded_pipeline(recorded: RecordedRun) -> Pipeline:
    """The pipeline as the run loaded it: from its recorded text (else its file, if it still
    has the recorded digest).

    The text is loaded from a file in a temporary directory, with the recorded file's folder
    on the import path (a pipeline importing a module beside it finds it there), and the
    pipeline keeps the recorded path: the new run records where it came from.
    """
    source = recorded.pipeline_source
    if source is None:
        if recorded.pipeline and os.path.isfile(recorded.pipeline):
            pipe = load_pipeline(recorded.pipeline)
            if pipe.digest == recorded.pipeline_digest:
                return pipe
        raise UsageError(
            f"run {recorded.run_id} does not record its pipeline's text, and its file "
            f"{recorded.pipeline or '(none)'} is not as it ran: give the pipeline file to "
            "replay it with"
        )
    name = Path(recorded.pipeline).name if recorded.pipeline else "pipeline.py"
    folder = os.path.dirname(recorded.pipeline) if recorded.pipeline else None
    with tempfile.TemporaryDirectory(prefix="orchestrator-replay-pipeline-") as tmp:
        file = Path(tmp) / name
        file.write_bytes(_source_bytes(source))
        added = folder is not None and os.path.isdir(folder)
        if added:
            sys.path.insert(0, str(folder))
        try:
            pipe = load_pipeline(file)
        finally:
            if added and str(folder) in sys.path:
                sys.path.remove(str(folder))
    return attrs.evolve(pipe, path=recorded.pipeline)


def _source_bytes(source: str) -> bytes:
    """A pipeline's recorded text as its file's bytes: in the encoding its coding declaration
    names (Python reads it back so), else UTF-8."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source.encode("utf-8")).readline)
        return source.encode(encoding, errors="replace")
    except (SyntaxError, LookupError):  # a declaration Python refuses: it refuses the file too
        return source.encode("utf-8")


def _replay_json(
    record: ReplayRecord, agents: ReplayAgents, strict: bool, timing: Timing, given: bool
) -> dict[str, Any]:
    """The result's ``replay`` object: what was replayed, and what differed, by step."""
    found = sorted(
        agents.divergences,
        key=lambda d: (
            str(d.get("step") or ""),
            int(d.get("attempt") or 0),
            int(d.get("turn") or 0),
        ),
    )
    return {
        "of": record.run_id,
        "strict": strict,
        "timing": timing,
        "pipeline": "given" if given else "recorded",
        "divergences": [d for d in found if d.get("kind") != "not-replayable"],
        "notReplayable": [d for d in found if d.get("kind") == "not-replayable"],
    }


async def replay_run(
    run: str | os.PathLike[str] | ReplayRecord,
    pipeline: Pipeline | str | os.PathLike[str] | None = None,
    *,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    strict: bool = False,
    timing: Timing = "fast",
    cwd: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    config: Config | None = None,
    max_sessions: int | None = None,
    escalate: Escalate | None = None,
    apply: bool = False,
    on_event: Callable[[RunEvent], None] | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    transcript: str | os.PathLike[str] | None = None,
    in_process: bool = False,
) -> RunOutcome:
    """Run a recorded run again, offline: every agent step served by its replay agent.

    ``run`` is a run id (or a unique prefix) of the run store, a replay record file (as
    ``orchestrator replay RUN --save FILE`` writes one), or a
    :class:`~orchestrator.replay.ReplayRecord`. The replay is a new run, recorded and
    reported like any other (its options say ``replay``: of which run, strict or not, its
    timing, which pipeline), of the recorded pipeline (the text the run loaded; ``pipeline``
    gives a file, as it is now, or a :class:`~orchestrator.pipeline.Pipeline` instead; a
    prompt or a comparison is rebuilt from its record, as a resume does), with its recorded
    inputs and settings; ``policy`` replaces the recorded policy, and the requests the agents
    made are decided by it again. It works on ``cwd`` (default: the recorded workspace),
    whose files should be as the run found them: a read that returns other content is a
    divergence. Nothing is written to it unless ``apply``.

    No agent is started and no model is called: each agent is a replay agent (a subprocess,
    or in this process with ``in_process``, for tests) playing the record of its sessions:
    the recorded answers, the recorded updates (at once, or with ``timing="recorded"`` at
    their recorded pace), the recorded requests re-issued against the new run's branches, the
    recorded changes an agent made on disk itself written at the end of its turn. The result
    has ``replay``: ``of`` (the recorded run), ``divergences`` (each with its ``step``,
    ``attempt``, ``turn``, ``kind``, ``detail``, ``recorded`` and ``now``) and
    ``notReplayable`` (turns the record cannot play: cut by the storage cap, no answer
    recorded). ``strict`` stops a turn at its first divergence: its step fails there. The
    record played is kept in the new run's directory (``replay-record.json``).

    A batch run is refused: replay one of its repositories' runs.
    """
    check_trio_face("replay_run")  # before anything starts
    if timing not in ("fast", "recorded"):
        raise UsageError(f"replay timing {timing!r}: expected 'fast' or 'recorded'")
    state = state_directory(state_dir)
    record = await load_replay_record(run, state_dir=state)
    recorded = RecordedRun.from_json(record.run)
    if recorded.kind == "batch":
        raise UsageError(
            f"run {recorded.run_id} is a batch run: replay one of its repositories' runs "
            f"(orchestrator show {recorded.run_id} lists them)"
        )
    if not recorded.kind:
        raise UsageError(
            "the replay record holds no run (one made from a transcript has none): serve its "
            "agents with a replay connector instead"
        )
    if pipeline is not None and recorded.kind != "pipeline":
        raise UsageError(
            f"run {recorded.run_id} is a {recorded.kind} run: it has no pipeline to replace"
        )
    where = cwd if cwd is not None else recorded.cwd
    if cwd is not None and not os.path.isdir(cwd):
        raise UsageError(f"the workspace to replay on, {os.fspath(cwd)}, is not a directory")
    if not where or not os.path.isdir(where):
        raise UsageError(
            f"the workspace of run {recorded.run_id}, {where or '(none recorded)'}, is not a "
            "directory: give the workspace to replay it on"
        )
    rebuilt = await rebuild_run(
        recorded,
        state=state,
        doing="replay",
        config=config,
        policy=policy,
        max_sessions=max_sessions,
        pipeline=pipeline,
        apply=apply,
        load_recorded=_recorded_pipeline,
    )
    agents = ReplayAgents(record, strict=strict, timing=timing, in_process=in_process)
    spec = rebuilt.prompt_agent
    started = time.monotonic()
    given = pipeline is not None and recorded.kind == "pipeline"
    options = dict(recorded.options)
    extra: dict[str, Any] = {
        "replay": {
            "of": recorded.run_id,
            "strict": strict,
            "timing": timing,
            "pipeline": "given" if given else "recorded",
        }
    }
    for key in ("prompt", "compare"):  # what rebuilds a prompt or a comparison again
        if key in options:
            extra[key] = options[key]

    def faithful() -> bool:
        # applied only as recorded: a file written over content the replay read otherwise
        # would lose what the workspace holds now
        return not agents.divergences

    def finish(outcome: RunOutcome) -> Mapping[str, Any]:
        result = dict(outcome.result)
        if spec is not None:  # a prompt reads like a prompt again
            result = prompt_result(outcome, spec, time.monotonic() - started)
        if apply and agents.divergences:
            held = "not applied: the replay differs from the record (see its divergences)"
            if outcome.status == "succeeded":
                held += f"; review it, then apply it with `orchestrator apply {outcome.run_id}`"
            result["warnings"] = [*result.get("warnings", ()), held]
        return {**result, "replay": _replay_json(record, agents, strict, timing, given)}

    run_ids: list[str] = []

    def heard(event: RunEvent) -> None:
        if event.type == "run_started" and not run_ids:
            run_ids.append(event.run_id)
        if on_event is not None:
            on_event(event)

    # per-update events only for a listener that wants them (as the one given says)
    wants = getattr(on_event, "wants_updates", True) if on_event is not None else False
    heard.wants_updates = wants  # type: ignore[attr-defined]
    try:
        return await run_pipeline(
            rebuilt.pipeline,
            dict(recorded.inputs),
            cwd=where,
            state_dir=state,
            config=rebuilt.config,
            _kind=rebuilt.kind,
            _settings_restored=rebuilt.restored.settings,
            _extra_options=extra,
            _finish_result=finish,
            escalate=escalate,
            apply=apply,
            on_event=heard,
            on_update=on_update,
            transcript=transcript,
            connector=agents,
            verify=rebuilt.verify,
            _apply_gate=faithful,
        )
    finally:
        with trio.CancelScope(shield=True):
            if run_ids:  # the record it played, beside the run
                target = state / "runs" / run_ids[0] / RECORD_FILE
                await trio.to_thread.run_sync(_keep_record, record, target)
            await trio.to_thread.run_sync(agents.close)


def _keep_record(record: ReplayRecord, target: Path) -> None:
    """Write ``record`` to ``target`` (a failure is logged: the run is recorded already)."""
    try:
        record.dump(target)
    except OSError as e:
        log.warning("the replay record could not be kept", file=str(target), error=str(e))
