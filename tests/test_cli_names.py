"""File names that are not UTF-8, end to end through the console script.

The workspace holds ``caf\\xe9.txt`` (latin-1: the byte 0xe9) and, beside it, a file literally
named ``caf\\xe9.txt`` with a backslash. A scripted agent (a real subprocess) lists its directory
through a terminal, edits the file under the name it was shown there, and writes a file whose
name is not UTF-8 into its working directory itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import CLI, agent_command, as_json, record_events, run_cli, write_script

from orchestrator._names import name_of
from orchestrator.cli.output import output_schema
from orchestrator.testing import ReadFile, Replace, Say, Terminal, Turn, WriteDisk
from orchestrator.vfs.testing import git

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

LATIN1 = name_of(b"caf\xe9.txt")
LITERAL = "caf\\xe9.txt"
NEW = name_of(b"n\xffw.txt")
CHANGES = [
    {"path": "caf\\xe9.txt", "pathBytes": "Y2Fm6S50eHQ=", "change": "modified"},
    {"path": "n\\xffw.txt", "pathBytes": "bv93LnR4dA==", "change": "added"},
]


def valid(document: Any) -> Any:
    """``document``, checked against the shipped output schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    return document


def project(root: Path) -> Path:
    """A git repository holding the latin-1 file and its literal lookalike."""
    root.mkdir()
    (root / LATIN1).write_bytes(b"hello\n")
    (root / LITERAL).write_bytes(b"literal\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


async def test_prompt_applies_to_the_exact_files_and_every_output_names_them_alike(
    tmp_path: Path, state_dir: Path
) -> None:
    """`prompt --json --apply` edits the latin-1 file itself (no new file), makes the agent's
    new file under its exact bytes, records the run, and `show`, `diff` and `changes.patch`
    name the files the documented way (display + pathBytes, git quoting)."""
    ws = project(tmp_path / "ws")
    pristine = tmp_path / "pristine"
    shutil.copytree(ws, pristine)
    script = write_script(
        tmp_path / "agent.json",
        Turn(
            steps=(
                Terminal(command="ls"),
                ReadFile(path="caf\\xe9.txt", then_write=Replace(old="hello", new="bonjour")),
                WriteDisk(path="n\\xffw.txt", content="new\n"),
                Say(text="done"),
            )
        ),
    )
    agent = f"names={shlex.join(agent_command(script))}"
    done = await run_cli(
        "prompt",
        *("--agent", agent, "--policy", "trusted", "--cwd", str(ws)),
        *("--json", "--apply", "edit the file"),
        cwd=tmp_path,
        state=state_dir,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result = valid(as_json(done))
    assert result["changes"] == CHANGES
    assert result["applied"] is True
    assert '--- "a/caf\\351.txt"\n+++ "b/caf\\351.txt"\n' in result["diff"]

    # the agent saw the name as \xe9 in its terminal, and that text reached the exact file
    events = record_events(script.with_suffix(".jsonl"))
    (listing,) = [e["output"] for e in events if e["event"] == "terminal"]
    assert "caf\\xe9.txt" in listing.splitlines()
    (read,) = [e for e in events if e["event"] == "fs_read"]
    assert read["content"] == "hello\n"
    listed = sorted(os.listdir(os.fsencode(ws)))
    assert listed == [b".git", b"caf\\xe9.txt", b"caf\xe9.txt", b"n\xffw.txt"]
    assert (ws / LATIN1).read_bytes() == b"bonjour\n"
    assert (ws / LITERAL).read_bytes() == b"literal\n"
    assert (ws / NEW).read_bytes() == b"new\n"

    # the run is recorded, names exactly
    run_id = result["runId"]
    shown = valid(as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir)))
    assert shown["changes"] == CHANGES
    assert shown["status"] == "succeeded"
    text = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    # the diff stat names it as --json does, with its count from the diff
    [stat] = [line for line in text.stdout.decode().splitlines() if " caf\\xe9.txt " in line]
    assert stat.split("|")[1].split()[0].isdigit(), stat
    diff = await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)
    assert '+++ "b/n\\377w.txt"' in diff.stdout.decode()

    # changes.patch applies to the workspace as it was, with the same result
    patch = Path(result["patch"])
    git(pristine, "apply", "--check", str(patch))
    git(pristine, "apply", str(patch))
    for name in (LATIN1, LITERAL, NEW):
        assert (pristine / name).read_bytes() == (ws / name).read_bytes()
