"""Agent steps with a check and rounds: the agent keeps working in its session until the check
passes, each round recorded; what a check writes never becomes the agent's work.

The agents are real subprocesses: the demo agent (whose prompt lines are instructions, so a
check's output that holds one is a fix it carries out) and scripted agents.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from run_helpers import (
    CLI,
    as_json,
    config,
    record_events,
    run_cli,
    spec_for,
    workspace,
)

from orchestrator.cli.live import PlainView, round_note
from orchestrator.cli.output import SCHEMA_VERSION, output_schema
from orchestrator.config import Config
from orchestrator.errors import UsageError
from orchestrator.pipeline import Budget, CheckResult, Pipeline, default_feedback, step
from orchestrator.pipeline.results import RunEvent, StepResult
from orchestrator.runs import (
    CheckEntry,
    RoundEntry,
    RunOutcome,
    get_run_json,
    list_runs,
    resume_run,
    run_pipeline,
)
from orchestrator.testing import AgentScript, Turn
from orchestrator.testing.script import WriteDisk

LIMIT = 60.0  # seconds any one run here may take

ITEMS = [f"f{i}.txt" for i in range(10)]
#: items whose check asks for a second round
TWICE = {"f2.txt", "f5.txt", "f7.txt"}
#: the item whose check never passes
NEVER = "f9.txt"
#: what the check says of it: long, so that its rounds use up the token budget
NEVER_SAYS = "f9.txt is not right yet: " + "x" * 2000


async def run(pipe: Pipeline, ws: Path, cfg: Config | None = None, **kw: Any) -> RunOutcome:
    """Run ``pipe`` on ``ws`` under the ``edit`` policy, within the time limit."""
    with trio.fail_after(LIMIT):
        return await run_pipeline(pipe, {}, cwd=ws, config=cfg or config(), policy="edit", **kw)


def valid(outcome: RunOutcome) -> None:
    """The run's ``--json`` object is valid under the shipped schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(
        {"schemaVersion": SCHEMA_VERSION, **outcome.result}
    )


def item_check(workdir: Path, result: StepResult) -> tuple[bool, str]:
    """Pass an item once it says ``done`` (and ``checked``, for the items of TWICE); the fix
    is the check's message, an instruction the demo agent carries out. Writes a scratch file."""
    (workdir / "check.log").write_text(f"checked {result.item}\n")
    item = str(result.item)
    text = (workdir / item).read_text()
    if item == NEVER:
        return False, NEVER_SAYS
    if "done" not in text:
        return False, f'replace "todo" with "done" in {item}'
    if item in TWICE and "checked" not in text:
        return False, f'append "checked" to {item}'
    return True, f"{item} is fine"


async def test_fan_out_rounds_until_each_item_passes(tmp_path: Path, state_dir: Path) -> None:
    """Ten items: most pass in one round, three need a second one, one never passes and is
    stopped by the budget; the run reports exactly those, and merges only the passed items."""
    ws = workspace(tmp_path, dict.fromkeys(ITEMS, "todo\n"))

    @step
    def files() -> list[str]:
        return ITEMS

    @step(agent="demo", over="files", check=item_check, rounds=5, budget=Budget(max_tokens=3000))
    def edit(item: str) -> str:
        return f'replace "todo" with "done" in {item}'

    outcome = await run(Pipeline.from_steps([files, edit], name="rounds"), ws)
    assert outcome.status == "failed"
    valid(outcome)
    instances = outcome.result["steps"]["edit"]["instances"]
    for item in ITEMS:
        one = instances[item]
        checks = [r["check"] for r in one["rounds"]]
        if item == NEVER:
            # round 1 and 2 fail the check; round 3 goes over the budget: no check, no round 4
            assert one["status"] == "failed"
            assert one["errorKind"] == "budget"
            assert [r["turn"] for r in one["rounds"]] == [1, 2, 3]
            assert [c["passed"] for c in checks[:2]] == [False, False]
            assert checks[0]["output"] == NEVER_SAYS
            assert checks[2] is None
            continue
        assert one["status"] == "succeeded", one["error"]
        expected = [False, True] if item in TWICE else [True]
        assert [c["passed"] for c in checks] == expected, item
        assert all(c["exitCode"] is None for c in checks)  # a Python check has no exit code
        assert one["changes"] == [{"path": item, "change": "modified"}]
    # the same, typed
    typed = outcome.steps["edit"].instances
    assert [r.passed for r in typed["f5.txt"].rounds] == [False, True]
    assert typed["f5.txt"].rounds[0].check == CheckEntry(
        passed=False, output='append "checked" to f5.txt', exit_code=None, timed_out=False
    )
    assert typed[NEVER].rounds[2] == RoundEntry(turn=3, stop_reason="end_turn", check=None, diff="")
    assert [r.to_json() for r in typed["f5.txt"].rounds] == instances["f5.txt"]["rounds"]
    # what reaches the run's result: the items that passed, and nothing a check wrote
    merged = {c["path"] for c in outcome.result["changes"]}
    assert merged == set(ITEMS) - {NEVER}
    assert "check.log" not in outcome.diff
    assert (ws / "f0.txt").read_text() == "todo\n"  # nothing applied
    stored = await get_run_json(outcome.run_id, state_dir=state_dir)
    assert stored["steps"]["edit"]["instances"]["f2.txt"]["rounds"] == instances["f2.txt"]["rounds"]
    assert "+checked" in instances["f2.txt"]["diff"]
    # each round's own diff: round 1 the replacement, round 2 the line the check asked for
    first, second = (r["diff"] for r in instances["f2.txt"]["rounds"])
    assert "-todo\n+done\n" in first and "checked" not in first
    assert "\n done\n+checked\n" in second and "-todo" not in second


async def test_second_prompt_carries_the_check_output(tmp_path: Path) -> None:
    """A shell check fails the first round: the same session's second prompt holds its output
    and exit status; the agent fixes it in round 2, the step succeeds with two rounds."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    script = AgentScript(
        name="fixer",
        record_path=str(tmp_path / "fixer.jsonl"),
        turns=(
            Turn(steps=(WriteDisk("a.txt", "bad\n"),)),
            Turn(steps=(WriteDisk("a.txt", "good\n"),)),
        ),
    )
    spec = spec_for(script, tmp_path, "fixer")
    check = "grep -q good a.txt || { echo 'a.txt holds:'; cat a.txt; exit 3; }"

    @step(agent="fixer", check=check, rounds=3)
    def fix() -> str:
        return "make a.txt good"

    outcome = await run(Pipeline.from_steps([fix], name="fix"), ws, config(spec))
    assert outcome.status == "succeeded", outcome.result["steps"]["fix"]
    valid(outcome)
    one = outcome.result["steps"]["fix"]["instances"]["fix"]
    failed = {"passed": False, "exitCode": 3, "output": "a.txt holds:\nbad", "timedOut": False}
    passed = {"passed": True, "exitCode": 0, "output": "", "timedOut": False}
    first, second = (r.pop("diff") for r in one["rounds"])
    assert one["rounds"] == [
        {"turn": 1, "stopReason": "end_turn", "check": failed},
        {"turn": 2, "stopReason": "end_turn", "check": passed},
    ]
    assert "-start\n+bad\n" in first and "-bad\n+good\n" in second
    prompts = [e for e in record_events(tmp_path / "fixer.jsonl") if e["event"] == "prompt"]
    assert [p["text"] for p in prompts[:1]] == ["make a.txt good"]
    assert len(prompts) == 2
    assert prompts[1]["sessionId"] == prompts[0]["sessionId"]  # the same session
    second = prompts[1]["text"]
    assert "exit status 3" in second
    assert "a.txt holds:\nbad" in second
    assert second == default_feedback(CheckResult(False, "a.txt holds:\nbad", 3), 2)
    assert one["changes"] == [{"path": "a.txt", "change": "modified"}]
    assert "+good" in outcome.diff


async def test_check_output_never_becomes_the_agents_work(tmp_path: Path) -> None:
    """A check that never passes: the instance fails with its last output after N rounds, and
    what it wrote, changed or deleted in the branch directory is in no round's work."""
    ws = workspace(tmp_path, {"a.txt": "one\n", "keep.txt": "kept\n"})
    check = (
        "echo scratch > junk.txt; echo changed >> keep.txt; rm -f a.txt; echo round over; exit 1"
    )
    seen: list[str] = []

    def feedback(result: CheckResult, round: int) -> str:
        seen.append(f"{round}: {result.exit_code} {result.output}")
        return f'append "more" to a.txt\nappend "{round}" to a.txt'

    @step(agent="demo", check=check, rounds=3, feedback=feedback)
    def grow() -> str:
        return 'append "two" to a.txt'

    outcome = await run(Pipeline.from_steps([grow], name="grow"), ws)
    assert outcome.status == "failed"
    one = outcome.result["steps"]["grow"]["instances"]["grow"]
    assert one["errorKind"] == "check"
    assert one["error"] == "check failed (exit 1) after 3 rounds: round over"
    assert [r["check"]["exitCode"] for r in one["rounds"]] == [1, 1, 1]
    assert seen == ["2: 1 round over", "3: 1 round over"]
    # each round found a.txt as the agent left it (the check deleted it each time)
    assert "+more\n+2\n+more\n+3" in one["diff"]
    assert one["changes"] == [{"path": "a.txt", "change": "modified"}]
    assert "junk" not in one["diff"] and "keep.txt" not in one["diff"]


async def test_retries_start_the_rounds_over_on_a_fresh_branch(tmp_path: Path) -> None:
    """With retries, a failed loop starts again from a fresh branch: the second attempt's
    rounds do not see the first attempt's work."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    @step(agent="demo", check="exit 1", rounds=2, retries=1)
    def grow() -> str:
        return 'append "line" to a.txt'

    outcome = await run(Pipeline.from_steps([grow], name="grow"), ws)
    one = outcome.result["steps"]["grow"]["instances"]["grow"]
    assert one["attempt"] == 2
    assert len(one["rounds"]) == 2
    # the default feedback holds no instruction: one appended line per attempt, not more
    assert one["diff"].count("+line") == 1


async def test_rounds_end_when_the_turn_does_not_end_end_turn(tmp_path: Path) -> None:
    """An agent that refuses ends the loop at once: no check runs on that round."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    marker = tmp_path / "checked"
    script = AgentScript(name="refuser", turns=(Turn(stop_reason="refusal"),))
    spec = spec_for(script, tmp_path, "refuser")

    @step(agent="refuser", check=f"touch {marker}", rounds=3)
    def ask() -> str:
        return "do it"

    outcome = await run(Pipeline.from_steps([ask], name="ask"), ws, config(spec))
    one = outcome.result["steps"]["ask"]["instances"]["ask"]
    assert one["errorKind"] == "stopped"
    assert one["rounds"] == [{"turn": 1, "stopReason": "refusal", "check": None, "diff": ""}]
    assert not marker.exists()


async def test_async_check_and_check_result(tmp_path: Path) -> None:
    """An ``async`` check returning a CheckResult decides like any check."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    async def check(workdir: Path, result: StepResult) -> CheckResult:
        await trio.lowlevel.checkpoint()
        ok = "go" in (workdir / "a.txt").read_text()
        return CheckResult(ok, "needs go" if not ok else "", exit_code=None)

    @step(agent="demo", check=check, rounds=2, feedback=lambda c, n: 'append "go" to a.txt')
    def grow() -> str:
        return 'append "stop" to a.txt'

    outcome = await run(Pipeline.from_steps([grow], name="grow"), ws)
    assert outcome.status == "succeeded"
    one = outcome.result["steps"]["grow"]["instances"]["grow"]
    assert [r["check"]["output"] for r in one["rounds"]] == ["needs go", ""]


def test_rounds_options_are_checked() -> None:
    """rounds and feedback need a check; a check needs an agent step; values are checked."""

    def prompt() -> str:
        return "x"

    with pytest.raises(UsageError, match="rounds needs a check"):
        step(agent="demo", rounds=2)(prompt)
    with pytest.raises(UsageError, match="feedback needs a check"):
        step(agent="demo", feedback=default_feedback)(prompt)
    with pytest.raises(UsageError, match="check only applies to agent steps"):
        step(check="true")(prompt)
    with pytest.raises(UsageError, match="rounds must be 1 or more"):
        step(agent="demo", check="true", rounds=0)(prompt)
    with pytest.raises(TypeError, match="rounds must be an int"):
        step(agent="demo", check="true", rounds=True)(prompt)
    with pytest.raises(TypeError, match="check must be a shell command or a callable"):
        step(agent="demo", check=3)(prompt)  # type: ignore[call-overload]
    with pytest.raises(UsageError, match="check is an empty command"):
        step(agent="demo", check=" ")(prompt)
    made = step(agent="demo", check="true", rounds=4)(prompt)
    assert (made.check, made.rounds, made.feedback) == ("true", 4, None)


def test_rounds_are_bounded() -> None:
    """rounds beyond 100 are refused in one line naming the limit."""

    def prompt() -> str:
        return "x"

    with pytest.raises(
        UsageError, match=r"^step 'prompt': rounds must be at most 100, not 10{30}$"
    ):
        step(agent="demo", check="true", rounds=10**30)(prompt)
    assert step(agent="demo", check="true", rounds=100)(prompt).rounds == 100


def test_a_python_checks_signature_is_checked() -> None:
    """A Python check that cannot take (workdir, result) is refused when the step is made."""

    def prompt() -> str:
        return "x"

    with pytest.raises(TypeError, match=r"check must take two positional arguments .*\(\)$"):
        step(agent="demo", check=lambda: True)(prompt)
    with pytest.raises(TypeError, match="check must take two positional arguments"):
        step(agent="demo", check=lambda workdir, result, more: True)(prompt)
    assert step(agent="demo", check=lambda *args: True)(prompt).check is not None


CLI_PIPELINE = """
from orchestrator import step

CHECK = "grep -q fixed a.txt || { echo 'append \\"fixed\\" to a.txt'; exit 1; }"


@step(agent="demo", check=CHECK, rounds=2)
def fix() -> str:
    return 'append "tried" to a.txt'
"""


async def test_run_json_and_show_give_every_round(tmp_path: Path) -> None:
    """``run --json`` lists the instance's rounds (valid under the schema); ``show`` prints a
    line per round with what its check said."""
    ws, state = workspace(tmp_path, {"a.txt": "start\n"}), tmp_path / "state"
    pipeline = tmp_path / "fix.py"
    pipeline.write_text(CLI_PIPELINE)
    done = await run_cli(
        "run", str(pipeline), "--cwd", str(ws), "--policy", "edit", "--json", cwd=ws, state=state
    )
    assert done.returncode == 0, done.stderr.decode()
    result = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(result)
    [node] = result["graph"]["nodes"]
    assert (node["check"], node["rounds"]) == (
        "grep -q fixed a.txt || { echo 'append \"fixed\" to a.txt'; exit 1; }",
        2,
    )
    rounds = result["steps"]["fix"]["instances"]["fix"]["rounds"]
    assert [(r["turn"], r["check"]["passed"], r["check"]["exitCode"]) for r in rounds] == [
        (1, False, 1),
        (2, True, 0),
    ]
    assert rounds[0]["check"]["output"] == 'append "fixed" to a.txt'
    shown = await run_cli("show", result["runId"], cwd=ws, state=state)
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stdout.decode()
    assert '      round 1: check failed (exit 1): append "fixed" to a.txt\n' in text
    assert "      round 2: check passed (exit 0)\n" in text


async def test_cancelled_during_a_check_keeps_the_rounds_work(
    tmp_path: Path, state_dir: Path
) -> None:
    """Cancelled while its check runs, the instance is recorded interrupted with the rounds so
    far and the round's harvested work; the run is interrupted."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    checking = trio.Event()
    scope = trio.CancelScope()
    calls: list[int] = []

    async def check(workdir: Path, result: StepResult) -> bool:
        calls.append(len(calls) + 1)
        if len(calls) == 2:
            checking.set()
            await trio.sleep_forever()
        return False

    @step(agent="demo", check=check, rounds=3, feedback=lambda c, n: 'append "again" to a.txt')
    def grow() -> str:
        return 'append "first" to a.txt'

    async def cancel_when_checking() -> None:
        await checking.wait()
        scope.cancel()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_checking)
            with scope:
                await run_pipeline(
                    Pipeline.from_steps([grow], name="grow"), {}, cwd=ws, policy="edit"
                )
    assert scope.cancelled_caught
    [listed] = await list_runs()
    stored = await get_run_json(listed.run_id, state_dir=state_dir)
    one = stored["steps"]["grow"]["instances"]["grow"]
    assert stored["status"] == "interrupted"
    assert one["status"] == "interrupted"
    assert [(r["turn"], r["check"] is not None) for r in one["rounds"]] == [(1, True), (2, False)]
    assert "+first\n+again" in one["diff"]


async def test_resume_goes_on_from_the_failed_loops_branch(tmp_path: Path, state_dir: Path) -> None:
    """Resuming a run whose instance failed its rounds starts a new loop on the kept branch,
    the first prompt telling the task and the last check's feedback."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    allow = tmp_path / "allow"
    seen: list[tuple[str, int]] = []

    def check(workdir: Path, result: StepResult) -> tuple[bool, str]:
        if "second" in (workdir / "a.txt").read_text():
            return True, ""
        return False, f'append "{"second" if allow.exists() else "again"}" to a.txt'

    def feedback(result: CheckResult, round: int) -> str:
        seen.append((result.output, round))
        return result.output

    @step(agent="demo", check=check, rounds=2, feedback=feedback)
    def grow() -> str:
        return 'append "first" to a.txt'

    pipe = Pipeline.from_steps([grow], name="grow")
    first = await run(pipe, ws)
    assert first.status == "failed"
    assert first.result["steps"]["grow"]["instances"]["grow"]["errorKind"] == "check"
    allow.touch()
    with trio.fail_after(LIMIT):
        second = await resume_run(first.run_id, pipeline=pipe)
    assert second.status == "succeeded", second.result["steps"]
    one = second.result["steps"]["grow"]["instances"]["grow"]
    assert [r["check"]["passed"] for r in one["rounds"]] == [False, True]
    again = 'append "again" to a.txt'
    assert seen == [(again, 2), (again, 1), ('append "second" to a.txt', 2)]
    # the first loop's work is where the new one started
    assert "+first\n+again\n+first\n+again\n+second\n" in one["diff"]


async def test_fan_out_over_agents_iterates_each_branch_on_its_own(tmp_path: Path) -> None:
    """Two agents on one step: each has its own loop; one passes in round 2, the other never."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    def check(workdir: Path, result: StepResult) -> tuple[bool, str]:
        text = (workdir / "a.txt").read_text()
        if result.agent == "good" and "fixed" not in text:
            return False, 'append "fixed" to a.txt'
        return result.agent == "good", f"{result.agent} is never right"

    @step(agent=["good=demo", "bad=demo"], check=check, rounds=2)
    def edit() -> str:
        return 'append "tried" to a.txt'

    outcome = await run(Pipeline.from_steps([edit], name="agents"), ws)
    instances = outcome.result["steps"]["edit"]["instances"]
    assert [r["check"]["passed"] for r in instances["good"]["rounds"]] == [False, True]
    assert [r["check"]["passed"] for r in instances["bad"]["rounds"]] == [False, False]
    assert instances["good"]["status"] == "succeeded"
    assert instances["bad"]["error"] == "check failed after 2 rounds: bad is never right"
    assert "+fixed" in instances["good"]["diff"] and "+fixed" not in instances["bad"]["diff"]


async def test_the_step_timeout_spans_its_rounds(tmp_path: Path) -> None:
    """A check that outlasts the step's time is stopped when the time is up, and no round
    starts after it: the instance fails as a timeout."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    @step(agent="demo", check="sleep 60", rounds=5, timeout=3)
    def slow() -> str:
        return 'append "x" to a.txt'

    with trio.fail_after(30):  # far less than the check's own 60 s
        outcome = await run(Pipeline.from_steps([slow], name="slow"), ws)
    step_json = outcome.result["steps"]["slow"]
    assert step_json["errorKind"] == "timeout"
    assert step_json["error"] == "agent 'demo': step slow ran out of its 3s after 1 round"


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"round": 1, "rounds": 3, "passed": False}, "check failed, round 2 of 3"),
        ({"round": 3, "rounds": 3, "passed": False}, "check failed in round 3 of 3"),
        ({"round": 2, "rounds": 3, "passed": True}, "check passed in round 2 of 3"),
    ],
)
def test_progress_says_round_k_of_n(data: dict[str, Any], said: str) -> None:
    """A round's event is a progress line (and the live table's note): round k of N."""
    out = io.StringIO()
    PlainView(out)(RunEvent("step_round", "r1", "fix", "a.py", "demo", data))
    assert f"round    fix[a.py]: {said}" in out.getvalue()
    assert round_note(data) == said


async def test_feedback_that_returns_no_prompt_fails_the_instance(tmp_path: Path) -> None:
    """A feedback function returning something that is no prompt fails the instance, saying so."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    @step(agent="demo", check="exit 1", rounds=2, feedback=lambda c, n: 42)
    def grow() -> str:
        return 'append "x" to a.txt'

    outcome = await run(Pipeline.from_steps([grow], name="grow"), ws)
    one = outcome.result["steps"]["grow"]["instances"]["grow"]
    assert one["errorKind"] == "usage"
    assert one["error"].startswith("a step's feedback must return a prompt: a prompt is text")


async def test_a_failed_checks_error_is_one_line(tmp_path: Path) -> None:
    """A check's output of many lines (escapes, a long line): the instance's error is one line,
    the last one that says something; the round keeps the whole output."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    check = "printf 'first\\n\\033[2Jsecond \\001x\\n\\n  \\n'; exit 3"

    @step(agent="demo", check=check)
    def grow() -> str:
        return 'append "x" to a.txt'

    outcome = await run(Pipeline.from_steps([grow], name="grow"), ws)
    one = outcome.result["steps"]["grow"]["instances"]["grow"]
    assert one["error"] == "check failed (exit 3) after 1 round: [2Jsecond x"
    assert one["rounds"][0]["check"]["output"] == "first\n\x1b[2Jsecond \x01x\n\n  "
    long = "y" * 5000

    @step(agent="demo", check=f"echo {long}; exit 1")
    def wide() -> str:
        return 'append "x" to a.txt'

    outcome = await run(Pipeline.from_steps([wide], name="wide"), ws)
    error = outcome.result["steps"]["wide"]["instances"]["wide"]["error"]
    assert error == "check failed (exit 1) after 1 round: " + "y" * 199 + "\u2026"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_step_timeout_bounds_a_python_check(tmp_path: Path, kind: str) -> None:
    """A Python check that outlasts the step's time is abandoned when the time is up: the
    instance fails as a timeout, its late result never taken, nothing merged."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    release, finished = threading.Event(), threading.Event()

    def blocking(workdir: Path, result: StepResult) -> bool:
        release.wait(60)
        # the directory was given back (renamed away) meanwhile, or not
        with contextlib.suppress(OSError):
            (workdir / "late.txt").write_text("late\n")
        finished.set()
        return True

    async def waiting(workdir: Path, result: StepResult) -> bool:
        await trio.sleep(60)
        return True

    @step(agent="demo", check=blocking if kind == "sync" else waiting, rounds=3, timeout=3)
    def slow() -> str:
        return 'append "x" to a.txt'

    started = time.monotonic()
    try:
        with trio.fail_after(30):  # far less than the check's own 60 s
            outcome = await run(Pipeline.from_steps([slow], name="slow"), ws, apply=True)
    finally:
        release.set()
    assert time.monotonic() - started < 20
    step_json = outcome.result["steps"]["slow"]
    assert outcome.status == "failed"
    assert step_json["errorKind"] == "timeout"
    assert step_json["error"] == "agent 'demo': step slow ran out of its 3s in round 1's check"
    if kind == "sync":  # the abandoned thread ends on its own, after the run
        assert await trio.to_thread.run_sync(finished.wait, 30)
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]
    assert (ws / "a.txt").read_text() == "start\n"


async def test_the_step_timeout_bounds_a_blocking_feedback(tmp_path: Path) -> None:
    """A sync feedback function that blocks runs off the loop: the step's time still runs
    out, and the instance fails as a timeout at once."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    release = threading.Event()

    def feedback(check: CheckResult, round: int) -> str:
        release.wait(60)
        return 'append "late" to a.txt'

    @step(agent="demo", check="exit 1", rounds=2, feedback=feedback, timeout=3)
    def slow() -> str:
        return 'append "x" to a.txt'

    started = time.monotonic()
    try:
        with trio.fail_after(30):
            outcome = await run(Pipeline.from_steps([slow], name="slow"), ws)
    finally:
        release.set()
    assert time.monotonic() - started < 20
    step_json = outcome.result["steps"]["slow"]
    assert step_json["errorKind"] == "timeout"
    assert step_json["error"] == (
        "agent 'demo': step slow ran out of its 3s while its feedback ran"
    )


BLOCKING_PIPELINE = """
import time
from pathlib import Path

from orchestrator import step

STARTED = Path({started!r})


def check(workdir, result):
    STARTED.touch()
    time.sleep(60)
    return True


def feedback(check, round):
    STARTED.touch()
    time.sleep(60)
    return 'append "late" to a.txt'


@step(agent="demo", check={check}, rounds=2, feedback=feedback)
def fix() -> str:
    return 'append "tried" to a.txt'
"""


@pytest.mark.parametrize("blocked", ["check", "feedback"])
async def test_ctrl_c_is_not_held_by_a_blocking_check_or_feedback(
    tmp_path: Path, blocked: str
) -> None:
    """Ctrl-C while a sync check or feedback function blocks (60 s): the run ends at once,
    interrupted (130), the blocked thread abandoned."""
    ws, state = workspace(tmp_path, {"a.txt": "start\n"}), tmp_path / "state"
    started = tmp_path / "started"
    pipeline = tmp_path / "fix.py"
    pipeline.write_text(
        BLOCKING_PIPELINE.format(
            started=str(started),
            check="check" if blocked == "check" else repr("exit 1"),
        )
    )
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    argv = [str(CLI), "run", str(pipeline), "--cwd", str(ws), "--policy", "edit"]
    with trio.fail_after(LIMIT):
        cli = await trio.lowlevel.open_process(
            argv, cwd=ws, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            while not started.exists():
                assert cli.poll() is None
                await trio.sleep(0.05)
            signalled = time.monotonic()
            cli.send_signal(signal.SIGINT)
            with trio.fail_after(20):  # the blocked function would hold it 60 s
                code = await cli.wait()
            assert time.monotonic() - signalled < 20
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    assert code == 130
