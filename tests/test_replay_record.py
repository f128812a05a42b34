"""The replay record of a recorded run: built from the run store (replay_record) and from a
``--transcript`` file (record_from_transcript), for runs made with the demo agent."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from run_helpers import workspace

from orchestrator import Config, Pipeline, StepContext, prompt, run_pipeline, step
from orchestrator.errors import RunNotFound, UsageError
from orchestrator.pipeline._recording import own_changes
from orchestrator.replay import RecordedSession, RecordedTurn, ReplayRecord
from orchestrator.replay._frames import answers
from orchestrator.runs.replay_record import record_from_transcript, replay_record
from orchestrator.store import StoredChange, open_run_store
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.tree import MemoryTree

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo_pipeline.py"
#: seconds a run of the demo agent may take here
LIMIT = 120

ALICE = (
    'replace "colour" with "color" in README.md\n'
    'create docs/pricing.md with "# Pricing\\n\\nTotals come from compute_total.\\n"\n'
)
RENAMES = ("shop/__init__.py", "shop/cart.py", "shop/pricing.py")


def sample_project(tmp_path: Path) -> Path:
    """A copy of the sample project."""
    root = tmp_path / "sample"
    shutil.copytree(ROOT / "examples" / "sample-project", root)
    return root


async def demo_run(tmp_path: Path, state_dir: Path, **kw: Any) -> str:
    """Run the demo pipeline on a copy of the sample project under the edit policy."""
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            DEMO, cwd=sample_project(tmp_path), policy="edit", state_dir=state_dir, **kw
        )
    assert outcome.result["status"] in ("succeeded", "conflicts"), outcome.result
    return outcome.run_id


def requests(turn: RecordedTurn, method: str) -> list[dict[str, Any]]:
    """The agent's requests of ``method`` in the turn."""
    return [f.msg for f in turn.frames if f.dir == "recv" and f.msg.get("method") == method]


def answer(turn: RecordedTurn, request: dict[str, Any]) -> dict[str, Any]:
    """Our one answer to the agent's ``request`` in the turn."""
    (found,) = [
        f.msg
        for f in turn.frames
        if f.dir == "send" and "method" not in f.msg and f.msg.get("id") == request["id"]
    ]
    return found


def round_trips(record: ReplayRecord) -> None:
    """The record reads back from its JSON text as it was."""
    assert ReplayRecord.from_json(orjson.loads(record.dumps())) == record
    assert ReplayRecord.from_json(record.to_json()) == record


async def test_a_demo_pipeline_run_gives_every_instance_its_session_turns_and_changes(
    tmp_path: Path, state_dir: Path
) -> None:
    """Every agent instance of the demo pipeline is in the record with its agent, source,
    session, handshake, prompt, frames (fs and permission requests with our answers), answer
    and own changes; the record round-trips through JSON."""
    run_id = await demo_run(tmp_path, state_dir)
    record = await replay_record(run_id[:8], state_dir=state_dir)
    round_trips(record)

    async with open_run_store(state_dir) as store:
        steps = {s.key: s for s in await store.steps(run_id) if s.agent is not None}
        run = await store.get_run(run_id)
    assert (
        set(record.steps)
        == set(steps)
        == {
            *(f"rename[{path}]" for path in RENAMES),
            "docs[alice]",
            "docs[bob]",
        }
    )
    assert record.run["runId"] == run_id
    assert (record.run["kind"], record.run["cwd"]) == ("pipeline", run.cwd)
    assert record.run["pipeline"] == run.pipeline == str(DEMO)
    assert record.run["pipelineSource"] == DEMO.read_text()
    assert record.run["pipelineDigest"] == run.pipeline_digest
    assert record.run["options"] == dict(run.options)
    assert record.run["options"]["policy"] is not None

    for label in ("demo", "alice", "bob"):
        assert record.agents[label]["initialize"]["agentInfo"]["name"] == "demo-agent"
    for key, sessions in record.steps.items():
        (session,) = sessions
        assert session.attempt == 1 and session.replayable, key
        assert session.agent == steps[key].agent
        assert session.session_id == steps[key].session_id
        assert session.new is not None and session.new["sessionId"] == session.session_id
        (turn,) = session.turns
        assert turn.response is not None
        assert turn.response["result"]["stopReason"] == "end_turn"
        # every frame the agent sent is about this session; we answered each of its requests
        # once, and sent nothing else
        request_ids = [f.msg["id"] for f in turn.frames if f.dir == "recv" and "id" in f.msg]
        answered = [f.msg["id"] for f in turn.frames if f.dir == "send"]
        assert request_ids and sorted(answered) == sorted(request_ids)
        for frame in turn.frames:
            if frame.dir == "recv":
                assert frame.msg["params"]["sessionId"] == session.session_id
            else:
                assert "method" not in frame.msg
            assert frame.t >= 0
    # alice and bob each ran a session demo-1, on processes of their own
    alice, bob = record.steps["docs[alice]"][0], record.steps["docs[bob]"][0]
    assert (alice.source, bob.source) == ("alice", "bob")
    assert alice.session_id == bob.session_id == "demo-1"
    assert {record.steps[f"rename[{p}]"][0].source for p in RENAMES} == {"demo"}
    assert len({record.steps[f"rename[{p}]"][0].session_id for p in RENAMES}) == 3

    (turn,) = alice.turns
    assert turn.prompt_text.endswith(ALICE)
    (read,) = requests(turn, "fs/read_text_file")
    assert read["params"]["path"].endswith("/README.md")
    assert "colour" in answer(turn, read)["result"]["content"]
    # one permission per file: README.md edited, docs/pricing.md created
    asked = requests(turn, "session/request_permission")
    assert [a["params"]["toolCall"]["kind"] for a in asked] == ["edit", "edit"]
    for one in asked:
        allowed = {"outcome": "selected", "optionId": "allow"}
        assert answer(turn, one)["result"]["outcome"] == allowed
    # the created file the demo agent writes to disk itself: only in its own changes
    (wrote,) = requests(turn, "fs/write_text_file")
    assert "color" in wrote["params"]["content"]
    assert answer(turn, wrote)["result"] == {}
    # its own changes: what its turn changed, not the renames it forked from
    changes = {c.path: c for c in alice.changes}
    assert set(changes) == {"README.md", "docs/pricing.md"}
    assert changes["docs/pricing.md"].kind == "write"
    assert changes["docs/pricing.md"].data == b"# Pricing\n\nTotals come from compute_total.\n"
    assert b"color" in (changes["README.md"].data or b"")
    assert {c.path for c in bob.changes} == {"README.md", "CHANGES.md"}
    rename = record.steps["rename[shop/cart.py]"][0]
    assert [c.path for c in rename.changes] == ["shop/cart.py"]


async def test_a_retried_instance_has_a_session_per_attempt(
    tmp_path: Path, state_dir: Path
) -> None:
    """An instance retried after its check failed keeps both attempts' sessions, in order,
    each with its own prompt; its changes are on the last attempt's session."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    @step(agent="demo", check='grep -q "try 2" a.txt', retries=1)
    def grow(ctx: StepContext) -> str:
        return f'append "try {ctx.attempt}" to a.txt'

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([grow], name="grow"), cwd=ws, policy="edit", state_dir=state_dir
        )
    assert outcome.result["status"] == "succeeded"
    record = await replay_record(outcome.run_id, state_dir=state_dir)
    round_trips(record)
    first, second = record.steps["grow"]
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.session_id != second.session_id or first.source != second.source
    assert [t.prompt_text for t in first.turns] == ['append "try 1" to a.txt']
    assert [t.prompt_text for t in second.turns] == ['append "try 2" to a.txt']
    assert first.changes == ()
    assert [(c.path, c.kind, c.data) for c in second.changes] == [
        ("a.txt", "write", b"start\ntry 2\n")
    ]
    assert record.run["pipelineSource"] is None  # built in code: no file text


async def test_a_turn_cut_by_the_storage_cap_is_marked_cut(tmp_path: Path, state_dir: Path) -> None:
    """With a small max_turn_record_bytes the transcript drops a turn's updates: the record
    marks that turn cut, and its session not replayable."""
    ws = workspace(tmp_path, {f"f{i}.txt": "old\n" for i in range(6)})

    @step(agent="demo")
    def edit() -> str:
        return 'replace "old" with "new" in *.txt'

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([edit], name="edit"),
            cwd=ws,
            policy="edit",
            state_dir=state_dir,
            config=Config(agents={}, max_turn_record_bytes=1000),
        )
    assert outcome.result["status"] == "succeeded"
    async with open_run_store(state_dir) as store:
        cuts = [line for line in await store.transcript(outcome.run_id) if line["dir"] == "cut"]
    assert cuts  # the cap did cut the turn
    record = await replay_record(outcome.run_id, state_dir=state_dir)
    round_trips(record)
    (session,) = record.steps["edit"]
    (turn,) = session.turns
    assert turn.cut and session.complete and not session.replayable
    # what the cap keeps past the cut is there: the prompt's answer
    assert turn.response is not None and turn.response["result"]["stopReason"] == "end_turn"


async def test_a_prompt_run_has_a_record(project: Path, state_dir: Path) -> None:
    """A prompt run keeps its wire transcript by default: its record holds its one session."""
    (project / "README.md").write_text("The colour of things.\n")
    with trio.fail_after(LIMIT):
        run = await prompt(
            "demo",
            'replace "colour" with "color" in README.md',
            cwd=project,
            policy="edit",
            state_dir=state_dir,
        )
    assert run.status == "succeeded"
    record = await replay_record(run.run_id, state_dir=state_dir)
    round_trips(record)
    assert record.run["kind"] == "prompt"
    assert record.run["inputs"] == {"text": 'replace "colour" with "color" in README.md'}
    [(key, (session,))] = record.steps.items()
    assert key == "prompt"
    assert (session.agent, session.source, session.session_id) == ("demo", "demo", run.session_id)
    (turn,) = session.turns
    assert turn.prompt_text == 'replace "colour" with "color" in README.md'
    assert [r["method"] for r in (f.msg for f in turn.frames if f.dir == "recv") if "id" in r] == [
        "fs/read_text_file",
        "session/request_permission",
        "fs/write_text_file",
    ]
    assert [(c.path, c.data) for c in session.changes] == [("README.md", b"The color of things.\n")]
    assert session.replayable
    assert record.agents["demo"]["initialize"]["protocolVersion"] == 1


async def test_a_transcript_file_gives_a_record_without_changes(
    tmp_path: Path, state_dir: Path
) -> None:
    """A --transcript file of the demo pipeline gives a session per agent session, keyed
    agent:sessionId in the order they were opened, complete but without changes."""
    wire = tmp_path / "wire.ndjson"
    run_id = await demo_run(tmp_path, state_dir, transcript=wire)
    record = record_from_transcript(wire)
    round_trips(record)
    stored = await replay_record(run_id, state_dir=state_dir)
    assert set(record.steps) == {
        "demo:demo-1",
        "demo:demo-2",
        "demo:demo-3",
        "alice:demo-1",
        "bob:demo-1",
    }
    assert list(record.steps)[:3] == ["demo:demo-1", "demo:demo-2", "demo:demo-3"]
    assert set(record.agents) == {"demo", "alice", "bob"}
    for key, (session,) in record.steps.items():
        assert session.complete and session.replayable and session.changes == ()
        assert key == f"{session.agent}:{session.session_id}"
    # the same sessions, turns and frames as the store's record of the run
    for key, sessions in stored.steps.items():
        (from_store,) = sessions
        from_file = record.steps[f"{from_store.agent}:{from_store.session_id}"][0]
        assert from_file.source == from_store.source
        assert from_file.new == from_store.new
        assert [t.prompt for t in from_file.turns] == [t.prompt for t in from_store.turns]
        assert [[f.msg for f in t.frames] for t in from_file.turns] == [
            [f.msg for f in t.frames] for t in from_store.turns
        ], key
        assert [t.response for t in from_file.turns] == [t.response for t in from_store.turns]


async def test_an_unknown_run_is_not_found_and_a_batch_is_refused(state_dir: Path) -> None:
    """replay_record of a run id the store does not hold raises RunNotFound, of a batch run a
    UsageError, each one line."""
    from orchestrator.store import RunRecord

    with pytest.raises(RunNotFound) as caught:
        await replay_record("no-such-run", state_dir=state_dir)
    assert "no-such-run" in str(caught.value) and "\n" not in str(caught.value)
    async with open_run_store(state_dir) as store:
        await store.create_run(RunRecord("b1", "batch", "succeeded", 1.0, "/w"))
    with pytest.raises(UsageError, match=r"^run b1 is a batch run: replay one of") as refused:
        await replay_record("b1", state_dir=state_dir)
    assert "\n" not in str(refused.value)


def test_a_bad_transcript_file_is_a_usage_error(tmp_path: Path) -> None:
    """A missing file, a line that is not JSON, a JSON line of another kind and a file with
    no session are refused with one-line usage errors; a last line cut short is skipped."""
    missing = tmp_path / "missing.ndjson"
    with pytest.raises(UsageError, match="cannot read the transcript"):
        record_from_transcript(missing)
    garbage = tmp_path / "garbage.ndjson"
    garbage.write_text("not json\n{}\n")
    with pytest.raises(UsageError, match="line 1 is not JSON"):
        record_from_transcript(garbage)
    other = tmp_path / "other.ndjson"
    other.write_text('{"dir": "sideways"}\n')
    with pytest.raises(UsageError, match="line 1 is not a transcript line"):
        record_from_transcript(other)
    empty = tmp_path / "empty.ndjson"
    empty.write_text("")
    with pytest.raises(UsageError, match="holds no agent session"):
        record_from_transcript(empty)
    lines = [
        {"dir": "send", "t": 0.0, "agent": "a", "msg": {"jsonrpc": "2.0", "id": 0,
                                                         "method": "session/new",
                                                         "params": {"cwd": "/x"}}},
        {"dir": "recv", "t": 0.1, "agent": "a", "msg": {"jsonrpc": "2.0", "id": 0,
                                                         "result": {"sessionId": "s"}}},
    ]  # fmt: skip
    cut_short = tmp_path / "cut.ndjson"
    cut_short.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b'{"dir": "se')
    record = record_from_transcript(cut_short)
    assert list(record.steps) == ["a:s"]
    only: RecordedSession = record.steps["a:s"][0]
    assert (only.new, only.turns, only.complete) == ({"sessionId": "s"}, (), True)


def test_own_changes_are_against_the_fork_and_keep_a_change_back_to_the_base() -> None:
    """A forked branch's own changes are its writes (with modes; a mode change as a write of
    the content), deletions and a change back to the run's base content, not its parent's."""
    run_base = MemoryTree.from_files({"a.txt": b"A\n", "b.txt": b"B\n", "c.sh": b"c\n"})
    parent = Branch.from_tree(run_base, "parent")
    parent.write("a.txt", b"parent\n")
    parent.write("p.txt", b"parent only\n")
    child = parent.fork("child")
    child.write("a.txt", b"A\n")  # back to the run's base content: the net change is gone
    child.delete("b.txt")
    child.chmod("c.sh", 0o755)
    assert "a.txt" not in child.net_changes()

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    # each says what the child forked from there (its parent's content, not the run's base)
    assert own_changes(child) == [
        StoredChange("a.txt", "write", b"A\n", 0o100644, sha(b"parent\n")),
        StoredChange("b.txt", "delete", base_digest=sha(b"B\n")),
        StoredChange("c.sh", "write", b"c\n", 0o100755, sha(b"c\n")),
    ]


def process_lines(text: str, stop: str) -> list[dict[str, Any]]:
    """One agent process's transcript: a handshake, a session s-1 and one turn of it in which
    the agent reads a file."""
    frames = [
        ("send", {"id": 0, "method": "initialize", "params": {"protocolVersion": 1}}),
        ("recv", {"id": 0, "result": {"protocolVersion": 1, "agentInfo": {"name": text}}}),
        ("send", {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}),
        ("recv", {"id": 1, "result": {"sessionId": "s-1"}}),
        ("send", {"id": 2, "method": "session/prompt",
                  "params": {"sessionId": "s-1", "prompt": [{"type": "text", "text": text}]}}),
        ("recv", {"id": 0, "method": "fs/read_text_file",
                  "params": {"sessionId": "s-1", "path": "/w/a"}}),
        ("send", {"id": 0, "result": {"content": text}}),
        ("recv", {"id": 2, "result": {"stopReason": stop}}),
    ]  # fmt: skip
    return [
        {"dir": d, "t": i / 10, "agent": "a", "msg": {"jsonrpc": "2.0", **msg}}
        for i, (d, msg) in enumerate(frames)
    ]


async def test_a_source_holding_two_processes_gives_each_session_its_own_turns(
    state_dir: Path,
) -> None:
    """A resumed run appends its new process's transcript to the same source, where request
    ids and session ids start over: each recorded session gets the turns and answers of its
    own opening."""
    from orchestrator.store import RunRecord, SessionRecord

    async with open_run_store(state_dir) as store:
        await store.create_run(RunRecord("r1", "pipeline", "succeeded", 1.0, "/w"))
        lines = process_lines("first", "end_turn") + process_lines("second", "refusal")
        await store.add_transcript("r1", "a", lines)
        await store.put_session(SessionRecord("r1", "x", 1, "a", "a", "s-1"))
        await store.put_session(SessionRecord("r1", "y", 1, "a", "a", "s-1"))
    record = await replay_record("r1", state_dir=state_dir)
    round_trips(record)
    (x,), (y,) = record.steps["x"], record.steps["y"]
    assert [t.prompt_text for t in x.turns] == ["first"]
    assert [t.prompt_text for t in y.turns] == ["second"]
    assert [t.response for t in x.turns] == [{"result": {"stopReason": "end_turn"}}]
    assert [t.response for t in y.turns] == [{"result": {"stopReason": "refusal"}}]
    assert [f.msg.get("result") for f in y.turns[0].frames] == [None, {"content": "second"}]
    assert record.agents == {"a": {"initialize": lines[1]["msg"]["result"]}}


async def test_a_run_recorded_before_sessions_were_kept_is_not_complete(
    state_dir: Path,
) -> None:
    """A run whose store rows predate the per-attempt sessions gets its steps' last sessions,
    found in their transcript, marked not complete with the reason."""
    from orchestrator.store import RunRecord, StepRecord

    async with open_run_store(state_dir) as store:
        await store.create_run(RunRecord("r1", "pipeline", "succeeded", 1.0, "/w"))
        await store.add_transcript("r1", "a", process_lines("only", "end_turn"))
        await store.put_step(
            StepRecord("r1", "x", "x", agent="a", status="succeeded", session_id="s-1")
        )
    record = await replay_record("r1", state_dir=state_dir)
    (x,) = record.steps["x"]
    assert (x.agent, x.source, x.session_id, x.attempt) == ("a", "a", "s-1", 1)
    assert [t.prompt_text for t in x.turns] == ["only"]
    assert not x.complete and not x.replayable
    assert x.why is not None and "does not say which session served each attempt" in x.why


def test_a_pipeline_keeps_its_file_text_as_python_reads_it() -> None:
    """A pipeline's source is its text decoded as Python decodes it (its coding line); one
    built without text has none."""

    @step()
    def one() -> str:
        return "x"

    latin = b'# -*- coding: latin-1 -*-\nNAME = "caf\xe9"\n'
    assert (
        Pipeline.from_steps([one], text=latin).source
        == '# -*- coding: latin-1 -*-\nNAME = "café"\n'
    )
    assert Pipeline.from_steps([one]).source is None
    assert Pipeline.from_steps([one], text="given").source == "given"
    assert Pipeline.from_steps([one], text=latin).digest != Pipeline.from_steps([one]).digest


def test_what_an_agent_says_before_the_first_prompt_is_the_sessions_opening(
    tmp_path: Path,
) -> None:
    """A notification about a session between its session/new and its first prompt is kept
    as the session's opening, not in a turn; one after the prompt is the turn's."""
    commands = {"sessionUpdate": "available_commands_update", "availableCommands": []}
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}
    prompt = {"sessionId": "s", "prompt": [{"type": "text", "text": "go"}]}

    def line(t: float, direction: str, **msg: Any) -> dict[str, Any]:
        return {"dir": direction, "t": t, "agent": "a", "msg": {"jsonrpc": "2.0", **msg}}

    lines = [
        line(0.0, "send", id=0, method="session/new", params={"cwd": "/x", "mcpServers": []}),
        line(0.1, "recv", id=0, result={"sessionId": "s"}),
        line(0.2, "recv", method="session/update", params={"sessionId": "s", "update": commands}),
        line(0.3, "send", id=1, method="session/prompt", params=prompt),
        line(0.4, "recv", method="session/update", params={"sessionId": "s", "update": chunk}),
        line(0.5, "recv", id=1, result={"stopReason": "end_turn"}),
    ]
    path = tmp_path / "wire.ndjson"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    [session] = record_from_transcript(path).steps["a:s"]
    assert [f.msg["params"]["update"] for f in session.opening] == [commands]
    assert session.cwd == "/x"  # what a replay maps the recorded paths from
    [turn] = session.turns
    assert [f.msg["params"]["update"] for f in turn.frames] == [chunk]
    again = RecordedSession.from_json(orjson.loads(orjson.dumps(session.to_json())))
    assert again.opening == session.opening


def agent_requests_transcript(tmp_path: Path, ids: list[Any]) -> Path:
    """A transcript of one turn in which the agent reads a file per id of ``ids`` (each read
    asked before any is answered, answered in reverse order)."""

    def line(t: float, direction: str, **msg: Any) -> dict[str, Any]:
        return {"dir": direction, "t": t, "agent": "a", "msg": {"jsonrpc": "2.0", **msg}}

    prompt = {"sessionId": "s", "prompt": [{"type": "text", "text": "go"}]}
    lines = [
        line(0.0, "send", id=0, method="session/new", params={"cwd": "/x", "mcpServers": []}),
        line(0.1, "recv", id=0, result={"sessionId": "s"}),
        line(0.2, "send", id=1, method="session/prompt", params=prompt),
    ]
    for n, ident in enumerate(ids):
        read = {"sessionId": "s", "path": f"/x/f{n}"}
        lines.append(line(0.3, "recv", id=ident, method="fs/read_text_file", params=read))
    for n, ident in reversed(list(enumerate(ids))):
        lines.append(line(0.4, "send", id=ident, result={"content": f"text {n}"}))
    lines.append(line(0.5, "recv", id=1, result={"stopReason": "end_turn"}))
    path = tmp_path / "wire.ndjson"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


@pytest.mark.parametrize(
    "ids", [["1", 1], [1, 1.0]], ids=["string-and-integer", "integer-and-float"]
)
def test_an_agents_requests_of_equal_looking_ids_get_each_its_own_answer(
    tmp_path: Path, ids: list[Any]
) -> None:
    """Ids an agent numbers apart (string "1" and integer 1, integer 1 and float 1.0) keep
    each request paired with its own answer, as the replay agent pairs them."""
    [session] = record_from_transcript(agent_requests_transcript(tmp_path, ids)).steps["a:s"]
    [turn] = session.turns
    paired = answers(turn)
    assert len(paired) == len(ids)
    for at, reply in paired.items():
        asked = turn.frames[at].msg
        assert type(reply["id"]) is type(asked["id"])
        assert reply["result"] == {"content": f"text {asked['params']['path'][-1]}"}
    assert len(turn.frames) == 2 * len(ids)  # each request and its one answer, nothing else
