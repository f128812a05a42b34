"""The runs API end to end: validation before start, resume, branches and apply, compare, the store.

Agents are scripted subprocesses (or in-memory agents where the process is not the point);
pipeline files live in ``tests/pipelines/runner_*.py``. The autouse ``state_dir`` fixture
points the run store at a temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from run_helpers import config, spec_for, workspace

from orchestrator.agent.permissions import Escalation
from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.errors import AgentNotFound, AlreadyApplied, PipelineError, UsageError
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.branches import FINAL, diff_of, stored_changes
from orchestrator.pipeline.results import RunEvent, StepResult
from orchestrator.policy import Answer, Policy, PolicySet, Rule
from orchestrator.runs import (
    RunOutcome,
    apply_run,
    compare,
    diff_run,
    get_run_json,
    list_runs,
    resume_run,
    run_pipeline,
)
from orchestrator.store import BASE_UNKNOWN, RunRecord, StepRecord, StoredChange, open_run_store
from orchestrator.testing import (
    AgentRecord,
    AgentScript,
    AskPermission,
    ErrorReply,
    PermissionToolCall,
    Say,
    Turn,
    WriteDisk,
    WriteFile,
)
from orchestrator.testing.connector import memory_connector
from orchestrator.vfs import Branch, Workspace

LIMIT = 30.0  # seconds any one run here may take (subprocess agents start a Python each)
PIPELINES = Path(__file__).resolve().parent / "pipelines"
SAY = AgentScript(turns=(Turn(steps=(Say("done"),)),))


# --------------------------------------------------------------------------- helpers


def prompts(record: Path) -> list[str]:
    """The prompt texts a subprocess agent recorded (across all its processes)."""
    if not record.exists():
        return []
    entries = [orjson.loads(line) for line in record.read_bytes().splitlines() if line.strip()]
    return [str(e["text"]) for e in entries if e["event"] == "prompt"]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its text."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- refused before start


@pytest.mark.parametrize("name", ["runner_cycle.py", "runner_duplicate.py"])
async def test_invalid_pipeline_file_is_refused_before_any_agent_starts(
    tmp_path: Path, name: str
) -> None:
    """A cycle or a duplicate step is a PipelineError; no agent ran, no run was recorded."""
    marker = tmp_path / "agent-started"
    spec = AgentSpec("a", ("sh", "-c", f"touch {marker}"))
    with trio.fail_after(LIMIT), pytest.raises(PipelineError) as caught:
        await run_pipeline(
            PIPELINES / name, {"task": "t"}, cwd=workspace(tmp_path), config=config(spec)
        )
    expected = "cycle: draft -> review -> draft" if "cycle" in name else "duplicate step 'plan'"
    assert any(expected in p for p in caught.value.problems)
    assert not marker.exists()
    assert await list_runs() == []


async def test_missing_run_input_is_refused_before_any_agent_starts(tmp_path: Path) -> None:
    """A run input nobody gives is a UsageError naming it; the agent never starts."""
    marker = tmp_path / "agent-started"
    spec = AgentSpec("a", ("sh", "-c", f"touch {marker}"))

    @step(agent="a")
    def plan(task: str, audience: str) -> str:
        return f"{task} for {audience}"

    pipe = Pipeline.from_steps([plan], name="needs-inputs")
    with trio.fail_after(LIMIT), pytest.raises(UsageError) as caught:
        await run_pipeline(pipe, {"task": "t"}, cwd=workspace(tmp_path), config=config(spec))
    assert isinstance(caught.value, PipelineError)
    assert "missing input 'audience'" in str(caught.value)
    assert not marker.exists()
    assert await list_runs() == []


async def test_agent_whose_program_is_missing_is_refused_before_any_agent_starts(
    tmp_path: Path,
) -> None:
    """A step whose agent command is not on PATH is refused before another step's agent starts,
    with the error a prompt gives (AgentNotFound), its note naming the step."""
    marker = tmp_path / "agent-started"
    spec = AgentSpec("a", ("sh", "-c", f"touch {marker}"))

    @step(agent="a")
    def plan(task: str) -> str:
        return task

    @step(agent="nobody-has-this-agent")
    def build(plan: StepResult) -> str:
        return plan.text

    pipe = Pipeline.from_steps([plan, build], name="unknown-agent")
    with trio.fail_after(LIMIT), pytest.raises(UsageError) as caught:
        await run_pipeline(pipe, {"task": "t"}, cwd=workspace(tmp_path), config=config(spec))
    assert isinstance(caught.value, AgentNotFound)
    assert str(caught.value) == "agent nobody-has-this-agent: 'nobody-has-this-agent' not found"
    assert caught.value.__notes__ == ["named by step build"]
    assert not marker.exists()


# --------------------------------------------------------------------------- resume


async def test_resume_reruns_only_the_failed_step_and_its_descendants(tmp_path: Path) -> None:
    """Resume after build failed runs build and check only; plan and side are reused."""
    ws = workspace(tmp_path)
    record_a = tmp_path / "a.jsonl"
    record_flaky = tmp_path / "flaky.jsonl"
    tally = tmp_path / "tally.txt"
    a = spec_for(
        AgentScript(turns=(Turn(steps=(Say("ok"),)),), record_path=str(record_a)), tmp_path, "a"
    )
    broken = spec_for(
        AgentScript(
            turns=(Turn(error=ErrorReply(-32603, "flaky failure")),),
            record_path=str(record_flaky),
        ),
        tmp_path / "broken",
        "flaky",
    )
    fixed = spec_for(
        AgentScript(turns=(Turn(steps=(Say("built"),)),), record_path=str(record_flaky)),
        tmp_path / "fixed",
        "flaky",
    )
    with trio.fail_after(LIMIT):
        first = await run_pipeline(
            PIPELINES / "runner_resume.py",
            {"task": "t", "tally": str(tally)},
            cwd=ws,
            config=config(a, broken),
        )
    assert first.status == "failed"
    assert first.steps["build"].status == "failed"
    assert "flaky failure" in str(first.steps["build"].error)
    assert first.steps["check"].status == "skipped"
    assert first.steps["side"].status == "succeeded"
    assert not tally.exists()

    events: list[RunEvent] = []
    with trio.fail_after(LIMIT):
        second = await resume_run(first.run_id, config=config(a, fixed), on_event=events.append)
    assert second.run_id == first.run_id
    assert second.status == "succeeded"
    assert {name: s.status for name, s in second.steps.items()} == {
        "plan": "succeeded",
        "build": "succeeded",
        "check": "succeeded",
        "side": "succeeded",
    }
    assert second.steps["check"].instances["check"].value == "built"
    # plan and side were prompted once over both runs; build twice (failed, then fixed)
    assert sorted(p.split(":")[0] for p in prompts(record_a)) == ["plan", "side"]
    assert [p.split(":")[0] for p in prompts(record_flaky)] == ["build", "build"]
    assert tally.read_text() == "check\n"
    reused = {e.step for e in events if e.type == "step_reused"}
    started = {e.step for e in events if e.type == "step_started"}
    assert reused == {"plan", "side"}
    assert started == {"build", "check"}
    stored = await get_run_json(first.run_id)
    assert stored["status"] == "succeeded"


# --------------------------------------------------------------------------- branches and apply


WRITER = AgentScript(
    turns=(
        Turn(
            steps=(
                WriteFile("readme.txt", "hello, edited through fs\n"),
                WriteFile("src/via_fs.txt", "written through fs/write_text_file\n"),
                WriteDisk("on_disk.txt", "written straight to disk\n"),
                Say("wrote three files"),
            )
        ),
    )
)


def flaky_in_code(flag: Path) -> Pipeline:
    """write (the in-memory writer) -> gate (Python: fails until ``flag`` exists)."""

    @step(agent="m")
    def write() -> str:
        return "write notes"

    @step
    def gate(write: StepResult) -> int:
        if not flag.exists():
            raise RuntimeError("not yet")
        return len(write.changes)

    return Pipeline.from_steps([write, gate], name="in-code")


async def test_a_pipeline_built_in_code_resumes_when_given_again(tmp_path: Path) -> None:
    """No file holds it: resume asks for the pipeline, and with it reuses the finished step."""
    ws = workspace(tmp_path)
    flag = tmp_path / "flag"
    pipe = flaky_in_code(flag)
    kwargs: dict[str, Any] = {
        "config": config(AgentSpec("m", ("unused-in-memory-agent",))),
        "connector": memory_connector(memory_writer),
    }
    with trio.fail_after(LIMIT):
        first = await run_pipeline(pipe, cwd=ws, **kwargs)
    assert (first.status, first.steps["gate"].error_kind) == ("failed", "exception")
    with pytest.raises(UsageError, match="built in code"):
        await resume_run(first.run_id, **kwargs)
    flag.touch()
    events: list[RunEvent] = []
    with trio.fail_after(LIMIT):
        second = await resume_run(first.run_id, pipeline=pipe, on_event=events.append, **kwargs)
    assert (second.status, second.steps["gate"].value) == ("succeeded", 1)
    assert {e.step for e in events if e.type == "step_reused"} == {"write"}


async def test_resume_keeps_the_verify_commands_the_run_was_started_with(tmp_path: Path) -> None:
    """A step that failed its verify command fails it again on resume, unless verify is given."""
    ws = workspace(tmp_path)
    kwargs: dict[str, Any] = {
        "config": config(AgentSpec("m", ("unused-in-memory-agent",))),
        "connector": memory_connector(memory_writer),
    }
    pipe = two_step_pipeline()
    with trio.fail_after(LIMIT):
        first = await run_pipeline(
            pipe, {"name": "notes"}, cwd=ws, verify={"write": "test -f verified.txt"}, **kwargs
        )
        assert first.steps["write"].error == "verify failed: exit 1"
        again = await resume_run(first.run_id, pipeline=pipe, **kwargs)
        assert (again.status, again.steps["write"].error) == ("failed", "verify failed: exit 1")
        relaxed = await resume_run(first.run_id, pipeline=pipe, verify={}, **kwargs)
    assert relaxed.status == "succeeded"


async def test_branch_changes_reach_the_diff_and_are_applied_only_on_request(
    tmp_path: Path,
) -> None:
    """fs/* and disk writes reach the run's diff; only apply_run writes the workspace."""
    ws = workspace(tmp_path, {"readme.txt": "hello\n", "keep.txt": "untouched\n"})
    before = tree(ws)

    @step(agent="writer")
    def edit(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([edit], name="edit"),
            {"task": "write"},
            cwd=ws,
            config=config(spec_for(WRITER, tmp_path, "writer")),
        )
    assert outcome.status == "succeeded"
    changes = {c["path"]: c["change"] for c in outcome.result["changes"]}
    assert changes == {
        "readme.txt": "modified",
        "src/via_fs.txt": "added",
        "on_disk.txt": "added",
    }
    for text in ("hello, edited through fs", "written through fs", "written straight to disk"):
        assert text in outcome.diff
    assert (Path(outcome.run_dir) / "changes.patch").read_text()
    assert tree(ws) == before  # nothing written without apply

    # the workspace moves on under a file the run changed: apply refuses and writes nothing
    (ws / "readme.txt").write_text("hello, changed by a human\n")
    with trio.fail_after(LIMIT):
        refused = await apply_run(outcome.run_id)
    assert not refused.applied
    assert refused.workspace_changed == ("readme.txt",)
    assert tree(ws) == {**before, "readme.txt": "hello, changed by a human\n"}

    (ws / "readme.txt").write_text("hello\n")
    with trio.fail_after(LIMIT):
        applied = await apply_run(outcome.run_id)
    assert applied.applied
    assert set(applied.written) == {"readme.txt", "src/via_fs.txt", "on_disk.txt"}
    assert tree(ws) == {
        "keep.txt": "untouched\n",
        "on_disk.txt": "written straight to disk\n",
        "readme.txt": "hello, edited through fs\n",
        "src/via_fs.txt": "written through fs/write_text_file\n",
    }
    assert (await get_run_json(outcome.run_id))["applied"] is True


def write_pytest_cache(root: Path) -> None:
    """What ``pytest`` leaves behind: ``.pytest_cache/`` with a ``.gitignore`` of ``*``."""
    cache = root / ".pytest_cache"
    (cache / "v/cache").mkdir(parents=True)
    (cache / ".gitignore").write_text("# Created by pytest automatically.\n*\n")
    (cache / "README.md").write_text("# pytest cache directory #\n")
    (cache / "v/cache/nodeids").write_text('[\n  "test_app.py::test_x"\n]\n')


async def test_what_git_ignores_in_a_step_directory_is_neither_diffed_nor_applied(
    tmp_path: Path,
) -> None:
    """A verify step's .pytest_cache/ (own .gitignore) and build/ (root .gitignore) stay out."""
    ws = workspace(tmp_path, {".gitignore": "build/\n", "app.py": "x = 1\n"})
    before = tree(ws)

    @step
    def verify(workdir: Path) -> str:
        write_pytest_cache(workdir)
        (workdir / "build").mkdir()
        (workdir / "build/app.o").write_bytes(b"\x7fELF")
        (workdir / "report.txt").write_text("1 passed\n")
        return "1 passed"

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([verify], name="verify"), {}, cwd=ws, config=config()
        )
    assert outcome.status == "succeeded"
    assert {c["path"]: c["change"] for c in outcome.result["changes"]} == {"report.txt": "added"}
    for diff in (outcome.diff, (Path(outcome.run_dir) / "changes.patch").read_text()):
        assert "report.txt" in diff
        assert ".pytest_cache" not in diff and "build/" not in diff
    with trio.fail_after(LIMIT):
        applied = await apply_run(outcome.run_id)
    assert applied.applied and applied.written == ("report.txt",)
    assert tree(ws) == {**before, "report.txt": "1 passed\n"}
    assert not (ws / ".pytest_cache").exists() and not (ws / "build").exists()


# --------------------------------------------------------------------------- applying records


async def record_prompt(
    state: Path, cwd: Path, changes: list[StoredChange], status: str = "succeeded"
) -> str:
    """A prompt run as the store keeps it: one step named prompt, its changes under FINAL."""
    run_id = "p" + os.urandom(5).hex()
    now = time.time()
    async with open_run_store(state) as store:
        await store.create_run(RunRecord(run_id, "prompt", status, now, str(cwd), finished=now))
        await store.put_step(StepRecord(run_id, "prompt", "prompt", agent="x", status="succeeded"))
        await store.put_changes(run_id, FINAL, changes, diff="")
    return run_id


def digest(data: bytes) -> str:
    """The content digest the store records (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


def change(path: str, text: str, base: str | None) -> StoredChange:
    """A stored write of ``text`` over the base ``base`` (its text, or a digest marker)."""
    digest_of = base if base in (None, BASE_UNKNOWN) else digest(base.encode())
    return StoredChange(path, "write", text.encode(), None, digest_of)


@pytest.mark.parametrize("status", ["succeeded", "conflicts"])
async def test_a_prompt_run_applies_from_its_final_changes(
    tmp_path: Path, state_dir: Path, status: str
) -> None:
    """A prompt run applies its FINAL changes, as a whole or as its step; once only.

    ("conflicts" is what older releases recorded for a prompt whose apply found the workspace
    changed: a prompt has no branches to conflict, so it is checked like any apply.)
    """
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    run_id = await record_prompt(state_dir, ws, [change("a.txt", "new\n", "old\n")], status)
    with trio.fail_after(30):
        outcome = await apply_run(run_id[:4], step="prompt")
        assert (outcome.run_id, outcome.applied, outcome.written) == (run_id, True, ("a.txt",))
        assert outcome.keys == (FINAL,)
        with pytest.raises(AlreadyApplied, match="already applied at"):
            await apply_run(run_id)
    assert (ws / "a.txt").read_text() == "new\n"


async def test_a_change_whose_base_is_unknown_is_shown_and_never_applied(
    tmp_path: Path, state_dir: Path
) -> None:
    """A change recorded with an unknown base is refused (exit 3), the file unchanged or not."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    run_id = await record_prompt(state_dir, ws, [change("a.txt", "new\n", BASE_UNKNOWN)])
    with trio.fail_after(30):
        outcome = await apply_run(run_id)
    assert (outcome.applied, outcome.workspace_changed, outcome.exit_code) == (
        False,
        ("a.txt",),
        3,
    )
    assert (ws / "a.txt").read_text() == "old\n"


async def test_stored_changes_keep_a_file_changed_before_the_run_read_it(tmp_path: Path) -> None:
    """stored_changes keeps such a change with an unknown base; diff_of shows it whole."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    (ws / "b.txt").write_text("b\n")
    past = time.time() - 60  # not racily clean: the snapshot does not hash it up front
    os.utime(ws / "a.txt", (past, past))
    snap = Workspace.open(ws).snapshot()
    branch = Branch.from_tree(snap, "x")
    (ws / "a.txt").write_text("someone else\n")  # before the branch ever read it
    branch.write("a.txt", b"the run's\n")
    branch.write("b.txt", b"b2\n")
    net = branch.net_changes()
    stored = {c.path: c.base_digest for c in stored_changes(snap, net)}
    assert stored == {"a.txt": BASE_UNKNOWN, "b.txt": digest(b"b\n")}
    diff = diff_of(branch, net)
    assert "@@ base changed in the workspace during the run: the new version, whole @@" in diff
    assert "+the run's" in diff and "+b2" in diff


async def test_cancelled_run_records_the_interrupted_turn_with_its_cancelled_permission(
    tmp_path: Path, state_dir: Path
) -> None:
    """Cancelled with a permission pending: answered cancelled, the turn ended and recorded."""
    ws = workspace(tmp_path, {"readme.txt": "hello\n"})
    agent_record = tmp_path / "agent.jsonl"
    ask = AskPermission(PermissionToolCall("make-1", title="make", kind="execute"))
    script = AgentScript(
        turns=(
            Turn(steps=(Say("half way"), WriteDisk("draft.txt", "draft\n"), ask, Say(" done"))),
        ),
        record_path=str(agent_record),
    )
    policy = PolicySet(run=Policy([Rule("ask", name="ask before running", kinds="execute")]))

    @step(agent="a")
    def work(task: str) -> str:
        return task

    with trio.fail_after(LIMIT), trio.CancelScope() as scope:

        async def escalate(escalation: Escalation) -> Answer | None:
            scope.cancel()  # Ctrl-C while the human is asked
            await trio.sleep_forever()

        await run_pipeline(
            Pipeline.from_steps([work], name="interrupted"),
            {"task": "build it"},
            cwd=ws,
            config=config(spec_for(script, tmp_path, "a")),
            policy=policy,
            escalate=escalate,
        )
    assert scope.cancelled_caught
    [run] = await list_runs()
    shown = await get_run_json(run.run_id)
    assert shown["status"] == "interrupted"
    instance = shown["steps"]["work"]["instances"]["work"]
    assert instance["status"] == "interrupted"
    assert (instance["text"], instance["stopReason"]) == ("half way", "cancelled")
    assert instance["changes"] == [{"path": "draft.txt", "change": "added"}]
    assert [(p["toolCallId"], p["verdict"]) for p in instance["permissions"]] == [
        ("make-1", "cancelled")
    ]
    async with open_run_store(state_dir) as store:
        audit = await store.permissions(run.run_id)
    assert [(p["toolCallId"], p["verdict"]) for p in audit] == [("make-1", "cancelled")]
    # the agent was told the ACP way, and answered the turn before its process was stopped
    events = [e for e in AgentRecord.from_jsonl(agent_record).events if e["event"] != "recv"]
    kinds = [e["event"] for e in events]
    assert "cancel_request" not in kinds
    assert kinds.index("cancel") < kinds.index("turn_end") < kinds.index("eof")
    [answer] = [e for e in events if e["event"] == "response"]
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}


# --------------------------------------------------------------------------- compare


async def test_compare_runs_each_agent_on_its_branch_and_applies_only_the_chosen_one(
    tmp_path: Path,
) -> None:
    """Two agents, verify 'test -f done.txt': a passes, b fails; apply='a' writes only a's files."""
    ws = workspace(tmp_path, {"base.txt": "base\n"})
    a = spec_for(
        AgentScript(
            turns=(
                Turn(
                    steps=(
                        WriteFile("done.txt", "done by a\n"),
                        WriteFile("a.txt", "from a\n"),
                        Say("a finished"),
                    )
                ),
            )
        ),
        tmp_path,
        "a",
    )
    b = spec_for(
        AgentScript(turns=(Turn(steps=(WriteDisk("b.txt", "from b\n"), Say("b finished"))),)),
        tmp_path,
        "b",
    )
    with trio.fail_after(LIMIT):
        outcome = await compare(
            [a, b],
            "make done.txt",
            verify="test -f done.txt",
            apply="a",
            cwd=ws,
            config=Config(agents={}),
        )
    assert outcome.status == "succeeded"
    assert outcome.result["applied"] == "a"
    # the store says the same: the agent applied, by name
    assert (await get_run_json(outcome.run_id))["applied"] == "a"
    agents = {one["name"]: one for one in outcome.result["agents"]}
    assert set(agents) == {"a", "b"}
    assert agents["a"]["text"] == "a finished"
    assert agents["b"]["text"] == "b finished"
    assert agents["a"]["verify"]["exitCode"] == 0
    assert agents["b"]["verify"]["exitCode"] != 0
    assert (agents["b"]["status"], agents["b"]["error"]) == ("failed", "verify failed: exit 1")
    assert (outcome.result["succeeded"], outcome.result["winner"]) == (["a"], "a")
    assert {c["path"] for c in agents["a"]["changes"]} == {"a.txt", "done.txt"}
    assert {c["path"] for c in agents["b"]["changes"]} == {"b.txt"}
    assert tree(ws) == {"a.txt": "from a\n", "base.txt": "base\n", "done.txt": "done by a\n"}


# --------------------------------------------------------------------------- the store


def two_step_pipeline() -> Pipeline:
    """write (an agent writes notes.txt) -> count (Python, writes count.txt in its workdir)."""

    @step(agent="m")
    def write(name: str) -> str:
        return f"write {name}"

    @step
    def count(write: StepResult, workdir: Path) -> int:
        (workdir / "count.txt").write_text(f"{len(write.changes)}\n")
        return len(write.changes)

    return Pipeline.from_steps([write, count], name="store")


def memory_writer(_: AgentSpec) -> AgentScript:
    """An in-memory agent that writes notes.txt."""
    return AgentScript(turns=(Turn(steps=(WriteFile("notes.txt", "a note\n"), Say("noted"))),))


async def run_memory(ws: Path, **kwargs: Any) -> RunOutcome:
    """Run :func:`two_step_pipeline` with the in-memory writer."""
    with trio.fail_after(LIMIT):
        return await run_pipeline(
            two_step_pipeline(),
            {"name": "notes"},
            cwd=ws,
            config=config(AgentSpec("m", ("unused-in-memory-agent",))),
            connector=memory_connector(memory_writer),
            **kwargs,
        )


async def test_get_run_json_list_runs_and_diff_run_read_back_finished_runs(
    tmp_path: Path,
) -> None:
    """Stored JSON matches the outcome; runs list newest first; diffs whole or per step."""
    ws = workspace(tmp_path, {"readme.txt": "hello\n"})
    first = await run_memory(ws)
    second = await run_memory(ws)
    assert first.status == second.status == "succeeded"

    stored = await get_run_json(first.run_id)
    assert stored["status"] == first.result["status"] == "succeeded"
    assert stored["steps"] == first.result["steps"]
    assert stored["steps"]["count"]["instances"]["count"]["value"] == 1
    assert stored["runId"] == first.run_id

    runs = await list_runs()
    assert [r.run_id for r in runs] == [second.run_id, first.run_id]
    assert [r.status for r in runs] == ["succeeded", "succeeded"]
    assert [r.run_id for r in await list_runs(limit=1)] == [second.run_id]

    whole = await diff_run(first.run_id)
    assert whole == first.diff
    assert "+++ b/notes.txt" in whole
    assert "+++ b/count.txt" in whole
    # a step's diff is its tree against the run's base: write's has only its own file
    of_write = await diff_run(first.run_id, step="write")
    assert "+++ b/notes.txt" in of_write
    assert "count.txt" not in of_write
    of_count = await diff_run(first.run_id, step="count")
    assert "+++ b/notes.txt" in of_count
    assert "+++ b/count.txt" in of_count
    with pytest.raises(UsageError):
        await diff_run(first.run_id, step="no_such_step")


async def test_a_directory_made_a_symlink_is_recorded_whole_and_applies(tmp_path: Path) -> None:
    """A step that moves a directory aside and leaves a symlink in its place: the directory's
    files are deleted in the run's changes, a step after it runs on that tree, nothing counts
    as changed in the workspace, and the apply writes it."""
    ws = workspace(tmp_path, {"a.txt": "a\n"})
    (ws / "sub/deep").mkdir(parents=True)
    (ws / "sub/deep/keep.txt").write_text("keep\n")

    @step
    def swap(workdir: Path) -> None:
        (workdir / "sub/deep").rename(workdir / "sub/deep2")
        (workdir / "sub/deep").symlink_to("deep2")

    @step
    def after(swap: None, workdir: Path) -> None:
        (workdir / "later.txt").write_text("x\n")

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([swap, after], name="swap"), {}, cwd=ws, apply=True
        )
    assert outcome.status == "succeeded" and outcome.workspace_changed == ()
    assert {c["path"]: c["change"] for c in outcome.result["changes"]} == {
        "later.txt": "added",
        "sub/deep": "added",
        "sub/deep/keep.txt": "deleted",
        "sub/deep2/keep.txt": "added",
    }
    assert os.readlink(ws / "sub/deep") == "deep2"
    assert tree(ws) == {"a.txt": "a\n", "later.txt": "x\n", "sub/deep2/keep.txt": "keep\n"}
