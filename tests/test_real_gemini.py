"""End to end with the real Gemini CLI (``@google/gemini-cli``, ``--acp``), offline.

Gemini CLI speaks the Gemini API to the scripted model server on 127.0.0.1; every proxy
variable points at that server too, which refuses to proxy: nothing leaves the machine. It
reads and writes files through the client's ``fs/*`` methods, so its edits land in the run's
branch. Two of its ways need the client's agent quirks (matched on ``agentInfo``): it creates a
new file only when the read of the missing path answers empty content, and it reports its token
counts only in the prompt response's ``_meta.quota``. Skipped with the reason when node or
Gemini CLI is missing (``python tools/install_node_agents.py`` installs it); under ``$CI`` with
npm present it fails instead.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from real_agents import (
    GEMINI,
    GEMINI_MODEL,
    Project,
    SocketWatch,
    edit_policy,
    edit_scenario,
    make_project,
    received_methods,
    require_installed,
    tagged_processes,
    transcript_frames,
)

from orchestrator.runs import PromptRun, get_run_json, prompt
from orchestrator.testing._model_gemini import estimate_tokens
from orchestrator.testing.model_server import (
    ModelServer,
    Reply,
    Scenario,
    Write,
    open_model_server,
)

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

#: Gemini CLI starts in 5-20 s on a busy machine and plays a three-step scenario in a few more
LIMIT = 240.0


@pytest.fixture(autouse=True)
def installed() -> None:
    """Skip (or fail under CI) when Gemini CLI is not installed."""
    require_installed(GEMINI)


@pytest.fixture
def tag() -> str:
    """A mark in the agent's environment that finds all its processes afterwards."""
    return uuid.uuid4().hex


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """The small project the turns run on."""
    return make_project(tmp_path / "project")


async def run_gemini(
    scenario: Scenario, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> tuple[PromptRun, ModelServer, Path]:
    """Play ``scenario`` with Gemini CLI through the library; the run, the server, the wire."""
    transcript = tmp_path / "wire.ndjson"
    watch = SocketWatch(tag)
    async with open_model_server([scenario]) as server:
        spec = GEMINI.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run)
                run = await prompt(
                    spec,
                    f"Please do {scenario.marker} in this project.",
                    cwd=project.root,
                    policy=edit_policy(),
                    transcript=transcript,
                    state_dir=state_dir,
                )
                nursery.cancel_scope.cancel()
    assert server.refused == [], "a request tried to leave the machine through the proxy"
    assert watch.off_machine == set(), f"connections off the machine: {watch.off_machine}"
    assert tagged_processes(tag) == [], "agent processes outlived the run"
    return run, server, transcript


def sent_requests(transcript: Path, method: str, *, by: str = "agent") -> list[dict[str, Any]]:
    """The requests of ``method`` the agent (or the client) sent, from the wire transcript."""
    direction = "recv" if by == "agent" else "send"
    out = []
    for frame in transcript_frames(transcript):
        msg = frame.get("msg")
        if frame.get("dir") == direction and isinstance(msg, dict) and msg.get("method") == method:
            out.append(msg)
    return out


def session_cwd(transcript: Path) -> str:
    """The directory the client gave the agent in ``session/new`` (the run's branch)."""
    for frame in transcript_frames(transcript):
        msg = frame.get("msg")
        if (
            frame.get("dir") == "send"
            and isinstance(msg, dict)
            and msg.get("method") == "session/new"
        ):
            return str(msg["params"]["cwd"])
    raise AssertionError("no session/new in the transcript")


async def test_gemini_edits_through_the_clients_fs(
    project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """Gemini CLI reads greet.py and edits it through fs/*; the edit is the run's change."""
    before = project.snapshot()
    run, server, transcript = await run_gemini(edit_scenario(), project, tmp_path, tag, state_dir)
    assert run.turn.stop_reason == "end_turn", run.error
    assert "Stopped here." in run.turn.text
    assert {c.path: c.change for c in run.changes} == {"greet.py": "modified"}
    assert '+    return "Hi, " + name' in run.diff
    assert project.snapshot() == before, "the workspace changed without apply"
    methods = received_methods(transcript)
    assert "fs/read_text_file" in methods and "fs/write_text_file" in methods
    (write,) = sent_requests(transcript, "fs/write_text_file")
    assert write["params"]["path"] == str(Path(session_cwd(transcript)) / "greet.py")
    assert write["params"]["content"] == Project.EDITED
    # the model saw Gemini's own tools, with the file's content in the read's result
    calls = [r.tool_call.name for r in server.requests if r.tool_call is not None]
    assert calls == ["read_file", "replace"]
    assert any("Hello, " in text for r in server.requests for text in r.tool_results())
    assert {r.api for r in server.requests} == {"gemini"}
    assert any(GEMINI_MODEL in r.path for r in server.requests)
    assert run.agent_info is not None and run.agent_info.name == "gemini-cli"


# --------------------------------------------------------------------------- its quirks


def new_file_scenario(marker: str = "RA-NEW") -> Scenario:
    """Write a file that does not exist yet, then answer."""
    return Scenario(marker, (Write(Project.NEW_FILE, Project.NEW_CONTENT), Reply("Notes written.")))


def recorded_quirks(run_json: dict[str, Any]) -> list[str]:
    """The ids of the agent quirks a run's JSON says were applied (``agent.quirks``)."""
    quirks: list[str] = run_json["agent"]["quirks"]
    return quirks


def answers_to(
    transcript: Path, request: dict[str, Any], *, by: str = "client"
) -> list[dict[str, Any]]:
    """The answers the client (or the agent) gave to one request, from the wire transcript."""
    direction = "send" if by == "client" else "recv"
    out = []
    for frame in transcript_frames(transcript):
        msg = frame.get("msg")
        if (
            frame.get("dir") == direction
            and isinstance(msg, dict)
            and "method" not in msg
            and msg.get("id") == request["id"]
        ):
            out.append(msg)
    return out


async def test_gemini_creates_a_new_file_through_the_clients_fs(
    project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """A missing file reads as empty for Gemini CLI, so its write_file creates NOTES.md."""
    before = project.snapshot()
    run, server, transcript = await run_gemini(
        new_file_scenario(), project, tmp_path, tag, state_dir
    )
    results = [text for r in server.requests for text in r.tool_results()]
    assert not any("Error checking existing file" in text for text in results), results
    assert run.turn.stop_reason == "end_turn", run.error
    assert "Notes written." in run.turn.text
    assert {c.path: c.change for c in run.changes} == {Project.NEW_FILE: "added"}
    assert f"+{Project.NEW_CONTENT.splitlines()[0]}" in run.diff
    assert project.snapshot() == before, "the workspace changed without apply"
    cwd = Path(session_cwd(transcript))
    # Gemini reads the path first; the read of the missing file answered empty content
    reads = [
        m
        for m in sent_requests(transcript, "fs/read_text_file")
        if m["params"]["path"] == str(cwd / Project.NEW_FILE)
    ]
    assert reads, "Gemini CLI did not read the new file's path first"
    assert [a.get("result") for a in answers_to(transcript, reads[0])] == [{"content": ""}]
    (write,) = sent_requests(transcript, "fs/write_text_file")
    assert write["params"]["path"] == str(cwd / Project.NEW_FILE)
    assert write["params"]["content"] == Project.NEW_CONTENT
    assert "gemini-missing-file-reads-empty" in recorded_quirks(run.to_json())
    stored = await get_run_json(run.run_id, state_dir=state_dir)
    assert "gemini-missing-file-reads-empty" in recorded_quirks(stored)


async def test_gemini_token_counts_are_the_runs_usage(
    project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """The token counts Gemini CLI reports in ``_meta.quota`` are the run's usage."""
    run, server, transcript = await run_gemini(edit_scenario(), project, tmp_path, tag, state_dir)
    assert run.turn.stop_reason == "end_turn", run.error
    (prompt_request,) = sent_requests(transcript, "session/prompt", by="client")
    (answer,) = answers_to(transcript, prompt_request, by="agent")
    counts = answer["result"]["_meta"]["quota"]["token_count"]
    # Gemini sums the prompt tokens the server reported for each of the turn's requests
    assert counts["input_tokens"] == sum(estimate_tokens(r.body) for r in server.requests)
    tokens = {
        "inputTokens": counts["input_tokens"],
        "outputTokens": counts["output_tokens"],
        "totalTokens": counts["input_tokens"] + counts["output_tokens"],
    }
    assert run.to_json()["usage"]["tokens"] == tokens
    stored = await get_run_json(run.run_id, state_dir=state_dir)
    assert stored["usage"]["tokens"] == tokens
    assert "gemini-usage-from-meta-quota" in recorded_quirks(run.to_json())
