"""The replay agent: a recorded agent played back to the orchestrator's own client.

Records are built by hand with the record classes, or recorded from a real run of the demo
agent (its wire transcript converted here). The integration tests start the replay agent as a
real subprocess (``python -m orchestrator.replay``), talk to it through ``open_agent`` with a
real branch directory as cwd and the branch's policy services, and check every frame it sends
against the official ACP schema (agent side), besides the client-side check of conftest.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from attrs import define, field
from conftest import pid_gone
from schema_check import SCHEMA_PATH, SchemaIndex, _load_index

import orchestrator.agent.launch as launch_module
from orchestrator.agent.branch_services import open_branch_services
from orchestrator.agent.client import ClientOptions, open_agent
from orchestrator.agent.launch import open_agent_on_stream
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.agent.turn import TurnResult
from orchestrator.errors import JsonRpcError, UsageError
from orchestrator.jsonrpc.connection import JsonRpcConnection
from orchestrator.policy import PolicySet
from orchestrator.protocol import types as t
from orchestrator.replay import (
    BASE_UNKNOWN,
    RecordedChange,
    RecordedFrame,
    RecordedSession,
    RecordedTurn,
    ReplayRecord,
)
from orchestrator.replay._divergence import NOT_REPLAYABLE, REPLAY_DIVERGED, Divergence
from orchestrator.replay.agent import ReplayAgent, Timing, serve_replay_agent
from orchestrator.vfs import Branch, Workdir, Workspace, materialize_async

LIMIT = 30.0  # seconds any test here may take (each agent is a fresh Python process)
AGENT = "demo"
#: the cwd of the hand-made records' sessions (their paths under it are mapped to the live one)
RECORDED_CWD = "/recorded/branch"
INIT = {
    "protocolVersion": 1,
    "agentCapabilities": {"promptCapabilities": {"embeddedContext": True}},
    "authMethods": [],
    "agentInfo": {"name": "demo-agent", "version": "1.0.0"},
}
OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


# --------------------------------------------------------------------------- records


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def note(t: float, sid: str, update: dict[str, Any]) -> RecordedFrame:
    """A recorded ``session/update`` notification of the agent."""
    msg = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": update},
    }
    return RecordedFrame(t, "recv", msg)


def say(t: float, sid: str, words: str) -> RecordedFrame:
    """A recorded agent message chunk."""
    return note(t, sid, {"sessionUpdate": "agent_message_chunk", "content": text(words)})


def ask(t: float, request_id: int, method: str, params: dict[str, Any]) -> RecordedFrame:
    """A recorded request of the agent."""
    return RecordedFrame(
        t, "recv", {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    )


def answered(t: float, request_id: int, result: Any = None, error: Any = None) -> RecordedFrame:
    """Our recorded answer to a request of the agent."""
    body = {"error": error} if error is not None else {"result": result}
    return RecordedFrame(t, "send", {"jsonrpc": "2.0", "id": request_id, **body})


def permission(
    t: float, request_id: int, sid: str, path: str, chose: str = "allow"
) -> list[RecordedFrame]:
    """A recorded permission request for an edit of ``path`` and its recorded answer."""
    params = {
        "sessionId": sid,
        "toolCall": {
            "toolCallId": "call-1",
            "title": f"edit {path}",
            "kind": "edit",
            "locations": [{"path": path}],
        },
        "options": OPTIONS,
    }
    outcome = {"outcome": {"outcome": "selected", "optionId": chose}}
    return [
        ask(t, request_id, "session/request_permission", params),
        answered(t, request_id, outcome),
    ]


def turn(
    prompt: str,
    frames: Sequence[RecordedFrame],
    *,
    stop: str = "end_turn",
    response: Any = "default",
    cut: bool = False,
) -> RecordedTurn:
    """A recorded turn answered ``stop`` (or ``response`` as given)."""
    if response == "default":
        response = {"result": {"stopReason": stop}}
    return RecordedTurn(0.0, [text(prompt)], frames, response, cut)


def session(
    sid: str,
    turns: Sequence[RecordedTurn],
    *,
    changes: Sequence[RecordedChange] = (),
    attempt: int = 1,
    complete: bool = True,
    why: str | None = None,
) -> RecordedSession:
    """A recorded session of the demo agent."""
    return RecordedSession(
        AGENT, attempt, AGENT, sid, {"sessionId": sid}, turns, changes, complete, why, RECORDED_CWD
    )


def make_record(steps: dict[str, Sequence[RecordedSession]]) -> ReplayRecord:
    """A record of one agent, ``demo``, serving ``steps``."""
    return ReplayRecord(
        {"runId": "r-test", "kind": "pipeline"},
        {AGENT: {"initialize": INIT}},
        {key: tuple(sessions) for key, sessions in steps.items()},
    )


def write(
    path: str, data: bytes, mode: int | None = None, *, base: str | None = BASE_UNKNOWN
) -> RecordedChange:
    """A recorded write of ``path`` (``base``: what it found there)."""
    return RecordedChange(path, "write", data, mode, base)


# --------------------------------------------------------------------------- schema (agent side)


@define
class AgentFrameValidator:
    """Checks what the agent sends against the official schema: its requests' and
    notifications' params (``x-side`` client) and its answers' results (``x-side`` agent)."""

    index: SchemaIndex = field(factory=lambda: _load_index(SCHEMA_PATH.resolve()))
    #: our request id -> method, until the agent answers it
    pending: dict[Any, str] = field(factory=dict)
    faults: list[str] = field(factory=list)
    validated: int = 0

    def _def(self, method: str, suffix: str, side: str) -> str | None:
        for name, definition in self.index.defs.items():
            if (
                definition.get("x-method") == method
                and definition.get("x-side") == side
                and name.endswith(suffix)
            ):
                return name
        return None

    def _check(self, def_name: str | None, value: Any, what: str) -> None:
        if def_name is None:
            self.faults.append(f"{what}: no schema def")
            return
        fault = self.index.fault(def_name, value)
        self.validated += 1
        if fault is not None:
            self.faults.append(f"{what} against {def_name}: {fault}")

    def feed(self, direction: str, frame: bytes) -> None:
        msg = orjson.loads(frame)
        if direction == "send":  # ours: remember the request to check the agent's answer
            if "method" in msg and "id" in msg:
                self.pending[msg["id"]] = msg["method"]
            return
        assert msg.get("jsonrpc") == "2.0", msg
        method = msg.get("method")
        if isinstance(method, str) and method.startswith("_"):
            return  # an extension method: the envelope only (checked above)
        if method is not None:
            if method == "session/update":
                self._check("SessionNotification", msg.get("params"), method)
            else:
                suffix = "Request" if "id" in msg else "Notification"
                self._check(self._def(method, suffix, "client"), msg.get("params"), method)
        else:
            asked = self.pending.pop(msg.get("id"), None)
            if "error" in msg:
                self._check("Error", msg["error"], f"error answer to {asked}")
            elif asked is not None and not asked.startswith("_"):
                self._check(
                    self._def(asked, "Response", "agent"), msg.get("result"), f"answer to {asked}"
                )


@pytest.fixture(autouse=True)
def validate_agent_frames(
    validate_client_frames: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[AgentFrameValidator]]:
    """Every frame the (replay) agent sends to our client is checked against the schema."""
    inner: Callable[..., JsonRpcConnection] = vars(launch_module)[
        "JsonRpcConnection"
    ]  # conftest's client-side validating factory
    validators: list[AgentFrameValidator] = []

    def factory(stream: Any, **kwargs: Any) -> JsonRpcConnection:
        validator = AgentFrameValidator()
        validators.append(validator)
        chained = kwargs.pop("frame_observer", None)

        def observe(direction: Any, frame: bytes, valid: bool) -> None:
            validator.feed(direction, frame)
            if chained is not None:
                chained(direction, frame, valid)

        return inner(stream, frame_observer=observe, **kwargs)

    monkeypatch.setattr(launch_module, "JsonRpcConnection", factory)
    yield validators
    faults = [f for v in validators for f in v.faults]
    assert not faults, "the replay agent sent frames violating the ACP schema:\n" + "\n".join(
        faults
    )
    assert sum(v.validated for v in validators) > 0 or not validators


# --------------------------------------------------------------------------- the client side


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Create ``root`` holding ``files``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` with its bytes."""
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath, name)
            found[str(full.relative_to(root))] = full.read_bytes()
    return found


@asynccontextmanager
async def open_branch(tmp_path: Path, name: str, files: dict[str, bytes]) -> AsyncIterator[Workdir]:
    """A branch of a workspace holding ``files``, materialized; removed on the way out."""
    workspace = write_tree(tmp_path / f"ws-{name}", files)
    snapshot = await trio.to_thread.run_sync(Workspace.open(workspace).snapshot)
    workdir = await materialize_async(
        Branch.from_tree(snapshot, name), tmp_path / "branches" / name
    )
    try:
        yield workdir
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(workdir.remove)


@define
class Replayed:
    """What a replay did: each prompt's result or error, the divergences, the branch after."""

    results: list[TurnResult | JsonRpcError] = field(factory=list)
    divergences: list[dict[str, Any]] = field(factory=list)
    files: dict[str, bytes] = field(factory=dict)
    modes: dict[str, int] = field(factory=dict)
    pid: int | None = None
    #: the branch directory the replay ran in (removed since)
    root: Path | None = None

    def kinds(self) -> list[str]:
        return [d["kind"] for d in self.divergences]


def replay_command(path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.replay", str(path), "--agent", AGENT, *args]


async def replay(
    tmp_path: Path,
    record: ReplayRecord,
    prompts: Sequence[str],
    *,
    files: dict[str, bytes] | None = None,
    policy: str = "trusted",
    step: str | None = "edit",
    args: Sequence[str] = (),
    sessions: int = 1,
    transcript: Path | None = None,
) -> Replayed:
    """Replay ``record`` as a subprocess on a fresh branch; each prompt in turn, in each session."""
    path = tmp_path / "record.json"
    record.dump(path)
    out = tmp_path / "divergences.jsonl"
    out.unlink(missing_ok=True)
    replayed = Replayed()
    async with open_branch(tmp_path, "replay", files or {"a.txt": b"one\n"}) as workdir:
        root = Path(workdir.root)
        async with open_branch_services(workdir, PolicySet.from_preset(policy)) as branch:
            with trio.fail_after(LIMIT):
                async with open_agent(
                    replay_command(path, "--divergences", str(out), *args),
                    name=AGENT,
                    cwd=root,
                    services=branch.services,
                    options=ClientOptions(step_meta=True),
                    transcript=None if transcript is None else TranscriptWriter(transcript),
                    term_grace=1.0,
                ) as conn:
                    replayed.pid = conn.pid
                    replayed.root = root
                    for _ in range(sessions):
                        live = await conn.new_session(root, step=step)
                        for prompt in prompts:
                            try:
                                replayed.results.append(await live.prompt(prompt))
                            except JsonRpcError as e:
                                replayed.results.append(e)
        replayed.files = read_tree(root)
        replayed.modes = {rel: stat.S_IMODE((root / rel).stat().st_mode) for rel in replayed.files}
    assert replayed.pid is not None and pid_gone(replayed.pid), (
        "the replay agent outlived its connection"
    )
    if out.exists():
        replayed.divergences = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    print("divergences:", replayed.divergences)  # shown when a test fails
    return replayed


# ------------------------------------------------------------------ recorded from the demo agent


def _read_transcript(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def record_from_demo_transcript(path: Path, changes: Sequence[RecordedChange]) -> ReplayRecord:
    """A record of one demo session of one turn, from the wire transcript of its run."""
    lines = [line for line in _read_transcript(path) if "msg" in line]
    sent: dict[Any, str] = {}
    init = new = cwd = None
    prompt_line: dict[str, Any] | None = None
    frames: list[RecordedFrame] = []
    response = None
    for line in lines:
        msg, direction = line["msg"], line["dir"]
        if direction == "send" and "method" in msg and "id" in msg:
            sent[msg["id"]] = msg["method"]
            if msg["method"] == "session/prompt":
                prompt_line = line
            elif msg["method"] == "session/new":
                cwd = msg["params"]["cwd"]
            continue
        if direction == "recv" and "method" not in msg and msg.get("id") in sent:
            method = sent[msg["id"]]
            if method == "initialize":
                init = msg["result"]
            elif method == "session/new":
                new = msg["result"]
            elif method == "session/prompt":
                response = {k: msg[k] for k in ("result", "error") if k in msg}
            continue
        if prompt_line is not None and response is None:
            frames.append(RecordedFrame(line["t"] - prompt_line["t"], direction, msg))
    assert init is not None and new is not None and prompt_line is not None
    recorded_turn = RecordedTurn(
        prompt_line["t"], prompt_line["msg"]["params"]["prompt"], frames, response
    )
    sid = new["sessionId"]
    recorded = RecordedSession(AGENT, 1, AGENT, sid, new, [recorded_turn], changes, cwd=cwd)
    return ReplayRecord({"runId": "r-demo"}, {AGENT: {"initialize": init}}, {"edit": (recorded,)})


def tree_changes(before: dict[str, bytes], after: dict[str, bytes]) -> list[RecordedChange]:
    """What changed from ``before`` to ``after``, as recorded changes (each with what it
    found there, as the run store records them)."""
    changes = [
        write(p, d, base=sha(before.get(p))) for p, d in sorted(after.items()) if before.get(p) != d
    ]
    changes += [
        RecordedChange(p, "delete", base=sha(before[p])) for p in sorted(before) if p not in after
    ]
    return changes


def sha(data: bytes | None) -> str | None:
    """What the store records of a file's content: its SHA-256 (hex), None for no file."""
    return None if data is None else hashlib.sha256(data).hexdigest()


DEMO_FILES = {"a.txt": b"one\nold two\n", "gone.txt": b"bye\n"}
DEMO_PROMPT = "\n".join(
    [
        'replace "old" with "new" in a.txt',
        'create docs/new.md with "hello"',
        "delete gone.txt",
        "run echo ran",
    ]
)


def agent_frames(transcript: Path, root: Path) -> list[tuple[str, Any]]:
    """The agent's requests and notifications in a transcript, in order: method and params
    with the branch directory written ``ROOT`` (the ids and the directory differ by run)."""
    found = []
    for line in _read_transcript(transcript):
        msg = line.get("msg")
        if line["dir"] == "recv" and isinstance(msg, dict) and "method" in msg:
            params = orjson.loads(
                orjson.dumps(msg.get("params")).replace(str(root).encode(), b"ROOT")
            )
            found.append((msg["method"], params))
    return found


async def record_demo(tmp_path: Path) -> tuple[ReplayRecord, TurnResult, dict[str, bytes]]:
    """Run the demo agent for one turn on a branch, recording its transcript; the record, the
    turn's result and the branch's files after it."""
    transcript = tmp_path / "demo.jsonl"
    async with open_branch(tmp_path, "recorded", DEMO_FILES) as workdir:
        root = Path(workdir.root)
        async with open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch:
            with trio.fail_after(LIMIT):
                async with open_agent(
                    [sys.executable, "-m", "orchestrator.demo"],
                    name=AGENT,
                    cwd=root,
                    services=branch.services,
                    transcript=TranscriptWriter(transcript, agent=AGENT),
                    term_grace=1.0,
                ) as conn:
                    live = await conn.new_session(root)
                    result = await live.prompt(DEMO_PROMPT)
        after = read_tree(root)
    return record_from_demo_transcript(transcript, tree_changes(DEMO_FILES, after)), result, after


def updates_of(result: TurnResult) -> tuple[Any, ...]:
    """What a turn showed the user: text, thoughts, tool calls' titles and statuses, plan."""
    calls = {k: (c.title, c.status) for k, c in result.tool_calls.items()}
    plan = [(e.content, e.status) for e in result.plan or []]
    return result.stop_reason, result.text, result.thoughts, calls, plan


# --------------------------------------------------------------------------- tests: a demo run


async def test_a_recorded_demo_run_replays_with_the_same_frames_and_changes(tmp_path: Path) -> None:
    """A demo run replayed on a fresh branch shows the same updates and leaves the same files."""
    record, recorded_result, recorded_files = await record_demo(tmp_path)
    assert recorded_files["docs/new.md"] == b"hello"  # written behind the client's back
    transcript = tmp_path / "replayed.jsonl"
    replayed = await replay(
        tmp_path, record, [DEMO_PROMPT], files=DEMO_FILES, transcript=transcript
    )
    assert replayed.root is not None
    recorded_frames = agent_frames(tmp_path / "demo.jsonl", tmp_path / "branches" / "recorded")
    replayed_frames = agent_frames(transcript, replayed.root)
    assert [m for m, _ in recorded_frames].count("terminal/create") == 1
    assert replayed_frames == recorded_frames
    (result,) = replayed.results
    assert isinstance(result, TurnResult)
    assert updates_of(result) == updates_of(recorded_result)
    assert replayed.divergences == []
    assert replayed.files == recorded_files
    assert "gone.txt" not in replayed.files


async def test_a_demo_run_replayed_on_other_content_reports_the_read(tmp_path: Path) -> None:
    """A file that now holds other content gives an fs-read divergence naming it."""
    record, _, _ = await record_demo(tmp_path)
    files = {**DEMO_FILES, "a.txt": b"one\nold three\n"}
    replayed = await replay(tmp_path, record, [DEMO_PROMPT], files=files)
    assert replayed.kinds() == ["fs-read"]
    (divergence,) = replayed.divergences
    assert divergence["recorded"] == "one\nold two\n"
    assert divergence["now"] == "one\nold three\n"
    assert divergence["step"] == "edit" and divergence["turn"] == 0


# --------------------------------------------------------------------------- tests: divergence


def permitted_session(*, changes: Sequence[RecordedChange]) -> RecordedSession:
    """A session whose one turn asks permission (granted in the record), then says done."""
    frames = [
        say(0.0, "s-1", "editing"),
        *permission(0.1, 0, "s-1", f"{RECORDED_CWD}/a.txt"),
        say(0.2, "s-1", "done"),
    ]
    return session("s-1", [turn("edit it", frames)], changes=changes)


async def test_a_permission_the_policy_now_rejects_is_reported_and_no_disk_write_made(
    tmp_path: Path,
) -> None:
    """Under deny-all the granted permission is rejected: reported, and the changes not applied."""
    record = make_record({"edit": [permitted_session(changes=[write("b.txt", b"B\n")])]})
    replayed = await replay(tmp_path, record, ["edit it"], policy="deny-all")
    assert replayed.kinds() == ["permission", "disk"]
    assert replayed.divergences[0]["recorded"] == "allow_once"
    assert replayed.divergences[0]["now"] == "reject_once"
    assert "b.txt" not in replayed.files
    (result,) = replayed.results
    assert isinstance(result, TurnResult) and result.text == "editingdone"


async def test_no_write_nor_command_is_sent_past_a_permission_refused_now(tmp_path: Path) -> None:
    """After a granted permission is refused now, the recorded fs write and terminal are not
    sent (each reported), the rest of the turn is: nothing runs that the policy refused."""
    cwd = RECORDED_CWD
    frames = [
        *permission(0.0, 0, "s-1", f"{cwd}/a.txt"),
        ask(
            0.1,
            1,
            "fs/write_text_file",
            {"sessionId": "s-1", "path": f"{cwd}/a.txt", "content": "X"},
        ),
        answered(0.1, 1, {}),
        ask(0.2, 2, "terminal/create", {"sessionId": "s-1", "command": "touch ran.txt"}),
        answered(0.2, 2, {"terminalId": "t-9"}),
        ask(0.3, 3, "terminal/wait_for_exit", {"sessionId": "s-1", "terminalId": "t-9"}),
        answered(0.3, 3, {"exitCode": 0}),
        say(0.4, "s-1", "done"),
    ]
    record = make_record({"edit": [session("s-1", [turn("go", frames)])]})
    replayed = await replay(tmp_path, record, ["go"], policy="deny-all")
    assert replayed.kinds() == ["permission", "request", "request"]
    assert "fs/write_text_file not sent" in replayed.divergences[1]["detail"]
    assert "terminal/create not sent" in replayed.divergences[2]["detail"]
    assert "ran.txt" not in replayed.files
    assert replayed.files.get("a.txt") != b"X"
    (result,) = replayed.results
    assert isinstance(result, TurnResult) and result.text == "done"


async def test_a_permission_granted_again_applies_the_changes(tmp_path: Path) -> None:
    """Under a policy that grants it, the same record diverges nowhere and writes the file."""
    record = make_record({"edit": [permitted_session(changes=[write("b.txt", b"B\n")])]})
    replayed = await replay(tmp_path, record, ["edit it"], policy="trusted")
    assert replayed.divergences == []
    assert replayed.files["b.txt"] == b"B\n"


async def test_what_the_agent_said_before_its_first_prompt_comes_with_that_prompt(
    tmp_path: Path,
) -> None:
    """The notifications recorded between session/new and the first prompt (the agent's
    commands) are sent again, before the first turn's frames, and only once."""
    commands = {
        "sessionUpdate": "available_commands_update",
        "availableCommands": [{"name": "review", "description": "Review the branch"}],
    }
    recorded = attrs.evolve(
        session("s-1", [turn("one", [say(0, "s-1", "a")]), turn("two", [say(0, "s-1", "b")])]),
        opening=[note(0.0, "s-1", commands)],
    )
    transcript = tmp_path / "replayed.jsonl"
    replayed = await replay(
        tmp_path, make_record({"edit": [recorded]}), ["one", "two"], transcript=transcript
    )
    assert replayed.divergences == []
    assert replayed.root is not None
    updates = [
        params["update"]["sessionUpdate"]
        for method, params in agent_frames(transcript, replayed.root)
        if method == "session/update"
    ]
    assert updates == ["available_commands_update", "agent_message_chunk", "agent_message_chunk"]


async def test_a_changed_prompt_is_reported(tmp_path: Path) -> None:
    """A prompt text other than the recorded one is a prompt divergence; the turn goes on."""
    record = make_record(
        {"edit": [session("s-1", [turn("the old prompt", [say(0, "s-1", "hi")])])]}
    )
    replayed = await replay(tmp_path, record, ["a new prompt"])
    assert replayed.kinds() == ["prompt"]
    assert replayed.divergences[0]["recorded"] == "the old prompt"
    assert replayed.divergences[0]["now"] == "a new prompt"
    (result,) = replayed.results
    assert isinstance(result, TurnResult) and result.text == "hi"


async def test_strict_stops_at_the_first_divergence(tmp_path: Path) -> None:
    """--strict answers the prompt -32050 at the first divergence: no more frames, no writes."""
    frames = [
        say(0, "s-1", "before"),
        *permission(0.1, 0, "s-1", f"{RECORDED_CWD}/a.txt"),
        say(0.2, "s-1", "after"),
    ]
    record = make_record(
        {"edit": [session("s-1", [turn("go", frames)], changes=[write("b.txt", b"B")])]}
    )
    replayed = await replay(tmp_path, record, ["go"], policy="deny-all", args=["--strict"])
    (error,) = replayed.results
    assert isinstance(error, JsonRpcError)
    assert error.code == REPLAY_DIVERGED
    assert error.message.startswith("replay diverged: the permission was answered reject_once")
    assert error.data["divergence"]["kind"] == "permission"
    assert replayed.kinds() == ["permission"]
    assert "b.txt" not in replayed.files


async def test_strict_stops_before_any_frame_on_a_changed_prompt(tmp_path: Path) -> None:
    """A strict replay of a changed prompt sends none of the turn's frames."""
    frames = [*permission(0.0, 0, "s-1", f"{RECORDED_CWD}/a.txt"), say(0.1, "s-1", "after")]
    record = make_record(
        {"edit": [session("s-1", [turn("old", frames)], changes=[write("b.txt", b"B")])]}
    )
    replayed = await replay(tmp_path, record, ["new"], args=["--strict"])
    (error,) = replayed.results
    assert isinstance(error, JsonRpcError) and error.code == REPLAY_DIVERGED
    assert error.data["divergence"]["kind"] == "prompt"
    assert "b.txt" not in replayed.files


async def test_a_request_refused_now_is_reported_and_blocks_the_disk_writes(tmp_path: Path) -> None:
    """An fs read answered with an error where the record has a result is a request divergence."""
    frames = [
        ask(0, 3, "fs/read_text_file", {"sessionId": "s-1", "path": "/elsewhere/outside.txt"}),
        answered(0, 3, {"content": "secret"}),
    ]
    record = make_record(
        {"edit": [session("s-1", [turn("go", frames)], changes=[write("b.txt", b"B")])]}
    )
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.kinds() == ["request", "disk"]
    assert "fs/read_text_file" in replayed.divergences[0]["detail"]
    assert "b.txt" not in replayed.files


# --------------------------------------------------------------------------- tests: terminals


def terminal_frames(sid: str, output: str, code: int) -> list[RecordedFrame]:
    """A command run through the client's terminal, as recorded (terminal id ``rec-term-9``)."""
    tid = "rec-term-9"
    ref = {"sessionId": sid, "terminalId": tid}
    status = {"exitCode": code, "signal": None}
    return [
        ask(0, 1, "terminal/create", {"sessionId": sid, "command": "echo ran"}),
        answered(0, 1, {"terminalId": tid}),
        note(
            0,
            sid,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "c",
                "title": "run",
                "kind": "execute",
                "status": "in_progress",
                "content": [{"type": "terminal", "terminalId": tid}],
            },
        ),
        ask(0, 2, "terminal/wait_for_exit", ref),
        answered(0, 2, status),
        ask(0, 3, "terminal/output", ref),
        answered(0, 3, {"output": output, "truncated": False, "exitStatus": status}),
        ask(0, 4, "terminal/release", ref),
        answered(0, 4, {}),
    ]


async def test_terminal_ids_are_mapped_to_the_live_ones(tmp_path: Path) -> None:
    """The recorded terminal id is replaced by the client's: no divergence, the update names it."""
    record = make_record(
        {"edit": [session("s-1", [turn("go", terminal_frames("s-1", "ran\n", 0))])]}
    )
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.divergences == []
    (result,) = replayed.results
    assert isinstance(result, TurnResult)
    content = result.tool_calls["c"].content
    assert content and isinstance(content[0], t.Terminal)
    assert content[0].terminal_id != "rec-term-9" and content[0].terminal_id.startswith("term-")


async def test_a_terminal_whose_output_and_exit_differ_is_reported(tmp_path: Path) -> None:
    """A command that prints and exits otherwise than recorded gives terminal divergences."""
    record = make_record(
        {"edit": [session("s-1", [turn("go", terminal_frames("s-1", "other\n", 3))])]}
    )
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.kinds() == ["terminal", "terminal", "terminal"]
    assert replayed.divergences[0]["recorded"] == {"exitCode": 3, "signal": None}
    assert replayed.divergences[0]["now"] == {"exitCode": 0, "signal": None}
    assert replayed.divergences[1]["now"] == "ran\n"


# --------------------------------------------------------------------------- tests: disk writes


async def test_disk_writes_apply_contents_modes_and_deletions(tmp_path: Path) -> None:
    """The recorded own changes land in the branch: new files, modes, deletions."""
    changes = [
        write("a.txt", b"changed\n", base=sha(b"one\n")),
        write("bin/run.sh", b"#!/bin/sh\n", 0o100755),
        write("new.txt", b"new"),
        write("setid.sh", b"x", 0o106755),  # a record never sets a set-id or sticky bit
        RecordedChange("old.txt", "delete", base=sha(b"x")),
    ]
    record = make_record({"edit": [session("s-1", [turn("go", [])], changes=changes)]})
    replayed = await replay(tmp_path, record, ["go"], files={"a.txt": b"one\n", "old.txt": b"x"})
    assert replayed.divergences == []
    assert replayed.files == {
        "a.txt": b"changed\n",
        "bin/run.sh": b"#!/bin/sh\n",
        "new.txt": b"new",
        "setid.sh": b"x",
    }
    assert replayed.modes["bin/run.sh"] == 0o755
    assert replayed.modes["new.txt"] == 0o644
    assert replayed.modes["setid.sh"] == 0o755


async def test_disk_writes_are_applied_after_the_last_turn_only(tmp_path: Path) -> None:
    """Changes of a two-turn session are written after its last turn, not its first."""
    changes = [write("b.txt", b"B")]
    record = make_record(
        {"edit": [session("s-1", [turn("one", []), turn("two", [])], changes=changes)]}
    )
    once = await replay(tmp_path, record, ["one"])
    assert "b.txt" not in once.files
    twice = await replay(tmp_path, record, ["one", "two"])
    assert twice.files["b.txt"] == b"B" and twice.divergences == []


async def test_disk_writes_outside_the_cwd_are_refused(tmp_path: Path) -> None:
    """A change naming ``..`` or an absolute path is refused and reported; the rest applied."""
    outside = tmp_path / "outside.txt"
    changes = [
        write("../escaped.txt", b"no"),
        write(str(outside), b"no"),
        write("ok.txt", b"yes"),
    ]
    record = make_record({"edit": [session("s-1", [turn("go", [])], changes=changes)]})
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.kinds() == ["disk", "disk"]
    assert "leaves the session's directory" in replayed.divergences[0]["detail"]
    assert "absolute path" in replayed.divergences[1]["detail"]
    assert replayed.files["ok.txt"] == b"yes"
    assert not outside.exists() and not (tmp_path / "branches" / "escaped.txt").exists()


async def test_a_disk_write_through_a_symlink_is_refused(tmp_path: Path) -> None:
    """A change whose directory is now a symlink out of the cwd is refused and reported."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    record = make_record(
        {"edit": [session("s-1", [turn("go", [])], changes=[write("link/x.txt", b"no")])]}
    )
    path = tmp_path / "record.json"
    record.dump(path)
    async with open_branch(tmp_path, "linked", {"a.txt": b"1"}) as workdir:
        root = Path(workdir.root)
        (root / "link").symlink_to(target)
        found: list[Divergence] = []
        async with open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch:
            with trio.fail_after(LIMIT):
                async with replay_in_memory(record, branch.services, found) as conn:
                    live = await conn.new_session(root, step="edit")
                    await live.prompt("go")
    assert [d.kind for d in found] == ["disk"]
    assert "is a symlink" in found[0].detail
    assert list(target.iterdir()) == []


# --------------------------------------------------------------------------- tests: not replayable


async def test_a_cut_turn_is_not_replayable(tmp_path: Path) -> None:
    """A turn cut by the storage cap is answered with an error and reported not-replayable."""
    record = make_record({"edit": [session("s-1", [turn("go", [say(0, "s-1", "x")], cut=True)])]})
    replayed = await replay(tmp_path, record, ["go"])
    (error,) = replayed.results
    assert isinstance(error, JsonRpcError) and error.code == NOT_REPLAYABLE
    assert "cut by the per-turn storage cap" in error.message
    assert replayed.kinds() == ["not-replayable"]


async def test_a_turn_without_a_response_is_not_replayable(tmp_path: Path) -> None:
    """A turn whose prompt has no recorded answer is not replayable."""
    record = make_record({"edit": [session("s-1", [turn("go", [], response=None)])]})
    replayed = await replay(tmp_path, record, ["go"])
    (error,) = replayed.results
    assert isinstance(error, JsonRpcError) and error.code == NOT_REPLAYABLE
    assert "no answer to its prompt" in error.message
    assert replayed.kinds() == ["not-replayable"]


async def test_an_incomplete_session_and_an_extra_turn_are_not_replayable(tmp_path: Path) -> None:
    """A session the record marks incomplete, and a prompt past the recorded turns, are refused."""
    record = make_record(
        {"edit": [session("s-1", [turn("go", [])], complete=False, why="no transcript")]}
    )
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.kinds() == ["not-replayable"]
    assert "no transcript" in replayed.divergences[0]["detail"]
    record = make_record({"edit": [session("s-1", [turn("go", [])])]})
    replayed = await replay(tmp_path, record, ["go", "again"])
    assert isinstance(replayed.results[0], TurnResult)
    assert isinstance(replayed.results[1], JsonRpcError)
    assert replayed.kinds() == ["not-replayable"]


async def test_a_recorded_error_answer_is_answered_again(tmp_path: Path) -> None:
    """A turn the agent answered with an error is answered with that error."""
    error = {"code": -32000, "message": "model overloaded"}
    record = make_record({"edit": [session("s-1", [turn("go", [], response={"error": error})])]})
    replayed = await replay(tmp_path, record, ["go"])
    (answer,) = replayed.results
    assert isinstance(answer, JsonRpcError) and "model overloaded" in answer.message
    assert replayed.divergences == []


# --------------------------------------------------------------------------- tests: sessions


async def test_sessions_are_picked_by_step_and_attempt(tmp_path: Path) -> None:
    """The k-th session/new of a step plays its k-th attempt, then the last again."""
    record = make_record(
        {
            "other": [session("o-1", [turn("go", [say(0, "o-1", "other")])])],
            "edit": [
                session("e-1", [turn("go", [say(0, "e-1", "first")])]),
                session("e-2", [turn("go", [say(0, "e-2", "second")])], attempt=2),
            ],
        }
    )
    replayed = await replay(tmp_path, record, ["go"], sessions=3)
    texts = [r.text for r in replayed.results if isinstance(r, TurnResult)]
    assert texts == ["first", "second", "second"]
    assert replayed.divergences == []


async def test_without_a_step_sessions_are_served_in_record_order(tmp_path: Path) -> None:
    """Without a step key each session/new plays the next unused session; then an error."""
    record = make_record(
        {
            "one": [session("o-1", [turn("go", [say(0, "o-1", "one")])])],
            "two": [session("t-1", [turn("go", [say(0, "t-1", "two")])])],
        }
    )
    replayed = await replay(tmp_path, record, ["go"], step=None, sessions=2)
    assert [r.text for r in replayed.results if isinstance(r, TurnResult)] == ["one", "two"]
    with pytest.raises(JsonRpcError, match="no more sessions"):
        await replay(tmp_path, record, ["go"], step=None, sessions=3)


async def test_two_live_sessions_of_one_recorded_id_get_distinct_ids(tmp_path: Path) -> None:
    """Opening the same recorded session twice gives two live session ids."""
    record = make_record({"edit": [session("s-1", [turn("go", [say(0, "s-1", "x")])])]})
    found: list[Divergence] = []
    async with open_branch(tmp_path, "twice", {"a.txt": b"1"}) as workdir:
        root = Path(workdir.root)
        async with open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch:
            with trio.fail_after(LIMIT):
                async with replay_in_memory(record, branch.services, found) as conn:
                    first = await conn.new_session(root, step="edit")
                    second = await conn.new_session(root, step="edit")
                    assert first.session_id == "s-1" and second.session_id != "s-1"
                    assert (await second.prompt("go")).text == "x"
                    assert (await first.prompt("go")).text == "x"
    assert found == []


# --------------------------------------------------------------------------- tests: timing


@asynccontextmanager
async def replay_in_memory(
    record: ReplayRecord, services: Any, found: list[Divergence], **kwargs: Any
) -> AsyncIterator[Any]:
    """The client connected to ``serve_replay_agent`` over an in-memory stream."""
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: serve_replay_agent(agent_end, record, AGENT, divergences=found.append, **kwargs)
        )
        async with open_agent_on_stream(
            client_end, name=AGENT, services=services, options=ClientOptions(step_meta=True)
        ) as conn:
            yield conn
        await client_end.aclose()


def timed_record() -> ReplayRecord:
    frames = [say(1.0, "s-1", "a"), say(5.0, "s-1", "b"), say(9.0, "s-1", "c")]
    return make_record({"edit": [session("s-1", [turn("go", frames)])]})


async def _timed(tmp_path: Path, timing: Timing) -> tuple[float, list[str]]:
    """Seconds of (virtual) time the turn took, and the chunks in order."""
    chunks: list[str] = []
    async with (
        open_branch(tmp_path, timing, {"a.txt": b"1"}) as workdir,
        open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch,
        replay_in_memory(timed_record(), branch.services, [], timing=timing) as conn,
    ):
        live = await conn.new_session(workdir.root, step="edit")

        def seen(update: Any) -> None:
            chunks.append(update.content.text)

        start = trio.current_time()
        await live.prompt("go", on_update=seen)
        return trio.current_time() - start, chunks


async def test_recorded_timing_waits_for_each_frame_and_keeps_order(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """timing=recorded sends each frame at its recorded offset (virtual clock), in order."""
    took, chunks = await _timed(tmp_path, "recorded")
    assert chunks == ["a", "b", "c"]
    assert took >= 9.0


async def test_fast_timing_does_not_wait(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    """timing=fast sends the frames in order without letting the (virtual) clock move."""
    took, chunks = await _timed(tmp_path, "fast")
    assert chunks == ["a", "b", "c"]
    assert took == 0.0


async def test_the_agent_counts_no_wait_in_fast_mode() -> None:
    """The agent's own count of waits is 0 in fast mode and one per late frame in recorded."""
    record = timed_record()
    cases: tuple[tuple[Timing, int], ...] = (("fast", 0), ("recorded", 3))
    for timing, expected in cases:
        client_end, agent_end = trio.testing.memory_stream_pair()
        agent = ReplayAgent(
            JsonRpcConnection(agent_end, name="client"), record, AGENT, timing=timing
        )
        agent.install()
        peer = JsonRpcConnection(client_end, name="agent")
        peer.on_notification("session/update", lambda params: None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.rpc.serve)
            await nursery.start(peer.serve)
            await peer.request("session/new", {"cwd": "/tmp", "mcpServers": []})
            answer = await peer.request(
                "session/prompt", {"sessionId": "s-1", "prompt": [text("go")]}
            )
            assert answer == {"stopReason": "end_turn"}
            assert agent.waits == expected
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- tests: bad input


def run_replay_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.replay", *args],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json", "is not JSON"),
        (b'{"format": "something else"}', "it is not a replay record"),
        (
            b'{"format": "acp-orchestrator/replay-record", "version": 1, "steps": {"x": 3}}',
            "does not hold a list of sessions",
        ),
        (b'{"format": "acp-orchestrator/replay-record", "version": 9}', "reads up to version 1"),
    ],
)
def test_a_malformed_record_exits_2_with_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """A record that cannot be read: exit 2, one line on stderr naming the problem."""
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    done = run_replay_cli(str(path), "--agent", AGENT)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: ")


def test_an_unknown_agent_or_missing_file_exits_2(tmp_path: Path) -> None:
    """An agent the record lacks, or no record file: exit 2, one line."""
    path = tmp_path / "record.json"
    make_record({}).dump(path)
    done = run_replay_cli(str(path), "--agent", "nobody")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: the record has no agent 'nobody' (it has: demo)"
    ]
    done = run_replay_cli(str(tmp_path / "missing.json"), "--agent", AGENT)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "cannot read the replay record" in done.stderr


def test_serve_replay_agent_refuses_an_unknown_agent() -> None:
    """The in-memory agent refuses a label the record lacks with a UsageError."""
    with pytest.raises(UsageError, match="no agent 'nobody'"):
        ReplayAgent(
            JsonRpcConnection(trio.testing.memory_stream_pair()[0]), make_record({}), "nobody"
        )


def test_divergence_json_keeps_texts_short() -> None:
    """A divergence's recorded and now texts are cut to about 200 characters."""
    value = Divergence("s", 1, 0, "fs-read", "differs", "x" * 1000, {"k": "y" * 1000}).to_json()
    assert len(value["recorded"]) < 230 and value["recorded"].endswith("(1000 chars)")
    assert isinstance(value["now"], str) and len(value["now"]) < 230
    assert Divergence.from_json(orjson.loads(orjson.dumps(value))).kind == "fs-read"


async def test_a_refusal_in_an_earlier_turn_blocks_the_last_turns_disk_writes(
    tmp_path: Path,
) -> None:
    """A permission refused in turn 1 keeps the changes recorded for turn 2 off the disk."""
    first = turn("one", permission(0, 0, "s-1", f"{RECORDED_CWD}/a.txt"))
    record = make_record(
        {"edit": [session("s-1", [first, turn("two", [])], changes=[write("b.txt", b"B")])]}
    )
    replayed = await replay(tmp_path, record, ["one", "two"], policy="deny-all")
    assert replayed.kinds() == ["permission", "disk"]
    assert replayed.divergences[1]["turn"] == 1
    assert "b.txt" not in replayed.files


async def test_cancel_ends_a_running_turn(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    """session/cancel ends the turn with stopReason cancelled: no later frame, no disk write."""
    frames = [say(0.0, "s-1", "first"), say(100.0, "s-1", "never")]
    record = make_record(
        {"edit": [session("s-1", [turn("go", frames)], changes=[write("b.txt", b"B")])]}
    )
    chunks: list[str] = []
    started = trio.Event()

    def seen(update: Any) -> None:
        chunks.append(update.content.text)
        started.set()

    async with (
        open_branch(tmp_path, "cancel", {"a.txt": b"1"}) as workdir,
        open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch,
        replay_in_memory(record, branch.services, [], timing="recorded") as conn,
    ):
        live = await conn.new_session(workdir.root, step="edit")
        results: list[TurnResult] = []

        async def run() -> None:
            results.append(await live.prompt("go", on_update=seen))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await started.wait()
            await live.cancel()
        assert not (Path(workdir.root) / "b.txt").exists()
    assert [r.stop_reason for r in results] == ["cancelled"]
    assert chunks == ["first"]


async def test_a_request_of_an_unknown_method_is_sent_as_recorded(tmp_path: Path) -> None:
    """A request the client does not serve goes out; its error answer matches the record's."""
    not_found = {"code": -32601, "message": "Method not found"}
    frames = [
        ask(0, 5, "_vendor/thing", {"sessionId": "s-1"}),
        answered(0, 5, error=not_found),
        ask(0, 6, "_vendor/thing", {"sessionId": "s-1"}),
        answered(0, 6, {"ok": True}),
    ]
    record = make_record({"edit": [session("s-1", [turn("go", frames)])]})
    replayed = await replay(tmp_path, record, ["go"])
    assert replayed.kinds() == ["request"]
    assert "_vendor/thing answered an error" in replayed.divergences[0]["detail"]


async def test_mode_config_and_close_are_accepted(tmp_path: Path) -> None:
    """session/set_mode, set_config_option and close are accepted without a divergence."""
    options = [
        {
            "id": "model",
            "name": "Model",
            "type": "select",
            "currentValue": "m",
            "options": [{"value": "m", "name": "M"}],
        }
    ]
    modes = {"currentModeId": "edit", "availableModes": [{"id": "edit", "name": "Edit"}]}
    recorded = RecordedSession(
        AGENT,
        1,
        AGENT,
        "s-1",
        {"sessionId": "s-1", "configOptions": options, "modes": modes},
        [turn("go", [say(0, "s-1", "x")])],
        cwd=RECORDED_CWD,
    )
    record = ReplayRecord({"runId": "r"}, {AGENT: {"initialize": INIT}}, {"edit": (recorded,)})
    found: list[Divergence] = []
    async with (
        open_branch(tmp_path, "modes", {"a.txt": b"1"}) as workdir,
        open_branch_services(workdir, PolicySet.from_preset("trusted")) as branch,
        replay_in_memory(record, branch.services, found) as conn,
    ):
        live = await conn.new_session(workdir.root, step="edit")
        await live.set_mode("edit")
        await live.set_config_option("model", "m")
        assert (await live.prompt("go")).text == "x"
    assert found == []


def test_a_sessions_cwd_is_an_optional_key_of_the_record() -> None:
    """A session's cwd round-trips through JSON; absent it is None; not a string is refused."""
    recorded = session("s-1", [turn("go", [])])
    again = ReplayRecord.from_json(orjson.loads(make_record({"k": [recorded]}).dumps()))
    assert again.steps["k"][0].cwd == RECORDED_CWD
    assert again.steps["k"][0] == recorded
    value = recorded.to_json()
    del value["cwd"]
    assert RecordedSession.from_json(value).cwd is None
    with pytest.raises(UsageError, match="cwd is not a string"):
        RecordedSession.from_json({**value, "cwd": 3})


# --------------------------------------------------------------------------- tests: sources


async def test_the_agent_plays_a_run_of_the_store_or_a_transcript_file(
    tmp_path: Path, state_dir: Path
) -> None:
    """``python -m orchestrator.replay RUN`` (from the run store) and ``... TRANSCRIPT`` (a
    --transcript file) stand in for the recorded agent in a prompt: the same reply and diff."""
    from orchestrator.agents import AgentSpec
    from orchestrator.config import Config
    from orchestrator.runs import prompt

    def project(name: str) -> Path:
        root = tmp_path / name
        (root / "docs").mkdir(parents=True)
        (root / "docs" / "a.md").write_text("The colour.\n")
        return root

    task = 'replace "colour" with "color" in **/*.md'
    wire = tmp_path / "wire.ndjson"
    recorded = await prompt(
        "demo", task, cwd=project("p0"), policy="edit", state_dir=state_dir, transcript=wire
    )
    assert "+The color." in recorded.diff
    sources = [(recorded.run_id, "--step", "prompt", "--state-dir", str(state_dir)), (str(wire),)]
    for n, source in enumerate(sources, start=1):
        spec = AgentSpec(
            name="replayed", command=(sys.executable, "-m", "orchestrator.replay", *source)
        )
        again = await prompt(
            "replayed",
            task,
            cwd=project(f"p{n}"),
            policy="edit",
            state_dir=state_dir,
            config=Config(agents={"replayed": spec}),
        )
        assert again.turn.text == recorded.turn.text, source
        assert again.turn.stop_reason == "end_turn"
        assert again.diff == recorded.diff
        assert again.agent_info == recorded.agent_info


def test_a_step_the_record_lacks_or_an_unknown_run_exits_2(tmp_path: Path, state_dir: Path) -> None:
    """--step naming no instance, and a run id the store lacks: exit 2, one line."""
    path = tmp_path / "record.json"
    make_record({"edit": [session("s-1", [turn("go", [])])]}).dump(path)
    done = run_replay_cli(str(path), "--step", "nothing")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: the record has no step instance 'nothing' (it has: edit)"
    ]
    done = run_replay_cli("feedbeef", "--state-dir", str(state_dir))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "feedbeef" in done.stderr


async def test_a_change_that_does_not_say_what_it_found_overwrites_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    """A recorded change without its base (an old or hand-edited record) writes a path only
    where nothing is now: an existing file is neither overwritten nor deleted."""
    changes = [
        write("user.txt", b"agent\n"),
        RecordedChange("precious.txt", "delete"),
        write("fresh.txt", b"new\n"),
    ]
    record = make_record({"edit": [session("s-1", [turn("go", [])], changes=changes)]})
    files = {"user.txt": b"USER\n", "precious.txt": b"PRECIOUS\n"}
    replayed = await replay(tmp_path, record, ["go"], files=files)
    assert replayed.kinds() == ["disk", "disk"]
    assert all("does not say what" in d["detail"] for d in replayed.divergences)
    assert replayed.files == {**files, "fresh.txt": b"new\n"}
