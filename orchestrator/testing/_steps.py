"""How the scripted agent plays a turn: its steps, in order, and the prompt's answer.

Private to :mod:`orchestrator.testing.scripted_agent`; the steps are documented in
:mod:`orchestrator.testing.script`, the events they record in the agent's module.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any, Literal

import attrs
import orjson
import trio
from attrs import define, field

from orchestrator._names import display_name, parse_name
from orchestrator.errors import JsonRpcError
from orchestrator.testing._wire import AgentRecord, FloodAnswers, Wire, outcome_of
from orchestrator.testing.script import (
    AskPermission,
    Crash,
    DeleteDisk,
    Flood,
    FloodRequests,
    HugeLine,
    JsonObject,
    Notify,
    PermissionToolCall,
    Plan,
    Raw,
    ReadFile,
    Request,
    Say,
    Sleep,
    Spawn,
    Stall,
    Step,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Turn,
    Update,
    Usage,
    UserMessage,
    WriteDisk,
    WriteFile,
    terminal_content,
)

__all__ = ["CLEANUP_GRACE", "ScriptedCrash", "Session", "StepRunner", "TurnState"]

CLEANUP_GRACE = 2.0  # seconds to kill/release a terminal after a cancel
_FLOOD_BATCH_BYTES = 1 << 20
# A daemon's start: fork, setsid, fork again; the middle process prints the daemon's pid.
_DETACH = """
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
pid = os.fork()
if pid:
    os.write(1, str(pid).encode())
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
try:
    os.execvp(sys.argv[1], sys.argv[1:])
finally:
    os._exit(127)
"""


class ScriptedCrash(Exception):
    """A ``crash`` step (or ``exit_at_start``): the agent exits with ``exit_code``."""

    def __init__(self, exit_code: int, stderr: str):
        super().__init__(f"scripted crash with exit code {exit_code}")
        self.exit_code = exit_code
        self.stderr = stderr


@define
class TurnState:
    """A running turn: its cancel scope and whether the client asked to cancel it."""

    ignore_cancel: bool
    scope: trio.CancelScope = field(factory=trio.CancelScope)
    cancel_requested: bool = False


@define
class Session:
    """One session the client opened."""

    id: str
    cwd: str
    mode: str | None
    config: list[JsonObject]
    prompts: int = 0
    turn: TurnState | None = None

    def resolve(self, path: str) -> str:
        """``path`` joined to the session cwd (an absolute path stays as is)."""
        return os.path.join(self.cwd, path)

    def on_disk(self, path: str) -> trio.Path:
        """The file the agent itself touches for ``path``, a name in the display form (``\\xHH``
        is a byte that is not UTF-8, see :mod:`orchestrator._names`), joined to the cwd."""
        return trio.Path(self.resolve(parse_name(path)))


@define
class StepRunner:
    """Plays turns and steps over the agent's wire, recording what the client answered."""

    wire: Wire
    record: AgentRecord

    async def run_turn(self, req_id: Any, session: Session, turn: Turn, state: TurnState) -> None:
        """Play ``turn``, answer the prompt ``req_id``, then run ``updates_after_response``."""
        stop_reason: str = turn.stop_reason
        with state.scope:
            ended = await self.run_steps(session, turn.steps, state)
            if ended is not None:
                stop_reason = ended
        cancelled = state.scope.cancelled_caught or (
            state.cancel_requested and not turn.ignore_cancel
        )
        if session.turn is state:
            session.turn = None
        if cancelled:
            stop_reason = turn.cancel_stop_reason
        if turn.error is not None and not cancelled:
            error = turn.error
            self.record.add(
                "turn_end", sessionId=session.id, error=error.to_json(), cancelled=False
            )
            await self.wire.reply_error(
                req_id, JsonRpcError(error.message, error.data, code=error.code)
            )
        else:
            self.record.add(
                "turn_end", sessionId=session.id, stopReason=stop_reason, cancelled=cancelled
            )
            response: JsonObject = {"stopReason": stop_reason}
            if turn.response_meta is not None:
                response["_meta"] = turn.response_meta
            await self.wire.reply(req_id, response)
        after = TurnState(ignore_cancel=True)
        await self.run_steps(session, turn.updates_after_response, after)

    async def run_steps(
        self, session: Session, steps: tuple[Step, ...], state: TurnState
    ) -> str | None:
        """Run steps in order; a stop reason if one of them ended the turn early."""
        for step in steps:
            await trio.lowlevel.checkpoint_if_cancelled()
            ended = await self.run_step(session, step, state)
            if ended is not None:
                return ended
        return None

    async def run_step(self, session: Session, step: Step, state: TurnState) -> str | None:
        """Run one step; a stop reason if it ended the turn early."""
        match step:
            case Say() | Think():
                kind = "agent_message_chunk" if isinstance(step, Say) else "agent_thought_chunk"
                for piece in _split(step.text, step.chunks):
                    await self.wire.update(session.id, _text_chunk(kind, piece))
            case UserMessage():
                await self.wire.update(session.id, _text_chunk("user_message_chunk", step.text))
            case Plan():
                entries = [attrs.asdict(e) for e in step.entries]  # every field is required
                await self.wire.update(session.id, {"sessionUpdate": "plan", "entries": entries})
            case ToolCall():
                await self.wire.update(
                    session.id, {"sessionUpdate": "tool_call"} | _tool_fields(step)
                )
            case ToolUpdate():
                patch = {"sessionUpdate": "tool_call_update"} | _tool_fields(step)
                await self.wire.update(session.id, patch)
            case Usage():
                usage = {"sessionUpdate": "usage_update", "used": step.used, "size": step.size}
                if step.cost is not None:
                    usage["cost"] = {"amount": step.cost, "currency": step.currency}
                await self.wire.update(session.id, usage)
            case Update():
                await self.wire.update(session.id, dict(step.update))
            case AskPermission():
                return await self._ask_permission(session, step)
            case ReadFile():
                await self._read_file(session, step)
            case WriteFile():
                await self._write_file(session, session.resolve(step.path), step.content)
            case WriteDisk():
                await self._write_disk(session, step)
            case DeleteDisk():
                target = session.on_disk(step.path)
                try:
                    await target.unlink()
                except FileNotFoundError:
                    self.record.add("disk_delete", path=display_name(str(target)), existed=False)
                else:
                    self.record.add("disk_delete", path=display_name(str(target)), existed=True)
            case Spawn():
                await self._spawn(session, step)
            case Terminal():
                await self._terminal(session, step, state)
            case Request():
                reply = await self.wire.request(step.method, step.params)
                self.record.add("request", method=step.method, **outcome_of(reply))
            case Notify():
                note: JsonObject = {"jsonrpc": "2.0", "method": step.method}
                if step.params is not None:
                    note["params"] = step.params
                await self.wire.send(note)
            case HugeLine():
                await self.wire.send_bytes(self._huge_line(session, step.size_bytes))
            case Raw():
                text = step.text if step.text.endswith("\n") else step.text + "\n"
                await self.wire.send_bytes(text.encode())
            case Sleep():
                await trio.sleep(step.seconds)
            case Stall():
                await trio.sleep_forever()
            case Crash():
                raise ScriptedCrash(step.exit_code, step.stderr)
            case Flood():
                await self._flood(session, step)
            case FloodRequests():
                await self._flood_requests(session, step)
        return None

    def _huge_line(self, session: Session, size: int) -> bytes:
        update = _text_chunk("agent_message_chunk", "")
        message = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session.id, "update": update},
        }
        padding = max(0, size - len(orjson.dumps(message)) - 1)
        update["content"]["text"] = "x" * padding
        return orjson.dumps(message) + b"\n"

    async def _flood(self, session: Session, step: Flood) -> None:
        params = {"sessionId": session.id, "update": _text_chunk("agent_message_chunk", step.text)}
        line = (
            orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}) + b"\n"
        )
        per_batch = max(1, _FLOOD_BATCH_BYTES // len(line))
        left = step.count
        while left > 0:
            n = min(left, per_batch)
            await self.wire.send_bytes(line * n)
            left -= n

    async def _flood_requests(self, session: Session, step: FloodRequests) -> None:
        params = dict(step.params)
        params.setdefault("sessionId", session.id)
        if isinstance(params.get("path"), str):
            params["path"] = session.resolve(params["path"])
        head = b'{"jsonrpc":"2.0","id":"flood-'
        tail = b'","method":%s,"params":%s}\n' % (orjson.dumps(step.method), orjson.dumps(params))
        answers = None
        if step.read_answers:
            answers = self.wire.flood = FloodAnswers(step.count)
        else:
            self.wire.stop_reading()
        per_batch = max(1, _FLOOD_BATCH_BYTES // (len(head) + len(tail) + 8))
        for start in range(0, step.count, per_batch):
            ids = range(start, min(start + per_batch, step.count))
            await self.wire.send_bytes(b"".join([head + b"%d" % i + tail for i in ids]))
        if answers is None:
            self.record.add("flood_requests", method=step.method, count=step.count)
            await trio.sleep_forever()  # deaf: not even a cancel could reach the turn
            return
        if step.count:
            await answers.done.wait()
        self.wire.flood = None
        self.record.add(
            "flood_requests",
            method=step.method,
            count=step.count,
            answered=answers.answered,
            errors=answers.errors,
        )

    async def _ask_permission(self, session: Session, step: AskPermission) -> str | None:
        tc = step.tool_call
        tool = _tool_fields(tc)
        options = [o.to_json() for o in step.options]
        params = {"sessionId": session.id, "toolCall": tool, "options": options}
        reply = await self.wire.request("session/request_permission", params)
        result = reply.get("result")
        outcome = result.get("outcome") if isinstance(result, dict) else None
        kinds = {o.option_id: o.kind for o in step.options}
        option_id = outcome.get("optionId") if isinstance(outcome, dict) else None
        option_kind = kinds.get(option_id) if isinstance(option_id, str) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "cancelled":
            decision = "cancelled"
        elif option_kind is not None:
            decision = "allow" if option_kind.startswith("allow") else "reject"
        else:
            decision = "invalid"
        self.record.add(
            "permission",
            sessionId=session.id,
            toolCallId=tc.id,
            decision=decision,
            optionId=option_id,
            optionKind=option_kind,
            answer=outcome_of(reply),
        )
        if decision == "cancelled":
            return "cancelled"
        if decision == "allow" or step.on_reject == "continue":
            return None
        return step.on_reject

    async def _read_file(self, session: Session, step: ReadFile) -> None:
        path = session.resolve(step.path)
        params: JsonObject = {"sessionId": session.id, "path": path}
        if step.line is not None:
            params["line"] = step.line
        if step.limit is not None:
            params["limit"] = step.limit
        reply = await self.wire.request("fs/read_text_file", params)
        result = reply.get("result")
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            self.record.add(
                "fs_read",
                sessionId=session.id,
                path=path,
                error=reply.get("error", {"message": "no content", "result": result}),
            )
            return
        self.record.add("fs_read", sessionId=session.id, path=path, content=content)
        if step.then_write is not None:
            await self._write_file(session, path, step.then_write.apply(content))

    async def _write_file(self, session: Session, path: str, content: str) -> None:
        params = {"sessionId": session.id, "path": path, "content": content}
        reply = await self.wire.request("fs/write_text_file", params)
        self.record.add(
            "fs_write", sessionId=session.id, path=path, content=content, **outcome_of(reply)
        )

    async def _write_disk(self, session: Session, step: WriteDisk) -> None:
        target = session.on_disk(step.path)
        shown = display_name(str(target))
        try:
            await target.parent.mkdir(parents=True, exist_ok=True)
            await target.write_bytes(step.content.encode())
        except OSError as exc:
            self.record.add("disk_write", path=shown, error=str(exc))
        else:
            self.record.add("disk_write", path=shown)

    async def _spawn(self, session: Session, step: Spawn) -> None:
        argv = list(step.argv)
        try:
            if step.detach:
                # The helper exits at once; its grandchild prints nothing but its own pid.
                done = await trio.run_process(
                    [sys.executable, "-c", _DETACH, *argv],
                    cwd=session.cwd,
                    stdin=subprocess.DEVNULL,
                    capture_stdout=True,
                    check=False,
                )
                printed = done.stdout.strip()
                pid = int(printed) if done.returncode == 0 and printed.isdigit() else None
                self.record.add("spawn", argv=argv, pid=pid, exitCode=done.returncode)
                return
            output: dict[str, Any] = (
                {"capture_stdout": True} if step.to_client else {"stdout": subprocess.DEVNULL}
            )
            done = await trio.run_process(
                argv, cwd=session.cwd, stdin=subprocess.DEVNULL, check=False, **output
            )
        except OSError as exc:
            self.record.add("spawn", argv=argv, error=str(exc))
            return
        if step.to_client and done.stdout:
            await self.wire.send_bytes(done.stdout)
        self.record.add("spawn", argv=argv, exitCode=done.returncode)

    async def _terminal(self, session: Session, step: Terminal, state: TurnState) -> None:
        params: JsonObject = {"sessionId": session.id, "command": step.command}
        if step.args is not None:
            params["args"] = list(step.args)
        if step.env:
            params["env"] = [{"name": k, "value": v} for k, v in step.env.items()]
        if step.cwd is not None:
            params["cwd"] = session.resolve(step.cwd)
        if step.output_byte_limit is not None:
            params["outputByteLimit"] = step.output_byte_limit
        event: JsonObject = {"sessionId": session.id, "command": step.command}
        created = await self.wire.request("terminal/create", params)
        result = created.get("result")
        terminal_id = result.get("terminalId") if isinstance(result, dict) else None
        if not isinstance(terminal_id, str):
            self.record.add("terminal", **event, stage="create", **outcome_of(created))
            return
        event["terminalId"] = terminal_id
        ids = {"sessionId": session.id, "terminalId": terminal_id}
        title = " ".join([step.command, *(step.args or ())])
        if step.tool_call_id is not None:
            embed = ToolCall(
                step.tool_call_id,
                title,
                kind="execute",
                status="in_progress",
                content=(terminal_content(terminal_id),),
                raw_input={"command": title},
            )
            await self.run_step(session, embed, state)
        try:
            timeout = step.timeout if step.timeout is not None else math.inf
            with trio.move_on_after(timeout) as timer:
                await self.wire.request("terminal/wait_for_exit", ids)
            if timer.cancelled_caught:
                await self.wire.request("terminal/kill", ids)
            output = await self.wire.request("terminal/output", ids)
        except trio.Cancelled:
            if state.cancel_requested:  # a session/cancel, not the end of the connection
                with trio.move_on_after(CLEANUP_GRACE, shield=True):
                    await self.wire.request("terminal/kill", ids)
                    await self.wire.request("terminal/release", ids)
                self.record.add("terminal", **event, cancelled=True)
            raise
        await self.wire.request("terminal/release", ids)
        out = output.get("result")
        if not isinstance(out, dict):
            self.record.add("terminal", **event, stage="output", **outcome_of(output))
            return
        exit_status = out.get("exitStatus")
        self.record.add(
            "terminal",
            **event,
            exitStatus=exit_status,
            output=out.get("output"),
            truncated=out.get("truncated"),
            killed=timer.cancelled_caught,
        )
        if step.tool_call_id is not None:
            code = exit_status.get("exitCode") if isinstance(exit_status, dict) else None
            status: Literal["completed", "failed"] = "completed" if code == 0 else "failed"
            raw_output = {"exitCode": code, "output": out.get("output")}
            done = ToolUpdate(step.tool_call_id, status=status, raw_output=raw_output)
            await self.run_step(session, done, state)


def _tool_fields(tool: ToolCall | ToolUpdate | PermissionToolCall) -> JsonObject:
    """A tool call's ACP fields, without the unset ones (and the empty ones, but in a patch)."""
    fields: JsonObject = {
        "title": tool.title,
        "kind": tool.kind,
        "status": tool.status,
        "locations": None if tool.locations is None else [loc.to_json() for loc in tool.locations],
        "content": None if tool.content is None else list(tool.content),
        "rawInput": getattr(tool, "raw_input", None),
        "rawOutput": getattr(tool, "raw_output", None),
    }
    keep_empty = isinstance(tool, ToolUpdate)
    kept = {k: v for k, v in fields.items() if v is not None and (keep_empty or v != [])}
    return {"toolCallId": tool.id} | kept


def _split(text: str, pieces: int) -> list[str]:
    n = max(1, min(pieces, len(text)))
    return [text[i * len(text) // n : (i + 1) * len(text) // n] for i in range(n)]


def _text_chunk(kind: str, text: str) -> JsonObject:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
