"""What the command line writes on stderr, through the console script: with ``--log-json``
every line is one JSON object (its own errors and notes too), each event is said once at every
verbosity, and a reader that leaves standard output early costs nothing (no traceback, the
command's exit code)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "orchestrator"
#: seconds a whole command may take (its agents are Python subprocesses)
LIMIT = 120.0
EXIT_OK, EXIT_USAGE, EXIT_CONFLICTS, EXIT_INTERRUPTED = 0, 2, 4, 130

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: two demo agents append different lines to CHANGES.md: their branches conflict when the
#: Python step after them merges them
CONFLICT = """\
from orchestrator import StepContext, step


@step(agent=["a=demo", "b=demo"])
def work(ctx: StepContext) -> str:
    return f'append "- {ctx.agent}" to CHANGES.md'


@step()
def after(work: object) -> str:
    return "ok"
"""

#: one Python step that waits until the file GO exists
WAITING = """\
from pathlib import Path

import trio

from orchestrator import step


@step()
async def wait() -> str:
    while not Path({go!r}).exists():
        await trio.sleep(0.02)
    return "ok"
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace holding CHANGES.md."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "CHANGES.md").write_text("# changes\n")
    return root


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The console script run to its end (the state directory comes from the environment)."""
    return subprocess.run(
        [str(CLI), *args], cwd=cwd, capture_output=True, text=True, timeout=LIMIT, check=False
    )


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each of which must be one JSON object."""
    entries = [json.loads(line) for line in stderr.splitlines()]
    assert all(isinstance(e, dict) and {"level", "event"} <= set(e) for e in entries), stderr
    return entries


# --------------------------------------------------------------------------- --log-json


def test_a_usage_error_is_a_json_line_with_log_json_and_one_plain_line_without(
    ws: Path, state_dir: Path
) -> None:
    """A usage error, found by the parser or after it, is one JSON line with ``--log-json``
    (given after the command too) and ``orchestrator: error: ...`` without."""
    pipeline = str(ROOT / "pipelines" / "compare_agents.py")
    for args in (("run", "--log-json"), ("run", pipeline, "--set", "agents=[", "--log-json")):
        done = cli(*args, cwd=ws)
        assert done.returncode == EXIT_USAGE, done.stderr
        [entry] = json_lines(done.stderr)
        assert (entry["level"], entry["event"], entry["logger"]) == (
            "error",
            "usage_error",
            "orchestrator.cli",
        )
        assert "pipeline" in entry["message"] or "--set agents" in entry["message"]
        plain = cli(*args[:-1], cwd=ws)
        assert plain.returncode == EXIT_USAGE
        [line] = plain.stderr.splitlines()
        assert line.startswith(("orchestrator: error: --set agents", "orchestrator run: error: "))


def _interrupt(pipeline: Path, ws: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline`` and interrupt it (SIGINT) once its step started."""
    proc = subprocess.Popen(
        [str(CLI), "run", str(pipeline), *flags],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:  # progress lines: the step is under way once one says so
        said.append(line)
        if "started" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=LIMIT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(said) + err)


def test_an_interrupted_run_and_its_resume_say_every_line_in_json(
    tmp_path: Path, ws: Path, state_dir: Path
) -> None:
    """With ``--log-json`` the line ending an interrupted run and what its resume restored and
    replaced (and with what) are JSON lines like the others; without it, plain lines."""
    go = tmp_path / "go"
    pipeline = tmp_path / "waiting.py"
    pipeline.write_text(WAITING.format(go=str(go)))
    for as_json in (True, False):
        flags = ("--log-json",) if as_json else ()
        done = _interrupt(pipeline, ws, "--policy", "trusted", *flags)
        assert done.returncode == EXIT_INTERRUPTED, done.stderr
        run_id = json.loads(cli("runs", "--json", cwd=ws).stdout)["runs"][0]["runId"]
        go.touch()
        resumed = cli("resume", run_id, "--policy", "edit", *flags, cwd=ws)
        go.unlink()
        assert resumed.returncode == EXIT_OK, resumed.stderr
        hint = f"run {run_id} interrupted; orchestrator resume {run_id} goes on"
        if as_json:
            last = json_lines(done.stderr)[-1]
            assert (last["event"], last["message"], last["runId"]) == (
                "run_interrupted",
                hint,
                run_id,
            )
            replaced = [e for e in json_lines(resumed.stderr) if e["event"] == "resume_replaced"]
            assert [e["message"] for e in replaced] == [
                "replaced by this resume: policy edit (3 run rules)"
            ]
        else:
            assert done.stderr.splitlines()[-1] == hint
            assert "\nreplaced by this resume: policy edit (3 run rules)\n" in resumed.stderr


# --------------------------------------------------------------------------- once each


@pytest.mark.parametrize("verbose", [(), ("-v",)], ids=["default", "verbose"])
@pytest.mark.parametrize("log_json", [(), ("--log-json",)], ids=["plain", "json"])
def test_each_event_is_said_once_on_stderr(
    tmp_path: Path, ws: Path, state_dir: Path, verbose: tuple[str, ...], log_json: tuple[str, ...]
) -> None:
    """The merge conflict, each permission, each agent's start and each step's start and end
    appear exactly once on stderr, at the default level and with ``-v``, plain or JSON."""
    pipeline = tmp_path / "conflict.py"
    pipeline.write_text(CONFLICT)
    done = cli("run", str(pipeline), "--policy", "edit", *verbose, *log_json, cwd=ws)
    assert done.returncode == EXIT_CONFLICTS, done.stderr
    if log_json:
        said = [json.dumps(e) for e in json_lines(done.stderr)]
    else:
        said = done.stderr.splitlines()

    def times(*words: str) -> int:
        return sum(all(w in line for w in words) for line in said)

    # the conflict: its kind is said by the progress line only
    assert times("CHANGES.md", "content") == 1, said
    assert times("Append a line to CHANGES.md") == 2, said  # a permission per agent
    assert times("agent process started") == (2 if verbose else 0), said  # one per agent
    for instance in ("work[a]", "work[b]"):  # progress lines: said at every level
        assert times("started", instance) == 1, said
        assert times("done", instance, "1 file changed") == 1, said
    assert times("after", "merge conflict in CHANGES.md") == 1, said  # the step that failed


# --------------------------------------------------------------------------- stdout's reader


@pytest.mark.parametrize(
    "args",
    [("runs",), ("runs", "--json"), ("show", "RUN"), ("run", "PIPELINE", "--policy", "edit")],
    ids=["runs", "runs-json", "show", "run"],
)
def test_a_reader_that_left_stdout_changes_nothing(
    tmp_path: Path, ws: Path, state_dir: Path, args: tuple[str, ...]
) -> None:
    """With standard output a pipe nobody reads any more (its read end closed before the
    command starts), the command ends as it would have: its exit code, no traceback."""
    pipeline = tmp_path / "conflict.py"
    pipeline.write_text(CONFLICT)
    first = cli("run", str(pipeline), "--policy", "edit", "--json", cwd=ws)
    assert first.returncode == EXIT_CONFLICTS, first.stderr
    run_id = json.loads(first.stdout)["runId"]
    args = tuple({"RUN": run_id, "PIPELINE": str(pipeline)}.get(a, a) for a in args)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [str(CLI), *args],
            cwd=ws,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=LIMIT,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == (EXIT_CONFLICTS if args[0] == "run" else EXIT_OK), done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
