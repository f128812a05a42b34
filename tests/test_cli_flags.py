"""The command line's flags and inputs, through the console script: ``-v`` and ``--log-json``
before or after the command, ``--no-progress`` on every run command, the prompt from standard
input or a file, and ``--model``/``--mode`` (``NAME:MODEL`` in ``compare``) with the demo
agent, which offers the models ``demo-fast`` and ``demo-slow`` and the modes ``edit`` and
``plan``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from run_helpers import CLI, CLI_LIMIT, as_json
from schema_check import validate_transcript

EXIT_OK, EXIT_USAGE = 0, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: an instruction of the demo agent that changes README.md
TASK = 'replace "colour" with "color" in README.md'

PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def fix(task: str) -> str:
    return task
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with one file the task changes."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "README.md").write_text("the colour\n")
    return root


async def cli(
    *args: str, cwd: Path, state: Path, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """The console script run to its end with ``stdin`` on its standard input."""
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), *args],
            cwd=cwd,
            env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)},
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def log_lines(done: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    """The JSON log lines the command wrote on stderr."""
    out = []
    for line in done.stderr.decode().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def one_error_line(done: subprocess.CompletedProcess[bytes], *words: str) -> None:
    """The command exited 2 with one line on stderr holding ``words``, and no traceback."""
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("orchestrator: error: ")
    for word in words:
        assert word in lines[0]


# --------------------------------------------------------------------------- -v, --log-json


@pytest.mark.parametrize(
    ("before", "after", "debug"),
    [((), ("-v",), False), (("-v",), ("-v",), True), ((), ("-vv",), True)],
    ids=["after", "before-and-after", "vv-after"],
)
async def test_verbosity_counts_before_and_after_the_command(
    before: tuple[str, ...], after: tuple[str, ...], debug: bool, ws: Path, tmp_path: Path
) -> None:
    """-v before and after the command add up (two make debug), and --log-json works after
    it: every log line on stderr is a JSON object."""
    done = await cli(
        *before,
        "prompt",
        "--agent",
        "demo",
        "--no-progress",
        TASK,
        *after,
        "--log-json",
        cwd=ws,
        state=tmp_path / "state",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    logs = log_lines(done)
    assert "run started" in {e["event"] for e in logs}  # info: one -v at least
    assert any(e["level"] == "debug" for e in logs) is debug


# --------------------------------------------------------------------------- --no-progress


async def test_prompt_no_progress_prints_the_reply_without_streaming(
    ws: Path, tmp_path: Path
) -> None:
    """prompt --no-progress prints the reply on stdout and no tool call lines on stderr."""
    state = tmp_path / "state"
    shown = await cli("prompt", "--agent", "demo", TASK, cwd=ws, state=state)
    quiet = await cli("prompt", "--agent", "demo", "--no-progress", TASK, cwd=ws, state=state)
    assert quiet.returncode == EXIT_OK, quiet.stderr.decode()
    # the same reply; the endings (after a blank line) differ only in run id and time
    assert quiet.stdout.split(b"\n\n")[0] == shown.stdout.split(b"\n\n")[0]
    assert quiet.stdout.startswith(b"Done.\n")
    assert b" tool     > edit: " in shown.stderr
    assert b" tool " not in quiet.stderr


@pytest.mark.parametrize("command", ["prompt", "compare", "run", "resume"])
async def test_every_run_command_takes_no_progress(command: str, ws: Path, tmp_path: Path) -> None:
    """prompt, compare, run and resume take --no-progress and then report no progress."""
    state = tmp_path / "state"
    (tmp_path / "fix.py").write_text(PIPELINE)
    argv = {
        "prompt": ["prompt", "--agent", "demo", TASK],
        "compare": ["compare", "--agent", "demo", TASK],
        "run": ["run", str(tmp_path / "fix.py"), "--set", f"task={TASK}"],
    }
    if command == "resume":
        first = await cli(*argv["run"], "--json", cwd=ws, state=state)
        argv["resume"] = ["resume", as_json(first)["runId"]]
    done = await cli(*argv[command], "--no-progress", cwd=ws, state=state)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    err = done.stderr.decode()
    for progress in ("started ", "done     ", "permit ", "tool "):
        assert progress not in err


# --------------------------------------------------------------------------- the prompt's text


@pytest.mark.parametrize("how", ["stdin", "stdin-file", "file"])
@pytest.mark.parametrize("command", ["prompt", "compare"])
async def test_the_prompt_comes_from_stdin_or_a_file(
    command: str, how: str, ws: Path, tmp_path: Path
) -> None:
    """`-` reads the prompt from standard input, --prompt-file F from F (- for stdin too)."""
    task = tmp_path / "task.txt"
    task.write_text(TASK + "\n")
    given = {
        "stdin": ["-"],
        "stdin-file": ["--prompt-file", "-"],
        "file": ["--prompt-file", str(task)],
    }[how]
    done = await cli(
        command,
        "--agent",
        "demo",
        "--policy",
        "edit",
        "--json",
        *given,
        cwd=ws,
        state=tmp_path / "state",
        stdin=(TASK + "\n").encode() if how != "file" else b"",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    text = result["text"] if command == "prompt" else result["agents"][0]["text"]
    assert text == "Done.\n- Replace 'colour' with 'color' in README.md: README.md\n"
    runs = as_json(await cli("runs", "--json", cwd=ws, state=tmp_path / "state"))["runs"]
    assert runs[0]["inputs"] == {("text" if command == "prompt" else "task"): TASK + "\n"}


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("missing", ("--prompt-file", "no-such.txt", "No such file")),
        ("not-utf8", ("--prompt-file", "not UTF-8")),
        ("stdin-not-utf8", ("standard input", "not UTF-8")),
        ("both", ("TEXT", "--prompt-file", "not both")),
        ("neither", ("no prompt",)),
        ("empty", ("the prompt is empty",)),
        ("empty-file", ("--prompt-file", "is empty")),
        ("empty-stdin", ("standard input is empty",)),
    ],
)
@pytest.mark.parametrize("command", ["prompt", "compare"])
async def test_a_prompt_that_cannot_be_read_is_one_line_exit_2(
    command: str, case: str, words: tuple[str, ...], ws: Path, tmp_path: Path
) -> None:
    """A missing or non-UTF-8 prompt file, both TEXT and --prompt-file, none, or an empty
    prompt: one line on stderr, exit 2, no agent started and no run recorded."""
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "blank.txt").write_text(" \n\n")
    given, stdin = {
        "missing": (["--prompt-file", str(tmp_path / "no-such.txt")], b""),
        "not-utf8": (["--prompt-file", str(tmp_path / "bad.txt")], b""),
        "stdin-not-utf8": (["-"], b"caf\xe9\n"),
        "both": (["--prompt-file", str(tmp_path / "blank.txt"), TASK], b""),
        "neither": ([], b""),
        "empty": ([" "], b""),
        "empty-file": (["--prompt-file", str(tmp_path / "blank.txt")], b""),
        "empty-stdin": (["-"], b"\n"),
    }[case]
    state = tmp_path / "state"
    done = await cli(command, "--agent", "demo", *given, cwd=ws, state=state, stdin=stdin)
    one_error_line(done, *words)
    runs = await cli("runs", "--json", cwd=ws, state=state)
    assert as_json(runs)["runs"] == []


# --------------------------------------------------------------------------- --model, --mode


async def test_prompt_model_and_mode_take_effect_and_are_recorded(ws: Path, tmp_path: Path) -> None:
    """--model and --mode are set through the agent's config options before the turn (every
    frame valid ACP); the agent runs them, and the result and the run store say so."""
    state, wire = tmp_path / "state", tmp_path / "wire.ndjson"
    done = await cli(
        "prompt", "--agent", "demo", "--model", "Demo slow", "--mode", "plan",
        "--policy", "edit", "--transcript", str(wire), "--json", TASK,
        cwd=ws, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert (result["model"], result["mode"]) == ("demo-slow", "plan")
    assert result["text"].startswith("Done (model demo-slow, mode plan).\n")
    assert result["changes"] == []  # plan mode changes nothing
    assert (ws / "README.md").read_text() == "the colour\n"
    sent = [
        json.loads(line)["msg"]
        for line in wire.read_text().splitlines()
        if json.loads(line)["dir"] == "send"
    ]
    settings = [m["params"] for m in sent if m.get("method") == "session/set_config_option"]
    assert [(s["configId"], s["value"]) for s in settings] == [
        ("mode", "plan"),
        ("model", "demo-slow"),
    ]
    assert validate_transcript(wire).validated > 0
    shown = as_json(await cli("show", result["runId"], "--json", cwd=ws, state=state))
    assert (shown["model"], shown["mode"]) == ("demo-slow", "plan")


async def test_without_model_the_agents_default_is_recorded(ws: Path, tmp_path: Path) -> None:
    """Without --model the result names the model the agent ran by default."""
    done = await cli("prompt", "--agent", "demo", "--json", TASK, cwd=ws, state=tmp_path / "s")
    result = as_json(done)
    assert (result["model"], result["mode"]) == ("demo-fast", "edit")
    assert result["text"].startswith("Done.\n")


@pytest.mark.parametrize(
    ("flag", "value", "offered"),
    [("--model", "huge", "demo-fast, demo-slow"), ("--mode", "yolo", "edit, plan")],
)
@pytest.mark.parametrize("as_json_output", [False, True], ids=["text", "json"])
async def test_a_model_or_mode_not_offered_is_one_line_exit_2(
    flag: str, value: str, offered: str, as_json_output: bool, ws: Path, tmp_path: Path
) -> None:
    """A model or mode the agent does not offer: exit 2, one line naming those it offers
    (NotOffered in --json), and no turn."""
    extra = ["--json"] if as_json_output else []
    done = await cli(
        "prompt", "--agent", "demo", flag, value, *extra, TASK, cwd=ws, state=tmp_path / "s"
    )
    what = flag.removeprefix("--")
    one_error_line(done, f"offers no {what} {value!r}", f"it offers: {offered}")
    if as_json_output:
        error = as_json(done)
        assert error["error"]["type"] == "NotOffered"
        assert error["exitCode"] == EXIT_USAGE
        assert "runId" in error
    else:
        assert done.stdout == b""


async def test_compare_puts_one_agent_on_two_models_labelled_apart(
    ws: Path, tmp_path: Path
) -> None:
    """compare --agent demo:demo-fast --agent demo:demo-slow runs the demo agent on each
    model, labelled apart, in text and in --json; each agent ran its own model."""
    state = tmp_path / "state"
    agents = ["--agent", "demo:demo-fast", "--agent", "demo:demo-slow"]
    done = await cli("compare", *agents, "--json", TASK, cwd=ws, state=state)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    ran = {a["name"]: (a["model"], a["text"].splitlines()[0]) for a in result["agents"]}
    assert ran == {
        "demo:demo-fast": ("demo-fast", "Done (model demo-fast, mode edit)."),
        "demo:demo-slow": ("demo-slow", "Done (model demo-slow, mode edit)."),
    }
    text = await cli("compare", *agents, "--no-progress", TASK, cwd=ws, state=state)
    assert text.returncode == EXIT_OK, text.stderr.decode()
    shown = (text.stdout + text.stderr).decode()
    assert "demo:demo-fast" in shown and "demo:demo-slow" in shown


async def test_compare_model_and_mode_for_every_agent(ws: Path, tmp_path: Path) -> None:
    """compare --model sets the model of the agents that name none; --mode every agent's."""
    done = await cli(
        "compare", "--agent", "demo", "--agent", "b=demo:demo-fast",
        "--model", "demo-slow", "--mode", "plan", "--json", TASK,
        cwd=ws, state=tmp_path / "state",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    ran = {a["name"]: (a["model"], a["mode"]) for a in as_json(done)["agents"]}
    assert ran == {"demo": ("demo-slow", "plan"), "b": ("demo-fast", "plan")}


async def test_compare_with_a_model_not_offered_fails_that_agent_alone(
    ws: Path, tmp_path: Path
) -> None:
    """A compared agent on a model it does not offer fails like any failed agent (its entry
    failed with the error naming the models it offers); the other one runs and wins, the
    table and the winner are printed and the exit follows the comparison (0), text and --json."""
    state = tmp_path / "state"
    agents = ["--agent", "demo:demo-fast", "--agent", "demo:nope"]
    error = "agent demo:nope offers no model 'nope'; it offers: demo-fast, demo-slow"
    done = await cli("compare", *agents, "--no-progress", TASK, cwd=ws, state=state)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    out = done.stdout.decode()
    rows = out.split("\n\n")[0].splitlines()
    assert rows[1].split()[:3] == ["*", "demo:demo-fast", "succeeded"]
    assert rows[2].split()[:2] == ["demo:nope", "failed"]
    assert f"demo:nope:\n  (no message)\n  error: {error}\n" in out
    assert "winner: demo:demo-fast (" in out
    assert "orchestrator: error" not in done.stderr.decode()
    result = as_json(await cli("compare", *agents, "--json", TASK, cwd=ws, state=state))
    assert (result["status"], result["winner"]) == ("succeeded", "demo:demo-fast")
    assert [(a["name"], a["status"], a["error"]) for a in result["agents"]] == [
        ("demo:demo-fast", "succeeded", None),
        ("demo:nope", "failed", error),
    ]
    runs = as_json(await cli("runs", "--json", cwd=ws, state=state))["runs"]
    assert [r["kind"] for r in runs] == ["compare", "compare"]


async def test_a_pipeline_step_names_an_agent_on_a_model(ws: Path, tmp_path: Path) -> None:
    """@step(agent="demo:demo-slow") runs the demo agent on demo-slow, recorded with the step."""
    (tmp_path / "slow.py").write_text(PIPELINE.replace('agent="demo"', 'agent="demo:demo-slow"'))
    done = await cli(
        "run", str(tmp_path / "slow.py"), "--set", f"task={TASK}", "--json",
        cwd=ws, state=tmp_path / "state",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    step = as_json(done)["steps"]["fix"]
    (instance,) = step["instances"].values()
    assert (instance["agent"], instance["model"]) == ("demo:demo-slow", "demo-slow")
    assert instance["text"].startswith("Done (model demo-slow, mode edit).\n")


async def test_prompt_tool_calls_off_a_terminal_are_progress_lines(
    ws: Path, tmp_path: Path
) -> None:
    """Off a terminal prompt's tool calls are lines in the log format, JSON with --log-json
    (every stderr line then parses), as the progress of the other run commands."""
    state = tmp_path / "state"
    plain = await cli("prompt", "--agent", "demo", "--policy", "edit", TASK, cwd=ws, state=state)
    assert plain.returncode == EXIT_OK, plain.stderr.decode()
    lines = plain.stderr.decode().splitlines()
    assert lines and all(re.match(r"\d\d:\d\d:\d\d (info|warning) +tool +[<>] ", x) for x in lines)
    done = await cli(
        "prompt", "--agent", "demo", "--policy", "edit", "--log-json", TASK, cwd=ws, state=state
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    events = [json.loads(line) for line in done.stderr.decode().splitlines()]
    assert [e["event"] for e in events][:2] == ["tool_call", "tool_call_update"]
    assert events[0]["kind"] == "edit" and events[1]["status"] == "completed"
