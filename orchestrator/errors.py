"""The one error hierarchy of the orchestrator.

Every exception the library raises on purpose derives from :class:`OrchestratorError`.
Lower layers raise the most specific class they can; upper layers translate at their
boundary with ``raise X from e`` so the original cause stays attached.

JSON-RPC error objects map to subclasses of :class:`JsonRpcError` by their ``code``
(see :func:`error_from_code`); unknown codes become a plain :class:`JsonRpcError`.

Every error class the library raises is importable from here: the virtual filesystem's
(:class:`WorkspaceChanged`, :class:`FileTooLarge`, ... defined in :mod:`orchestrator.vfs.errors`),
the protocol codec's :class:`StructureError` and the test model server's :class:`UnsafeBind` are
looked up when first asked for (they live in modules that import this one).

:data:`ErrorKind` names why a step instance failed (``errorKind`` in a run's ``--json`` object).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, get_args

from ._names import display_names

if TYPE_CHECKING:
    from .protocol.codec import StructureError
    from .testing.model_server import UnsafeBind
    from .vfs.errors import (
        ApplyError,
        FileTooLarge,
        MergeConflictError,
        PathNotFound,
        PathRefused,
        SymlinkOutside,
        VfsError,
        WorkspaceChanged,
    )
    from .vfs.export import GitBranchRefused

__all__ = [
    "ERROR_KINDS",
    "AgentArchiveError",
    "AgentError",
    "AgentExited",
    "AgentHung",
    "AgentNotFound",
    "AgentStartError",
    "AlreadyApplied",
    "ApplyError",
    "ApplyRefused",
    "AuthRequired",
    "AuthenticationError",
    "BacklogExceeded",
    "CapabilityNotSupported",
    "ClusterError",
    "CommandRefused",
    "ConnectionClosed",
    "ErrorKind",
    "FileNotFound",
    "FileTooLarge",
    "GitBranchRefused",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "JsonRpcError",
    "LoginRequired",
    "McpServerUnsupported",
    "MergeConflictError",
    "MessageTooLarge",
    "MethodNotFound",
    "NotOffered",
    "OrchestratorError",
    "ParseError",
    "PathNotFound",
    "PathRefused",
    "PipelineError",
    "ProtocolError",
    "ProtocolVersionMismatch",
    "PushFailed",
    "RegistryError",
    "RemoteTurnFailed",
    "RepoUnavailable",
    "ReportError",
    "RequestCancelled",
    "ResourceNotFound",
    "ResumeConflict",
    "RunBusy",
    "RunCancelled",
    "RunNotFound",
    "SandboxUnavailable",
    "StateDirectoryError",
    "StepAborted",
    "StoreError",
    "StoreVersionError",
    "StructureError",
    "SymlinkOutside",
    "SymlinkRefused",
    "TurnTimeout",
    "UnknownAgent",
    "UnsafeBind",
    "UnsettledConflicts",
    "UsageError",
    "VfsError",
    "WorkspaceChanged",
    "error_from_code",
]

#: why a step instance (or a step as a whole) failed, as a run records it (``errorKind``):
#:
#: - ``timeout``: its turn ran past its timeout or idle timeout, or the agent stopped answering
#: - ``agent-exited``: the agent process ended (or closed its connection) during the turn
#: - ``agent-start``: the agent could not be started, or did not complete ``initialize``
#: - ``agent-error``: the agent answered an error, or broke the protocol
#: - ``stopped``: the turn ended with a stop reason other than ``end_turn`` (``refusal``,
#:   ``max_tokens``, ``max_turn_requests``, ``cancelled``)
#: - ``verify``: the step's verify command failed
#: - ``check``: the step's check failed in every round it had
#: - ``budget``: the turn went over the step's token budget
#: - ``policy``: the permission policy or the sandbox refused what the step needed
#: - ``conflict``: merging the step's parents left conflicts
#: - ``file-too-large``: the step left a file larger than the limit on a changed file
#: - ``workspace-changed``: a file the step needed changed in the workspace during the run
#: - ``exception``: the pipeline's own Python code raised (a step function, a condition, a
#:   fan-out source)
#: - ``usage``: bad input met while running (a model or mode the agent does not offer, ...)
#: - ``store``: the run store failed
#: - ``node-lost``: the cluster node running the instance was lost during its turn: what the
#:   agent did is unknown (never sent again on its own; a resume runs the instance again)
#: - ``internal``: anything else
ErrorKind: TypeAlias = Literal[
    "timeout",
    "agent-exited",
    "agent-start",
    "agent-error",
    "stopped",
    "verify",
    "check",
    "budget",
    "policy",
    "conflict",
    "file-too-large",
    "workspace-changed",
    "exception",
    "usage",
    "store",
    "node-lost",
    "internal",
]
#: every :data:`ErrorKind`, in the order documented there
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

#: the error classes defined in modules that import this one, by the module defining them
_ELSEWHERE = {
    "ApplyError": "orchestrator.vfs.errors",
    "FileTooLarge": "orchestrator.vfs.errors",
    "MergeConflictError": "orchestrator.vfs.errors",
    "PathNotFound": "orchestrator.vfs.errors",
    "PathRefused": "orchestrator.vfs.errors",
    "SymlinkOutside": "orchestrator.vfs.errors",
    "VfsError": "orchestrator.vfs.errors",
    "WorkspaceChanged": "orchestrator.vfs.errors",
    "GitBranchRefused": "orchestrator.vfs.export",
    "StructureError": "orchestrator.protocol.codec",
    "UnsafeBind": "orchestrator.testing.model_server",
}


def __getattr__(name: str) -> Any:
    # looked up on first use: those modules import this one (an import here would be a cycle)
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ELSEWHERE})


class OrchestratorError(Exception):
    """Base class of every error raised by the orchestrator on purpose."""


class UsageError(OrchestratorError):
    """Bad input from the user: a wrong option, a missing file, an unknown agent name."""


class ClusterError(OrchestratorError):
    """A cluster that cannot run the work: Ray is not installed, its address cannot be
    reached, or no node of it offers agent slots."""


class RemoteTurnFailed(OrchestratorError):
    """An agent step's turn that failed on a cluster node: the node's message, the
    :data:`ErrorKind` it failed with, and the traceback of the pipeline's code that raised
    there, if any (the exception itself stays on the node)."""

    def __init__(self, message: str, kind: ErrorKind, traceback: str | None = None) -> None:
        super().__init__(message)
        self.remote_kind: ErrorKind = kind
        self.remote_traceback = traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.remote_kind, self.remote_traceback))


class RegistryError(UsageError):
    """An ACP registry that cannot be read (a bad file, URL or JSON), or an agent id it does
    not hold, or an agent of it that cannot be started here."""


class AgentArchiveError(OrchestratorError):
    """The archive of a binary agent of the ACP registry could not be fetched, verified
    (its SHA-256 is not the one the registry names) or unpacked. Raised in the process that
    starts the agent, which says so on its stderr."""


class UnknownAgent(UsageError):
    """An agent given by a name that is no known agent, nor a program, but close to a known one
    (a typo): ``suggestion`` is that name."""

    def __init__(self, name: str, suggestion: str):
        self.name = name
        self.suggestion = suggestion
        super().__init__(f"unknown agent {name!r}; did you mean {suggestion!r}?")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.suggestion))


class AgentNotFound(UsageError):
    """An agent whose program cannot be found (not installed, or not on ``PATH``): ``name`` is
    the agent, ``program`` what was looked for, ``install`` how to install it, if known."""

    def __init__(self, name: str, program: str, install: str | None = None):
        self.name = name
        self.program = program
        self.install = install
        hint = f" (install: {install})" if install else ""
        super().__init__(f"agent {name}: {program!r} not found{hint}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.program, self.install))


class PipelineError(UsageError):
    """A pipeline that cannot run: ``problems`` holds every problem found, not just the first.

    ``source`` names what was checked (a pipeline file or name) and prefixes the message.
    """

    def __init__(self, problems: str | Iterable[str], source: str | None = None):
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        self.source = source
        super().__init__(self._describe())

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickling would pass the message back as ``problems``.
        return (type(self), (self.problems, self.source))

    def _describe(self) -> str:
        head = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            return head + self.problems[0]
        lines = "".join(f"\n  - {problem}" for problem in self.problems)
        return f"{head}{len(self.problems)} problems:{lines}"


# --------------------------------------------------------------------------- JSON-RPC


class JsonRpcError(OrchestratorError):
    """A JSON-RPC error object, received from the peer or to be sent to it."""

    code: int = -32603
    default_message: ClassVar[str] = "Error"

    def __init__(self, message: str | None = None, data: Any = None, *, code: int | None = None):
        self.message = message if message is not None else self.default_message
        self.data = data
        if code is not None:
            self.code = code
        super().__init__(self.message)

    def __str__(self) -> str:
        text = f"{self.message} (code {self.code})"
        detail = _data_text(self.data)
        return f"{text}: {detail}" if detail else text

    def to_error_object(self) -> dict[str, Any]:
        """The wire form: ``{"code", "message"[, "data"]}``."""
        obj: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            obj["data"] = self.data
        return obj

    @classmethod
    def from_error_object(cls, obj: Any) -> JsonRpcError:
        """Build the matching subclass from a received error object (tolerant of junk)."""
        if not isinstance(obj, dict):
            return InternalError("malformed error object", data=obj)
        code = obj.get("code")
        message = obj.get("message")
        if not isinstance(code, int) or isinstance(code, bool):
            code = InternalError.code
        if not isinstance(message, str):
            message = str(message) if message is not None else None
        return error_from_code(code, message, obj.get("data"))


#: how many characters of an error's data its message shows
DATA_CHARS = 300


def _data_text(data: Any) -> str:
    """An error's ``data`` as one line of text for its message (empty when it holds nothing):
    a string as itself, anything else as compact JSON, never a Python repr; bounded."""
    if data is None or data == "" or data == {} or data == []:
        return ""
    if isinstance(data, str):
        text = " ".join(data.split())
    else:
        try:
            text = json.dumps(data, ensure_ascii=False, separators=(", ", ": "), default=str)
        except (ValueError, RecursionError):  # a cycle or a structure too deep to show
            text = f"({type(data).__name__})"
    if len(text) > DATA_CHARS:
        text = text[: DATA_CHARS - 3] + "..."
    return text


class ParseError(JsonRpcError):
    """-32700: the peer sent text that is not JSON."""

    code = -32700
    default_message = "Parse error"


class InvalidRequest(JsonRpcError):
    """-32600: the JSON is not a valid request object."""

    code = -32600
    default_message = "Invalid request"


class MethodNotFound(JsonRpcError):
    """-32601: the method does not exist or is not served here."""

    code = -32601
    default_message = "Method not found"


class InvalidParams(JsonRpcError):
    """-32602: the parameters do not have the shape the method needs."""

    code = -32602
    default_message = "Invalid params"


class CommandRefused(InvalidParams):
    """-32602: the permission policy refused to start a terminal command.

    ``record`` is the audit record of the refusal (a
    :class:`~orchestrator.agent.services.PermissionRecord`) when the check made one; the
    client adds it to the session's and the turn's permission decisions.
    """

    def __init__(self, message: str, *, record: Any = None):
        super().__init__(message)
        self.record = record


class InternalError(JsonRpcError):
    """-32603: the handler failed."""

    code = -32603
    default_message = "Internal error"


class RequestCancelled(JsonRpcError):
    """-32800: the request was cancelled (``$/cancel_request``) before it finished."""

    code = -32800
    default_message = "Request cancelled"


class AuthRequired(JsonRpcError):
    """-32000: the agent needs ``authenticate`` first."""

    code = -32000
    default_message = "Authentication required"


class ResourceNotFound(JsonRpcError):
    """-32002: a resource such as a file was not found."""

    code = -32002
    default_message = "Resource not found"


class FileNotFound(ResourceNotFound):
    """-32002 for ``fs/read_text_file``: the path is one the client serves, and no file is
    there (a path refused, a directory or a session without files are other errors)."""


_BY_CODE: dict[int, type[JsonRpcError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        RequestCancelled,
        AuthRequired,
        ResourceNotFound,
    )
}


def error_from_code(code: int, message: str | None = None, data: Any = None) -> JsonRpcError:
    """The :class:`JsonRpcError` subclass for ``code`` (a plain one for unknown codes)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return JsonRpcError(message or "Error", data, code=code)
    return cls(message, data)


# --------------------------------------------------------------------------- transport


class ProtocolError(OrchestratorError):
    """The peer broke the protocol in a way that is worth reporting (not always fatal)."""


class MessageTooLarge(ProtocolError):
    """A single message exceeded the configured maximum size; it was dropped."""

    def __init__(self, size: int, limit: int):
        self.size = size
        self.limit = limit
        super().__init__(f"message of at least {size} bytes exceeds the limit of {limit} bytes")


class ConnectionClosed(OrchestratorError):
    """The stream to the peer ended (EOF or broken) while something still waited on it.

    ``exit_status`` and ``stderr_tail`` are filled in when the peer is a process;
    ``malformed`` is the start of the first line it sent that was not JSON (quoted and escaped,
    see :func:`~orchestrator.jsonrpc.framing.excerpt`), if it sent one.
    """

    def __init__(
        self,
        reason: str = "connection closed",
        *,
        peer: str | None = None,
        exit_status: int | None = None,
        stderr_tail: str = "",
        malformed: str | None = None,
    ):
        self.reason = reason
        self.peer = peer
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail
        self.malformed = malformed
        super().__init__(self._describe())

    def __str__(self) -> str:
        # described when shown: the connection adds ``malformed`` after a factory built it
        return self._describe()

    def _describe(self) -> str:
        text = f"{self.peer}: {self.reason}" if self.peer else self.reason
        if self.exit_status is not None:
            text += f" (exit status {self.exit_status})"
        if self.malformed:
            text += f"; it had sent a line that is not JSON: {self.malformed}"
        if self.stderr_tail:
            tail = self.stderr_tail.rstrip()[-2000:]
            text += f"\n--- last stderr lines ---\n{tail}"
        return text


class BacklogExceeded(ConnectionClosed):
    """The peer left more unanswered than a limit allows, so it was cut off.

    ``limit`` names the limit (``max_requests_in_flight`` or ``max_unsent_bytes``, the keys of
    the ``[limits]`` table of a config file) and ``value`` is its value; ``what`` says what
    passed it. An agent that sends requests and does not read the answers ends this way.
    """

    def __init__(self, what: str, limit: str, value: int, *, peer: str | None = None):
        self.what = what
        self.limit = limit
        self.value = value
        super().__init__(f"stopped: {what}, over the limit {limit} = {value:,}", peer=peer)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_backlog_exceeded, (self.what, self.limit, self.value, self.peer))


def _backlog_exceeded(what: str, limit: str, value: int, peer: str | None) -> BacklogExceeded:
    return BacklogExceeded(what, limit, value, peer=peer)


# --------------------------------------------------------------------------- agents


class AgentError(OrchestratorError):
    """Something went wrong with one agent; ``agent`` names it."""

    def __init__(self, message: str, *, agent: str | None = None):
        self.agent = agent
        super().__init__(f"agent {agent!r}: {message}" if agent else message)


class AgentExited(ConnectionClosed):
    """The agent process ended (crash, exit, or closed its stdout) with work pending."""


class AgentStartError(AgentError):
    """The agent could not be started or did not complete ``initialize``."""


class AgentHung(AgentError):
    """The agent stopped answering: a turn outlived its timeout or its cancel grace."""

    #: whether the agent ignored ``session/cancel`` too (its process is no longer usable)
    unresponsive: bool = True


class TurnTimeout(AgentHung):
    """A turn ran past its total or idle timeout."""


class ProtocolVersionMismatch(AgentError):
    """The agent answered ``initialize`` with a protocol version we do not speak.

    ``response`` is its answer as read (the ``InitializeResponse``: what it says it is and
    offers), or None.
    """

    def __init__(self, message: str, *, agent: str | None = None, response: Any = None):
        self.response = response
        super().__init__(message, agent=agent)


class CapabilityNotSupported(AgentError):
    """The agent did not advertise the capability an operation needs."""


class NotOffered(UsageError):
    """A session choice (a model, a mode) that the agent does not offer.

    ``what`` is the kind of choice (``model``, ``mode``), ``value`` what was asked for,
    ``offered`` what the agent offers, ``agent`` its label when known.
    """

    def __init__(
        self, what: str, value: str, offered: Sequence[str], agent: str | None = None
    ) -> None:
        self.what = what
        self.value = value
        self.offered = tuple(offered)
        self.agent = agent
        whose = f"agent {agent}" if agent else "the agent"
        choices = ", ".join(self.offered) if self.offered else f"no {what}"
        super().__init__(f"{whose} offers no {what} {value!r}; it offers: {choices}")


class McpServerUnsupported(UsageError):
    """MCP servers of a kind the agent cannot take (its ``mcpCapabilities`` lacks ``http`` or
    ``sse``), refused after ``initialize`` and before any session is asked for.

    ``servers`` holds (name, kind) of each refused server, ``agent`` the agent's label.
    """

    def __init__(self, servers: Sequence[tuple[str, str]], *, agent: str | None = None) -> None:
        self.servers = tuple(servers)
        self.agent = agent
        whose = f"agent {agent!r}" if agent else "the agent"
        listed = ", ".join(f"{name} ({kind})" for name, kind in self.servers)
        kinds = sorted({kind for _, kind in self.servers})
        super().__init__(
            f"{whose} does not take {' or '.join(kinds)} MCP servers (its mcpCapabilities do"
            f" not allow them): {listed}; give it stdio servers instead"
        )


class AuthenticationError(AgentError):
    """Authentication was required and could not be performed."""


class LoginRequired(AuthenticationError):
    """The agent requires authentication and no method it offers can be used unattended.

    Raised at once rather than waiting on a login nobody will complete: the agent offered
    no method, several (none chosen), or only ones a person must complete in a terminal.
    ``methods`` holds each offered method as ``{"id", "name", "description", "type",
    "command"}``, ``command`` being the terminal login to run (or None).
    """

    def __init__(
        self, message: str, *, agent: str | None = None, methods: Sequence[Any] = ()
    ) -> None:
        self.methods = tuple(methods)
        super().__init__(message, agent=agent)


class SandboxUnavailable(UsageError):
    """Agents were to run confined, and this kernel cannot confine them as asked.

    Raised before any agent starts: the kernel has no Landlock, has it disabled, or its
    Landlock version lacks what a rule needs (TCP port rules need ABI 4). Nothing then runs
    unconfined in its place.
    """


# --------------------------------------------------------------------------- run store


class StoreError(OrchestratorError):
    """The run store (the SQLite database of recorded runs) failed or holds bad data."""


class RunNotFound(StoreError, UsageError):
    """No recorded run matches the id (or id prefix) given, or the prefix names several runs."""


class StateDirectoryError(StoreError, UsageError):
    """The state directory cannot be used: not a directory, not writable, or inside the
    workspace of the run. Nothing was created in it."""


class StoreVersionError(StoreError):
    """The run store was written by a newer orchestrator: its schema version is unknown here."""


class RunBusy(OrchestratorError):
    """The run is running in another process (it holds the run's lock)."""

    def __init__(self, message: str, run_id: str | None = None):
        #: the run's full id
        self.run_id = run_id
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.run_id))


class RepoUnavailable(OrchestratorError):
    """A repository of a batch cannot be used: a local directory that is missing or not a
    directory, or a clone or fetch of a URL that failed (git's reason in the message, with any
    credentials in the URL redacted)."""


class ResumeConflict(OrchestratorError):
    """Files a stored run changed were changed in the workspace since the run."""

    def __init__(self, paths: Sequence[str], run_id: str | None = None):
        self.paths = tuple(paths)
        #: the run's full id, when known
        self.run_id = run_id
        shown = display_names(self.paths[:10])
        listed = ", ".join(shown) + (" ..." if len(self.paths) > 10 else "")
        super().__init__(f"the workspace changed since the run, in files the run changed: {listed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.paths, self.run_id))


class RunCancelled(OrchestratorError):
    """A call of the sync face was cancelled through its :class:`~orchestrator.CancelToken`.

    The call ended as an interrupted command does: its turns were cancelled and its agents
    stopped, nothing was applied after the cancel, and a run it had started is recorded
    ``interrupted`` (``run_id``; ``None`` when the call was cancelled before its run started).
    """

    def __init__(self, run_id: str | None = None):
        #: the interrupted run's full id, when the call had started one
        self.run_id = run_id
        super().__init__(f"run {run_id} interrupted" if run_id else "cancelled")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id,))


class ReportError(UsageError):
    """The result cannot be rendered (not a result object) or the report cannot be written."""


# --------------------------------------------------------------------------- pipelines


class StepAborted(OrchestratorError):
    """A step's own code raised ``SystemExit`` or ``KeyboardInterrupt``: that fails the step
    (as any exception it raises would), it does not end the run."""


# --------------------------------------------------------------------------- apply


class ApplyRefused(OrchestratorError):
    """A recorded run's changes cannot be applied as asked; nothing was written.

    ``run_id`` is the run's full id.
    """

    def __init__(self, run_id: str, message: str):
        self.run_id = run_id
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, str(self)))


class AlreadyApplied(ApplyRefused):
    """The same changes of the run were applied to its workspace before (``at``, epoch seconds)."""

    def __init__(self, run_id: str, message: str, at: float | None = None):
        self.at = at
        super().__init__(run_id, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, str(self), self.at))


class UnsettledConflicts(ApplyRefused):
    """The changes asked for hold merge conflicts between branches (``paths``) to settle first."""

    def __init__(self, run_id: str, message: str, paths: Iterable[str] = ()):
        self.paths = tuple(paths)
        super().__init__(run_id, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, str(self), self.paths))


class SymlinkRefused(ApplyRefused, UsageError):
    """The changes would make symlinks (``paths``) leading outside the workspace: bad input,
    never applied, whatever the workspace holds."""

    def __init__(self, run_id: str, message: str, paths: Iterable[str] = ()):
        self.paths = tuple(paths)
        super().__init__(run_id, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, str(self), self.paths))


class PushFailed(OrchestratorError):
    """Pushing a batch's new branch to a remote failed (``git push``; the message has git's
    last line, credentials in URLs hidden)."""
