"""What the run commands print: the result on stdout, progress on stderr, diffs when asked.

Every command runs as the console script (a subprocess) with scripted agents given as
``NAME=COMMAND``. ``compare`` prints a table that fits the width (``$COLUMNS``), each agent's
final message (bounded), the winner, one ``run RUN: STATUS`` line and how to apply; ``show RUN``
prints what the command printed, from the record; ``--diff`` (and ``diff RUN``) print diffs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from rich.cells import cell_len
from run_helpers import CLI, agent_command, as_json, configure, run_cli, write_script

from orchestrator.cli.output import output_schema
from orchestrator.testing import Say, ToolCall, ToolUpdate, Turn, Update, Usage, WriteDisk

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: an agent label longer than any column the table could give it if it cut names
LONG = "a-rather-long-agent-label-that-stays-whole"
#: the lines of the long agent's final message: more than compare shows
MESSAGE = [f"line {i} of the message" for i in range(1, 15)]

#: the diff of the file the writer agent adds
DIFF = "--- /dev/null\n+++ b/w.txt\n@@ -0,0 +1 @@\n+w\n"

PIPELINE = """\
from orchestrator import step


@step(agent="writer")
def write(task: str) -> str:
    return task
"""


def busy(path: str, content: str, *, cost: float | None = None, lines: int = 1) -> Turn:
    """A turn with a tool call, a file written to disk, a usage update and a message."""
    return Turn(
        steps=(
            ToolCall(id="t1", title=f"write {path}", kind="edit"),
            WriteDisk(path=path, content=content),
            ToolUpdate(id="t1", status="completed"),
            Usage(used=1200, size=200000, cost=cost),
            Say(text="\n".join(MESSAGE[:lines]) + "\n"),
        )
    )


class Project:
    """A workspace and the scripts of its agents."""

    def __init__(self, root: Path, state: Path) -> None:
        self.root = root
        self.state = state
        self.workspace = root / "project"
        self.workspace.mkdir()
        (self.workspace / "README.md").write_text("hello\n")
        self.scripts = root / "agents"
        self.scripts.mkdir()

    def agent(self, name: str, turn: Turn) -> str:
        """``NAME=COMMAND`` for an agent that plays ``turn``."""
        script = write_script(self.scripts / f"{name}.json", turn)
        return f"{name}={shlex.join(agent_command(script))}"

    async def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """The console script run in the project's folder; the finished process."""
        return await run_cli(*args, cwd=self.root, state=self.state)

    async def compare(self, *extra: str) -> subprocess.CompletedProcess[bytes]:
        """A comparison of a long-named agent (14 lines of message, 2 lines changed, a cost)
        and ``short`` (1 line, 1 line changed: the winner)."""
        return await self.cli(
            "compare", "--cwd", str(self.workspace), "--agent",
            self.agent(LONG, busy("long.txt", "a\nb\n", cost=0.25, lines=len(MESSAGE))),
            "--agent", self.agent("short", busy("short.txt", "s\n")),
            *extra, "do the task",
        )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path, state_dir: Path) -> Project:
    """See :class:`Project`."""
    return Project(tmp_path, state_dir)


def run_id_of(out: str) -> str:
    """The run id in the ``run RUN: STATUS`` line of ``out`` (there is exactly one)."""
    [found] = re.findall(r"^run ([0-9a-f]+): \w+$", out, re.MULTILINE)
    return str(found)


def table(out: str) -> list[str]:
    """The table at the top of a comparison's output (up to the first blank line)."""
    lines = out.split("\n")
    return lines[: lines.index("")]


def branches_line(out: str) -> str:
    """The line that says what the run's branch directories cost (its bytes depend on when
    each one was deleted), checked for its form."""
    found = re.search(
        r"^branches: \d+ director(y|ies) made, \d+ reused, .+ copied, peak .+ on disk\n",
        out,
        re.M,
    )
    assert found is not None, out
    return found.group(0)


async def test_compare_prints_the_table_and_messages_on_stdout_at_80_columns(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns the table fits (least useful columns dropped, the long label whole);
    stdout holds the table, each bounded message, the winner, one `run` line and how to apply;
    stderr holds progress only."""
    monkeypatch.setenv("COLUMNS", "80")
    done = await project.compare()
    assert done.returncode == 0, done.stderr.decode()
    out, err = done.stdout.decode(), done.stderr.decode()
    rows = table(out)
    assert all(cell_len(line) <= 80 for line in out.splitlines() if line in rows), rows
    assert rows[0].split() == ["AGENT", "OUTCOME", "FILES", "+/-", "TIME"]
    assert rows[1].split()[:5] == [LONG, "succeeded", "1", "+2", "-0"]
    assert rows[2].split()[:6] == ["*", "short", "succeeded", "1", "+1", "-0"]
    run_id = run_id_of(out)
    # the long message: its first 10 lines, then how many more and where
    assert f"{LONG} (0.1.0, end_turn):\n" + "".join(f"  {line}\n" for line in MESSAGE[:10]) in out
    assert f"  \u2026 (4 more lines: orchestrator show {run_id})\n" in out
    assert "short (0.1.0, end_turn):\n  line 1 of the message\n" in out
    assert out.endswith(
        "winner: short (1 line changed, "
        + out.split("winner: short (1 line changed, ")[1].split("\n")[0]
        + f"\nrun {run_id}: succeeded\n"
        + branches_line(out)
        + f"nothing was written to the workspace; to apply: orchestrator apply {run_id} "
        "--step 'compare[short]'\n"
        f"each agent's diff: orchestrator diff {run_id}\n"
    )
    assert "+++ " not in out  # no diff without --diff
    # stderr: progress lines only, no part of the result
    assert f"run {run_id}" not in err
    for said in ("winner", "AGENT", "line 1 of the message", "to apply"):
        assert said not in err, err


async def test_compare_table_at_200_columns_has_every_column(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 200 columns no column is dropped; tokens (the context use the agents reported) and
    cost show as the agents reported them."""
    monkeypatch.setenv("COLUMNS", "200")
    done = await project.compare("--no-progress")
    assert done.returncode == 0, done.stderr.decode()
    rows = table(done.stdout.decode())
    assert rows[0].split() == [
        "AGENT", "OUTCOME", "FILES", "+/-", "TOOLS", "ASK/OK/NO", "TOKENS", "COST", "TIME"
    ]  # fmt: skip
    long_row = rows[1].split()
    # TOKENS: the agents reported only a usage_update (used 1200), no token counts at the end
    assert long_row[:9] == [LONG, "succeeded", "1", "+2", "-0", "1", "0/0/0", "1,200", "0.25"]
    assert long_row[9] == "USD"
    assert rows[2].split()[:10] == [
        "*", "short", "succeeded", "1", "+1", "-0", "1", "0/0/0", "1,200", "-"
    ]  # fmt: skip
    assert done.stderr.decode() == ""


async def test_compare_diff_labels_each_agent_and_diff_run_does_too(project: Project) -> None:
    """compare --diff prints each agent's diff under a `# compare[NAME]` line; `diff RUN` of
    the comparison prints the same labelled diffs; the result stays on stdout."""
    done = await project.compare("--no-progress", "--diff")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    long_header = f"# compare[{LONG}]: succeeded, 1 file changed, +2 -0\n"
    short_header = "# compare[short]: succeeded, 1 file changed, +1 -0\n"
    assert long_header + "--- /dev/null\n+++ b/long.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n" in out
    assert short_header + "--- /dev/null\n+++ b/short.txt\n@@ -0,0 +1 @@\n+s\n" in out
    assert out.index(long_header) < out.index(short_header) < out.index("winner: short")
    diff = await project.cli("diff", run_id_of(out))
    assert diff.returncode == 0, diff.stderr.decode()
    text = diff.stdout.decode()
    assert text.startswith(long_header + "--- /dev/null\n+++ b/long.txt\n")
    assert "\n" + short_header + "--- /dev/null\n+++ b/short.txt\n" in text
    assert "+s\n" in text.split(short_header)[1] and "+s\n" not in text.split(short_header)[0]


async def test_show_of_a_comparison_prints_the_same_table(project: Project) -> None:
    """show RUN of a comparison prints the table compare printed, and each message whole."""
    done = await project.compare("--no-progress")
    out = done.stdout.decode()
    shown = await project.cli("show", run_id_of(out))
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stdout.decode()
    assert "\n\n" + "\n".join(table(out)) + "\n\n" in text
    assert "".join(f"  {line}\n" for line in MESSAGE) in text
    assert "more lines" not in text
    assert text.endswith(out[out.index("winner: ") :])


async def test_compare_json_agents_carry_the_prompt_fields(project: Project) -> None:
    """compare --json: each agent entry has a prompt object's fields (agent {name, version,
    reportedName}, runId, applied, ...) besides its old ones, valid under the schema; the
    agent applied with --apply is the one marked applied."""
    done = await project.compare("--json", "--apply", "short")
    assert done.returncode == 0, done.stderr.decode()
    result = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(result)
    agents: dict[str, dict[str, Any]] = {a["name"]: a for a in result["agents"]}
    for name, agent in agents.items():
        assert agent["runId"] == result["runId"]
        assert agent["agent"] == {
            "name": name,
            "version": "0.1.0",
            "reportedName": name,  # what its script calls it: the label
            "quirks": [],
        }
        for field in ("status", "stopReason", "text", "toolCalls", "permissions", "usage"):
            assert field in agent, field
        assert agent["changes"] and agent["diff"] and agent["wallSeconds"] > 0
        assert agent["applied"] is (name == "short")
        assert agent["workspaceChanged"] == []
        assert agent["agentInfo"]["version"] == "0.1.0"  # the instance's fields stay
    assert agents["short"]["toolCalls"][0]["title"] == "write short.txt"
    assert agents[LONG]["usage"]["cost"] == {"amount": 0.25, "currency": "USD"}
    shown = as_json(await project.cli("show", result["runId"], "--json"))
    assert [(a["name"], a["applied"]) for a in shown["agents"]] == [(LONG, False), ("short", True)]


async def test_prompt_ending_goes_to_stdout_and_show_prints_the_same(project: Project) -> None:
    """prompt prints its reply and then its ending (turn facts, diff stat, run status, how to
    apply) on stdout, tool calls on stderr; show RUN prints the message, the tool calls and
    permissions, then the very same ending."""
    done = await project.cli(
        "prompt", "--cwd", str(project.workspace), "--agent",
        project.agent("solo", busy("new.txt", "one\ntwo\n", cost=0.5, lines=3)), "go",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    out, err = done.stdout.decode(), done.stderr.decode()
    reply = "".join(f"{line}\n" for line in MESSAGE[:3])
    assert out.startswith(reply + "\n")
    ending = out[len(reply) + 1 :]
    run_id = run_id_of(ending)
    lines = ending.splitlines()
    assert re.fullmatch(
        r"solo \(0\.1\.0\): end_turn, 1 tool call, permissions none asked, "
        r"1,200 tokens, 0\.50 USD, \d+\.\d+ s",
        lines[0],
    ), lines[0]
    assert lines[1:4] == [
        " new.txt (new) | 2 ++",
        " 1 file changed, 2 insertions(+)",
        f"run {run_id}: succeeded",
    ]
    assert lines[4].startswith(f"not applied; to apply: orchestrator apply {run_id} ")
    assert "+++ " not in out
    assert " tool     > edit: write new.txt\n" in err
    assert "end_turn" not in err and "run " not in err and "new.txt (new)" not in err

    shown = await project.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stdout.decode()
    assert text.startswith(f"run {run_id} (prompt) in {project.workspace}\n\n{reply}\n")
    assert "tool calls:\n  completed   edit     write new.txt\n" in text
    assert text.endswith("\n" + ending)


#: a notice an agent sends for the user, as the run's JSON keeps it
NOTICE = {
    "severity": "warning",
    "title": "Context almost full",
    "description": "Older messages will be summarized.",
}
#: a turn that sends NOTICE, then its message
NOTICE_TURN = Turn(steps=(Update({"sessionUpdate": "notice", **NOTICE}), Say("done\n")))


async def test_a_prompt_shows_a_notice_keeps_it_and_show_prints_it(project: Project) -> None:
    """An agent's notice is a line on stderr while prompt runs, is kept in the --json object
    (so in the record), and show RUN prints it with the turn."""
    agent = project.agent("noter", NOTICE_TURN)
    argv = ("prompt", "--cwd", str(project.workspace), "--agent", agent)
    done = await project.cli(*argv, "go")
    assert done.returncode == 0, done.stderr.decode()
    assert "notice   Context almost full (Older messages will be summarized.)\n" in (
        done.stderr.decode()
    )
    run_id = run_id_of(done.stdout.decode())
    shown = await project.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr.decode()
    assert (
        "notices:\n  warning   Context almost full (Older messages will be summarized.)\n"
        in shown.stdout.decode()
    )
    as_json_done = await project.cli(*argv, "--json", "go")
    assert as_json_done.returncode == 0, as_json_done.stderr.decode()
    result = as_json(as_json_done)
    assert result["notices"] == [NOTICE]
    jsonschema.validate(result, output_schema())
    shown_json = await project.cli("show", result["runId"], "--json")
    assert as_json(shown_json)["notices"] == [NOTICE]


async def test_a_run_shows_a_notice_and_its_step_keeps_it(project: Project) -> None:
    """In a pipeline run an agent's notice is a progress line naming the step, its step
    instance keeps it, and show RUN prints it under the step."""
    configure(project.workspace, writer=write_script(project.scripts / "w.json", NOTICE_TURN))
    pipeline = project.root / "pipe.py"
    pipeline.write_text(PIPELINE)
    argv = ("run", str(pipeline), "--cwd", str(project.workspace), "--set", "task=go")
    done = await project.cli(*argv)
    assert done.returncode == 0, done.stderr.decode()
    assert "notice   write: Context almost full (Older messages will be summarized.)\n" in (
        done.stderr.decode()
    )
    run_id = run_id_of(done.stdout.decode())
    shown_json = await project.cli("show", run_id, "--json")
    result = as_json(shown_json)
    assert result["steps"]["write"]["instances"]["write"]["notices"] == [NOTICE]
    jsonschema.validate(result, output_schema())
    shown = await project.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr.decode()
    assert (
        "    notices:\n      warning   Context almost full (Older messages will be summarized.)\n"
        in shown.stdout.decode()
    )


async def test_diff_flag_prints_the_diff_of_prompt_run_resume_and_show(project: Project) -> None:
    """--diff on prompt, run, resume and show prints the run's diff before its diff stat;
    without it none of them prints a diff."""
    configure(
        project.workspace, writer=write_script(project.scripts / "w.json", busy("w.txt", "w\n"))
    )
    pipeline = project.root / "pipe.py"
    pipeline.write_text(PIPELINE)
    commands = {
        "prompt": ("prompt", "--cwd", str(project.workspace), "--agent", "writer", "go"),
        "run": ("run", str(pipeline), "--cwd", str(project.workspace), "--set", "task=go"),
    }
    for name, argv in commands.items():
        plain = await project.cli(*argv)
        assert plain.returncode == 0, (name, plain.stderr.decode())
        assert "+++ " not in plain.stdout.decode(), name
        with_diff = await project.cli(*argv, "--diff")
        assert with_diff.returncode == 0, (name, with_diff.stderr.decode())
        out = with_diff.stdout.decode()
        assert DIFF in out, (name, out)
        assert out.index(DIFF) < out.index(" w.txt (new) | 1 +\n"), name
        assert DIFF not in with_diff.stderr.decode(), name
        run_id = run_id_of(out)
        shown = await project.cli("show", run_id)
        assert "+++ " not in shown.stdout.decode(), name
        shown = await project.cli("show", run_id, "--diff")
        assert DIFF in shown.stdout.decode(), name
        # resume (every step reused) ends as the run did: the diff only with --diff
        resumed = await project.cli("resume", run_id)
        assert resumed.returncode == 0, (name, resumed.stderr.decode())
        assert "+++ " not in resumed.stdout.decode(), name
        assert f"run {run_id}: succeeded\n" in resumed.stdout.decode(), name
        resumed = await project.cli("resume", run_id, "--diff")
        assert DIFF in resumed.stdout.decode(), name


VALUES_PIPELINE = """\
from orchestrator import step


@step()
def numbers() -> list[int]:
    return list(range(30))


@step(over="numbers")
def square(item: int) -> int:
    return item * item


@step()
def table(numbers: list[int]) -> str:
    return "\\n".join(f"row {n}" for n in numbers)


@step()
def nothing(numbers: list[int]) -> None:
    return None
"""


async def test_run_prints_the_values_of_its_final_steps_and_show_prints_them_whole(
    project: Project,
) -> None:
    """run prints what its final steps returned (each instance, the first 20 lines, then how
    many more and where); steps something depends on and None values are left out; show
    prints the values whole."""
    pipeline = project.root / "values.py"
    pipeline.write_text(VALUES_PIPELINE)
    done = await project.cli("run", str(pipeline), "--cwd", str(project.workspace))
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    run_id = run_id_of(out)
    assert "square[0]:\n  0\n" in out and "square[29]:\n  841\n" in out
    rows = "".join(f"  row {n}\n" for n in range(20))
    assert f"table:\n{rows}  \u2026 (10 more lines: orchestrator show {run_id} --json)\n" in out
    assert "numbers:" not in out and "nothing:" not in out
    assert out.index("table:") < out.index(f"run {run_id}: succeeded")
    shown = (await project.cli("show", run_id)).stdout.decode()
    assert "table:\n" + "".join(f"  row {n}\n" for n in range(30)) in shown


async def test_the_winner_line_gives_the_time_the_table_gives(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The winner's time in `winner: NAME (...)` reads as in the table's TIME column."""
    monkeypatch.setenv("COLUMNS", "200")
    done = await project.compare("--no-progress")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    row = next(r for r in table(out) if r.startswith("* short "))
    time = " ".join(row.split()[-2:])  # "0.34 s"
    assert re.fullmatch(r"\d+\.\d+ s", time), row
    assert f"winner: short (1 line changed, {time})\n" in out


DEMO_PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task
"""


async def test_show_of_a_pipeline_ends_as_run_did(project: Project) -> None:
    """show RUN of a pipeline ends with the lines run ended with: `run RUN: STATUS`, whether
    and how to apply, and the default policy's rejections."""
    pipeline = project.root / "edit.py"
    pipeline.write_text(DEMO_PIPELINE)
    task = 'append "- z" to README.md'
    argv = ("run", str(pipeline), "--cwd", str(project.workspace), "--no-progress")
    done = await project.cli(*argv, "--set", f"task={task}")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    run_id = run_id_of(out)
    ending = out[out.index(f"run {run_id}: succeeded\n") :]
    assert ending == (
        f"run {run_id}: succeeded\n"
        "branches: 1 directory made, 0 reused, 6 bytes copied, peak 6 bytes on disk\n"
        "no file changed\n"
        "1 permission request was rejected by the default policy (no policy was given); "
        "--policy edit allows edits\n"
    )
    shown = await project.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr.decode()
    assert shown.stdout.decode().endswith("\n" + ending)


async def test_compare_and_run_apply_say_they_applied(project: Project) -> None:
    """compare --apply NAME ends `applied compare[NAME] to the workspace (N files)`, run
    --apply and resume --apply `applied to the workspace (N files)`; show of each ends so."""
    done = await project.compare("--no-progress", "--apply", "short")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    run_id = run_id_of(out)
    ending = (
        f"run {run_id}: succeeded\n{branches_line(out)}"
        "applied compare[short] to the workspace (1 file)\n"
    )
    assert out.endswith("\n" + ending)
    assert (project.workspace / "short.txt").read_text() == "s\n"
    assert (await project.cli("show", run_id)).stdout.decode().endswith("\n" + ending)

    configure(
        project.workspace, writer=write_script(project.scripts / "w.json", busy("w.txt", "w\n"))
    )
    pipeline = project.root / "pipe.py"
    pipeline.write_text(PIPELINE)
    argv = ("--cwd", str(project.workspace), "--set", "task=go", "--no-progress")
    done = await project.cli("run", str(pipeline), *argv, "--apply")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    run_id = run_id_of(out)
    ending = f"run {run_id}: succeeded\n{branches_line(out)}applied to the workspace (1 file)\n"
    assert out.endswith("\n" + ending)
    assert (project.workspace / "w.txt").read_text() == "w\n"
    assert (await project.cli("show", run_id)).stdout.decode().endswith("\n" + ending)

    (project.workspace / "w.txt").unlink()
    done = await project.cli("run", str(pipeline), *argv)
    run_id = run_id_of(done.stdout.decode())
    resumed = await project.cli("resume", run_id, "--apply", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr.decode()
    ending = f"run {run_id}: succeeded\napplied to the workspace (1 file)\n"
    assert resumed.stdout.decode().endswith("\n" + ending)
    assert (project.workspace / "w.txt").read_text() == "w\n"
