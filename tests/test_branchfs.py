"""Tests for orchestrator.agent.branchfs: fs/read_text_file and fs/write_text_file over a branch."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes import lock_held_by_another_thread
from log_capture import capture_logs

from orchestrator._names import display_name
from orchestrator.agent.branchfs import (
    NOWAIT_MAX_BYTES,
    BranchFileSystem,
    BranchRouter,
    select_lines,
)
from orchestrator.agent.services import (
    ClientServices,
    FileSystemService,
    NowaitFileSystemService,
    SessionContext,
)
from orchestrator.errors import InvalidParams, JsonRpcError, ResourceNotFound
from orchestrator.protocol import types as t
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Write
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.workdir import Workdir

TEXT = "one\ntwo\nthree\nfour\nfive\n"


@pytest.fixture
def wd(tmp_path: Path) -> Iterator[Workdir]:
    root = make_tree(
        tmp_path / "ws", {"notes.txt": TEXT, "src/a.py": "a = 1\n", "latin1.txt": b"caf\xe9\n"}
    )
    os.utime(root / "notes.txt", (time.time() - 100, time.time() - 100))
    workdir = materialize(
        Branch.from_tree(Workspace.open(root).snapshot(), "agent"), tmp_path / "state" / "agent"
    )
    yield workdir
    workdir.close()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "outside", {"secret.txt": "top secret\n"})


def ctx(wd: Workdir) -> SessionContext:
    return SessionContext(agent="test-agent", session_id="s1", cwd=wd.root)


async def read(
    fs: FileSystemService, wd: Workdir, path: str, line: int | None = None, limit: int | None = None
) -> str:
    request = t.ReadTextFileRequest(session_id="s1", path=path, line=line, limit=limit)
    return (await fs.read_text_file(request, ctx(wd))).content


async def write(fs: FileSystemService, wd: Workdir, path: str, content: str) -> None:
    request = t.WriteTextFileRequest(session_id="s1", path=path, content=content)
    assert isinstance(await fs.write_text_file(request, ctx(wd)), t.WriteTextFileResponse)


async def test_read_whole_file_and_line_ranges(wd: Workdir) -> None:
    """Reads return the file, or `limit` lines from 1-based `line`."""
    fs = BranchFileSystem(wd)
    path = os.path.join(wd.root, "notes.txt")
    assert await read(fs, wd, path) == TEXT
    assert await read(fs, wd, path, line=2, limit=2) == "two\nthree\n"
    assert await read(fs, wd, path, line=4) == "four\nfive\n"
    assert await read(fs, wd, path, limit=1) == "one\n"
    assert await read(fs, wd, path, line=99) == ""
    with pytest.raises(InvalidParams):
        await read(fs, wd, path, line=0)
    with pytest.raises(InvalidParams):
        await read(fs, wd, path, limit=-1)


def test_select_lines_without_trailing_newline() -> None:
    """Line selection keeps line ends and handles a last line without one."""
    assert select_lines("a\nb", 2, 1) == "b"
    assert select_lines("a\r\nb\r\n", 1, 1) == "a\r\n"
    assert select_lines("x", None, None) == "x"


async def test_reads_see_what_the_agent_wrote_on_disk(wd: Workdir) -> None:
    """A file changed on disk behind the client's back is read (and harvested) as it is now."""
    Path(wd.root, "notes.txt").write_text("rewritten by a tool\n")
    assert (
        await read(BranchFileSystem(wd), wd, os.path.join(wd.root, "notes.txt"))
        == "rewritten by a tool\n"
    )
    assert wd.branch.changes["notes.txt"] == Write(b"rewritten by a tool\n")


async def test_write_creates_parents_and_updates_branch_and_disk(wd: Workdir) -> None:
    """Writes create directories, land on disk and in the branch, and need no harvest."""
    fs = BranchFileSystem(wd)
    target = os.path.join(wd.root, "new", "deeper", "file.md")
    await write(fs, wd, target, "# héllo\n")
    assert Path(target).read_text(encoding="utf-8") == "# héllo\n"
    assert wd.branch.read("new/deeper/file.md") == "# héllo\n".encode()
    assert not (await fs.harvest()).changed
    assert await read(fs, wd, target) == "# héllo\n"


async def test_missing_file_is_resource_not_found(wd: Workdir) -> None:
    """A missing file answers -32002."""
    with pytest.raises(ResourceNotFound) as info:
        await read(BranchFileSystem(wd), wd, os.path.join(wd.root, "nope.txt"))
    assert info.value.code == -32002


async def test_non_utf8_is_refused_not_mangled(wd: Workdir) -> None:
    """Reading a file that is not UTF-8 is an InvalidParams error naming the offset."""
    with pytest.raises(InvalidParams, match="not UTF-8") as info:
        await read(BranchFileSystem(wd), wd, os.path.join(wd.root, "latin1.txt"))
    assert info.value.data == {"path": os.path.join(wd.root, "latin1.txt"), "offset": 3}


async def test_directory_is_invalid(wd: Workdir) -> None:
    """Reading or writing a directory is invalid."""
    fs = BranchFileSystem(wd)
    with pytest.raises(InvalidParams):
        await read(fs, wd, os.path.join(wd.root, "src"))
    with pytest.raises(InvalidParams):
        await write(fs, wd, os.path.join(wd.root, "src"), "x")
    with pytest.raises(InvalidParams):
        await read(fs, wd, wd.root)


@pytest.mark.parametrize(
    "make_path",
    [
        lambda root, outside: os.path.join(root, "..", "outside", "secret.txt"),
        lambda root, outside: os.path.join(root, "src", "..", "..", "..", "outside", "secret.txt"),
        lambda root, outside: os.path.join(outside, "secret.txt"),
        lambda root, outside: os.path.join(root, "escape", "secret.txt"),
        lambda root, outside: os.path.join(root, "secret-link"),
        lambda root, outside: "relative/path.txt",
        lambda root, outside: "/etc/passwd",
    ],
    ids=[
        "dotdot",
        "deep-dotdot",
        "absolute-outside",
        "dir-symlink-out",
        "file-symlink-out",
        "relative",
        "etc",
    ],
)
async def test_paths_outside_the_branch_are_refused(
    wd: Workdir, outside: Path, make_path: object
) -> None:
    """Traversal, outward symlinks and foreign paths are refused and logged; nothing changes."""
    os.symlink(outside, Path(wd.root, "escape"))
    os.symlink(outside / "secret.txt", Path(wd.root, "secret-link"))
    path = make_path(wd.root, str(outside))  # type: ignore[operator]
    fs = BranchFileSystem(wd)
    before = capture(outside)
    with capture_logs() as logs:
        with pytest.raises(InvalidParams):
            await read(fs, wd, path)
        with pytest.raises(InvalidParams):
            await write(fs, wd, path, "pwned\n")
    assert capture(outside) == before
    refused = [e for e in logs if e["event"] == "fs request refused"]
    assert len(refused) == 2 and refused[0]["session"] == "s1"
    assert not any(k.startswith(("escape/", "secret")) for k in wd.branch.changes)


async def test_symlink_inside_the_branch_is_followed(wd: Workdir) -> None:
    """A symlink to another file of the branch reads and writes that file."""
    os.symlink("notes.txt", Path(wd.root, "alias.txt"))
    fs = BranchFileSystem(wd)
    assert await read(fs, wd, os.path.join(wd.root, "alias.txt")) == TEXT
    await write(fs, wd, os.path.join(wd.root, "alias.txt"), "via alias\n")
    assert Path(wd.root, "notes.txt").read_text() == "via alias\n"
    assert os.path.islink(Path(wd.root, "alias.txt"))


async def test_router_maps_sessions_to_branches(wd: Workdir, tmp_path: Path) -> None:
    """A router serves each bound session from its branch and refuses unknown sessions."""
    router = BranchRouter()
    fs = BranchFileSystem(wd)
    router.bind("s1", fs)
    services = ClientServices(fs=router)
    assert services.capabilities().fs is not None
    assert await read(router, wd, os.path.join(wd.root, "notes.txt"), limit=1) == "one\n"
    await write(router, wd, os.path.join(wd.root, "r.txt"), "routed\n")
    assert wd.branch.read("r.txt") == b"routed\n"
    Path(wd.root, "by-terminal.txt").write_text("made by a command\n")
    status = t.TerminalExitStatus(exit_code=0)
    await router.on_terminal_exit(ctx(wd), "term-1", status)
    assert wd.branch.read("by-terminal.txt") == b"made by a command\n"
    await fs.on_terminal_exit(ctx(wd), "term-1", status)
    router.unbind("s1")
    with pytest.raises(InvalidParams, match="no branch"):
        await read(router, wd, os.path.join(wd.root, "notes.txt"))
    await router.on_terminal_exit(ctx(wd), "term-1", status)


async def test_concurrent_requests_and_harvests_stay_consistent(wd: Workdir) -> None:
    """Many concurrent writes, reads and harvests leave disk and branch in agreement."""
    fs = BranchFileSystem(wd)

    async def writer(i: int) -> None:
        path = os.path.join(wd.root, "many", f"f{i}.txt")
        await write(fs, wd, path, f"v{i}\n")
        assert await read(fs, wd, path) == f"v{i}\n"

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(writer, i)
                if i % 10 == 0:
                    nursery.start_soon(fs.harvest)
    assert not (await fs.harvest(full=True)).changed
    for i in range(30):
        assert wd.branch.read(f"many/f{i}.txt") == f"v{i}\n".encode()


# ---------------------------------------------------------------------- answered at once


def read_nowait(
    fs: NowaitFileSystemService,
    wd: Workdir,
    path: str,
    line: int | None = None,
    limit: int | None = None,
) -> str:
    request = t.ReadTextFileRequest(session_id="s1", path=path, line=line, limit=limit)
    return fs.read_text_file_nowait(request, ctx(wd)).content


def write_nowait(fs: NowaitFileSystemService, wd: Workdir, path: str, content: str) -> None:
    request = t.WriteTextFileRequest(session_id="s1", path=path, content=content)
    assert isinstance(fs.write_text_file_nowait(request, ctx(wd)), t.WriteTextFileResponse)


async def test_nowait_read_matches_the_async_read(wd: Workdir) -> None:
    """A small file is read at once with the same content and line selection as in a thread."""
    fs = BranchFileSystem(wd)
    path = os.path.join(wd.root, "notes.txt")
    for line, limit in [(None, None), (2, 2), (4, None), (None, 1), (99, None)]:
        assert read_nowait(fs, wd, path, line, limit) == await read(fs, wd, path, line, limit)
    assert read_nowait(fs, wd, path, line=2, limit=2) == "two\nthree\n"
    with pytest.raises(InvalidParams):
        read_nowait(fs, wd, path, line=0)
    with pytest.raises(InvalidParams):
        read_nowait(fs, wd, path, limit=-1)


async def test_nowait_read_sees_and_harvests_what_the_agent_wrote(wd: Workdir) -> None:
    """A file changed on disk is read at once as it is now, and harvested into the branch."""
    Path(wd.root, "notes.txt").write_text("rewritten by a tool\n")
    fs = BranchFileSystem(wd)
    assert read_nowait(fs, wd, os.path.join(wd.root, "notes.txt")) == "rewritten by a tool\n"
    assert wd.branch.changes["notes.txt"] == Write(b"rewritten by a tool\n")


async def test_nowait_read_of_a_large_file_would_block(wd: Workdir) -> None:
    """A file over NOWAIT_MAX_BYTES is left unread (WouldBlock) to the async read."""
    fs = BranchFileSystem(wd)
    limit, over = Path(wd.root, "limit.txt"), Path(wd.root, "over.txt")
    limit.write_text("x" * NOWAIT_MAX_BYTES)
    over.write_text("y" * (NOWAIT_MAX_BYTES + 1))
    assert read_nowait(fs, wd, str(limit)) == "x" * NOWAIT_MAX_BYTES
    with pytest.raises(trio.WouldBlock):
        read_nowait(fs, wd, str(over))
    assert "over.txt" not in wd.branch.changes  # not even harvested
    assert await read(fs, wd, str(over)) == "y" * (NOWAIT_MAX_BYTES + 1)
    assert "over.txt" in wd.branch.changes


async def test_nowait_write_lands_on_disk_and_in_the_branch(wd: Workdir) -> None:
    """A small write at once creates parents and lands on disk and in the branch."""
    fs = BranchFileSystem(wd)
    target = os.path.join(wd.root, "new", "deeper", "file.md")
    write_nowait(fs, wd, target, "# héllo\n")
    assert Path(target).read_text(encoding="utf-8") == "# héllo\n"
    assert wd.branch.read("new/deeper/file.md") == "# héllo\n".encode()
    assert not (await fs.harvest()).changed
    assert await read(fs, wd, target) == "# héllo\n"
    at_limit = "é" * (NOWAIT_MAX_BYTES // 2)  # exactly NOWAIT_MAX_BYTES bytes of UTF-8
    write_nowait(fs, wd, target, at_limit)
    assert wd.branch.read("new/deeper/file.md") == at_limit.encode()


async def test_nowait_write_over_the_limit_would_block_and_writes_nothing(wd: Workdir) -> None:
    """Content over NOWAIT_MAX_BYTES (in UTF-8 bytes) is left unwritten to the async write."""
    fs = BranchFileSystem(wd)
    target = os.path.join(wd.root, "big.txt")
    content = "é" * (NOWAIT_MAX_BYTES // 2 + 1)  # fewer characters than the limit, more bytes
    with pytest.raises(trio.WouldBlock):
        write_nowait(fs, wd, target, content)
    assert not os.path.exists(target)
    assert "big.txt" not in wd.branch.changes
    await write(fs, wd, target, content)
    assert wd.branch.read("big.txt") == content.encode()


async def _outcome(call: Callable[[], Awaitable[object]]) -> tuple[object, list[str]]:
    """What ``call`` returned or the JsonRpcError it raised, and the events it logged."""
    with capture_logs() as logs:
        try:
            value: object = await call()
        except JsonRpcError as e:
            value = (type(e), e.code, e.message, e.data)
    return value, [e["event"] for e in logs]


@pytest.mark.parametrize(
    "make_path",
    [
        lambda root, outside: os.path.join(root, "..", "outside", "secret.txt"),
        lambda root, outside: os.path.join(outside, "secret.txt"),
        lambda root, outside: os.path.join(root, "escape", "secret.txt"),
        lambda root, outside: os.path.join(root, "secret-link"),
        lambda root, outside: "relative/path.txt",
        lambda root, outside: root,
        lambda root, outside: os.path.join(root, "nope.txt"),
        lambda root, outside: os.path.join(root, "nodir", "nope.txt"),
        lambda root, outside: os.path.join(root, "src"),
        lambda root, outside: os.path.join(root, "latin1.txt"),
        lambda root, outside: os.path.join(root, "notes.txt", "inside-a-file"),
    ],
    ids=[
        "dotdot",
        "absolute-outside",
        "dir-symlink-out",
        "file-symlink-out",
        "relative",
        "branch-root",
        "missing",
        "missing-dir",
        "directory",
        "not-utf8",
        "through-a-file",
    ],
)
async def test_nowait_fails_as_the_async_methods_do(
    wd: Workdir, outside: Path, make_path: Any
) -> None:
    """Refused, missing, directory and non-UTF-8 paths fail at once as they do in a thread."""
    os.symlink(outside, Path(wd.root, "escape"))
    os.symlink(outside / "secret.txt", Path(wd.root, "secret-link"))
    path: str = make_path(wd.root, str(outside))
    fs = BranchFileSystem(wd)
    before = capture(outside)

    async def read_at_once() -> str:
        return read_nowait(fs, wd, path)

    async def write_at_once() -> None:
        write_nowait(fs, wd, path, "pwned\n")

    read_in_thread = await _outcome(lambda: read(fs, wd, path))
    assert await _outcome(read_at_once) == read_in_thread
    write_in_thread = await _outcome(lambda: write(fs, wd, path, "pwned\n"))
    assert await _outcome(write_at_once) == write_in_thread
    assert capture(outside) == before


async def test_nowait_would_block_while_a_harvest_holds_the_directory(wd: Workdir) -> None:
    """While another thread holds the workdir, nowait reads and writes leave it untouched."""
    fs = BranchFileSystem(wd)
    notes, target = os.path.join(wd.root, "notes.txt"), os.path.join(wd.root, "new.txt")
    with lock_held_by_another_thread(wd):
        with pytest.raises(trio.WouldBlock):
            read_nowait(fs, wd, notes)
        with pytest.raises(trio.WouldBlock):
            write_nowait(fs, wd, target, "new\n")
        assert not os.path.exists(target)
        assert "new.txt" not in wd.branch.changes
    assert read_nowait(fs, wd, notes) == TEXT
    write_nowait(fs, wd, target, "new\n")
    assert wd.branch.read("new.txt") == b"new\n"


async def test_router_delegates_nowait_requests(wd: Workdir) -> None:
    """The router serves nowait requests from the session's branch, WouldBlock included."""
    router = BranchRouter()
    router.bind("s1", BranchFileSystem(wd))
    assert read_nowait(router, wd, os.path.join(wd.root, "notes.txt"), limit=1) == "one\n"
    write_nowait(router, wd, os.path.join(wd.root, "r.txt"), "routed\n")
    assert wd.branch.read("r.txt") == b"routed\n"
    Path(wd.root, "big.txt").write_text("z" * (NOWAIT_MAX_BYTES + 1))
    with pytest.raises(trio.WouldBlock):
        read_nowait(router, wd, os.path.join(wd.root, "big.txt"))
    with pytest.raises(trio.WouldBlock):
        write_nowait(router, wd, os.path.join(wd.root, "r.txt"), "z" * (NOWAIT_MAX_BYTES + 1))
    assert wd.branch.read("r.txt") == b"routed\n"
    router.unbind("s1")
    with pytest.raises(InvalidParams, match="no branch"):
        read_nowait(router, wd, os.path.join(wd.root, "notes.txt"))
    with pytest.raises(InvalidParams, match="no branch"):
        write_nowait(router, wd, os.path.join(wd.root, "r.txt"), "x")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a\0b.txt", id="nul-byte"),
        pytest.param("x" * 256, id="name-over-NAME_MAX"),
        pytest.param("/".join(["p" * 200] * 21), id="path-over-PATH_MAX"),
        pytest.param("bad\ud800.txt", id="lone-surrogate"),
    ],
)
async def test_paths_that_can_name_no_file_are_invalid_params(wd: Workdir, name: str) -> None:
    """A path no system call could take is refused (-32602, logged) before any is made."""
    fs = BranchFileSystem(wd)
    path = os.path.join(wd.root, name)
    with capture_logs() as logs:
        with pytest.raises(InvalidParams) as info:
            await write(fs, wd, path, "x\n")
        with pytest.raises(InvalidParams):
            await read(fs, wd, path)
    assert info.value.data == {"path": display_name(path)}  # the form the agent is shown
    assert len(info.value.message) < 600  # a long path is cut in the message, whole in data
    assert [e["event"] for e in logs] == ["fs request refused"] * 2
    assert not wd.branch.changes


async def test_a_path_resolving_past_the_system_limit_is_invalid_params(wd: Workdir) -> None:
    """A short path that a symlink makes too long once resolved is refused like a long one."""
    fd = os.open(wd.root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(20):  # 4,020 bytes below the branch directory: made one level at a time
        os.mkdir("p" * 200, dir_fd=fd)
        deeper = os.open("p" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    os.symlink("/".join(["p" * 200] * 20), Path(wd.root, "short"))
    fs = BranchFileSystem(wd)
    with pytest.raises(InvalidParams, match="once resolved, a path of"):
        await write(fs, wd, os.path.join(wd.root, "short", "q" * 200), "x\n")
