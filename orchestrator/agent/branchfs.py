"""The ACP fs service over a branch: ``fs/read_text_file`` and ``fs/write_text_file``.

One :class:`BranchFileSystem` serves one branch through its :class:`~orchestrator.vfs.Workdir`
(the adapter lives with the agent side it serves):
construct it per branch and install it for the session(s) working on that branch, e.g.
``ClientServices(fs=BranchFileSystem(workdir))`` as the session's services, so a session id maps
to its branch by construction. Where one service must serve a whole connection, a
:class:`BranchRouter` maps session ids to branch services.

Paths must be absolute and resolve (after ``..`` and symlinks) inside the branch directory,
and be paths the system can look up: no NUL byte, no name over 255 bytes (``NAME_MAX``), under
4,096 bytes in all (``PATH_MAX``), resolved or not; directories may nest as deep as that allows.
A path ending in ``/`` names a directory, not a file; no write goes in or as ``.git`` (git
obeys what it finds there, hooks and ``core.fsmonitor``, when an allowed command runs it).
Anything else is refused with ``InvalidParams`` (-32602) and logged, and nothing is written. A
missing file is ``FileNotFound`` (-32002; plain ``ResourceNotFound`` when a parent is a file,
where no file could be made); content that is not UTF-8 is refused, never mangled; content
over the workdir's limit on a changed file is refused (-32602, with ``path``, ``size`` and
``limit`` in the error's data) before anything is written, and the turn goes on.
Reads harvest the file first, so they see what the agent wrote on disk; writes create parent
directories, replace the file atomically and record the change in the branch. Files of up to
:data:`NOWAIT_MAX_BYTES` are served at once, in the connection's read loop (the ``*_nowait``
methods); larger ones, or any request while a harvest holds the directory, in a worker thread.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio
from attrs import define, field

from .._log import get_logger
from .._names import display_name, logged_name, parse_name
from .._sizes import format_size
from ..errors import FileNotFound, InvalidParams, JsonRpcError, ResourceNotFound
from ..vfs import check_path_limits
from ..vfs.errors import FileTooLarge, PathNotFound, PathRefused
from ..vfs.ignore import is_vcs_name
from ..vfs.workdir import HarvestReport, Workdir

if TYPE_CHECKING:
    from ..protocol import types as t
    from .services import SessionContext

__all__ = ["NOWAIT_MAX_BYTES", "BranchFileSystem", "BranchRouter"]

log = get_logger(__name__)


#: Files up to this size are read and written in the connection's read loop (``*_nowait``):
#: a few system calls cost less than a task and a thread hop. Larger ones go through a thread.
NOWAIT_MAX_BYTES = 64 * 1024


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _split_lines(text: str) -> list[str]:
    """Lines split on ``\\n`` only, each keeping its end."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def select_lines(text: str, line: int | None, limit: int | None) -> str:
    """The ``limit`` lines of ``text`` starting at 1-based ``line`` (all when both are None)."""
    if line is None and limit is None:
        return text
    if line is not None and line < 1:
        raise InvalidParams(f"line must be 1 or more, got {line}")
    if limit is not None and limit < 0:
        raise InvalidParams(f"limit must not be negative, got {limit}")
    start = (line or 1) - 1
    lines = _split_lines(text)
    end = len(lines) if limit is None else start + limit
    return "".join(lines[start:end])


@define(eq=False)
class BranchFileSystem:
    """The fs service of one branch (satisfies ``FileSystemService``)."""

    workdir: Workdir

    @property
    def branch_name(self) -> str:
        """The branch this service reads and writes."""
        return self.workdir.branch.name

    def resolve(self, path: str, *, write: bool = False) -> str:
        """The branch path for the absolute ``path``, or :class:`PathRefused`; with ``write``,
        one with no ``.git`` component either.

        ``path`` is read in the display form of names (:func:`~orchestrator._names.parse_name`):
        ``\\xHH`` stands for a byte that is not UTF-8, so the agent reaches a file by the
        text it was shown for it.
        """
        try:
            path = parse_name(path)
        except ValueError as e:
            raise PathRefused(path, "not valid Unicode") from e
        check_path_limits(path)  # before any system call: they fail on such paths
        if not os.path.isabs(path):
            raise PathRefused(path, "not an absolute path")
        if path.endswith("/"):
            # realpath would drop the slash and name the file: "a.txt/" is no file
            raise PathRefused(path, "ends with '/', which names a directory, not a file")
        root = os.path.realpath(self.workdir.root)
        if not (
            _within(os.path.normpath(path), self.workdir.root)
            or _within(os.path.normpath(path), root)
        ):
            raise PathRefused(path, f"outside the branch directory {self.workdir.root}")
        real = os.path.realpath(path)
        if not _within(real, root):
            raise PathRefused(path, "resolves outside the branch directory (through a symlink)")
        if real != path:
            try:
                check_path_limits(real)
            except PathRefused as e:
                raise PathRefused(path, f"once resolved, {e.reason}") from None
        rel = os.path.relpath(real, root).replace(os.sep, "/")
        if rel == ".":
            raise PathRefused(path, "is the branch directory itself")
        vcs = next((part for part in rel.split("/") if is_vcs_name(part)), None) if write else None
        if vcs is not None:
            # git obeys what it finds there (hooks, core.fsmonitor), and so do the others (an
            # hg hook): a command the policy allows would run what the agent wrote; in any
            # case, as a case-insensitive file system takes ``.GIT`` for ``.git``
            raise PathRefused(path, f"no file is written in or as {vcs}")
        return rel

    def _refused(self, method: str, e: PathRefused, ctx: SessionContext) -> JsonRpcError:
        log.warning(
            "fs request refused",
            method=method,
            path=logged_name(e.path),
            reason=e.reason,
            branch=self.branch_name,
            agent=ctx.agent,
            session=ctx.session_id,
        )
        return InvalidParams(str(e), {"path": display_name(e.path)})

    def _read(
        self, request: t.ReadTextFileRequest, ctx: SessionContext, *, nowait: bool = False
    ) -> str:
        try:
            rel = self.resolve(request.path)
            if nowait:
                maybe = self.workdir.read_nowait(rel, NOWAIT_MAX_BYTES)
                if maybe is None:
                    raise trio.WouldBlock
                data = maybe
            else:
                data = self.workdir.read(rel)
        except PathRefused as e:
            raise self._refused("fs/read_text_file", e, ctx) from e
        except (PathNotFound, FileNotFoundError) as e:
            raise FileNotFound(f"file not found: {request.path}", {"path": request.path}) from e
        except NotADirectoryError as e:  # a parent is a file: no file could be made there
            raise ResourceNotFound(f"file not found: {request.path}", {"path": request.path}) from e
        except IsADirectoryError as e:
            raise InvalidParams(f"{request.path} is a directory", {"path": request.path}) from e
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidParams(
                f"{request.path} is not UTF-8 text (invalid byte at offset {e.start}); "
                "it was not read",
                {"path": request.path, "offset": e.start},
            ) from e
        return select_lines(text, request.line, request.limit)

    def _write(
        self, request: t.WriteTextFileRequest, ctx: SessionContext, *, nowait: bool = False
    ) -> None:
        try:
            rel = self.resolve(request.path, write=True)
            data = request.content.encode("utf-8")
            if not nowait:
                self.workdir.write(rel, data)
            elif len(data) > NOWAIT_MAX_BYTES or not self.workdir.write_nowait(rel, data):
                raise trio.WouldBlock
        except PathRefused as e:
            raise self._refused("fs/write_text_file", e, ctx) from e
        except UnicodeEncodeError as e:
            raise InvalidParams(f"content for {request.path} is not valid Unicode") from e
        except FileTooLarge as e:
            size = e.files[0][1]
            log.warning(
                "fs write refused: over the limit on a changed file",
                path=logged_name(request.path),
                size=size,
                limit=e.limit,
                branch=self.branch_name,
                agent=ctx.agent,
                session=ctx.session_id,
            )
            raise InvalidParams(
                f"{request.path}: {format_size(size)} ({size} bytes) is over the limit of "
                f"{format_size(e.limit)} ({e.limit} bytes) on a changed file; nothing was written",
                {"path": request.path, "size": size, "limit": e.limit},
            ) from e
        except IsADirectoryError as e:
            raise InvalidParams(f"{request.path} is a directory", {"path": request.path}) from e
        log.debug("fs write", path=display_name(rel), bytes=len(data), branch=self.branch_name)

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve ``fs/read_text_file`` (``line``/``limit`` are 1-based line selection)."""
        from ..protocol.types import ReadTextFileResponse  # heavy module: loaded on first use

        content = await trio.to_thread.run_sync(self._read, request, ctx)
        return ReadTextFileResponse(content=content)

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Serve ``fs/write_text_file`` (parent directories are created)."""
        from ..protocol.types import WriteTextFileResponse  # heavy module: loaded on first use

        await trio.to_thread.run_sync(self._write, request, ctx)
        return WriteTextFileResponse()

    def read_text_file_nowait(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """:meth:`read_text_file` at once, for a file of up to :data:`NOWAIT_MAX_BYTES`.

        Raises :class:`trio.WouldBlock` for a larger file, or while a harvest holds the branch
        directory: the async method serves those.
        """
        from ..protocol.types import ReadTextFileResponse

        return ReadTextFileResponse(content=self._read(request, ctx, nowait=True))

    def write_text_file_nowait(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """:meth:`write_text_file` at once, for content of up to :data:`NOWAIT_MAX_BYTES`."""
        from ..protocol.types import WriteTextFileResponse

        self._write(request, ctx, nowait=True)
        return WriteTextFileResponse()

    async def harvest(self, *, full: bool = False) -> HarvestReport:
        """Harvest the branch directory (call after every turn and terminal command)."""
        return await self.workdir.harvest_async(full=full)

    async def on_terminal_exit(
        self, ctx: SessionContext, terminal_id: str, status: t.TerminalExitStatus
    ) -> None:
        """A terminal service ``on_exit`` hook: harvest what the command changed."""
        await self.harvest()


@define(eq=False)
class BranchRouter:
    """One fs service for a connection: routes each session's requests to its branch."""

    _routes: dict[str, BranchFileSystem] = field(factory=dict, alias="_routes")

    def bind(self, session_id: str, fs: BranchFileSystem) -> None:
        """Serve ``session_id`` from ``fs``'s branch."""
        self._routes[session_id] = fs

    def unbind(self, session_id: str) -> None:
        """Forget ``session_id``."""
        self._routes.pop(session_id, None)

    def route(self, session_id: str) -> BranchFileSystem:
        """The branch service of ``session_id`` (``InvalidParams`` if none is bound)."""
        fs = self._routes.get(session_id)
        if fs is None:
            raise InvalidParams(f"no branch is bound to session {session_id!r}")
        return fs

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve ``fs/read_text_file`` from the session's branch."""
        return await self.route(ctx.session_id).read_text_file(request, ctx)

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Serve ``fs/write_text_file`` into the session's branch."""
        return await self.route(ctx.session_id).write_text_file(request, ctx)

    def read_text_file_nowait(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve ``fs/read_text_file`` at once from the session's branch (or WouldBlock)."""
        return self.route(ctx.session_id).read_text_file_nowait(request, ctx)

    def write_text_file_nowait(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Serve ``fs/write_text_file`` at once into the session's branch (or WouldBlock)."""
        return self.route(ctx.session_id).write_text_file_nowait(request, ctx)

    async def on_terminal_exit(
        self, ctx: SessionContext, terminal_id: str, status: t.TerminalExitStatus
    ) -> None:
        """A terminal service ``on_exit`` hook: harvest the session's branch."""
        fs = self._routes.get(ctx.session_id)
        if fs is not None:
            await fs.harvest()
