"""The library API (``prompt`` / ``prompt_sync``) with the demo agent on a temporary project."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import orjson
import pytest
import trio
from fakes import AllowOnce
from schema_check import validate_transcript

from orchestrator.agent.services import (
    ClientServices,
)
from orchestrator.agent.turn import TurnAccumulator
from orchestrator.agents import AgentSpec, resolve_agent
from orchestrator.errors import TurnTimeout, UsageError
from orchestrator.protocol import types as t
from orchestrator.runs import FileChange, PromptRun, prompt
from orchestrator.sync import prompt_sync
from orchestrator.testing import AgentScript, Stall, Turn
from orchestrator.testing.scripted_agent import scripted_agent_command

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-project"
LIMIT = 30.0
DEMO_EDIT = 'replace "colour" with "color" in **/*.md'
TITLE = "Replace 'colour' with 'color' in **/*.md"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A fresh copy of the sample project."""
    root = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_prompt_sync_returns_a_prompt_run(project: Path) -> None:
    """prompt_sync runs one turn and returns every field; the default policy rejects edits."""
    before = snapshot(project)
    started = time.monotonic()
    run = prompt_sync("demo", DEMO_EDIT, cwd=project, timeout=LIMIT)
    elapsed = time.monotonic() - started
    assert isinstance(run, PromptRun)
    assert re.fullmatch(r"[0-9a-f]{12}", run.run_id)
    assert run.agent == resolve_agent("demo")
    assert run.agent_info is not None
    assert (run.agent_info.name, run.agent_info.version) == ("demo-agent", "1.0.0")
    assert run.session_id == "demo-1"
    assert run.turn.stop_reason == "end_turn"
    assert run.turn.text == f"Done.\n- {TITLE}: README.md (permission refused)\n"
    assert 0 < run.wall_seconds <= elapsed
    assert run.permissions == run.turn.permissions
    (record,) = run.permissions
    assert (record.tool_call_id, record.verdict, record.option_id) == (
        "call-0-README.md",
        "reject",
        "reject",
    )
    assert (record.agent, record.session_id, record.kind) == ("demo", "demo-1", "edit")
    assert snapshot(project) == before


def test_to_json_mirrors_the_run(project: Path) -> None:
    """to_json: the --json object, derived field by field from the run, and serialisable."""
    run = prompt_sync("demo", DEMO_EDIT, cwd=project, timeout=LIMIT)
    data = run.to_json()
    assert orjson.loads(orjson.dumps(data)) == data
    assert data["runId"] == run.run_id
    assert data["sessionId"] == run.session_id
    assert data["agent"] == {
        "name": "demo",
        "version": "1.0.0",
        "reportedName": "demo-agent",
        "quirks": [],
    }
    assert data["stopReason"] == "end_turn"
    assert data["text"] == run.turn.text
    # CHANGES.md matches too but has no "colour": no tool call
    assert data["toolCalls"] == [
        {
            "toolCallId": "call-0-README.md",
            "title": f"{TITLE} (README.md)",
            "kind": "edit",
            "status": "failed",
        },
    ]
    (permission,) = data["permissions"]
    record = run.permissions[0]
    assert permission == {
        "toolCallId": "call-0-README.md",
        "kind": "edit",
        "title": f"{TITLE} (README.md)",
        "verdict": "reject",
        "optionId": "reject",
        "rule": record.rule,
    }
    assert data["usage"] == {
        "used": run.turn.usage.used if run.turn.usage else None,
        "size": 200_000,
    }
    assert data["wallSeconds"] == round(run.wall_seconds, 3)


def test_to_json_without_agent_info_or_usage() -> None:
    """An agent that sent no agentInfo and no usage: those fields are null."""
    run = PromptRun(
        run_id="abc",
        agent=AgentSpec("x", ("x",)),
        agent_info=None,
        session_id="s",
        turn=TurnAccumulator().result("cancelled"),
        wall_seconds=1.23456,
    )
    data = run.to_json()
    assert data["agent"] == {"name": "x", "version": None, "reportedName": None, "quirks": []}
    assert (data["usage"], data["wallSeconds"], data["stopReason"]) == (None, 1.235, "cancelled")
    assert (data["toolCalls"], data["permissions"], data["text"]) == ([], [], "")


async def test_prompt_with_edit_policy_changes_files(project: Path) -> None:
    """With policy "edit" the edit is allowed into the branch; only apply=True writes it."""
    readme = (project / "README.md").read_text("utf-8")
    seen: list[t.SessionUpdate] = []
    with trio.fail_after(LIMIT):
        run = await prompt("demo", DEMO_EDIT, cwd=project, policy="edit", on_update=seen.append)
    assert (project / "README.md").read_text("utf-8") == readme  # the workspace is untouched
    assert run.changes == (FileChange(path="README.md", change="modified"),)
    assert "-A tiny project" in run.diff or "colour" in run.diff
    assert "+" in run.diff and "color" in run.diff
    assert not run.applied
    assert (Path(run.run_dir) / "changes.patch").is_file()
    assert run.turn.text == f"Done.\n- {TITLE}: README.md\n"
    assert [(p.verdict, p.option_id) for p in run.permissions] == [("allow", "allow")]
    chunks = (t.AgentMessageChunk, t.AgentThoughtChunk)
    assert [u for u in seen if not isinstance(u, chunks)] == run.turn.updates
    assert run.turn.tool_calls["call-0-README.md"].status == "completed"
    with trio.fail_after(LIMIT):
        applied = await prompt("demo", DEMO_EDIT, cwd=project, policy="edit", apply=True)
    assert applied.applied
    assert (project / "README.md").read_text("utf-8") == readme.replace("colour", "color")


async def test_prompt_run_is_recorded_and_applied_later(project: Path) -> None:
    """A prompt run is listed in the run store, shown, diffed and applied later."""
    from orchestrator.runs import apply_run, diff_run, get_run_json, list_runs

    readme = (project / "README.md").read_text("utf-8")
    with trio.fail_after(LIMIT):
        run = await prompt("demo", DEMO_EDIT, cwd=project, policy="edit")
        [listed] = await list_runs()
        shown = await get_run_json(run.run_id[:6])
        diff = await diff_run(run.run_id)
        assert (project / "README.md").read_text("utf-8") == readme
        applied = await apply_run(run.run_id)
    assert (listed.run_id, listed.kind, listed.status) == (run.run_id, "prompt", "succeeded")
    assert shown["kind"] == "prompt" and shown["text"] == run.turn.text
    assert shown["permissions"][0]["verdict"] == "allow"
    assert "+" in diff and "color" in diff
    assert applied.applied and applied.written == ("README.md",)
    assert (project / "README.md").read_text("utf-8") == readme.replace("colour", "color")


async def test_prompt_policy_vets_terminal_commands(project: Path) -> None:
    """The demo's commands run in a real terminal when the policy trusts them, not otherwise."""
    with trio.fail_after(LIMIT):
        trusted = await prompt("demo", "run echo hi", cwd=project, policy="trusted")
        refused = await prompt("demo", "run echo hi", cwd=project)
    assert trusted.turn.tool_calls["call-0-run"].status == "completed"
    assert "- Run echo hi: exit 0 hi" in trusted.turn.text
    assert refused.turn.tool_calls["call-0-run"].status == "failed"
    assert "- Run echo hi: refused" in refused.turn.text


async def test_prompt_takes_a_spec_services_and_transcript(project: Path, tmp_path: Path) -> None:
    """An AgentSpec names the run; services replace the policy; the transcript is schema-valid."""
    spec = AgentSpec("my-demo", (sys.executable, "-m", "orchestrator.demo"))
    wire = tmp_path / "wire.ndjson"
    services = ClientServices(permission=AllowOnce())
    with trio.fail_after(LIMIT):
        run = await prompt(
            spec, DEMO_EDIT, cwd=project, services=services, transcript=wire, apply=True
        )
    assert run.agent is spec
    assert run.to_json()["agent"]["name"] == "my-demo"
    assert [(p.agent, p.verdict, p.rule) for p in run.permissions] == [("my-demo", "allow", "test")]
    assert "colour" not in (project / "README.md").read_text("utf-8")
    assert validate_transcript(wire).validated > 0


async def test_prompt_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    """A missing cwd or an unknown policy preset is refused before any agent starts."""
    with trio.fail_after(LIMIT):
        with pytest.raises(UsageError, match="not a directory"):
            await prompt("demo", "hi", cwd=tmp_path / "missing")
        with pytest.raises(UsageError, match="nonsense"):
            await prompt("demo", "hi", cwd=tmp_path, policy="nonsense")


async def test_prompt_missing_agent_command_fails_to_start(tmp_path: Path) -> None:
    """An agent command that does not exist: a usage error naming it, before anything starts."""
    with trio.fail_after(LIMIT), pytest.raises(UsageError, match=r"no-such-agent-xyz.*not found"):
        await prompt("no-such-agent-xyz --acp", "hi", cwd=tmp_path)


async def test_prompt_timeout_fails_the_run_with_turn_timeout(tmp_path: Path) -> None:
    """A turn that outlives ``timeout`` is cancelled: the run is returned failed, a timeout."""
    script = AgentScript(turns=(Turn(steps=(Stall(),)),))
    spec = AgentSpec("staller", tuple(scripted_agent_command(script, tmp_path)))
    with trio.fail_after(LIMIT):
        run = await prompt(spec, "go", cwd=tmp_path, timeout=0.5)
    assert (run.status, run.exit_code, run.error_kind) == ("failed", 1, "timeout")
    assert isinstance(run.exception, TurnTimeout)
    assert run.error is not None and "timeout" in run.error


async def test_prompt_first_recovers_an_interrupted_apply(tmp_path: Path) -> None:
    """An apply killed mid-way is completed from its journal before the next run starts."""
    from test_vfs_apply import expected_new, killed_mid_apply

    ws, state, _before = killed_mid_apply(tmp_path)
    assert (ws / "f4.txt").read_text() == "old 4\n"  # half applied
    with trio.fail_after(LIMIT):
        await prompt("demo", "hello", cwd=ws, state_dir=state)
    for rel, data in expected_new(ws).items():
        assert (ws / rel).read_bytes() == data
    assert not (ws / "gone.txt").exists()
