"""Every command goes one way: config, store check, recorded settings, one escalation choice.

The console script runs as a subprocess against scripted agents (subprocesses too): ``prompt``
reads the project's ``.orchestrator.toml`` like ``run`` and ``compare``; every command opens and
checks the run store before an agent starts; ``resume`` restores the policy, limits and agents a
run was started with; ``ask`` rules reach the human at the terminal under every command.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import sqlite3
import termios
from pathlib import Path

import orjson
import pytest
import trio
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    configure,
    prompts,
    run_cli,
    snapshot,
    write_agent,
)

from orchestrator.agent.client import ClientOptions
from orchestrator.agent.turn import DEFAULT_MAX_TURN_RECORD_BYTES
from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.policy import Policy, PolicySet, Rule
from orchestrator.runs.settings import RunSettings, restore_settings
from orchestrator.store import STORE_FILENAME
from orchestrator.testing import (
    AskPermission,
    Crash,
    Location,
    PermissionToolCall,
    Say,
    Turn,
    WriteFile,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


def editing_turn(path: str = "README.md") -> Turn:
    """Ask to edit ``path``; when allowed, write it and say done (a reject ends the turn)."""
    call = PermissionToolCall(
        id="edit-1", title=f"Edit {path}", kind="edit", locations=(Location(path=path),)
    )
    return Turn(
        steps=(
            AskPermission(tool_call=call, on_reject="end_turn"),
            WriteFile(path=path, content="edited\n"),
            Say(text="done"),
        )
    )


async def test_prompt_resolves_agents_from_the_project_config(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """An agent defined in .orchestrator.toml works with prompt, as with run and compare."""
    script = write_agent(tmp_path / "mine.json", editing_turn())
    configure(project, mine=script)
    done = await run_cli(
        "prompt", "--agent", "mine", "--policy", "edit", "--json", "go",
        cwd=project, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["agent"]["name"] == "mine"
    assert result["changes"] == [{"path": "README.md", "change": "modified"}]
    assert prompts(script) == 1
    # a prompt reads in runs and show like any run
    listed = await run_cli("runs", cwd=project, state=state_dir)
    assert f"{result['runId']}" in listed.stdout.decode()
    assert "prompt" in listed.stdout.decode() and "go" in listed.stdout.decode()
    shown = (await run_cli("show", result["runId"], cwd=project, state=state_dir)).stdout.decode()
    assert re.search(r"^mine( \(.*\))?: end_turn, ", shown, re.MULTILINE), shown
    assert " README.md | 2 +-\n" in shown


async def test_every_command_checks_the_store_before_an_agent_starts(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A store of a newer schema: prompt --apply and compare exit 1 before any agent starts."""
    script = write_agent(tmp_path / "mine.json", editing_turn())
    state_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(state_dir / STORE_FILENAME) as db:
        db.execute("PRAGMA user_version = 999")
    before = snapshot(project)
    agent = f"mine={shlex.join(agent_command(script))}"
    for argv in (
        ["prompt", "--apply", "--policy", "edit", "--agent", agent, "go"],
        ["compare", "--policy", "edit", "--agent", agent, "go"],
    ):
        done = await run_cli(*argv, "--cwd", str(project), cwd=tmp_path, state=state_dir)
        assert done.returncode == EXIT_FAILED, done.stderr.decode()
        assert "newer" in done.stderr.decode() or "version" in done.stderr.decode()
        assert "Traceback" not in done.stderr.decode()
    assert prompts(script) == 0
    assert snapshot(project) == before


PIPELINE = """\
from orchestrator import step


@step(agent="editor")
def edit(task: str) -> str:
    return task
"""


async def failed_edit_run(tmp_path: Path, project: Path, state_dir: Path) -> str:
    """A pipeline run under --policy edit whose agent crashes; the editor then fixed. Its id."""
    crashing = write_agent(tmp_path / "crashing.json", Turn(steps=(Crash(exit_code=3),)))
    configure(project, editor=crashing)
    pipeline = tmp_path / "edit.py"
    pipeline.write_text(PIPELINE)
    first = await run_cli(
        "run", str(pipeline), "--set", "task=go", "--policy", "edit", "--json",
        "--cwd", str(project), cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert first.returncode == EXIT_FAILED, first.stderr.decode()
    # the user fixes the agent's command, and resumes
    configure(project, editor=write_agent(tmp_path / "fixed.json", editing_turn()))
    return str(as_json(first)["runId"])


async def test_resume_restores_the_policy_the_run_started_with(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A run started with --policy edit, resumed without it, still allows the edit."""
    run_id = await failed_edit_run(tmp_path, project, state_dir)  # resumed without --policy
    resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    assert result["status"] == "succeeded"
    assert result["changes"] == [{"path": "README.md", "change": "modified"}]
    [instance] = result["steps"]["edit"]["instances"].values()
    assert [(p["verdict"], p["rule"]) for p in instance["permissions"]] == [
        ("allow", "run/edit: edit in workspace")
    ]
    assert "policy" in result["restored"]["restored"]
    assert result["restored"]["policy"] == "edit"
    assert "agents.editor" in result["restored"]["overridden"]
    # said in words too
    again = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    assert again.returncode == EXIT_OK


async def test_resume_policy_option_overrides_the_recorded_one(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """resume --policy deny-all replaces the recorded policy: the edit is rejected."""
    run_id = await failed_edit_run(tmp_path, project, state_dir)
    resumed = await run_cli(
        "resume", run_id, "--policy", "deny-all", "--json", cwd=tmp_path, state=state_dir
    )
    result = as_json(resumed)
    assert result["restored"]["overridden"][0] == "policy"
    assert result["changes"] == []
    [instance] = result["steps"]["edit"]["instances"].values()
    assert [p["verdict"] for p in instance["permissions"]] == ["reject"]


def test_settings_round_trip_without_secret_values() -> None:
    """Recorded settings keep rules and limits; secret values are stored by name and read again."""
    policy = PolicySet(run=Policy.preset("edit", Rule("ask", name="ask net", kinds="fetch")))
    spec = AgentSpec("a", ("agent", "--acp"), {"API_KEY": "s3cret", "MODE": "fast"})
    recorded = RunSettings(policy, "custom.toml", {}, 3, {"a": spec}, max_file_size=2048).to_json()
    assert "s3cret" not in json.dumps(recorded)
    back = restore_settings(recorded, Config.builtin(), environ={"API_KEY": "again"})
    assert back.settings.policy == policy
    assert back.settings.max_sessions == 3
    assert back.settings.max_file_size == 2048
    assert back.settings.agents["a"].env == {"API_KEY": "again", "MODE": "fast"}
    assert back.restored == ("policy", "maxSessions", "maxFileSize", "agents")
    lost = restore_settings(recorded, Config.builtin(), environ={})
    assert lost.missing_secrets == ("API_KEY",)


def test_recorded_limits_are_restored_over_the_config() -> None:
    """A run records the [limits] its config set; a resume restores them, the config fills in
    the ones the record lacks, and they reach the agents' client options."""
    recorded = RunSettings(limits={"max_requests_in_flight": 50}).to_json()
    config = Config.from_toml("[limits]\nmax_requests_in_flight = 9\nmax_unsent_bytes = 4096\n")
    back = restore_settings(recorded, config, environ={})
    assert back.settings.limits == {"max_requests_in_flight": 50, "max_unsent_bytes": 4096}
    assert "limits" in back.restored
    options = back.settings.client_options(ClientOptions(cancel_grace=3.0))
    assert (options.max_requests_in_flight, options.max_unsent_bytes) == (50, 4096)
    assert options.cancel_grace == 3.0
    assert back.settings.max_turn_record_bytes == DEFAULT_MAX_TURN_RECORD_BYTES


# --------------------------------------------------------------------------- ask at the terminal

ASK_EDITS = """\
[[rules]]
name = "ask to edit"
verdict = "ask"
kinds = ["edit"]
"""


async def _on_a_terminal(
    argv: list[str], *, cwd: Path, state: Path, answer: bytes, watch: float = 0.0
) -> str:
    """Run the console script with a terminal of its own; answer its question with ``answer``
    (after ``watch`` seconds of reading what the command writes while the question stands,
    which is kept between ``<asking>`` and ``</asking>`` in what is returned).

    Returns everything the command wrote to the terminal.
    """
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO  # the test reads what the command writes, not its own typing
    termios.tcsetattr(slave, termios.TCSANOW, attrs)

    def controlling_terminal() -> None:  # runs in the child, after setsid
        import fcntl

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    seen = b""
    with trio.fail_after(CLI_LIMIT):
        proc = await trio.lowlevel.open_process(
            [str(CLI), *argv],
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        os.set_blocking(master, False)
        try:
            answered = False
            while proc.poll() is None or not answered:
                await trio.lowlevel.wait_readable(master)
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal closed: the command ended
                    break
                seen += chunk
                if not answered and b"Allow?" in seen:
                    seen += b"<asking>" + await _read_for(master, watch) + b"</asking>"
                    os.write(master, answer)
                    answered = True
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
            os.close(master)
    return seen.decode(errors="replace")


async def _read_for(fd: int, seconds: float) -> bytes:
    """What arrives on ``fd`` within ``seconds``."""
    got = b""
    with trio.move_on_after(seconds):
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                got += os.read(fd, 65536)
            except OSError:
                break
    return got


async def test_the_live_table_is_not_drawn_over_a_question(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """While a question stands, the live table stops redrawing, then goes on after it."""
    script = write_agent(tmp_path / "editor.json", editing_turn())
    configure(project, editor=script)
    policy = tmp_path / "ask.toml"
    policy.write_text(ASK_EDITS)
    pipeline = tmp_path / "edit.py"
    pipeline.write_text(PIPELINE)
    argv = ["run", str(pipeline), "--set", "task=go", "--policy", str(policy)]
    # the table redraws four times a second: a second with the question up would show some
    seen = await _on_a_terminal(
        [*argv, "--cwd", str(project)], cwd=tmp_path, state=state_dir, answer=b"y\n", watch=1.0
    )
    before, rest = seen.split("<asking>")
    during, after = rest.split("</asking>")
    assert "Allow?" in before and "━" in before
    assert during == ""
    assert "succeeded" in after
    assert prompts(script) == 1


@pytest.mark.parametrize("command", ["run", "compare"])
async def test_ask_rules_reach_the_terminal_under_every_command(
    tmp_path: Path, project: Path, state_dir: Path, command: str
) -> None:
    """An ask rule asks the human at the terminal under run and compare (not only prompt)."""
    script = write_agent(tmp_path / "editor.json", editing_turn())
    configure(project, editor=script)
    policy = tmp_path / "ask.toml"
    policy.write_text(ASK_EDITS)
    pipeline = tmp_path / "edit.py"
    pipeline.write_text(PIPELINE)
    head = ["run", str(pipeline), "--set", "task=go"] if command == "run" else ["compare"]
    if command == "compare":
        head += ["--agent", "editor"]
    tail = ["go"] if command == "compare" else []
    argv = [*head, "--policy", str(policy), "--cwd", str(project), "--no-progress", *tail]
    seen = await _on_a_terminal(argv, cwd=tmp_path, state=state_dir, answer=b"y\n")
    assert "Allow?" in seen
    assert "succeeded" in seen
    assert prompts(script) == 1
    runs = await run_cli("runs", "--json", cwd=tmp_path, state=state_dir)
    [run] = as_json(runs)["runs"]
    shown = as_json(await run_cli("show", run["runId"], "--json", cwd=tmp_path, state=state_dir))
    body = shown["agents"][0] if command == "compare" else shown["steps"]["edit"]["instances"]
    instance = body if command == "compare" else next(iter(body.values()))
    assert [p["verdict"] for p in instance["permissions"]] == ["allow"]


async def test_a_prompt_keeps_its_wire_transcript_unless_declined(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """prompt records its wire transcript in the store, with --transcript or without; a
    library caller's record_transcripts=False declines it."""
    from orchestrator import prompt
    from orchestrator.store import open_run_store

    plain = await run_cli(
        "prompt", "--agent", "demo", "--json", "hello", cwd=project, state=state_dir
    )
    asked_file = tmp_path / "wire.ndjson"
    asked = await run_cli(
        "prompt", "--agent", "demo", "--json", "--transcript", str(asked_file), "hello",
        cwd=project, state=state_dir,
    )  # fmt: skip
    assert plain.returncode == asked.returncode == EXIT_OK
    declined = await prompt(
        "demo", "hello", cwd=project, state_dir=state_dir, record_transcripts=False
    )
    assert declined.status == "succeeded"
    async with open_run_store(state_dir) as store:
        assert await store.transcript_sources(as_json(plain)["runId"]) == ["demo"]
        methods = [
            line["msg"].get("method")
            for line in await store.transcript(as_json(plain)["runId"])
            if line.get("dir") == "send"
        ]
        assert methods[:3] == ["initialize", "session/new", "session/prompt"]
        assert await store.transcript_sources(declined.run_id) == []
        kept = await store.transcript(as_json(asked)["runId"])
    frames = [orjson.loads(line) for line in asked_file.read_bytes().splitlines()]
    assert [f["msg"].get("method") for f in frames if f["dir"] == "send"][:2] == [
        "initialize",
        "session/new",
    ]
    assert len(kept) == len(frames)
