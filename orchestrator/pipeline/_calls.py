"""Small pieces of the pipeline runner: calling step functions, keys, values, verify commands."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import orjson
import trio

from .._names import decode_text
from ..agent import reaper
from ..agent.confine import Confined, confine
from ..agent.content import PromptInput, check_prompt
from ..errors import (
    AgentError,
    AgentHung,
    AgentStartError,
    AuthenticationError,
    AuthRequired,
    CommandRefused,
    ConnectionClosed,
    ErrorKind,
    JsonRpcError,
    OrchestratorError,
    ProtocolError,
    ProtocolVersionMismatch,
    RemoteTurnFailed,
    SandboxUnavailable,
    StepAborted,
    StoreError,
    UsageError,
)
from ..protocol import types as t
from ..sandbox import Sandbox
from ..vfs import FileTooLarge, MergeConflictError, WorkspaceChanged
from .results import RunEvent, StepResult, VerifyResult

MISSING = object()


async def call(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    inline: bool = False,
    abandon: bool = False,
) -> Any:
    """Call a step function: coroutine functions on the loop, plain ones in a worker thread.

    ``inline`` calls a plain function on the loop itself (agent steps' prompt builders, which
    only format text: a thread hop would cost more than the call). ``abandon``: a cancellation
    (Ctrl-C, a timeout) returns at once, leaving the thread to finish in the background, its
    result ignored (Python cannot stop a thread); else the caller waits for it. A ``SystemExit`` or
    ``KeyboardInterrupt`` the function raises becomes :class:`StepAborted` (see
    :func:`_aborted`).
    """
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(**kwargs)
        if inline:
            result = fn(**kwargs)
        else:
            result = await trio.to_thread.run_sync(lambda: fn(**kwargs), abandon_on_cancel=abandon)
        if inspect.isawaitable(result):
            return await result
        return result
    except (SystemExit, KeyboardInterrupt) as e:
        _reraise_aborted(e)


def _reraise_aborted(e: SystemExit | KeyboardInterrupt) -> NoReturn:
    """Raise what ``e`` out of the pipeline's code means (see :func:`_aborted`): a
    :class:`StepAborted` caused by ``e``, whose traceback is the step's (:func:`user_traceback`)."""
    aborted = _aborted(e)
    if aborted is e:
        raise e
    raise aborted from e


def _aborted(e: SystemExit | KeyboardInterrupt) -> BaseException:
    """What a ``SystemExit`` or ``KeyboardInterrupt`` out of the pipeline's code means.

    The pipeline's code is the user's: ``sys.exit()`` in a step fails the step (with the place
    it was called from in the message), it does not end the orchestrator half-way through a run;
    so does a ``KeyboardInterrupt`` it raises itself. One that a real Ctrl-C raised (trio's
    SIGINT handler interrupting code on the loop) is returned as it is, to interrupt the run.
    """
    frames = list(traceback.walk_tb(e.__traceback__))
    if (
        isinstance(e, KeyboardInterrupt)
        and frames
        and _is_caller(frames[-1][0].f_globals.get("__name__"))
    ):
        return e
    what = type(e).__name__
    if isinstance(e, SystemExit) and e.code is not None:
        what += f"({e.code!r})"
    users = [(f, n) for f, n in frames if not _is_caller(f.f_globals.get("__name__"))]
    where = ""
    if users:
        frame, line = users[-1]
        where = f" at {frame.f_code.co_filename}:{line} in {frame.f_code.co_name}"
    return StepAborted(f"{what} raised{where} (it fails the step, not the run)")


def prompt_input(prompt: Any) -> PromptInput:
    if prompt is None:
        raise UsageError("an agent step returned no prompt")
    if isinstance(prompt, StepResult):
        return prompt.text
    try:  # refused here, naming the step's mistake, not by the agent as a broken request
        return check_prompt(prompt)
    except UsageError as e:
        raise UsageError(f"an agent step must return its prompt: {e}") from None


def item_key(key: Any, value: Any, mapping: bool) -> str:
    if mapping:
        return str(key)
    if isinstance(value, (str, int, float)) and len(str(value)) <= 80:
        return str(value)
    return str(key)


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "step"


#: the error kind of each class (the first match in this order wins)
_KINDS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorKind], ...] = (
    (AgentHung, "timeout"),
    ((AgentStartError, ProtocolVersionMismatch, AuthenticationError, AuthRequired), "agent-start"),
    (ConnectionClosed, "agent-exited"),
    ((SandboxUnavailable, CommandRefused), "policy"),
    ((JsonRpcError, ProtocolError, AgentError), "agent-error"),
    (StoreError, "store"),
    (UsageError, "usage"),
)


def error_kind(e: BaseException) -> ErrorKind:
    """The :data:`~orchestrator.errors.ErrorKind` of an exception that failed a step."""
    if isinstance(e, RemoteTurnFailed):  # a failure on a cluster node says its kind
        return e.remote_kind
    if isinstance(e, StepAborted) or user_traceback(e) is not None:
        return "exception"  # the pipeline's own code raised it
    if isinstance(e, FileTooLarge):
        return "file-too-large"
    if isinstance(e, WorkspaceChanged):
        return "workspace-changed"
    if isinstance(e, MergeConflictError):
        return "conflict"
    for classes, kind in _KINDS:
        if isinstance(e, classes):
            return kind
    return "internal"


def describe(e: BaseException) -> str:
    if isinstance(e, OrchestratorError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def fan_out_items(source: Any) -> list[tuple[str, Any]]:
    """The (key, item) pairs of a fan-out over ``source``: a mapping's items or a sequence's.

    Keys are the mapping's keys, or short items themselves, or positions when those would
    not be unique.
    """
    mapping = isinstance(source, Mapping)
    try:  # the source may be the pipeline's own iterable
        values = list(source.items()) if mapping else list(enumerate(source))
    except (SystemExit, KeyboardInterrupt) as e:
        _reraise_aborted(e)
    items = [(item_key(k, v, mapping), v) for k, v in values]
    if len({k for k, _ in items}) != len(items):
        items = [(str(i), v) for i, (_, v) in enumerate(items)]
    return items


#: the packages of the frames between the runner and the pipeline's code (a worker thread's)
_CALLERS = ("orchestrator", "trio", "outcome")
#: the functions through which the runner enters the pipeline's code
_ENTRIES = frozenset({call.__code__, fan_out_items.__code__})


def user_traceback(e: BaseException) -> str | None:
    """The traceback of ``e`` from where the runner entered the pipeline's code; None if not.

    The runner calls step functions and conditions through :func:`call` and iterates fan-out
    sources in :func:`fan_out_items`: the frames down to there (and trio's, of the worker
    thread) are the orchestrator's and are left out. An exception that the pipeline's code did
    not raise (an agent's failure, a timeout, a merge conflict) has no traceback here: its
    message says it all. A :class:`StepAborted` has the traceback of the ``SystemExit`` or
    ``KeyboardInterrupt`` that caused it.
    """
    if isinstance(e, StepAborted) and e.__cause__ is not None:
        return user_traceback(e.__cause__)
    if isinstance(e, RemoteTurnFailed):  # the pipeline's code raised on a node, or did not
        return e.remote_traceback
    frames = [frame for frame, _ in traceback.walk_tb(e.__traceback__)]
    entries = [i for i, frame in enumerate(frames) if frame.f_code in _ENTRIES]
    if not entries:
        return None
    skip = entries[-1] + 1
    while skip < len(frames) and _is_caller(frames[skip].f_globals.get("__name__")):
        skip += 1
    if skip == len(frames):
        return None
    formatted = traceback.TracebackException.from_exception(e)
    # one entry per frame of the walk above, in the same order (unless sys.tracebacklimit
    # cut it: then it is left as Python would print it)
    if len(formatted.stack) == len(frames):
        del formatted.stack[:skip]
    return "".join(formatted.format())


def _is_caller(module: Any) -> bool:
    return isinstance(module, str) and module.partition(".")[0] in _CALLERS


def jsonable(value: Any) -> Any:
    if value is MISSING:
        return None
    try:
        orjson.dumps(value)
    except TypeError:
        return repr(value)
    return value


def stored_value(value: Any) -> tuple[Any, bool]:
    """A Python step's value as JSON for the store, and whether it could be stored."""
    try:
        return orjson.loads(orjson.dumps(value)), True
    except TypeError:
        return None, False


def update_event(
    run_id: str, step: str, key: str | None, agent: str, update: t.SessionUpdate
) -> RunEvent:
    data: dict[str, Any] = {"kind": getattr(update, "session_update", type(update).__name__)}
    if isinstance(update, (t.ToolCall, t.ToolCallUpdate)):
        data.update(title=update.title, toolKind=update.kind, status=update.status)
    elif isinstance(update, t.UsageUpdate):
        data.update(tokens=update.used)
    elif isinstance(update, t.Notice):
        data.update(severity=update.severity, title=update.title)
        if update.description:
            data.update(description=update.description)
    return RunEvent("update", run_id, step, key, agent, data)


async def run_verify(
    command: str, directory: Path, *, timeout: float = 600.0, sandbox: Sandbox | None = None
) -> VerifyResult:
    """Run shell ``command`` in ``directory``; keep its exit code and the tail of its output.

    The command runs in its own process group, which is killed when it times out, when the run
    is cancelled, and after it exits; then so are its descendants that left the group (see
    :mod:`orchestrator.agent.reaper`): nothing it started in the background outlives it.
    With ``sandbox`` it runs confined by Landlock to ``directory`` (it runs what the agent
    wrote there: its tests, its build scripts).
    """
    if sandbox is None:
        return await _verify(command, command, None, directory, timeout)
    confined: Confined = await trio.to_thread.run_sync(
        lambda: confine(("/bin/sh", "-c", command), sandbox, cwd=str(directory), environ=os.environ)
    )
    try:
        return await _verify(command, list(confined.argv), confined.env, directory, timeout)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(confined.release)


async def _verify(
    command: str,
    args: str | list[str],
    env: Mapping[str, str] | None,
    directory: Path,
    timeout: float,
) -> VerifyResult:
    done: list[subprocess.CompletedProcess[bytes]] = []
    tree = reaper.open_tree()

    async def kill_group(proc: trio.Process) -> None:
        _signal_group(proc.pid, signal.SIGTERM)
        with trio.move_on_after(2.0):
            await proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)

    async def run(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        done.append(
            await trio.run_process(
                args,
                shell=isinstance(args, str),  # the line itself, or the confined launcher's argv
                cwd=directory,
                env=tree.environment(os.environ if env is None else env),
                capture_stdout=True,
                stderr=subprocess.STDOUT,
                check=False,
                start_new_session=True,
                deliver_cancel=kill_group,
                task_status=task_status,
            )
        )

    proc: trio.Process | None = None
    try:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:
                proc = await nursery.start(run)
    finally:
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)
            await reaper.release_tree(tree)
        else:
            reaper.close_tree(tree)
    if scope.cancelled_caught or not done:
        return VerifyResult(command, 124, f"timed out after {timeout:g}s", timed_out=True)
    output = decode_text(done[0].stdout)
    tail = "\n".join(output.splitlines()[-40:])
    return VerifyResult(command, done[0].returncode, tail)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
