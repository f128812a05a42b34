"""The ``[limits]`` against hostile agents, through the console script.

An agent that floods requests and never reads the answers is stopped past
``max_requests_in_flight``; a turn of a flood of chunks is recorded cut to
``max_turn_record_bytes``, and says so. The limits come from the user's config file.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jsonschema
import orjson
import pytest
from run_helpers import CLI, agent_command, as_json, prompts, run_cli, write_script

from orchestrator.cli.output import output_schema
from orchestrator.store import open_run_store
from orchestrator.testing import Flood, FloodRequests, Say, ToolCall, Turn, Usage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


def limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **values: int) -> None:
    """A user config file setting ``[limits]`` (the console script inherits the variable)."""
    path = tmp_path / "user.toml"
    path.write_text("[limits]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()))
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(path))


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("hello\n")
    return root


async def test_an_agent_flooding_requests_it_never_reads_is_stopped(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that stops reading and floods 5,000 requests is stopped past
    max_requests_in_flight = 100: exit 1, the error names the limit, the run is recorded
    failed with that message."""
    limits(tmp_path, monkeypatch, max_requests_in_flight=100)
    flood = FloodRequests(5_000, params={"path": "README.md"})
    script = write_script(tmp_path / "hostile.json", Turn(steps=(Say("reading"), flood)))
    agent = f"hostile={shlex.join(agent_command(script))}"
    done = await run_cli(
        "prompt", "--agent", agent, "--cwd", str(project(tmp_path)), "--json", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr.decode()
    document = as_json(done)
    message = (
        "hostile: stopped: 101 of its requests were in flight at once (being handled, or "
        "answered and the answers not read), over the limit max_requests_in_flight = 100"
    )
    assert document["error"] == {"type": "BacklogExceeded", "message": message}
    assert done.stderr.decode().splitlines()[-1] == f"orchestrator: error: {message}"
    assert prompts(script) == 1  # never sent again
    shown = as_json(
        await run_cli("show", document["runId"], "--json", cwd=tmp_path, state=state_dir)
    )
    assert shown["status"] == "failed"
    assert shown["steps"]["prompt"]["error"] == message


async def test_a_turn_of_many_chunks_is_stored_cut_to_the_limit(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn of 3,000 chunks (300 KB) and 400 tool calls under max_turn_record_bytes = 20,000
    ends as the agent ended it, but the run store keeps the head of its text, of its tool calls
    and of its transcript, each within the limit, and --json, show --json and show say so."""
    cap = 20_000
    limits(tmp_path, monkeypatch, max_turn_record_bytes=cap)
    calls = tuple(ToolCall(f"call-{i:03d}", f"read file {i}", kind="read") for i in range(400))
    turn = Turn(steps=(Flood(3_000, "y" * 100), *calls, Usage(used=10, size=100)))
    script = write_script(tmp_path / "chatty.json", turn)
    agent = f"chatty={shlex.join(agent_command(script))}"
    wire = tmp_path / "wire.ndjson"
    done = await run_cli(
        "prompt", "--agent", agent, "--cwd", str(project(tmp_path)), "--json",
        "--transcript", str(wire), "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    document = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    assert (document["stopReason"], document["usage"]["used"]) == ("end_turn", 10)
    assert document["text"] == "y" * cap
    kept_calls = document["toolCalls"]
    assert 0 < len(kept_calls) < 400
    assert len(orjson.dumps(kept_calls)) <= cap + len(kept_calls)  # the commas between them
    assert [c["toolCallId"] for c in kept_calls] == [
        f"call-{i:03d}" for i in range(len(kept_calls))
    ]
    cut = {
        "limit": cap,
        "textBytes": 300_000,
        "droppedTextBytes": 300_000 - cap,
        "toolCalls": 400,
        "droppedToolCalls": 400 - len(kept_calls),
    }
    assert document["cut"] == cut
    run_id = document["runId"]

    async with open_run_store(state_dir) as store:
        (step,) = await store.steps(run_id)
        run = await store.get_run(run_id)
        transcript = await store.transcript(run_id)
    assert step.result is not None and run.result is not None
    for stored in (step.result, run.result):
        assert (stored["text"], stored["toolCalls"], stored["cut"]) == ("y" * cap, kept_calls, cut)
        assert (stored["stopReason"], stored["usage"]["used"]) == ("end_turn", 10)
    sent = [e["msg"].get("method") for e in transcript if e["dir"] == "send"]
    start = next(
        i for i, e in enumerate(transcript) if e.get("msg", {}).get("method") == "session/prompt"
    )
    turn_part = transcript[start:]
    assert turn_part[-1]["dir"] == "cut"
    assert sum(len(orjson.dumps(e)) + 1 for e in turn_part[:-1]) <= cap
    assert turn_part[-1]["frames"] > 3_000
    assert "session/prompt" in sent
    assert wire.read_bytes().splitlines()[-1] == orjson.dumps(turn_part[-1])

    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    assert (shown["text"], shown["cut"]) == ("y" * cap, cut)
    text = (await run_cli("show", run_id, cwd=tmp_path, state=state_dir)).stdout.decode()
    assert (
        f"turn cut in the run store (limit max_turn_record_bytes = 20,000 bytes): 280,000 of "
        f"300,000 bytes of text and {400 - len(kept_calls)} of 400 tool calls left out"
    ) in text
