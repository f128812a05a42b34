"""The event stream of a run: every step instance is started, updated, maybe retried, and ended
exactly once (finished, failed or skipped; or reused by a resume), and nothing follows its end.

The same property is checked over several pipelines run through
:func:`~orchestrator.runs.run_pipeline` with the demo agent (the ``on_event`` stream and the
events kept in the run store) and over the progress lines of the console script off a terminal
(plain lines and ``--log-json``): fan-in merges that fail or resolve, a verify command failing
after the agent's turn, Python steps raising, retries, conditions, empty fan-outs, a resume.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from run_helpers import CLI, run_cli

from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.results import Results, RunEvent, StepContext, StepResult
from orchestrator.runs import RunOutcome, resume_run, run_pipeline
from orchestrator.store import open_run_store

PIPELINES = Path(__file__).parent / "pipelines"
FAN_IN = PIPELINES / "fan_in_conflict.py"
RESUME = PIPELINES / "resume_events.py"
LIMIT = 60.0  # seconds any one run here may take

ENDINGS = {"step_finished", "step_failed", "step_skipped"}
#: what may happen to an instance between its start and its end
DURING = {"update", "permission", "step_round"}


def instance_of(event: Mapping[str, Any]) -> str:
    """``step[key]`` for an event of a fanned-out instance, ``step`` otherwise."""
    key = event.get("key")
    return f"{event['step']}[{key}]" if key is not None else str(event["step"])


def lifecycle_errors(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where ``events`` (JSON objects, in order) break the life of a step instance.

    An instance is started, then has updates and permissions, then ends once; a retry is
    followed by the next attempt's start. A step that ends before any instance of it starts
    (skipped, failed in its input stage, a fan-out over nothing) has one ending and no start;
    its parents' merge conflicts come before everything else of it. A resumed instance is
    reused, and that is all. Nothing happens to an instance after its end.
    """
    errors: list[str] = []
    state: dict[str, str] = {}
    attempts: dict[str, int] = {}
    for event in events:
        kind = event["type"]
        if event.get("step") is None:
            continue
        name = instance_of(event)
        now = state.get(name, "new")
        if now == "ended":
            errors.append(f"{name}: {kind} after its end")
            continue
        if kind == "conflict" and now == "new":
            continue
        if kind == "step_started" and now in ("new", "retrying"):
            attempts[name] = attempts.get(name, 0) + 1
            if event.get("attempt") != attempts[name]:
                errors.append(f"{name}: attempt {event.get('attempt')}, not {attempts[name]}")
            state[name] = "running"
        elif kind in DURING and now == "running":
            pass
        elif kind == "step_retry" and now == "running":
            state[name] = "retrying"
        elif kind in ENDINGS and now == "running":
            state[name] = "ended"
        elif kind in ENDINGS and now == "new" and event.get("key") is None:
            state[name] = "ended"  # the step ended as a whole, before any instance started
        elif kind == "step_reused" and now == "new":
            state[name] = "ended"
        else:
            errors.append(f"{name}: {kind} while {now}")
    errors += [f"{name}: never ended ({now})" for name, now in state.items() if now != "ended"]
    return errors


def endings(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each instance's ending (or reuse) event type, by instance name."""
    return {
        instance_of(e): e["type"]
        for e in events
        if e["type"] in ENDINGS | {"step_reused"} and e.get("step") is not None
    }


def attempts_of(events: Iterable[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """A run's events as the run store keeps them, split at each ``run_started`` (a resume
    adds an attempt of the run to the same record)."""
    out: list[list[dict[str, Any]]] = []
    for event in events:
        if event["type"] == "run_started":
            out.append([])
        out[-1].append(dict(event))
    return out


async def stored_events(state_dir: Path, run_id: str) -> list[list[dict[str, Any]]]:
    """The run store's events of ``run_id``, by attempt of the run."""
    async with open_run_store(state_dir) as store:
        return attempts_of(await store.events(run_id))


async def run_checked(
    pipe: Pipeline | Path,
    ws: Path,
    state_dir: Path,
    *,
    verify: Mapping[str, str] | None = None,
) -> tuple[RunOutcome, dict[str, str]]:
    """Run ``pipe`` on ``ws``; check the property over ``on_event`` and the run store, and
    return the outcome with each instance's ending."""
    seen: list[RunEvent] = []
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            pipe, {}, cwd=ws, policy="edit", verify=verify, on_event=seen.append
        )
    stream = [e.to_json() for e in seen]
    assert stream[0]["type"] == "run_started"
    assert stream[-1]["type"] == "run_finished"
    assert lifecycle_errors(stream) == []
    (stored,) = await stored_events(state_dir, outcome.run_id)
    assert lifecycle_errors(stored) == []
    # the store keeps what the listener saw, but the session updates and the run's end
    assert [e for e in stream if e["type"] not in ("update", "run_finished")] == stored
    return outcome, endings(stream)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace whose README.md has one line that every agent here edits."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "README.md").write_text("hello\n")
    return root


def test_lifecycle_errors_finds_what_the_first_reports_showed() -> None:
    """The checker itself: a step reported done then failed, or done then skipped, is caught."""
    shown: list[dict[str, Any]] = [
        {"type": "step_finished", "step": "polite"},
        {"type": "step_failed", "step": "polite"},
        {"type": "step_finished", "step": "final"},
        {"type": "step_skipped", "step": "final"},
        {"type": "step_started", "step": "x", "attempt": 1},
        {"type": "step_retry", "step": "x"},
        {"type": "step_finished", "step": "x"},
    ]
    assert lifecycle_errors(shown) == [
        "polite: step_failed after its end",
        "final: step_skipped after its end",
        "x: step_finished while retrying",
        "x: never ended (retrying)",
    ]


async def test_a_fan_in_whose_merge_fails_ends_it_once_as_failed(ws: Path, state_dir: Path) -> None:
    """Three demo agents edit one line; the fan-in fails once (never done) and its dependent
    is skipped once (never done)."""
    outcome, ended = await run_checked(FAN_IN, ws, state_dir)
    assert outcome.status == "conflicts"
    assert ended == {
        "edit[a]": "step_finished",
        "edit[b]": "step_finished",
        "edit[c]": "step_finished",
        "polite": "step_failed",
        "final": "step_skipped",
    }


async def test_a_fan_in_whose_merge_resolves_runs_after_its_conflicts(
    ws: Path, state_dir: Path
) -> None:
    """With ``merge="theirs"`` the conflicts come first, then the fan-in starts and finishes."""

    @step(agent=["a=demo", "b=demo"])
    def edit(ctx: StepContext) -> str:
        return f'replace "hello" with "hello from {ctx.agent}" in README.md'

    @step(agent="demo", merge="theirs")
    def polite(edit: Results) -> str:
        return 'append "thanks" to README.md'

    @step
    def final(polite: StepResult) -> str:
        return polite.text

    pipe = Pipeline.from_steps([edit, polite, final], name="resolved")
    outcome, ended = await run_checked(pipe, ws, state_dir)
    assert outcome.status == "succeeded"
    assert set(ended.values()) == {"step_finished"}
    assert set(ended) == {"edit[a]", "edit[b]", "polite", "final"}


async def test_a_verify_failing_after_the_turn_ends_the_instance_once(
    ws: Path, state_dir: Path
) -> None:
    """The agent's turn succeeds, its verify command fails: failed once, dependents skipped."""

    @step(agent=["a=demo", "b=demo"])
    def edit(ctx: StepContext) -> str:
        return f'create {ctx.agent}.txt with "{ctx.agent}"'

    @step
    def after(edit: Results) -> int:
        return len(edit)

    @step
    def last(after: int) -> int:
        return after

    pipe = Pipeline.from_steps([edit, after, last], name="verify")
    outcome, ended = await run_checked(pipe, ws, state_dir, verify={"edit": "test -f b.txt"})
    assert outcome.status == "failed"
    assert ended == {
        "edit[a]": "step_failed",
        "edit[b]": "step_finished",
        "after": "step_skipped",
        "last": "step_skipped",
    }


async def test_python_steps_raising_retrying_and_skipped_end_once(
    ws: Path, state_dir: Path
) -> None:
    """Raising, retried into success, retried out, a false or raising condition, a fan-out over
    nothing and a fan-out with a failing item: each instance ends exactly once."""

    def broken() -> bool:
        raise RuntimeError("no condition")

    @step(agent="demo")
    def edit() -> str:
        return 'append "more" to README.md'

    @step
    def boom(edit: StepResult) -> str:
        raise ValueError("boom")

    @step
    def after(boom: str) -> str:
        return boom

    @step(retries=2)
    def flaky(ctx: StepContext) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt")
        return ctx.attempt

    @step(retries=1)
    def hopeless(flaky: int) -> int:
        raise RuntimeError("always")

    @step(when=lambda: False)
    def never() -> int:
        return 1

    @step(when=broken)
    def unsure() -> int:
        return 1

    @step
    def nothing() -> list[str]:
        return []

    @step(over="nothing")
    def each_of_nothing(item: str) -> str:
        return item

    @step
    def items() -> list[str]:
        return ["x", "y"]

    @step(over="items")
    def each(item: str) -> str:
        if item == "y":
            raise ValueError("not y")
        return item

    @step
    def gathered(each: Results, each_of_nothing: Results, never: int, unsure: int) -> int:
        return len(each)

    pipe = Pipeline.from_steps(
        [
            edit,
            boom,
            after,
            flaky,
            hopeless,
            never,
            unsure,
            nothing,
            each_of_nothing,
            items,
            each,
            gathered,
        ],
        name="python",
    )
    outcome, ended = await run_checked(pipe, ws, state_dir)
    assert outcome.status == "failed"
    assert ended == {
        "edit": "step_finished",
        "boom": "step_failed",
        "after": "step_skipped",
        "flaky": "step_finished",
        "hopeless": "step_failed",
        "never": "step_skipped",
        "unsure": "step_failed",
        "nothing": "step_finished",
        "each_of_nothing": "step_finished",
        "items": "step_finished",
        "each[x]": "step_finished",
        "each[y]": "step_failed",
        "gathered": "step_skipped",
    }


async def test_a_resume_reuses_finished_instances_and_ends_the_others_once(
    ws: Path, state_dir: Path, tmp_path: Path
) -> None:
    """A resume reports a finished instance reused and nothing else of it; the instances that
    run again start and end once, in the listener's stream and in each attempt in the store."""
    ready = tmp_path / "ready"
    with trio.fail_after(LIMIT):
        first = await run_pipeline(RESUME, {"ready": str(ready)}, cwd=ws, policy="edit")
    assert first.status == "failed"
    ready.touch()
    seen: list[RunEvent] = []
    with trio.fail_after(LIMIT):
        second = await resume_run(first.run_id, on_event=seen.append)
    assert second.status == "succeeded"
    stream = [e.to_json() for e in seen]
    assert lifecycle_errors(stream) == []
    assert endings(stream) == {
        "edit[a]": "step_reused",
        "edit[b]": "step_reused",
        "check": "step_finished",
        "final": "step_finished",
    }
    before, after = await stored_events(state_dir, first.run_id)
    assert lifecycle_errors(before) == []
    assert endings(before) == {
        "edit[a]": "step_finished",
        "edit[b]": "step_finished",
        "check": "step_failed",
        "final": "step_skipped",
    }
    assert lifecycle_errors(after) == []
    assert endings(after) == endings(stream)


# --------------------------------------------------------------------------- the console script

#: a progress line off a terminal: time, level, verb, the instance and what follows
_PLAIN = re.compile(r"^\d\d:\d\d:\d\d (?:info|warning|error)\s+(\S+)\s+([^\s:]+)")
_PLAIN_ENDINGS = {"done", "FAILED", "skipped", "reused"}


@pytest.mark.skipif(not CLI.exists(), reason="the console script is not installed")
async def test_the_console_script_reports_each_instance_ending_once(
    ws: Path, state_dir: Path
) -> None:
    """Off a terminal, the plain progress lines and the ``--log-json`` lines of the fan-in
    whose merge fails end each instance once: polite FAILED, final skipped, neither done."""
    plain = await run_cli("run", str(FAN_IN), "--policy", "edit", cwd=ws, state=state_dir)
    assert plain.returncode == 4, plain.stderr
    said: dict[str, list[str]] = {}
    for line in plain.stderr.decode().splitlines():
        match = _PLAIN.match(line)
        if match and match[1] in _PLAIN_ENDINGS:
            said.setdefault(match[2], []).append(match[1])
    assert said == {
        "edit[a]": ["done"],
        "edit[b]": ["done"],
        "edit[c]": ["done"],
        "polite": ["FAILED"],
        "final": ["skipped"],
    }

    logged = await run_cli(
        "run", str(FAN_IN), "--policy", "edit", "--log-json", cwd=ws, state=state_dir
    )
    assert logged.returncode == 4, logged.stderr
    lines = [json.loads(line) for line in logged.stderr.decode().splitlines() if line[:1] == "{"]
    progress = [
        {**line, "type": line["event"]}
        for line in lines
        if line.get("logger") == "orchestrator.progress"
    ]
    assert lifecycle_errors(progress) == []
    assert endings(progress) == {
        "edit[a]": "step_finished",
        "edit[b]": "step_finished",
        "edit[c]": "step_finished",
        "polite": "step_failed",
        "final": "step_skipped",
    }
