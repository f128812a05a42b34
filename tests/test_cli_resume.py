"""``orchestrator run`` with a failing step, then ``show``, ``resume``, ``apply``, ``runs``.

The console script runs as a subprocess against scripted agents (also subprocesses) named in the
workspace's ``.orchestrator.toml``; "fixing the cause" of a failure points an agent at another
script in that file. Each script appends what its agent received to a record file beside it, so
the tests count the prompts each agent got.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from run_helpers import (
    CLI,
    agent_command,
    as_json,
    project_config,
    prompts,
    run_cli,
    snapshot,
    write_script,
)

from orchestrator.store import RunRecord, open_run_store
from orchestrator.testing import Crash, Say, Turn, WriteFile

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WORKSPACE_CHANGED = 0, 1, 2, 3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

PIPELINE = """\
from orchestrator import step


@step(agent="writer")
def write(task: str) -> str:
    return f"write {task}"


@step(agent="checker")
def check(write: object) -> str:
    return "check the change"


@step()
def summary(check: object) -> str:
    return "all done"
"""

QUICK = """\
from orchestrator import step


@step()
def double(n: int) -> int:
    return n * 2
"""


# --------------------------------------------------------------------------- helpers


def configure(project: Path, agents: dict[str, Path]) -> None:
    """Write the workspace's ``.orchestrator.toml``: agent name -> script it plays."""
    lines = []
    for name, script in agents.items():
        lines += [f"[agents.{name}]", f"command = {json.dumps(agent_command(script))}", ""]
    project_config(project, "\n".join(lines))


def statuses(result: dict[str, Any]) -> dict[str, str]:
    """Step name -> status, from a run's JSON object."""
    return {name: step["status"] for name, step in result["steps"].items()}


# --------------------------------------------------------------------------- fixtures


class Setup:
    """A workspace, a three-step pipeline and the scripts of its agents."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.project = root / "project"
        self.project.mkdir()
        (self.project / "README.md").write_text("hello\n")
        agents = root / "agents"
        agents.mkdir()
        self.writer = write_script(
            agents / "writer.json",
            Turn(steps=(WriteFile(path="README.md", content="hello world\n"), Say(text="ok"))),
        )
        self.broken = write_script(
            agents / "broken.json",
            Turn(steps=(Crash(exit_code=1, stderr="the checker broke"),)),
        )
        self.fixed = write_script(
            agents / "fixed.json",
            Turn(steps=(WriteFile(path="CHECKED.md", content="checked\n"), Say(text="ok"))),
        )
        configure(self.project, {"writer": self.writer, "checker": self.broken})
        self.pipeline = root / "write_check.py"
        self.pipeline.write_text(PIPELINE)

    def fix(self) -> None:
        """Fix the cause of the failure: the checker now plays a working script."""
        configure(self.project, {"writer": self.writer, "checker": self.fixed})


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    """See :class:`Setup`."""
    return Setup(tmp_path)


async def failed_run(setup: Setup, state: Path) -> str:
    """Run the pipeline (its checker crashes: exit 1); the run's id."""
    done = await run_cli(
        "run", str(setup.pipeline), "--cwd", str(setup.project), "--set", "task=greet",
        "--policy", "trusted", "--json", cwd=setup.root, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "failed"
    return str(result["runId"])


# --------------------------------------------------------------------------- tests


async def test_failed_step_fixed_then_resume_reuses_and_apply_writes(
    setup: Setup, state_dir: Path
) -> None:
    """Failed run shown failed/skipped; fixed, resume re-runs only the rest; apply writes."""
    before = snapshot(setup.project)
    run_id = await failed_run(setup, state_dir)

    shown = await run_cli("show", run_id, "--json", cwd=setup.root, state=state_dir)
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    result = as_json(shown)
    assert result["status"] == "failed"
    assert statuses(result) == {"write": "succeeded", "check": "failed", "summary": "skipped"}
    assert "exit status 1" in result["steps"]["check"]["error"]
    assert "check" in result["steps"]["summary"]["cause"]
    assert snapshot(setup.project) == before

    setup.fix()
    fixed_workspace = snapshot(setup.project)
    resumed = await run_cli(
        "resume", run_id, "--policy", "trusted", "--json", cwd=setup.root, state=state_dir
    )
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    assert result["runId"] == run_id
    assert result["status"] == "succeeded"
    assert statuses(result) == dict.fromkeys(("write", "check", "summary"), "succeeded")
    assert {c["path"]: c["change"] for c in result["changes"]} == {
        "README.md": "modified",
        "CHECKED.md": "added",
    }
    # the writer is not prompted again: its finished step is reused with its branch
    assert (prompts(setup.writer), prompts(setup.broken), prompts(setup.fixed)) == (1, 1, 1)
    async with open_run_store(state_dir) as store:
        reused = {e["step"] for e in await store.events(run_id) if e["type"] == "step_reused"}
    assert reused == {"write"}
    assert snapshot(setup.project) == fixed_workspace  # nothing applied yet

    # a second resume reuses everything and says so on its progress lines
    again = await run_cli("resume", run_id, "--policy", "trusted", cwd=setup.root, state=state_dir)
    assert again.returncode == EXIT_OK, again.stderr.decode()
    progress = again.stderr.decode()
    for name in ("write", "check", "summary"):
        assert f"reused   {name}" in progress, progress
    assert (prompts(setup.writer), prompts(setup.fixed)) == (1, 1)

    applied = await run_cli("apply", run_id, "--json", cwd=setup.root, state=state_dir)
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert as_json(applied)["applied"] is True
    assert (setup.project / "README.md").read_text() == "hello world\n"
    assert (setup.project / "CHECKED.md").read_text() == "checked\n"
    shown_after = as_json(await run_cli("show", run_id, "--json", cwd=setup.root, state=state_dir))
    assert shown_after["applied"] is True


async def test_resume_json_marks_reused_steps(setup: Setup, state_dir: Path) -> None:
    """resume --json says which step instances were reused rather than run again."""
    run_id = await failed_run(setup, state_dir)
    setup.fix()
    resumed = await run_cli(
        "resume", run_id, "--policy", "trusted", "--json", cwd=setup.root, state=state_dir
    )
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    marked = {
        name
        for name, step in result["steps"].items()
        if any(i.get("reused") for i in step["instances"].values())
    } | set(result.get("reused") or ())
    assert marked == {"write"}


async def test_resume_refused_when_the_workspace_changed(setup: Setup, state_dir: Path) -> None:
    """resume exits 3, naming the file, when a file a finished step changed was edited since."""
    run_id = await failed_run(setup, state_dir)
    setup.fix()
    (setup.project / "README.md").write_text("edited by hand\n")
    before = snapshot(setup.project)
    refused = await run_cli("resume", run_id, "--json", cwd=setup.root, state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED, refused.stderr.decode()
    body = as_json(refused)
    assert body["error"]["type"] == "ResumeConflict"
    assert body["paths"] == ["README.md"]
    assert "README.md" in refused.stderr.decode()
    assert snapshot(setup.project) == before
    assert (prompts(setup.writer), prompts(setup.fixed)) == (1, 0)  # nothing ran
    shown = as_json(await run_cli("show", run_id, "--json", cwd=setup.root, state=state_dir))
    assert shown["status"] == "failed"


async def test_show_report_writes_the_report(setup: Setup, state_dir: Path) -> None:
    """show RUN --report DIR writes report.html and report.md naming the steps and the failure."""
    run_id = await failed_run(setup, state_dir)
    report = setup.root / "report"
    shown = await run_cli(
        "show", run_id[:8], "--report", str(report), cwd=setup.root, state=state_dir
    )
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    assert f"report: {report / 'report.html'}" in shown.stdout.decode()
    assert run_id in shown.stdout.decode()
    html = (report / "report.html").read_text()
    markdown = (report / "report.md").read_text()
    for text in (html, markdown):
        assert run_id in text
        assert "check" in text and "summary" in text
    as_object = await run_cli(
        "show", run_id, "--report", str(report / "again"), "--json", cwd=setup.root, state=state_dir
    )
    assert as_json(as_object)["report"]["html"] == str(report / "again" / "report.html")


async def test_runs_json_lists_newest_first(tmp_path: Path, state_dir: Path) -> None:
    """runs --json lists the runs newest first; --limit keeps the newest."""
    project = tmp_path / "project"
    project.mkdir()
    pipeline = tmp_path / "quick.py"
    pipeline.write_text(QUICK)
    started = []
    for n in range(3):
        done = await run_cli(
            "run", str(pipeline), "--cwd", str(project), "--set", f"n={n}", "--json",
            cwd=tmp_path, state=state_dir,
        )  # fmt: skip
        assert done.returncode == EXIT_OK, done.stderr.decode()
        started.append(as_json(done)["runId"])
    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))["runs"]
    assert [r["runId"] for r in listed] == started[::-1]
    assert [r["inputs"]["n"] for r in listed] == [2, 1, 0]
    created = [r["created"] for r in listed]
    assert created == sorted(created, reverse=True)
    limited = as_json(
        await run_cli("runs", "--json", "--limit", "2", cwd=tmp_path, state=state_dir)
    )
    assert [r["runId"] for r in limited["runs"]] == started[:0:-1]


async def test_unknown_run_id_exits_2(tmp_path: Path, state_dir: Path) -> None:
    """An unknown run id exits 2 with a message naming it and pointing at `orchestrator runs`."""
    for command in ("show", "resume", "apply", "diff"):
        done = await run_cli(command, "0000nope", cwd=tmp_path, state=state_dir)
        assert done.returncode == EXIT_USAGE, command
        err = done.stderr.decode()
        assert "no run '0000nope'" in err and "orchestrator runs" in err, err
        assert "Traceback" not in err
    as_object = await run_cli("show", "0000nope", "--json", cwd=tmp_path, state=state_dir)
    assert as_object.returncode == EXIT_USAGE
    assert as_json(as_object)["error"]["type"] == "RunNotFound"


async def test_ambiguous_prefix_exits_2(tmp_path: Path, state_dir: Path) -> None:
    """A prefix matching two runs exits 2 listing both; the whole id picks the run."""
    first, second = "abc123000001", "abc123000002"
    async with open_run_store(state_dir) as store:
        for n, run_id in enumerate((first, second)):
            await store.create_run(
                RunRecord(run_id, "pipeline", "failed", time.time() + n, str(tmp_path))
            )
    for command in ("show", "resume", "apply"):
        done = await run_cli(command, "abc123", cwd=tmp_path, state=state_dir)
        assert done.returncode == EXIT_USAGE, command
        err = done.stderr.decode()
        assert "ambiguous" in err and first in err and second in err, err
    picked = await run_cli("show", second, "--json", cwd=tmp_path, state=state_dir)
    assert picked.returncode == EXIT_OK, picked.stderr.decode()
    assert as_json(picked)["runId"] == second


async def test_resume_a_compare_of_labelled_commands_reruns_its_failed_agent(
    setup: Setup, state_dir: Path
) -> None:
    """resume of a compare whose agents were given as NAME=COMMAND re-runs the failed one."""
    good = shlex.join(agent_command(setup.fixed))
    bad = write_script(setup.root / "agents" / "flaky.json", Turn(steps=(Crash(),)))
    done = await run_cli(
        "compare", "--cwd", str(setup.project), "--json", "--agent", f"good={good}",
        "--agent", f"flaky={shlex.join(agent_command(bad))}", "check it",
        cwd=setup.root, state=state_dir,
    )  # fmt: skip
    # one agent succeeded: the comparison did, and the crashed one is left to resume
    assert done.returncode == EXIT_OK, done.stderr.decode()
    first = as_json(done)
    assert (first["succeeded"], first["winner"]) == (["good"], "good")
    run_id = first["runId"]
    write_script(bad, Turn(steps=(Say(text="fine now"),)))
    resumed = await run_cli("resume", run_id, "--json", cwd=setup.root, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    assert [(a["name"], a["status"]) for a in as_json(resumed)["agents"]] == [
        ("good", "succeeded"),
        ("flaky", "succeeded"),
    ]
    assert prompts(setup.fixed) == 1  # the good agent's turn was reused


FAN_IN = """\
from orchestrator import step


@step
def names() -> list[str]:
    return ["a", "b", "c"]


@step(agent="demo", over="names")
def edit(item: str) -> str:
    return f'replace "title" with "{item}" in README.md'


@step(merge="fail")
def join(edit: object) -> str:
    return "joined"
"""


async def test_resume_after_a_new_merge_strategy_lists_the_conflicts_as_they_stand(
    tmp_path: Path, state_dir: Path
) -> None:
    """A conflicted fan-in resumed with merge="ours": only the conflicts of this merge remain."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# title\nbody\n")
    pipeline = tmp_path / "fan_in.py"
    pipeline.write_text(FAN_IN)
    argv = ["--policy", "edit", "--json"]
    first = await run_cli(
        "run", str(pipeline), "--cwd", str(project), *argv, cwd=tmp_path, state=state_dir
    )
    assert first.returncode == 4, first.stderr.decode()
    run_id = as_json(first)["runId"]
    assert [c["resolution"] for c in as_json(first)["conflicts"]] == ["fail"]

    pipeline.write_text(FAN_IN.replace('merge="fail"', 'merge="ours"'))
    for _ in range(2):  # each resume merges again: nothing piles up
        resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
        assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
        result = as_json(resumed)
        assert result["status"] == "succeeded"
        expected = [("join", "README.md", "ours")] * 2  # a+b, then c: two pairwise merges
        assert [(c["step"], c["path"], c["resolution"]) for c in result["conflicts"]] == expected
        shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
        assert shown["conflicts"] == result["conflicts"]
    text = await run_cli("resume", run_id, cwd=tmp_path, state=state_dir)
    assert "unresolved" not in text.stdout.decode() + text.stderr.decode()
    # no unsettled conflict is left to refuse the apply
    applied = await run_cli("apply", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert (project / "README.md").read_text() == "# a\nbody\n"


async def test_resume_of_an_applied_run_says_there_is_nothing_to_resume(
    tmp_path: Path, state_dir: Path
) -> None:
    """A run that succeeded and was applied is not resumed (exit 2, saying when it was
    applied), rather than refused for the files its own apply changed."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hi\n")
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "edit", "--apply", "--json",
        'append "x" to a.txt', cwd=ws, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    run_id = as_json(done)["runId"]
    again = await run_cli("resume", run_id, cwd=ws, state=state_dir)
    assert again.returncode == EXIT_USAGE, again.stderr.decode()
    err = again.stderr.decode()
    assert f"run {run_id} succeeded and its changes were applied to the workspace at " in err
    assert "nothing to resume" in err and "changed since" not in err
    assert (ws / "a.txt").read_text() == "hi\nx\n"


def test_only_the_whole_run_applied_leaves_nothing_to_resume() -> None:
    """A run whose final changes were written (recorded with their keys, or by a release that
    kept only the time) is applied; one with a step applied alone, or written to a git
    branch, is not (the run's ``applied`` time is set by a step's apply too)."""
    from orchestrator.pipeline.branches import FINAL
    from orchestrator.runs.resume import _applied_whole
    from orchestrator.store import ApplyRecord

    run = RunRecord("r1", "pipeline", "succeeded", 1.0, "/ws", applied=5.0)
    step = ApplyRecord("r1", ("edit[0]",), 5.0)
    whole = ApplyRecord("r1", (FINAL,), 7.0)
    branch = ApplyRecord("r1", (FINAL,), 6.0, git_branch="agent/x")
    assert _applied_whole(run, [step]) is None
    assert _applied_whole(run, [branch]) == 5.0  # the time alone: an older release's apply
    assert _applied_whole(run, [step, whole]) == 7.0
    assert _applied_whole(run, []) == 5.0
    assert _applied_whole(RunRecord("r2", "pipeline", "succeeded", 1.0, "/ws"), [branch]) is None
