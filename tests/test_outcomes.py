"""Typed views of a run's ``--json`` object (``orchestrator.runs.outcomes``).

The unit tests read ``tests/outcomes/*.json``: the objects ``get_run_json`` gave for real runs
of the demo agent, written by ``tests/outcome_runs.py`` (a prompt, a pipeline fanning out over
items and agents with a settled conflict, comparisons that succeeded and failed, a run with
merge conflicts, a failed run and its resume, an interrupted run). The last test makes those
runs again and checks the round trip over their live and stored objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from outcome_runs import make_runs

from orchestrator.runs import (
    AgentIdentity,
    AgentOutcome,
    FileChange,
    InstanceOutcome,
    PermissionEntry,
    RunOutcome,
    StepOutcome,
    ToolCallEntry,
    VerifyEntry,
)
from orchestrator.runs.verdict import judge

FIXTURES = Path(__file__).resolve().parent / "outcomes"
KINDS = sorted(p.stem for p in FIXTURES.glob("*.json"))


def fixture(name: str) -> dict[str, Any]:
    """The stored ``--json`` object of the recorded run ``name``."""
    loaded: dict[str, Any] = orjson.loads((FIXTURES / f"{name}.json").read_bytes())
    return loaded


def outcome(name: str) -> RunOutcome:
    """A RunOutcome over the recorded run ``name``."""
    result = fixture(name)
    return RunOutcome(result["runId"], result["status"], result, "")


def parts(result: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """Each object of a run's result that a typed value reads, with that value."""
    if result["kind"] == "prompt":
        yield "prompt", result, AgentOutcome.from_json(result)
    for name, entry in (result.get("steps") or {}).items():
        yield f"steps.{name}", entry, StepOutcome.from_json(entry, name=name)
        for key, one in entry["instances"].items():
            yield f"steps.{name}.{key}", one, InstanceOutcome.from_json(one, name=key)
    for n, entry in enumerate(result.get("agents") or ()):
        yield f"agents[{n}]", entry, AgentOutcome.from_json(entry)


def assert_round_trip(result: dict[str, Any]) -> None:
    """Every typed part of ``result`` gives back exactly its object, keys in order."""
    for where, source, typed in parts(result):
        back = typed.to_json()
        assert back == source, where
        assert orjson.dumps(back) == orjson.dumps(source), where


def test_the_fixtures_cover_every_kind_of_run() -> None:
    """The recorded runs are the kinds the round trip must cover."""
    statuses = {name: fixture(name)["status"] for name in KINDS}
    assert statuses == {
        "compare": "succeeded",
        "compare-failed": "failed",
        "conflicts": "conflicts",
        "failed": "failed",
        "interrupted": "interrupted",
        "pipeline": "succeeded",
        "prompt": "succeeded",
        "resumed": "succeeded",
    }


@pytest.mark.parametrize("name", KINDS)
def test_to_json_gives_back_the_recorded_objects(name: str) -> None:
    """Each step, instance, comparison entry and prompt object of a real run round-trips."""
    assert_round_trip(fixture(name))


def test_a_pipeline_fanning_out_over_items_and_agents_reads_typed() -> None:
    """Steps by name, instances by item or agent label, each with its turn's typed fields."""
    run = outcome("pipeline")
    assert list(run.steps) == ["files", "rename", "docs", "check"]
    assert {name: s.status for name, s in run.steps.items()} == dict.fromkeys(
        run.steps, "succeeded"
    )
    files = run.steps["files"]
    assert files.name == "files" and files.instances["files"].agent is None
    modules = ["shop/__init__.py", "shop/cart.py", "shop/pricing.py"]
    assert files.value == modules
    rename = run.steps["rename"].instances
    assert list(rename) == modules
    for key, one in rename.items():
        assert (one.name, one.item, one.agent, one.stop_reason) == (key, key, "demo", "end_turn")
        assert one.status == "succeeded" and one.error is None and one.error_kind is None
        assert one.model == "demo-fast" and one.session_id
        assert isinstance(one.wall_seconds, float) and one.attempt == 1
        assert all(isinstance(p, PermissionEntry) and p.verdict == "allow" for p in one.permissions)
        assert all(isinstance(c, ToolCallEntry) and c.tool_call_id for c in one.tool_calls)
    assert rename["shop/cart.py"].changed_files == ("shop/cart.py",)
    assert rename["shop/cart.py"].changes == (FileChange(path="shop/cart.py", change="modified"),)
    docs = run.steps["docs"]
    assert list(docs.instances) == ["alice", "bob"]
    assert docs.value is None, "a fanned-out step has no value of its own"
    alice = docs.instances["alice"]
    assert (alice.key, alice.agent) == ("alice", "alice")
    assert alice.changed_files == ("README.md", "docs/pricing.md")
    assert alice.changed_lines == 5, "one line replaced, three added"
    assert run.steps["check"].value == "ok: total 7.2"
    assert [c.path for c in run.changes] == [c["path"] for c in run.result["changes"]]


def test_failed_and_skipped_steps_say_why() -> None:
    """A Python step that raised: its error and traceback; its dependant: skipped, with a cause."""
    run = outcome("failed")
    build = run.steps["build"]
    assert (build.status, build.error) == ("failed", "RuntimeError: the marker is missing")
    assert build.traceback is not None and build.traceback.endswith(f"{build.error}\n")
    assert build.instances["build"].traceback == build.traceback
    after = run.steps["after"]
    assert (after.status, after.cause, after.instances) == (
        "skipped",
        "skipped because build failed",
        {},
    )
    assert run.steps["side"].value == 7


def test_a_resume_reads_like_a_run() -> None:
    """After the resume every step succeeded, the rerun ones on their second try."""
    run = outcome("resumed")
    assert {name: s.status for name, s in run.steps.items()} == dict.fromkeys(
        ("edit", "build", "after", "side"), "succeeded"
    )
    assert run.steps["build"].value == "built"


def test_an_interrupted_turn_keeps_its_cancelled_permission() -> None:
    """The step cut short reads interrupted; its permission answer cancelled, the extra audit
    fields the run store adds kept as they are."""
    check = outcome("interrupted").steps["check"]
    one = check.instances["check"]
    assert (check.status, one.status, one.stop_reason) == ("interrupted",) * 2 + ("cancelled",)
    [asked] = one.permissions
    assert (asked.verdict, asked.kind, asked.option_id) == ("cancelled", "edit", None)
    assert {"time", "paths", "command"} <= set(asked.extra)


def test_a_comparison_reads_its_agents_and_verdict() -> None:
    """One typed entry per agent, in order; the verdict agrees with the recorded one."""
    run = outcome("compare")
    assert [a.name for a in run.agents] == ["a", "b"]
    a, b = run.agents
    assert a.agent == AgentIdentity(name="a", version="1.0.0", reported_name="demo-agent")
    assert (a.status, a.applied, b.applied) == ("succeeded", True, False)
    assert a.run_id == run.run_id and a.workspace_changed == ()
    assert a.verify == VerifyEntry(
        command="grep -q color README.md", exit_code=0, output="", timed_out=False
    )
    assert a.verify_passed is True and a.changed_files == ("README.md",)
    assert a.changed_lines == 2
    assert a.usage == {"used": 95, "size": 200000} and a.total_tokens is None
    verdict = run.verdict
    assert verdict is not None
    assert (list(verdict.succeeded), verdict.winner) == (
        run.result["succeeded"],
        run.result["winner"],
    )
    assert run.winner == "a"
    other = outcome("pipeline")
    assert (other.verdict, other.winner, other.agents) == (None, None, ())


def test_a_failed_comparison_names_no_winner() -> None:
    """Every agent failed its verify command: each says so, and nobody wins."""
    run = outcome("compare-failed")
    assert [(a.status, a.verify_passed) for a in run.agents] == [("failed", False)] * 2
    assert all(a.error for a in run.agents)
    assert run.verdict == judge(run.result["agents"]) and run.verdict is not None
    assert run.verdict.winner is None


def test_a_prompt_object_reads_as_an_agent_outcome() -> None:
    """A prompt's object has a comparison entry's fields; its run-level keys stay extra."""
    result = fixture("prompt")
    one = AgentOutcome.from_json(result)
    assert (one.status, one.stop_reason, one.changed_files) == (
        "succeeded",
        "end_turn",
        ("README.md",),
    )
    assert one.agent is not None and one.agent.name == "demo"
    assert one.name is None and one.applied is False
    assert {"kind", "cwd", "defaultRejections", "patch"} <= set(one.extra)


def test_unknown_keys_and_error_kind_survive() -> None:
    """Keys of a newer version are kept in place; ``errorKind`` is read as a typed field."""
    entry = fixture("failed")["steps"]["build"]
    instance = entry["instances"]["build"]
    newer = {
        "status": "failed",
        "errorKind": "python",
        "hint": {"retry": True},
        "instances": {"build": {**instance, "errorKind": "python", "budget": [1, 2]}},
        "error": entry["error"],
    }
    step = StepOutcome.from_json(newer, name="build")
    assert step.error_kind == "python" and step.instances["build"].error_kind == "python"
    assert step.extra == {"hint": {"retry": True}}
    assert step.instances["build"].extra == {"budget": [1, 2]}
    assert step.to_json() == newer
    assert list(step.to_json()) == list(newer)


def test_an_unreadable_value_is_kept_as_it_was() -> None:
    """A value not of its field's shape leaves the field at its default and comes back whole."""
    odd = {"status": 3, "changes": "all of them", "verify": [], "wallSeconds": True, "agent": 5}
    one = InstanceOutcome.from_json(odd)
    assert (one.status, one.changes, one.verify, one.wall_seconds, one.agent) == (
        None,
        (),
        None,
        None,
        None,
    )
    assert one.extra == odd
    assert one.to_json() == odd


def test_a_changed_value_is_written_back() -> None:
    """Evolved fields, and values made in Python, write what they hold."""
    step = StepOutcome.from_json(fixture("failed")["steps"]["after"], name="after")
    assert attrs.evolve(step, status="failed").to_json()["status"] == "failed"
    made = InstanceOutcome(name="x", status="succeeded", value=[1], error_kind="timeout")
    assert made.to_json() == {"status": "succeeded", "errorKind": "timeout", "value": [1]}
    assert FileChange(path="a", change="added").to_json() == {"path": "a", "change": "added"}


def test_run_outcome_steps_are_typed_and_result_stays_raw() -> None:
    """``steps`` maps names to StepOutcome (read once); ``result`` is the plain object."""
    run = outcome("pipeline")
    assert all(isinstance(s, StepOutcome) for s in run.steps.values())
    assert run.steps is run.steps
    assert run.result == fixture("pipeline")
    assert {k: s.to_json() for k, s in run.steps.items()} == run.result["steps"]


# --------------------------------------------------------------------------- properties

_SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_TURN_KEYS = [f.metadata["json"] for f in attrs.fields(AgentOutcome) if "json" in f.metadata] + [
    f.metadata["json"] for f in attrs.fields(InstanceOutcome) if "json" in f.metadata
]
_STEP_KEYS = [f.metadata["json"] for f in attrs.fields(StepOutcome) if "json" in f.metadata]
_ENTRY_KEYS = ["path", "change", "toolCallId", "verdict", "rule", "exitCode", "name", "kind"]


def _objects(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects over known keys (values of the right shape or not) and unknown ones."""
    entry = st.dictionaries(st.sampled_from(_ENTRY_KEYS) | st.text(max_size=4), _JSON, max_size=4)
    value = _JSON | st.lists(entry, max_size=2) | entry
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), value, max_size=10)


@settings(max_examples=300, deadline=None)
@given(_objects(_TURN_KEYS), _objects(_STEP_KEYS))
def test_any_json_object_round_trips(turn: dict[str, Any], step: dict[str, Any]) -> None:
    """Whatever an object holds, known keys or not, of the right shape or not, comes back."""
    step = {**step, "instances": {"i": turn}} if len(step) % 2 else step
    for value in (
        AgentOutcome.from_json(turn),
        InstanceOutcome.from_json(turn, name="i"),
        StepOutcome.from_json(step, name="s"),
    ):
        source = step if isinstance(value, StepOutcome) else turn
        back = value.to_json()
        assert back == source and list(back) == list(source)


# --------------------------------------------------------------------------- real runs


async def test_the_objects_of_real_runs_round_trip(tmp_path: Path) -> None:
    """Every kind of run, made now with the demo agent: its live result and its stored
    object read typed and give themselves back; the live RunOutcome's steps are those."""
    with trio.fail_after(120):
        made = await make_runs(tmp_path)
    assert [name for name, _, _ in made] == [
        "prompt",
        "pipeline",
        "compare",
        "compare-failed",
        "conflicts",
        "failed",
        "resumed",
        "interrupted",
    ]
    for name, live, stored in made:
        assert_round_trip(stored)
        if live is not None:
            assert_round_trip(live)
        if name in ("pipeline", "failed", "resumed", "conflicts"):
            assert live is not None
            run = RunOutcome(live["runId"], live["status"], live, "")
            assert {k: s.to_json() for k, s in run.steps.items()} == stored["steps"], name
