"""Tests for orchestrator.vfs.service: fs/read_text_file and fs/write_text_file over a branch."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from orchestrator.agent.services import ClientServices, FileSystemService, SessionContext
from orchestrator.errors import InvalidParams, ResourceNotFound
from orchestrator.protocol import types as t
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Write
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.service import BranchFileSystem, BranchRouter, select_lines
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
