"""What the command line says, read by a person: one line per usage error, counts in the right
number, an agent's bad output quoted (bounded and escaped), errors as sentences and not Python
reprs. The console script runs as a subprocess; agents are real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from run_helpers import CLI, as_json, run_cli

import orchestrator
from orchestrator.errors import InternalError, InvalidParams, JsonRpcError
from orchestrator.jsonrpc.framing import excerpt

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


def error_line(done: subprocess.CompletedProcess[bytes], *words: str) -> str:
    """The one line of the command's stderr (no traceback, no usage block), naming ``words``."""
    stderr = done.stderr.decode()
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrator"), stderr
    for word in words:
        assert word in lines[0], stderr
    return lines[0]


def last_error(done: subprocess.CompletedProcess[bytes]) -> str:
    """The ``orchestrator: error:`` line of the command's stderr (logs may come before it)."""
    errors = [
        line for line in done.stderr.decode().splitlines() if line.startswith("orchestrator:")
    ]
    assert len(errors) == 1, done.stderr.decode()
    return errors[0]


def agent_file(path: Path, body: str) -> str:
    """An executable Python agent at ``path`` running ``body``; returns its command line."""
    path.write_text(f"#!{sys.executable}\nimport json, sys\n{body}")
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------------- --set


@pytest.mark.parametrize("value", ["[", '  {"a": 1', "[1,]", "{draft}"])
async def test_a_set_value_that_starts_like_json_and_is_not_is_refused(
    tmp_path: Path, project: Path, state_dir: Path, value: str
) -> None:
    """--set KEY=[... that is not JSON: exit 2, one line naming the key and where the JSON
    breaks, before anything runs (it used to reach the pipeline as a string)."""
    pipeline = tmp_path / "p.py"
    pipeline.write_text("from orchestrator import step\n\n@step\ndef s(x) -> str:\n    return x\n")
    done = await run_cli(
        "run", str(pipeline), "--set", f"x={value}", "--cwd", str(project), "--no-progress",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    error_line(done, "--set x: ", "not valid JSON", "column ")
    assert not (state_dir / "runs").exists()


async def test_text_that_starts_with_a_bracket_goes_as_a_json_string(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """The way out the error names: a JSON string starting with [ reaches the step as text."""
    pipeline = tmp_path / "p.py"
    pipeline.write_text("from orchestrator import step\n\n@step\ndef s(x) -> str:\n    return x\n")
    done = await run_cli(
        "run", str(pipeline), "--set", 'x="[draft] notes"', "--cwd", str(project), "--json",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert as_json(done)["steps"]["s"]["instances"]["s"]["value"] == "[draft] notes"


# --------------------------------------------------------------------------- agents' bad output

#: an agent that writes text (an escape sequence in it) on stdout instead of JSON-RPC, and exits
GARBAGE = "sys.stdout.write('hello \\x1b[31mI am not json\\n' + 'x' * 500 + '\\n')\n"


async def test_an_agent_that_prints_no_json_is_quoted_in_the_check(
    tmp_path: Path, state_dir: Path
) -> None:
    """agents --check of an agent printing text: the cause quotes the start of what it sent
    (escaped, bounded), and the next step points at no stderr section that is not there."""
    command = agent_file(tmp_path / "garbage", GARBAGE)
    done = await run_cli(
        "agents", "--check", "--json", "--log-json", f"g={command}", cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    check = as_json(done)["agents"][0]["check"]
    assert check["stderrTail"] is None
    assert check["cause"].endswith(
        "before answering initialize; instead of JSON-RPC it wrote on stdout: "
        '"hello \\x1b[31mI am not json"'
    )
    assert "read its stderr" not in check["nextStep"]
    assert "only JSON-RPC messages on stdout" in check["nextStep"]
    # the log line names the line too, bounded (JSON lines with --log-json)
    logs = [json.loads(line) for line in done.stderr.decode().splitlines()]
    malformed = [e for e in logs if e["event"] == "malformed JSON from peer"]
    assert [e["line"] for e in malformed] == [
        '"hello \\x1b[31mI am not json"',
        '"' + "x" * 80 + '"...',
    ]

    shown = await run_cli("agents", "--check", f"g={command}", cwd=tmp_path, state=state_dir)
    out = shown.stdout.decode()
    assert "\x1b" not in out
    assert "read its stderr" not in out and "  stderr" not in out


async def test_an_agent_that_prints_no_json_is_quoted_when_prompted(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """prompt with such an agent: the error says what it sent instead of answering."""
    command = agent_file(tmp_path / "garbage", GARBAGE)
    done = await run_cli(
        "prompt", "--agent", f"g={command}", "--cwd", str(project), "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED
    line = last_error(done)
    assert line.startswith("orchestrator: error: agent 'g': exited before completing initialize")
    assert line.endswith('it had sent a line that is not JSON: "hello \\x1b[31mI am not json"')


#: an agent that answers initialize with a bare number
NUMBER = (
    "request = json.loads(sys.stdin.readline())\n"
    "print(json.dumps({'jsonrpc': '2.0', 'id': request['id'], 'result': 5}), flush=True)\n"
    "sys.stdin.read()\n"
)


async def test_an_answer_to_initialize_that_does_not_fit_is_one_sentence(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """initialize answered with a number: the agent named, no Python dict in sight."""
    command = agent_file(tmp_path / "number", NUMBER)
    said = "its answer to initialize is not an InitializeResponse: expected an object, got number"
    done = await run_cli(
        "prompt", "--agent", f"n={command}", "--cwd", str(project), "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED
    assert last_error(done) == f"orchestrator: error: agent 'n': {said}"

    checked = await run_cli(
        "agents", "--check", "--json", f"n={command}", cwd=tmp_path, state=state_dir
    )
    check = as_json(checked)["agents"][0]["check"]
    assert check["error"] == said
    assert check["cause"] == "its answer to initialize does not follow ACP"


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (InternalError("boom", data={"details": "disk full"}),
         'boom (code -32603): {"details": "disk full"}'),
        (InternalError("boom", data="line one\n  line two"),
         "boom (code -32603): line one line two"),
        (InternalError("boom", data=[1, None, True]), "boom (code -32603): [1, null, true]"),
        (InternalError("boom", data={}), "boom (code -32603)"),
        (InvalidParams("bad", data={"path": ""}), 'bad (code -32602): {"path": ""}'),
        (JsonRpcError("odd", data=3.5, code=7), "odd (code 7): 3.5"),
    ],
)  # fmt: skip
def test_an_error_with_data_reads_as_one_line_of_json(error: JsonRpcError, text: str) -> None:
    """A JSON-RPC error's data is shown as JSON text on the same line, never as a Python repr."""
    assert str(error) == text


def test_an_errors_data_is_bounded() -> None:
    """Data of any size shows at most 300 characters."""
    text = str(InternalError("boom", data={"log": "x" * 10_000}))
    assert len(text) < 330 and text.endswith("...")


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (b"plain text", '"plain text"'),
        (b"tab\there \\ back", '"tab\\there \\\\ back"'),
        (b"caf\xe9 \xe2\x80\xae", '"caf\\xe9 \\u202e"'),
        (b"y" * 81, '"' + "y" * 80 + '"...'),
        ("é".encode() * 100, '"' + "é" * 80 + '"...'),
    ],
)
def test_an_excerpt_of_a_line_is_escaped_and_bounded(line: bytes, shown: str) -> None:
    """A received line is quoted with controls, bidi overrides and bytes that are not UTF-8
    escaped, and cut at 80 characters."""
    assert excerpt(line) == shown


# --------------------------------------------------------------------------- counts, names


async def test_counts_of_one_are_singular(tmp_path: Path, project: Path, state_dir: Path) -> None:
    """One file, one permission request, one tool call: said in the singular everywhere."""
    (project / "NOTES.md").write_text("notes\n")
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "edit", "--apply", "--cwd", str(project),
        "--json", 'append "x" to NOTES.md', cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    run_id = as_json(done)["runId"]
    again = await run_cli(
        "prompt", "--agent", "demo", "--policy", "edit", "--apply", "--cwd", str(project),
        'append "y" to NOTES.md', cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert "applied to the workspace (1 file)\n" in again.stdout.decode()
    shown = (await run_cli("show", run_id, cwd=tmp_path, state=state_dir)).stdout.decode()
    assert "end_turn, 1 tool call, permissions 1 asked: 1 allowed, 0 rejected," in shown
    assert " 1 file changed, 1 insertion(+)\n" in shown


async def test_a_name_with_no_command_says_so(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """--agent x= names an agent and gives it no command: exit 2, saying just that."""
    done = await run_cli(
        "prompt", "--agent", "x=", "--cwd", str(project), "hi", cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_USAGE
    assert error_line(done) == "orchestrator: error: x=: no command after the ="


@pytest.mark.parametrize(
    ("where", "says"),
    [("afile", "--report afile: not a directory"),
     ("afile/sub", "--report afile/sub: afile is not a directory")],
)  # fmt: skip
async def test_a_report_path_that_is_a_file_is_not_a_directory(
    tmp_path: Path, project: Path, state_dir: Path, where: str, says: str
) -> None:
    """--report naming a file (or a path under one): exit 2, saying it is not a directory."""
    (tmp_path / "afile").write_text("a file\n")
    done = await run_cli(
        "compare", "--agent", "demo", "--cwd", str(project), "--report", where, "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE
    assert error_line(done) == f"orchestrator: error: {says}"
    assert not (state_dir / "runs").exists()


async def test_diff_of_an_unknown_step_lists_the_steps(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """diff RUN --step with no such step names the run's steps, as apply does."""
    done = await run_cli(
        "prompt", "--agent", "demo", "--cwd", str(project), "--json", "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    run_id = as_json(done)["runId"]
    for command in ("diff", "apply"):
        refused = await run_cli(
            command, run_id, "--step", "prompt[zz]", cwd=tmp_path, state=state_dir
        )
        assert refused.returncode == EXIT_USAGE
        assert error_line(refused).endswith(
            f"run {run_id} has no step 'prompt[zz]' (finished: prompt)"
        )


async def test_an_agent_named_twice_is_checked_once(tmp_path: Path, state_dir: Path) -> None:
    """agents --check demo demo: one check, one row."""
    done = await run_cli(
        "agents", "--check", "--json", "demo", "demo", cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert [row["name"] for row in as_json(done)["agents"]] == ["demo"]
    shown = await run_cli("agents", "--check", "demo", "demo", cwd=tmp_path, state=state_dir)
    assert shown.stdout.decode().endswith("checked 1: 1 ok\n")


# --------------------------------------------------------------------------- the parser


async def test_version_prints_the_package_version(tmp_path: Path, state_dir: Path) -> None:
    """--version prints the version of the package (the one pyproject.toml declares)."""
    done = await run_cli("--version", cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_OK
    root = Path(__file__).resolve().parent.parent
    declared: Any = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert declared == orchestrator.__version__
    assert done.stdout.decode() == f"orchestrator {declared}\n"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "p.py", "--max-sessions", "0"],
         "orchestrator run: error: argument --max-sessions: must be at least 1, got 0 "
         "(see orchestrator run --help)"),
        (["prompt", "--agent", "demo", "--timeout", "nan", "hi"],
         "orchestrator prompt: error: argument --timeout: "),
        ([], "orchestrator: error: the following arguments are required: command"),
        (["frobnicate"], "orchestrator: error: argument command: invalid choice: 'frobnicate'"),
        (["runs", "--limit"], "orchestrator runs: error: argument --limit: expected one argument"),
    ],
)  # fmt: skip
async def test_a_parser_error_is_one_line(
    tmp_path: Path, state_dir: Path, argv: list[str], says: str
) -> None:
    """Bad arguments: exit 2 and one line, no usage block (with where to find help)."""
    done = await run_cli(*argv, cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE
    line = error_line(done, says)
    assert line.startswith(says) and line.endswith(" --help)")
