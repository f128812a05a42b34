"""The built-in demo agent, run as a process through our client with test services."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from attrs import define, field
from conftest import pid_gone
from fakes import AllowOnce

from orchestrator.agent.client import AgentConnection, open_agent
from orchestrator.agent.services import (
    ClientServices,
    SessionContext,
)
from orchestrator.agent.turn import TurnResult
from orchestrator.agents import resolve_agent
from orchestrator.demo.agent import HELP
from orchestrator.errors import ResourceNotFound
from orchestrator.protocol import types as t

LIMIT = 30.0

EVERY_INSTRUCTION = """\
Please do the following.
replace "colour" with "color" in *.md
rename old_name to new_name in src/**/*.py
append "more" to NOTES.md
create docs/new.md with "hello\\nworld"
delete junk.txt
run echo hi
"""


@define
class DirFs:
    """An fs service over one directory: real files, every request recorded."""

    root: Path
    reads: list[str] = field(factory=list)
    writes: list[str] = field(factory=list)
    #: called after each write (before it is answered)
    on_write: Callable[[SessionContext], Awaitable[None]] | None = None

    def _path(self, path: str) -> Path:
        p = Path(path)
        if not p.is_absolute() or not p.resolve().is_relative_to(self.root.resolve()):
            raise ResourceNotFound(f"{path} is outside {self.root}")
        return p

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """The file's text."""
        p = self._path(request.path)
        self.reads.append(str(p.relative_to(self.root)))
        return t.ReadTextFileResponse(content=p.read_text("utf-8"))

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Write the file."""
        p = self._path(request.path)
        p.write_text(request.content, "utf-8")
        self.writes.append(str(p.relative_to(self.root)))
        if self.on_write is not None:
            await self.on_write(ctx)
        return t.WriteTextFileResponse()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small project for the demo agent to edit."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("The colour is green.\nMy favourite colour.\n", "utf-8")
    (root / "NOTES.md").write_text("notes", "utf-8")
    (root / "src" / "app.py").write_text(
        "def old_name():\n    return old_name_helper()\n\nold_name()\n", "utf-8"
    )
    (root / "junk.txt").write_text("junk\n", "utf-8")
    return root


@asynccontextmanager
async def demo_agent(root: Path, services: ClientServices) -> AsyncIterator[AgentConnection]:
    """The demo agent as a process, with ``services``; its process must be gone afterwards."""
    pid = None
    async with open_agent(
        list(resolve_agent("demo").command),
        name="demo",
        cwd=root,
        services=services,
        term_grace=1.0,
    ) as conn:
        pid = conn.pid
        yield conn
    assert pid is not None
    assert pid_gone(pid)


async def test_every_instruction_edits_the_files(project: Path) -> None:
    """Each instruction kind changes the files as it says; fs edits go through the fs service."""
    fs = DirFs(project)
    with trio.fail_after(LIMIT):
        async with demo_agent(
            project, ClientServices(fs=fs, permission=AllowOnce(rule="allow-all"))
        ) as conn:
            session = await conn.new_session(project)
            result = await session.prompt(EVERY_INSTRUCTION)
    assert result.stop_reason == "end_turn"
    assert (project / "README.md").read_text(
        "utf-8"
    ) == "The color is green.\nMy favourite color.\n"
    assert (project / "src" / "app.py").read_text("utf-8") == (
        "def new_name():\n    return old_name_helper()\n\nnew_name()\n"
    )
    assert (project / "NOTES.md").read_text("utf-8") == "notes\nmore\n"
    assert (project / "docs" / "new.md").read_text("utf-8") == "hello\nworld"
    assert not (project / "junk.txt").exists()
    # edits of existing files went through fs/write_text_file; the new file went straight to disk
    assert fs.writes == ["README.md", "src/app.py", "NOTES.md"]
    assert fs.reads == ["NOTES.md", "README.md", "src/app.py", "NOTES.md", "junk.txt"]
    assert result.thoughts == "6 instruction(s)."
    assert "- Run echo hi: the client offers no terminal" in result.text
    assert result.text.startswith("Done.\n")
    assert result.usage is not None


async def test_tool_calls_carry_diffs_and_permissions_one_per_edit(project: Path) -> None:
    """Every edit is a tool call with a diff and one allowed permission; `run` fails."""
    with trio.fail_after(LIMIT):
        async with demo_agent(
            project, ClientServices(fs=DirFs(project), permission=AllowOnce(rule="allow-all"))
        ) as conn:
            session = await conn.new_session(project)
            result = await session.prompt(EVERY_INSTRUCTION)
    calls = result.tool_calls
    # NOTES.md matches *.md but has no "colour": read, not announced, no permission asked
    assert list(calls) == [
        "call-0-README.md",
        "call-1-src/app.py",
        "call-2-NOTES.md",
        "call-3-docs/new.md",
        "call-4-junk.txt",
        "call-5-run",
    ]
    edits = {
        "call-0-README.md": (
            "README.md",
            "The colour is green.\nMy favourite colour.\n",
            "The color is green.\nMy favourite color.\n",
        ),
        "call-1-src/app.py": (
            "src/app.py",
            "def old_name():\n    return old_name_helper()\n\nold_name()\n",
            "def new_name():\n    return old_name_helper()\n\nnew_name()\n",
        ),
        "call-2-NOTES.md": ("NOTES.md", "notes", "notes\nmore\n"),
        "call-3-docs/new.md": ("docs/new.md", None, "hello\nworld"),
        "call-4-junk.txt": ("junk.txt", "junk\n", ""),
    }
    for call_id, (rel, old, new) in edits.items():
        call = calls[call_id]
        assert call.status == "completed", call_id
        (diff,) = call.diffs()
        assert (diff.path, diff.old_text, diff.new_text) == (str(project / rel), old, new)
    assert calls["call-4-junk.txt"].kind == "delete"
    assert result.permissions[-1].kind == "delete"
    assert (calls["call-5-run"].kind, calls["call-5-run"].status) == ("execute", "failed")
    assert [(p.tool_call_id, p.verdict, p.option_id) for p in result.permissions] == [
        (call_id, "allow", "allow") for call_id in edits
    ]
    assert result.plan is not None
    assert len(result.plan) == 6
    assert {e.status for e in result.plan} == {"completed"}
    assert [e.content for e in result.plan][-1] == "Run echo hi"


async def test_rejected_edits_leave_files_alone(project: Path) -> None:
    """With the default (rejecting) permission service nothing is written."""
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    fs = DirFs(project)
    with trio.fail_after(LIMIT):
        async with demo_agent(project, ClientServices(fs=fs)) as conn:
            session = await conn.new_session(project)
            result = await session.prompt(EVERY_INSTRUCTION)
    assert result.stop_reason == "end_turn"
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    assert fs.writes == []
    assert len(result.permissions) == 5
    assert {(p.verdict, p.option_id, p.rule) for p in result.permissions} == {
        ("reject", "reject", "default")
    }
    assert result.tool_calls["call-0-README.md"].status == "failed"
    assert "README.md (permission refused)" in result.text


async def test_help_when_no_instruction(project: Path) -> None:
    """A prompt without an instruction gets the help text and no tool call."""
    with trio.fail_after(LIMIT):
        async with demo_agent(
            project, ClientServices(permission=AllowOnce(rule="allow-all"))
        ) as conn:
            session = await conn.new_session(project)
            result = await session.prompt("What can you do?")
    assert (result.stop_reason, result.text) == ("end_turn", HELP)
    assert result.tool_calls == {}
    assert result.plan is None


async def test_cancel_stops_between_instructions(project: Path) -> None:
    """A cancel during the first instruction: the second never runs and the turn is cancelled."""
    (project / "a.txt").write_text("a\n", "utf-8")
    (project / "b.txt").write_text("b\n", "utf-8")
    fs = DirFs(project)
    with trio.fail_after(LIMIT):
        async with demo_agent(
            project, ClientServices(fs=fs, permission=AllowOnce(rule="allow-all"))
        ) as conn:

            async def cancel_turn(ctx: SessionContext) -> None:
                # the notification goes out before the write's answer, so the agent sees it
                # before it moves on to the next instruction
                await conn.sessions[ctx.session_id].cancel()

            fs.on_write = cancel_turn
            session = await conn.new_session(project)
            result = await session.prompt('append "one" to a.txt\nappend "two" to b.txt')
    assert result.stop_reason == "cancelled"
    assert result.cancel_requested
    assert (project / "a.txt").read_text("utf-8") == "a\none\n"
    assert (project / "b.txt").read_text("utf-8") == "b\n"
    assert fs.writes == ["a.txt"]
    assert list(result.tool_calls) == ["call-0-a.txt"]
    assert result.plan is not None
    assert [e.status for e in result.plan] == ["completed", "in_progress"]


async def prompt_demo(project: Path, text: str, fs: DirFs | None = None) -> TurnResult:
    """One turn of the demo agent on ``project``, every permission allowed."""
    services = ClientServices(fs=fs or DirFs(project), permission=AllowOnce(rule="allow-all"))
    with trio.fail_after(LIMIT):
        async with demo_agent(project, services) as conn:
            session = await conn.new_session(project)
            return await session.prompt(text)


async def test_a_missing_file_is_reported_and_the_turn_goes_on(project: Path) -> None:
    """delete or append of a missing file is answered per instruction; the others still run."""
    result = await prompt_demo(
        project,
        'append "first" to NOTES.md\n'
        "delete nope.txt\n"
        'append "x" to missing/dir/file.md\n'
        'append "last" to NOTES.md\n',
    )
    assert result.stop_reason == "end_turn"
    assert result.text == (
        "Done.\n"
        "- Append a line to NOTES.md: NOTES.md\n"
        "- Delete nope.txt: nope.txt does not exist\n"
        "- Append a line to missing/dir/file.md: missing/dir/file.md does not exist\n"
        "- Append a line to NOTES.md: NOTES.md\n"
    )
    assert (project / "NOTES.md").read_text("utf-8") == "notes\nfirst\nlast\n"
    assert not (project / "missing").exists()
    assert list(result.tool_calls) == ["call-0-NOTES.md", "call-3-NOTES.md"]


async def test_an_error_answer_of_the_client_is_reported_and_the_turn_goes_on(
    project: Path, tmp_path: Path
) -> None:
    """A file the client refuses to read is named with the client's error; the turn goes on."""
    outside = tmp_path / "outside.md"
    outside.write_text("colour\n", "utf-8")
    (project / "link.md").symlink_to(outside)  # the fs service refuses what leads outside
    result = await prompt_demo(
        project, 'replace "colour" with "color" in *.md\nappend "more" to NOTES.md'
    )
    assert result.stop_reason == "end_turn"
    assert (
        f"- Replace 'colour' with 'color' in *.md: "
        f"README.md, link.md (not read: {project / 'link.md'} is outside {project})\n"
    ) in result.text
    assert "- Append a line to NOTES.md: NOTES.md\n" in result.text
    assert outside.read_text("utf-8") == "colour\n"
    assert (project / "NOTES.md").read_text("utf-8") == "notes\nmore\n"


async def test_double_star_alone_matches_every_file(project: Path) -> None:
    """``**`` (alone or at the end of a GLOB) matches every file below, as documented."""
    (project / "src" / "colour.txt").write_text("colour\n", "utf-8")
    result = await prompt_demo(
        project, 'replace "colour" with "color" in **\nreplace "notes" with "NOTES" in src/**'
    )
    assert result.text == (
        "Done.\n"
        "- Replace 'colour' with 'color' in **: README.md, src/colour.txt\n"
        "- Replace 'notes' with 'NOTES' in src/**: nothing changed in the 2 matching files\n"
    )
    assert (project / "src" / "colour.txt").read_text("utf-8") == "color\n"


async def test_files_an_edit_leaves_alone_are_no_tool_calls(project: Path) -> None:
    """Only files the edit changes are announced, asked about and written; none: nothing changed."""
    fs = DirFs(project)
    result = await prompt_demo(
        project, 'replace "colour" with "color" in **/*\nrename nothing_here to x in **/*.py', fs
    )
    assert list(result.tool_calls) == ["call-0-README.md"]
    assert [p.tool_call_id for p in result.permissions] == ["call-0-README.md"]
    assert fs.writes == ["README.md"]
    assert "- Rename nothing_here to x in **/*.py: nothing changed in the 1 matching file\n" in (
        result.text
    )


async def test_malformed_instruction_lines_are_answered_not_understood(project: Path) -> None:
    """A line starting with an instruction word that does not parse gets "not understood"
    with its reason, in its place; prose is ignored; the understood lines run."""
    result = await prompt_demo(
        project,
        "Please do this.\n"
        "rename a b to c in *.md\n"
        "rename old_name to 1abc in src/*.py\n"
        'append "oops to NOTES.md\n'
        "replace '' with 'x' in README.md\n"
        'append "done" to NOTES.md\n',
    )
    lines = result.text.splitlines()
    assert lines[0] == "Done."
    assert lines[1].startswith(
        "- not understood: rename a b to c in *.md (expected 'to' after OLD, found 'b'; "
        "the form is: rename OLD to NEW in GLOB)"
    )
    assert lines[2].startswith("- not understood: rename old_name to 1abc in src/*.py ('1abc'")
    assert lines[3].startswith('- not understood: append "oops to NOTES.md (a " quote')
    assert lines[4].startswith("- not understood: replace '' with 'x' in README.md (the text")
    assert lines[5] == "- Append a line to NOTES.md: NOTES.md"
    assert result.thoughts == "1 instruction(s). 4 line(s) not understood."
    assert (project / "README.md").read_text("utf-8").startswith("The colour is green.")
    assert (project / "NOTES.md").read_text("utf-8") == "notes\ndone\n"
    assert result.plan is not None
    assert [e.content for e in result.plan] == ["Append a line to NOTES.md"]


async def test_only_lines_not_understood_get_them_answered_and_the_help(project: Path) -> None:
    """With no instruction understood, the answer names the lines, then the help text."""
    result = await prompt_demo(project, "delete two words")
    assert result.text == (
        "Nothing done.\n"
        "- not understood: delete two words (unexpected 'words' after PATH; "
        "the form is: delete PATH)\n\n" + HELP
    )
    assert result.tool_calls == {}


async def test_a_file_name_that_is_not_utf8_is_skipped_and_the_others_edited(
    tmp_path: Path, state_dir: Path
) -> None:
    """A name JSON cannot carry (bytes not UTF-8) is skipped, said so; the other files change."""
    import os

    from orchestrator.runs import prompt

    root = tmp_path / "ws"
    root.mkdir()
    (root / "ok.md").write_text("colour\n")
    odd = root / os.fsdecode(b"caf\xe9-colour.md")  # its byte 0xe9 held as a surrogate
    odd.write_bytes(b"colour\n")
    with trio.fail_after(30):
        run = await prompt(
            "demo", 'replace "colour" with "color" in **/*.md', cwd=root, policy="edit"
        )
    assert (run.status, [(c.path, c.change) for c in run.changes]) == (
        "succeeded",
        [("ok.md", "modified")],
    )
    assert "caf\\xe9-colour.md (skipped: its name is not UTF-8" in run.turn.text
    assert "ok.md" in run.turn.text.splitlines()[1]
    assert odd.read_bytes() == b"colour\n"
