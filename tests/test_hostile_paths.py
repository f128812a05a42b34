"""Paths that can name no file, and trees of any depth: a hostile agent cannot crash ``prompt``.

The console script runs as a subprocess with scripted agents (subprocesses too) that send
``fs/*`` requests for paths holding a NUL byte, names over ``NAME_MAX`` and paths over
``PATH_MAX`` (each answered -32602, the turn going on), or write and read a thousand directories
deep; workspaces hold a chain of 1,100 directories, or one too long for the system to look up.
Every run prints its JSON and no traceback, and leaves no branch directory behind.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_chain
from run_helpers import CLI, agent_command, as_json, record_events, run_cli, write_agent

from orchestrator.testing import ReadFile, Say, Turn, WriteDisk, WriteFile
from orchestrator.vfs import remove_tree

EXIT_OK, EXIT_USAGE = 0, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path: Path, state_dir: Path) -> Iterator[None]:
    """Remove what the test made: pytest's own clean-up recurses once per directory level."""
    yield
    remove_tree(str(tmp_path))
    remove_tree(str(state_dir))


def fs_answers(script: Path) -> list[tuple[str, str, Any]]:
    """What each fs request of the agent got: (method, path, error code or None)."""
    out = []
    for event in record_events(script.with_suffix(".jsonl")):
        if event["event"] in ("fs_write", "fs_read"):
            error = event.get("error")
            out.append((event["event"], event["path"], error["code"] if error else None))
    return out


def no_branch_left(state: Path, run_id: str) -> bool:
    """Whether the run's branch directories are all gone."""
    branches = state / "runs" / run_id / "branches"
    return not branches.exists() or not any(branches.iterdir())


async def prompt(agent: str, project: Path, tmp_path: Path, state: Path, *extra: str) -> Any:
    """``orchestrator prompt --json`` with ``agent`` on ``project``."""
    return await run_cli(
        "prompt", "--json", "--policy", "edit", "--agent", agent, *extra,
        "--cwd", str(project), "go", cwd=tmp_path, state=state,
    )  # fmt: skip


UNUSABLE = [
    pytest.param("a\0b.txt", id="nul-byte"),
    pytest.param("n" * 5000 + ".txt", id="5000-character-name"),
    pytest.param("x" * 256, id="name-over-NAME_MAX"),
    pytest.param("/".join(["p" * 200] * 25) + "/f.txt", id="path-over-PATH_MAX"),
]


@pytest.mark.parametrize("name", UNUSABLE)
async def test_a_path_that_can_name_no_file_is_invalid_params_and_the_turn_goes_on(
    tmp_path: Path, project: Path, state_dir: Path, name: str
) -> None:
    """Writing and reading such a path answer -32602; the turn goes on, its JSON is printed."""
    script = write_agent(
        tmp_path / "h.json",
        Turn(
            steps=(
                WriteFile(name, "x\n"),
                ReadFile(name),
                WriteFile("ok.txt", "fine\n"),
                Say("done"),
            )
        ),
    )
    done = await prompt(f"h={shlex.join(agent_command(script))}", project, tmp_path, state_dir)
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_OK, stderr
    assert "Traceback" not in stderr
    result = as_json(done)
    assert (result["status"], result["text"]) == ("succeeded", "done")
    assert [c["path"] for c in result["changes"]] == ["ok.txt"]
    answers = [(method, code) for method, _, code in fs_answers(script)]
    assert answers == [("fs_write", -32602), ("fs_read", -32602), ("fs_write", None)]
    assert no_branch_left(state_dir, result["runId"])


async def test_a_file_a_thousand_directories_deep_is_written_read_and_applied(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """fs/write_text_file 1,000 directories deep works, the change applies; no branch is left."""
    deep = "/".join(["d"] * 1000) + "/f.txt"
    script = write_agent(
        tmp_path / "deep.json", Turn(steps=(WriteFile(deep, "deep\n"), ReadFile(deep), Say("ok")))
    )
    agent = f"deep={shlex.join(agent_command(script))}"
    done = await prompt(agent, project, tmp_path, state_dir, "--apply")
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_OK, stderr
    assert "Traceback" not in stderr
    result = as_json(done)
    assert (result["status"], result["applied"]) == ("succeeded", True)
    assert [c["path"] for c in result["changes"]] == [deep]
    assert [code for _, _, code in fs_answers(script)] == [None, None]
    assert (project / deep).read_text() == "deep\n"
    assert no_branch_left(state_dir, result["runId"])


async def test_a_workspace_holding_a_chain_of_1100_directories_is_checked_out(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """The agent reads the file at the bottom of the chain in its branch; the run succeeds."""
    make_chain(project, 1100)
    deep = "/".join(["d"] * 1100) + "/f.txt"
    script = write_agent(tmp_path / "r.json", Turn(steps=(ReadFile(deep), Say("read"))))
    done = await prompt(f"r={shlex.join(agent_command(script))}", project, tmp_path, state_dir)
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_OK, stderr
    assert "Traceback" not in stderr
    result = as_json(done)
    assert (result["status"], result["changes"]) == ("succeeded", [])
    reads = [e for e in record_events(script.with_suffix(".jsonl")) if e["event"] == "fs_read"]
    assert [e.get("content") for e in reads] == ["deep\n"]
    assert no_branch_left(state_dir, result["runId"])


async def test_a_workspace_too_deep_for_the_system_is_refused_before_the_run(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A directory path over PATH_MAX in the workspace: exit 2, one line, no run left."""
    make_chain(project, 22, name="p" * 200)
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    done = await prompt(f"s={shlex.join(agent_command(script))}", project, tmp_path, state_dir)
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1 and "too long for the system" in stderr
    assert as_json(done)["error"]["type"] == "UsageError"
    assert record_events(script.with_suffix(".jsonl")) == []  # no agent started
    runs = state_dir / "runs"
    assert not runs.exists() or not any(runs.iterdir())


async def test_names_of_255_bytes_are_written_harvested_and_applied(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A 255-byte name is edited through fs/write_text_file, two new ones are made (one by the
    client, one by the agent itself), and `prompt --apply` writes all three in the workspace."""
    edited = "m" * 251 + ".txt"
    made = "\u00e9" * 125 + "n.txt"  # two bytes a character: the longest name, cut in one
    own = "o" * 251 + ".txt"
    assert [len(os.fsencode(n)) for n in (edited, made, own)] == [255, 255, 255]
    (project / edited).write_text("old\n")
    script = write_agent(
        tmp_path / "long.json",
        Turn(
            steps=(
                WriteFile(edited, "new\n"),
                WriteFile(made, "made\n"),
                WriteDisk(own, "own\n"),
                Say("ok"),
            )
        ),
    )
    agent = f"long={shlex.join(agent_command(script))}"
    done = await prompt(agent, project, tmp_path, state_dir, "--apply")
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_OK, stderr
    assert "Traceback" not in stderr
    result = as_json(done)
    assert (result["status"], result["applied"]) == ("succeeded", True)
    assert sorted((c["path"], c["change"]) for c in result["changes"]) == sorted(
        [(edited, "modified"), (made, "added"), (own, "added")]
    )
    assert [code for _, _, code in fs_answers(script)] == [None, None]
    assert [(project / n).read_text() for n in (edited, made, own)] == ["new\n", "made\n", "own\n"]
    assert sorted(os.listdir(project)) == sorted(["README.md", edited, made, own])
    assert no_branch_left(state_dir, result["runId"])


async def test_writes_into_git_to_a_directory_path_or_through_a_lone_surrogate_are_refused(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """fs/write_text_file in or as `.git` (in any case), to a path ending in '/', or to a path
    holding a lone surrogate (sent as its JSON escape) is -32602 and writes nothing; `.git` the
    agent writes on disk itself is no change; the rest of the turn applies."""
    hook = "[core]\n\tfsmonitor = touch pwned\n"
    refused = [".git/config", ".GIT", "sub/.Git/HEAD", "README.md/", "new.txt/", "\ud800.txt"]
    script = write_agent(
        tmp_path / "g.json",
        Turn(
            steps=(
                *(WriteFile(path, hook) for path in refused),
                ReadFile("README.md/"),
                WriteDisk(".git/config", hook),
                WriteFile("ok.txt", "fine\n"),
                Say("done"),
            )
        ),
    )
    agent = f"g={shlex.join(agent_command(script))}"
    done = await prompt(agent, project, tmp_path, state_dir, "--apply")
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_OK, stderr
    assert "Traceback" not in stderr
    result = as_json(done)
    assert (result["status"], result["applied"]) == ("succeeded", True)
    assert [c["path"] for c in result["changes"]] == ["ok.txt"]
    writes = [e for e in record_events(script.with_suffix(".jsonl")) if e["event"] == "fs_write"]
    reasons = [e.get("error", {}).get("message", "") for e in writes]
    assert [e.get("error", {}).get("code") for e in writes] == [-32602] * 6 + [None]
    assert [r.rpartition(" ")[2] for r in reasons[:3]] == [".git", ".GIT", ".Git"], reasons
    assert all("no file is written in or as" in r for r in reasons[:3]), reasons
    assert all("names a directory" in r for r in reasons[3:5]), reasons
    assert "not valid Unicode" in reasons[5], reasons
    assert [code for method, _, code in fs_answers(script) if method == "fs_read"] == [-32602]
    assert sorted(os.listdir(project)) == ["README.md", "ok.txt"]
    assert (project / "README.md").read_text() == "# project\n"
    assert no_branch_left(state_dir, result["runId"])
