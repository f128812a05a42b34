"""Bad input is one clear line and exit 2, never a traceback; a step's own exit fails only it.

The console script runs as a subprocess (against scripted agents, subprocesses too). Each case
checks the exit code, that stderr holds one ``orchestrator: error:`` line and no traceback,
and that nothing ran or was written where it must not be.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    prompts,
    run_cli,
    snapshot,
    write_agent,
)

from orchestrator.sync import run_pipeline_sync
from orchestrator.testing import Say, Turn, WriteFile

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


def one_error_line(done: subprocess.CompletedProcess[bytes], *words: str) -> str:
    """The command's stderr, checked to be one error line naming ``words``, without traceback."""
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrator"), stderr
    for word in words:
        assert word in lines[0], stderr
    return lines[0]


def _drop_privileges() -> None:
    """In the child: a user namespace of its own, where root's capabilities do not reach the
    files outside (so permission bits hold for it as for anyone)."""
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


async def run_unprivileged(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the console script without the power to write where permission bits say no."""
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), *args],
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            preexec_fn=_drop_privileges if os.geteuid() == 0 else None,
        )


def _a_file(state: Path) -> str:
    state.write_text("not a directory\n")
    return str(state)


def _under_a_file(state: Path) -> str:
    state.write_text("not a directory\n")
    return str(state / "state")


def _store_a_directory(state: Path) -> str:
    (state / "runs.sqlite3").mkdir(parents=True)
    return str(state)


def _empty(state: Path) -> str:
    return ""


def _applies_a_file(state: Path) -> str:
    state.mkdir()
    (state / "applies").write_text("not a directory\n")
    return str(state)


def _runs_a_file(state: Path) -> str:
    state.mkdir()
    (state / "runs").write_text("not a directory\n")
    return str(state)


def _runs_a_dangling_link(state: Path) -> str:
    state.mkdir()
    (state / "runs").symlink_to(state / "nowhere")
    return str(state)


def _store_a_dangling_link(state: Path) -> str:
    state.mkdir()
    (state / "runs.sqlite3").symlink_to(state.parent / "outside.sqlite3")
    return str(state)


def _store_a_link_to_a_store(state: Path) -> str:
    (state.parent / "other").mkdir()
    (state.parent / "other" / "runs.sqlite3").write_bytes(b"")
    state.mkdir()
    (state / "runs.sqlite3").symlink_to(state.parent / "other" / "runs.sqlite3")
    return str(state)


def _journal(text: str) -> Callable[[Path], str]:
    def make(state: Path) -> str:
        (state / "applies" / "j1").mkdir(parents=True)
        (state / "applies" / "j1" / "journal.json").write_text(text)
        return str(state)

    return make


STATE_DIRS: list[tuple[str, Callable[[Path], str], str]] = [
    ("a-file", _a_file, "is not a directory"),
    ("under-a-file", _under_a_file, "is not a directory"),
    ("store-is-a-directory", _store_a_directory, "runs.sqlite3 is not a file"),
    ("empty-path", _empty, "empty path"),
    ("applies-a-file", _applies_a_file, "/applies is not a directory"),
    ("runs-a-file", _runs_a_file, "/runs is not a directory"),
    ("runs-a-dangling-link", _runs_a_dangling_link, "/runs is not a directory"),
    ("store-a-dangling-link", _store_a_dangling_link, "runs.sqlite3 is a symbolic link"),
    ("store-a-link-to-a-store", _store_a_link_to_a_store, "runs.sqlite3 is a symbolic link"),
    ("journal-not-json", _journal("{"), "/applies/j1/journal.json is damaged"),
    ("journal-not-an-object", _journal("[]"), "/applies/j1/journal.json is damaged"),
    (
        "journal-entry-without-action",
        _journal('{"workspace": "/w", "entries": [{"path": "a"}]}'),
        "/applies/j1/journal.json is damaged (an entry has no known action",
    ),
]


@pytest.mark.parametrize("command", ["prompt", "runs", "apply"])
@pytest.mark.parametrize(("make", "says"), [pytest.param(m, s, id=i) for i, m, s in STATE_DIRS])
async def test_a_state_directory_that_cannot_be_one_is_refused(
    tmp_path: Path,
    project: Path,
    command: str,
    make: Callable[[Path], str],
    says: str,
) -> None:
    """--state-dir a file, under a file, holding a directory or a link for its store, a file
    for its runs or applies directory or a damaged apply journal, empty: exit 2, one line
    naming the broken entry; nothing created where a link leads."""
    state = make(tmp_path / "state")
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    argv = {
        "prompt": ["prompt", "--agent", f"s={shlex.join(agent_command(script))}", "--cwd",
                   str(project), "go"],
        "runs": ["runs"],
        "apply": ["apply", "0123456789ab"],
    }[command]  # fmt: skip
    done = await run_cli(*argv, "--state-dir", state, cwd=tmp_path, state=tmp_path / "x")
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, says)
    assert prompts(script) == 0
    assert not (tmp_path / "outside.sqlite3").exists()


@pytest.mark.parametrize("command", ["prompt", "runs"])
@pytest.mark.parametrize("where", ["the-directory", "a-missing-one-in-it", "the-store"])
async def test_a_read_only_state_directory_is_refused(
    tmp_path: Path, project: Path, command: str, where: str
) -> None:
    """A state directory (or its store) this process cannot write: exit 2, one line."""
    state = tmp_path / "state"
    state.mkdir()
    if where == "the-store":
        made = await run_cli("runs", "--state-dir", str(state), cwd=tmp_path, state=state)
        assert made.returncode == EXIT_OK, made.stderr.decode()
        (state / "runs.sqlite3").chmod(0o444)
    state.chmod(0o555 if where != "the-store" else 0o755)
    target = state / "sub" if where == "a-missing-one-in-it" else state
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    argv = {
        "prompt": ["prompt", "--agent", f"s={shlex.join(agent_command(script))}", "--cwd",
                   str(project), "go"],
        "runs": ["runs"],
    }[command]  # fmt: skip
    try:
        done = await run_unprivileged(*argv, "--state-dir", str(target), cwd=tmp_path)
    finally:
        state.chmod(0o755)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, "not writable" if where != "a-missing-one-in-it" else "cannot create")
    assert prompts(script) == 0


async def test_a_state_directory_inside_the_workspace_is_refused_and_leaves_nothing(
    tmp_path: Path, project: Path
) -> None:
    """--state-dir inside --cwd: exit 2 before anything is created; the workspace is as it was."""
    script = write_agent(tmp_path / "w.json", Turn(steps=(WriteFile("README.md", "x\n"),)))
    before = snapshot(project)
    (project / "link").symlink_to(project)  # through a symlink too
    for state in (project / ".state", project / "link" / "nested" / "state", project):
        done = await run_cli(
            "prompt", "--policy", "edit", "--apply", "--agent",
            f"w={shlex.join(agent_command(script))}", "--state-dir", str(state),
            "--cwd", str(project), "go", cwd=tmp_path, state=tmp_path / "x",
        )  # fmt: skip
        assert done.returncode == EXIT_USAGE, done.stderr.decode()
        one_error_line(done, "inside the workspace")
    (project / "link").unlink()
    assert sorted(p.name for p in project.iterdir()) == ["README.md"]
    assert snapshot(project) == before
    assert prompts(script) == 0


STEP_EXITS = [
    pytest.param("raise SystemExit(3)", "SystemExit(3)", id="SystemExit"),
    pytest.param("sys.exit('bye')", "SystemExit('bye')", id="sys.exit"),
    pytest.param("raise KeyboardInterrupt", "KeyboardInterrupt", id="KeyboardInterrupt"),
]


@pytest.mark.parametrize("kind", ["def", "async def"])
@pytest.mark.parametrize(("statement", "says"), STEP_EXITS)
async def test_an_exit_raised_in_a_step_fails_that_step_and_the_run_goes_on(
    tmp_path: Path, project: Path, state_dir: Path, kind: str, statement: str, says: str
) -> None:
    """SystemExit / KeyboardInterrupt from a step's code: that step fails (where it was raised
    in the message, its traceback kept), its dependents are skipped, the others run; the run is
    recorded."""
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "import sys\nfrom orchestrator import step\n\n"
        f"@step\n{kind} leaves() -> str:\n    {statement}\n\n"
        "@step\ndef other() -> str:\n    return 'fine'\n\n"
        "@step\ndef after(leaves: str) -> str:\n    return leaves\n"
    )
    done = await run_cli(
        "run", str(pipeline), "--json", "--cwd", str(project), cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    result = as_json(done)
    steps = result["steps"]
    assert (steps["leaves"]["status"], steps["other"]["status"]) == ("failed", "succeeded")
    assert steps["after"]["status"] == "skipped"
    assert steps["leaves"]["error"].startswith(f"{says} raised at {pipeline}:6 in leaves")
    # its traceback, as any exception's: from the step's own frame, where it was raised
    trace = str(steps["leaves"]["traceback"])
    assert trace.startswith("Traceback (most recent call last):"), trace
    assert f'File "{pipeline}", line 6, in leaves' in trace and statement in trace, trace
    assert trace.splitlines()[-1].startswith(says.partition("(")[0]), trace
    assert "orchestrator/pipeline" not in trace, trace
    assert steps["leaves"]["errorKind"] == "exception"
    listed = await run_cli("runs", "--json", cwd=tmp_path, state=state_dir)
    assert [r["status"] for r in as_json(listed)["runs"]] == ["failed"]


def test_a_real_interrupt_during_a_step_still_interrupts_the_run(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """SIGINT delivered to the process while a step's code runs (not raised by it) interrupts
    the whole run."""
    pipeline = tmp_path / "p.py"
    # to the process, as Ctrl-C sends it: its main thread handles it, wherever the run is
    pipeline.write_text(
        "import os, signal, trio\nfrom orchestrator import step\n\n"
        "@step\nasync def hello() -> str:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    await trio.sleep_forever()\n"
        "    return 'not interrupted'\n"
    )
    try:
        run_pipeline_sync(str(pipeline), cwd=project, state_dir=state_dir)
    except BaseException as e:  # what ended the run is checked below
        interrupted = e
    else:
        pytest.fail("the run was not interrupted")
    if isinstance(interrupted, BaseExceptionGroup):
        assert interrupted.split(KeyboardInterrupt)[0] is not None, interrupted
    else:
        assert isinstance(interrupted, KeyboardInterrupt), interrupted
    listed = subprocess.run(
        [str(CLI), "runs", "--json", "--state-dir", str(state_dir)], capture_output=True, check=True
    )
    assert [r["status"] for r in as_json(listed)["runs"]] == ["interrupted"]


BAD_POLICIES = [
    pytest.param('[[rules]]\nverdict = "allow"\npaths = ["[z-a]"]\n', "rules[0]", id="glob"),
    pytest.param(
        '[[rules]]\nname = "docs"\nverdict = "allow"\npaths = ["docs/**", "src/[z-a].py"]\n',
        "rules[0] ('docs'): bad path glob 'src/[z-a].py'",
        id="named-rule-glob",
    ),
    pytest.param(
        '[steps.review]\n[[steps.review.rules]]\nverdict = "reject"\npaths = ["[z-a]"]\n',
        "[steps.review] rules[0]",
        id="step-rule-glob",
    ),
    pytest.param("x = " + "[" * 10_000 + "]" * 10_000 + "\n", "nested too deeply", id="deep"),
    pytest.param("ask_timeout = nan\n", "ask_timeout", id="ask-timeout-nan"),
    pytest.param("ask_timeout = inf\n", "ask_timeout", id="ask-timeout-inf"),
]


@pytest.mark.parametrize(("text", "says"), BAD_POLICIES)
async def test_a_bad_policy_file_is_refused_when_loaded(
    tmp_path: Path, project: Path, state_dir: Path, text: str, says: str
) -> None:
    """A path glob that makes no regex, TOML nested 10,000 deep, a NaN timeout: exit 2."""
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    done = await run_cli(
        "prompt", "--policy", str(policy), "--agent", f"s={shlex.join(agent_command(script))}",
        "--cwd", str(project), "go", cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, str(policy), says)
    assert prompts(script) == 0


async def test_a_project_config_nested_too_deeply_is_refused(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """.orchestrator.toml holding arrays nested 10,000 deep: exit 2, one line."""
    (project / ".orchestrator.toml").write_text("x = " + "[" * 10_000 + "]" * 10_000 + "\n")
    done = await run_cli(
        "prompt", "--agent", "demo", "--cwd", str(project), "go", cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, ".orchestrator.toml", "nested too deeply")


@pytest.mark.parametrize("depth", [101, 10_000])
async def test_set_json_nested_too_deeply_is_refused(
    tmp_path: Path, project: Path, state_dir: Path, depth: int
) -> None:
    """--set with JSON nested deeper than 100 levels: exit 2; 100 levels run."""
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n@step\ndef s(x) -> str:\n    return 'ok'\n"
    )

    async def run(levels: int) -> subprocess.CompletedProcess[bytes]:
        value = "[" * levels + "]" * levels
        return await run_cli(
            "run", str(pipeline), "--set", f"x={value}", "--cwd", str(project),
            "--no-progress", cwd=tmp_path, state=state_dir,
        )  # fmt: skip

    refused = await run(depth)
    assert refused.returncode == EXIT_USAGE, refused.stderr.decode()
    one_error_line(refused, "--set x", "more than 100 levels")
    done = await run(100)
    assert done.returncode == EXIT_OK, done.stderr.decode()


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-1", "0"])
@pytest.mark.parametrize(
    "argv",
    [
        ["prompt", "--agent", "demo", "--timeout"],
        ["prompt", "--agent", "demo", "--idle-timeout"],
        ["compare", "--agent", "demo", "--timeout"],
        ["compare", "--agent", "demo", "--idle-timeout"],
    ],
    ids=lambda argv: f"{argv[0]}-{argv[-1]}",
)
async def test_seconds_that_are_no_duration_are_usage_errors(
    tmp_path: Path, project: Path, state_dir: Path, argv: list[str], value: str
) -> None:
    """--timeout / --idle-timeout NaN, infinite, 0, negative or not a number: exit 2, one line
    naming the option, before anything starts (no run recorded)."""
    done = await run_cli(
        *argv, value, "--json", "--cwd", str(project), "go", cwd=tmp_path, state=state_dir
    )
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, f"argument {argv[-1]}")
    assert as_json(done)["exitCode"] == EXIT_USAGE
    assert not (state_dir / "runs").exists()


#: bytes that are not UTF-8, as the os module gives them (lone surrogates)
NOT_UTF8 = os.fsdecode(b"w\xe9s")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        pytest.param(["prompt", "--agent", "AGENT", "--cwd", "PROJECT", os.fsdecode(b"hi\xff")],
                     "an argument is not UTF-8 text: hi\\xff", id="prompt-text"),
        pytest.param(["prompt", "--agent", "AGENT", "--cwd", "ODD", "go"],
                     "argument --cwd is not UTF-8 text: ", id="prompt-cwd"),
        pytest.param(["compare", "--agent", "AGENT", "--cwd=ODD", "go"],
                     "argument --cwd is not UTF-8 text: ", id="compare-cwd"),
        pytest.param(["run", "PIPELINE", "--cwd", "ODD"],
                     "argument --cwd is not UTF-8 text: ", id="run-cwd"),
        pytest.param(["prompt", "--agent", "AGENT", "--cwd", "PROJECT", "--state-dir", "ODD",
                      "go"], "argument --state-dir is not UTF-8 text: ", id="prompt-state-dir"),
        pytest.param(["run", "PIPELINE", "--cwd", "PROJECT", "--set", f"x={NOT_UTF8}"],
                     "argument --set is not UTF-8 text: x=w\\xe9s", id="run-set"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
async def test_command_line_text_that_is_not_utf8_is_refused(
    tmp_path: Path, project: Path, state_dir: Path, argv: list[str], says: str, json_out: bool
) -> None:
    """An argument holding bytes that are not UTF-8 (a prompt, --cwd, --state-dir, --set):
    exit 2, one line showing them as \\xHH, before any agent starts or anything is recorded."""
    odd = tmp_path / NOT_UTF8
    odd.mkdir()
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n@step\ndef s() -> str:\n    return 'ok'\n"
    )
    given = {
        "AGENT": f"s={shlex.join(agent_command(script))}",
        "PROJECT": str(project),
        "ODD": str(odd),
        "--cwd=ODD": f"--cwd={odd}",
        "PIPELINE": str(pipeline),
    }
    args = [given.get(a, a) for a in argv] + (["--json"] if json_out else [])
    done = await run_cli(*args, cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, says)
    if json_out:
        assert as_json(done)["error"]["type"] == "UsageError"
    assert prompts(script) == 0
    assert not (state_dir / "runs").exists()


@pytest.mark.parametrize("command", ["prompt", "compare", "run"])
async def test_a_workspace_whose_path_is_not_utf8_is_refused(
    tmp_path: Path, state_dir: Path, command: str
) -> None:
    """The workspace (the default --cwd ., here a directory named by non-UTF-8 bytes): exit 2,
    one line naming it as \\xHH, nothing recorded (a run records it as text)."""
    odd = tmp_path / NOT_UTF8
    odd.mkdir()
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n@step\ndef s() -> str:\n    return 'ok'\n"
    )
    agent = f"s={shlex.join(agent_command(script))}"
    argv = {
        "prompt": ["prompt", "--agent", agent, "go"],
        "compare": ["compare", "--agent", agent, "go"],
        "run": ["run", str(pipeline), "--no-progress"],
    }[command]
    done = await run_cli(*argv, cwd=odd, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, "workspace", "w\\xe9s is not a UTF-8 path")
    assert prompts(script) == 0
    assert not (state_dir / "runs").exists()


@pytest.mark.parametrize("command", ["prompt", "runs"])
async def test_a_state_directory_whose_path_is_not_utf8_is_refused(
    tmp_path: Path, project: Path, command: str
) -> None:
    """$ORCHESTRATOR_STATE_DIR naming a path that is not UTF-8: exit 2, one line, nothing made."""
    state = tmp_path / os.fsdecode(b"s\xff")
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    argv = {
        "prompt": ["prompt", "--agent", f"s={shlex.join(agent_command(script))}", "--cwd",
                   str(project), "go"],
        "runs": ["runs"],
    }[command]  # fmt: skip
    done = await run_cli(*argv, cwd=tmp_path, state=state)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, "state directory", "s\\xff is not a UTF-8 path")
    assert prompts(script) == 0
    assert not state.exists()


@pytest.mark.parametrize(
    ("argv", "value", "says"),
    [
        (["runs", "--limit"], "99999999999999999999999", "must be at most 1,000,000,000"),
        (["run", "p.py", "--max-sessions"], "99999999999999999999", "must be at most"),
        (["compare", "--agent", "demo", "go", "--max-sessions"], "1000000001", "must be at most"),
        (["resume", "0123456789ab", "--max-sessions"], "10000000000", "must be at most"),
        (["runs", "--limit"], "\u0661\u0662\u0663", "expected a whole number"),
        (["runs", "--limit"], "1_0", "expected a whole number"),
        (["prompt", "--agent", "demo", "go", "--max-file-size"], "\u0661\u0662\u0663",
         "is not a size"),
        (["compare", "--agent", "demo", "go", "--max-file-size"], "\u0661K", "is not a size"),
    ],
    ids=lambda x: "-".join(x[:1] + x[-1:]) if isinstance(x, list) else None,
)  # fmt: skip
async def test_number_options_out_of_range_or_not_ascii_are_usage_errors(
    tmp_path: Path, project: Path, state_dir: Path, argv: list[str], value: str, says: str
) -> None:
    """A whole-number option beyond the bound (SQLite and JSON hold 64 bits), or a number in
    digits other than ASCII (Arabic-Indic, underscores): exit 2, one line, no run recorded."""
    extra = [] if argv[0] in ("runs", "resume") else ["--cwd", str(project)]
    done = await run_cli(*argv, value, "--json", *extra, cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, f"argument {argv[-1]}", says)
    assert as_json(done)["exitCode"] == EXIT_USAGE
    assert not (state_dir / "runs").exists()


@pytest.mark.parametrize("verify", ["", "  "], ids=["empty", "blank"])
async def test_an_empty_verify_command_is_refused(
    tmp_path: Path, project: Path, state_dir: Path, verify: str
) -> None:
    """compare --verify "" (which checked nothing, yet every agent passed): exit 2, one line,
    no agent started."""
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    done = await run_cli(
        "compare", "--agent", f"s={shlex.join(agent_command(script))}", "--verify", verify,
        "--cwd", str(project), "--no-progress", "go", cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, "verify command is empty")
    assert prompts(script) == 0


def _a_directory(path: Path) -> None:
    path.mkdir()


def _a_fifo(path: Path) -> None:
    os.mkfifo(path)


def _a_dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere.toml")


@pytest.mark.parametrize(
    "make", [_a_directory, _a_fifo, _a_dangling_link], ids=["directory", "fifo", "dangling-link"]
)
@pytest.mark.parametrize("command", ["prompt", "run"])
async def test_a_project_config_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, project: Path, state_dir: Path, make: Callable[[Path], None], command: str
) -> None:
    """.orchestrator.toml a directory, a FIFO or a link to nothing (ignored silently before):
    exit 2, one line naming it, no agent started."""
    make(project / ".orchestrator.toml")
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n@step\ndef s() -> str:\n    return 'ok'\n"
    )
    argv = {
        "prompt": ["prompt", "--agent", f"s={shlex.join(agent_command(script))}", "go"],
        "run": ["run", str(pipeline), "--no-progress"],
    }[command]
    done = await run_cli(*argv, "--cwd", str(project), cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    one_error_line(done, f"{project / '.orchestrator.toml'} is there but is not a regular file")
    assert prompts(script) == 0
