"""The demo agent: a small, deterministic ACP agent that does real work without a model.

It follows the instructions of :mod:`orchestrator.demo.instructions` written in the prompt.
It reads each file an instruction matches through ``fs/read_text_file`` when the client offers
it; for every file the instruction changes it reports a tool call, asks permission, and writes
the result back through ``fs/write_text_file``; files it creates it writes to disk itself, as
many real agents do. It runs commands through the client's terminal. Its answer says, per
instruction, what changed or why not (a missing file, a refused permission, the client's error
answer, a line not understood); one that cannot be done does not stop the others. It is a
demonstration and a test partner, not an AI: it understands nothing beyond those instructions.

Run it as ``python -m orchestrator.demo`` (ACP over stdin/stdout).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio
from attrs import define, field

from .._log import get_logger
from ..errors import InvalidParams, JsonRpcError
from ..jsonrpc.connection import JsonRpcConnection
from .instructions import Instruction, NotUnderstood, apply_edit, parse_prompt

__all__ = ["DemoAgent", "serve_demo_agent"]

log = get_logger(__name__)

AGENT_INFO = {"name": "demo-agent", "title": "Demo agent (rule-based)", "version": "1.0.0"}
HELP = (
    "I am the demo agent: I follow instructions, one per line, such as\n"
    '  replace "OLD" with "NEW" in src/**/*.py\n'
    "  rename old_name to new_name in **/*.py\n"
    '  append "TEXT" to NOTES.md\n'
    '  create docs/new.md with "TEXT"\n'
    "  delete PATH\n"
    "  run COMMAND\n"
)
#: the models it offers (names only: they work alike), through a config option of category
#: ``model``; the first is the default
MODELS = {"demo-fast": "Demo fast", "demo-slow": "Demo slow"}
#: its session modes, offered both as a ``mode`` config option and as legacy ``modes``:
#: in ``plan`` it says what it would do and changes nothing
MODES = {"edit": "Edit: follow the instructions", "plan": "Plan: say what would be done"}
OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


@define(eq=False)
class _Session:
    session_id: str
    cwd: Path
    cancelled: bool = False
    model: str = next(iter(MODELS))
    mode: str = next(iter(MODES))
    #: whether the client chose the model or the mode (the reply then says which ran)
    chosen: bool = False
    #: the tokens its turns have used so far (reported in ``usage_update``)
    used: int = 0

    def config_options(self) -> list[dict[str, Any]]:
        """The session's config options, with their current values."""

        def select(key: str, name: str, current: str, values: dict[str, str]) -> dict[str, Any]:
            return {
                "id": key,
                "name": name,
                "category": key,
                "type": "select",
                "currentValue": current,
                "options": [{"value": v, "name": n.split(":")[0]} for v, n in values.items()],
            }

        return [
            select("model", "Model", self.model, MODELS),
            select("mode", "Mode", self.mode, MODES),
        ]

    def modes(self) -> dict[str, Any]:
        """The session's modes in the legacy form (``modes`` of ``session/new``)."""
        return {
            "currentModeId": self.mode,
            "availableModes": [
                {"id": m, "name": d.split(":")[0], "description": d.split(": ", 1)[1]}
                for m, d in MODES.items()
            ],
        }


@define(eq=False)
class DemoAgent:
    """The agent's state over one connection."""

    rpc: JsonRpcConnection
    client_caps: dict[str, Any] = field(factory=dict)
    sessions: dict[str, _Session] = field(factory=dict)
    _counter: int = 0

    def install(self) -> None:
        """Register the ACP methods the agent serves."""
        self.rpc.on_request("initialize", self._initialize)
        self.rpc.on_request("session/new", self._new_session)
        self.rpc.on_request("session/prompt", self._prompt)
        self.rpc.on_request("session/set_config_option", self._set_config_option)
        self.rpc.on_request("session/set_mode", self._set_mode)
        self.rpc.on_notification("session/cancel", self._cancel)

    async def _initialize(self, params: Any) -> Any:
        self.client_caps = dict(params.get("clientCapabilities") or {})
        return {
            "protocolVersion": 1,
            "agentCapabilities": {"promptCapabilities": {"embeddedContext": True}},
            "authMethods": [],
            "agentInfo": AGENT_INFO,
        }

    async def _new_session(self, params: Any) -> Any:
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise InvalidParams("cwd must be an absolute path")
        self._counter += 1
        session_id = f"demo-{self._counter}"
        session = self.sessions[session_id] = _Session(session_id, Path(cwd))
        return {
            "sessionId": session_id,
            "configOptions": session.config_options(),
            "modes": session.modes(),
        }

    def _session(self, params: Any) -> _Session:
        session = self.sessions.get(params.get("sessionId"))
        if session is None:
            raise InvalidParams("unknown session")
        return session

    async def _set_config_option(self, params: Any) -> Any:
        session = self._session(params)
        key, value = params.get("configId"), params.get("value")
        values = {"model": MODELS, "mode": MODES}.get(key)
        if values is None:
            raise InvalidParams(f"unknown config option {key!r}")
        if value not in values:
            raise InvalidParams(f"unknown {key} {value!r}; offered: {', '.join(values)}")
        setattr(session, key, value)
        session.chosen = True
        return {"configOptions": session.config_options()}

    async def _set_mode(self, params: Any) -> Any:
        session = self._session(params)
        mode = params.get("modeId")
        if mode not in MODES:
            raise InvalidParams(f"unknown mode {mode!r}; offered: {', '.join(MODES)}")
        session.mode, session.chosen = mode, True
        await self._update(session, {"sessionUpdate": "current_mode_update", "currentModeId": mode})
        return {}

    def _cancel(self, params: Any) -> None:
        session = self.sessions.get(params.get("sessionId"))
        if session is not None:
            session.cancelled = True

    # ------------------------------------------------------------------ the turn

    async def _prompt(self, params: Any) -> Any:
        session = self._session(params)
        session.cancelled = False
        text = "\n".join(
            b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text"
        )
        lines = parse_prompt(text)
        instructions = [line for line in lines if isinstance(line, Instruction)]
        if not lines:
            await self._say(session, HELP)
            await self._count(session, len(text))
            return {"stopReason": "end_turn"}
        thought = f"{len(instructions)} instruction(s)."
        if len(lines) > len(instructions):
            thought += f" {len(lines) - len(instructions)} line(s) not understood."
        await self._update(
            session,
            {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": thought},
            },
        )
        if instructions:
            await self._plan(session, instructions, done=0)
        summary: list[str] = []
        i = 0  # the instruction's index, as in the plan and the tool call ids
        for line in lines:
            if session.cancelled:
                return {"stopReason": "cancelled"}
            if isinstance(line, NotUnderstood):
                summary.append(line.describe())
                continue
            summary.append(await self._run(session, i, line))
            i += 1
            await self._plan(session, instructions, done=i)
        if session.cancelled:
            return {"stopReason": "cancelled"}
        done = f"Done (model {session.model}, mode {session.mode})." if session.chosen else "Done."
        if not instructions:
            done = "Nothing done."
        answer = done + "\n" + "\n".join(f"- {s}" for s in summary) + "\n"
        await self._say(session, answer if instructions else f"{answer}\n{HELP}")
        await self._count(session, sum(len(s) for s in summary) + len(text))
        return {"stopReason": "end_turn"}

    async def _count(self, session: _Session, tokens: int) -> None:
        """Count ``tokens`` more in the session's context, and report its usage so far."""
        session.used += tokens
        await self._update(
            session, {"sessionUpdate": "usage_update", "used": session.used, "size": 200000}
        )

    async def _run(self, session: _Session, index: int, instruction: Instruction) -> str:
        """Carry out one instruction; the answer's line for it (what changed, or why not)."""
        head = instruction.describe()
        if session.mode == "plan":
            return f"{head}: planned, not done (plan mode)"
        if instruction.op == "run":
            return await self._run_command(session, index, instruction)
        if instruction.op in ("create", "delete", "append"):
            path = session.cwd / instruction.target
            # append and delete need the file (create makes new files)
            if instruction.op != "create" and not path.is_file():
                what = "is not a file" if path.exists() else "does not exist"
                return f"{head}: {instruction.target} {what}"
            paths = [path]
        else:
            paths = _glob(session.cwd, instruction.target)
            if not paths:
                return f"{head}: no file matches"
        changed = []
        for path in paths:
            if session.cancelled:
                break
            result = await self._edit_file(session, index, instruction, path)
            if result:
                changed.append(result)
        if changed:
            return f"{head}: " + ", ".join(changed)
        if instruction.op in ("create", "delete", "append"):
            return f"{head}: nothing changed"
        return f"{head}: nothing changed in the {len(paths)} matching file{'s' * (len(paths) > 1)}"

    async def _edit_file(
        self, session: _Session, index: int, instruction: Instruction, path: Path
    ) -> str | None:
        """Edit one file: its line in the answer, or None when the edit leaves it as it is.

        The file is read first, so a file the edit leaves unchanged is not announced as a tool
        call. An error answer of the client (a file it cannot read or write) is reported in
        the answer, and the turn goes on.
        """
        rel = os.path.relpath(path, session.cwd)
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            # a name that is not UTF-8 (Python holds its bytes as surrogates): JSON cannot
            # carry it to the client, in a request or an update; the other files go on
            shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
            return f"{shown} (skipped: its name is not UTF-8, which ACP's JSON cannot carry)"
        old = None
        if instruction.op != "create" or path.is_file():
            try:
                old = await self._read(session, path)
            except JsonRpcError as e:
                return f"{rel} (not read: {e.message})"
            except (OSError, UnicodeDecodeError) as e:
                return f"{rel} (not read: {e})"
        if instruction.op == "delete":
            new = None
        elif instruction.op == "create":
            new = instruction.new
        else:
            new = apply_edit(instruction, old or "")
        if old == new:
            return None
        call_id = f"call-{index}-{rel}"
        kind = "delete" if instruction.op == "delete" else "edit"
        await self._update(
            session,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": f"{instruction.describe()} ({rel})",
                "kind": kind,
                "status": "pending",
                "locations": [{"path": str(path)}],
                "rawInput": {"path": str(path)},
            },
        )
        allowed = await self._ask(session, call_id, instruction, rel, path)
        if not allowed:
            await self._tool_status(session, call_id, "failed")
            return f"{rel} (permission refused)"
        await self._tool_status(session, call_id, "in_progress")
        try:
            await self._write(session, instruction, path, new)
        except JsonRpcError as e:
            await self._tool_status(session, call_id, "failed")
            return f"{rel} (not written: {e.message})"
        except OSError as e:
            await self._tool_status(session, call_id, "failed")
            return f"{rel} (not written: {e.strerror or e})"
        diff = {"type": "diff", "path": str(path), "oldText": old, "newText": new or ""}
        await self._update(
            session,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": "completed",
                "content": [diff],
            },
        )
        return rel

    async def _write(
        self, session: _Session, instruction: Instruction, path: Path, new: str | None
    ) -> None:
        """Write ``new`` to ``path`` (None: delete it)."""
        if new is None:
            path.unlink(missing_ok=True)
        elif instruction.op == "create" or not self._fs("writeTextFile"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new, encoding="utf-8")  # behind the client's back, on purpose
        else:
            await self.rpc.request(
                "fs/write_text_file",
                {"sessionId": session.session_id, "path": str(path), "content": new},
            )

    async def _ask(
        self, session: _Session, call_id: str, instruction: Instruction, rel: str, path: Path
    ) -> bool:
        answer = await self.rpc.request(
            "session/request_permission",
            {
                "sessionId": session.session_id,
                "toolCall": {
                    "toolCallId": call_id,
                    "title": f"{instruction.describe()} ({rel})",
                    "kind": "delete" if instruction.op == "delete" else "edit",
                    "locations": [{"path": str(path)}],
                    "rawInput": {"path": str(path)},
                },
                "options": OPTIONS,
            },
        )
        outcome = (answer or {}).get("outcome") or {}
        if outcome.get("outcome") == "cancelled":
            session.cancelled = True
            return False
        return outcome.get("optionId") in ("allow", "allow-always")

    async def _run_command(self, session: _Session, index: int, instruction: Instruction) -> str:
        call_id = f"call-{index}-run"
        await self._update(
            session,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": instruction.describe(),
                "kind": "execute",
                "status": "pending",
                "rawInput": {"command": instruction.new},
            },
        )
        if not self.client_caps.get("terminal"):
            await self._tool_status(session, call_id, "failed")
            return f"{instruction.describe()}: the client offers no terminal"
        try:
            created = await self.rpc.request(
                "terminal/create",
                {
                    "sessionId": session.session_id,
                    "command": instruction.new,
                    "outputByteLimit": 32000,
                },
            )
            terminal_id = created["terminalId"]
            await self._update(
                session,
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "in_progress",
                    "content": [{"type": "terminal", "terminalId": terminal_id}],
                },
            )
            ended = await self.rpc.request(
                "terminal/wait_for_exit",
                {"sessionId": session.session_id, "terminalId": terminal_id},
            )
            output = await self.rpc.request(
                "terminal/output", {"sessionId": session.session_id, "terminalId": terminal_id}
            )
            await self.rpc.request(
                "terminal/release", {"sessionId": session.session_id, "terminalId": terminal_id}
            )
        except JsonRpcError as e:
            await self._tool_status(session, call_id, "failed")
            return f"{instruction.describe()}: refused ({e.message})"
        code = ended.get("exitCode")
        status = "completed" if code == 0 else "failed"
        await self._update(
            session,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": status,
                "rawOutput": output,
            },
        )
        tail = (output.get("output") or "").strip().splitlines()[-1:] or [""]
        return f"{instruction.describe()}: exit {code} {tail[0]}".rstrip()

    # ------------------------------------------------------------------ helpers

    def _fs(self, what: str) -> bool:
        return bool((self.client_caps.get("fs") or {}).get(what))

    async def _read(self, session: _Session, path: Path) -> str:
        if self._fs("readTextFile"):
            result = await self.rpc.request(
                "fs/read_text_file", {"sessionId": session.session_id, "path": str(path)}
            )
            return str(result.get("content", ""))
        return path.read_text(encoding="utf-8")

    async def _update(self, session: _Session, update: dict[str, Any]) -> None:
        await self.rpc.notify("session/update", {"sessionId": session.session_id, "update": update})

    async def _say(self, session: _Session, text: str) -> None:
        await self._update(
            session,
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        )

    async def _tool_status(self, session: _Session, call_id: str, status: str) -> None:
        await self._update(
            session, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}
        )

    async def _plan(self, session: _Session, instructions: list[Instruction], done: int) -> None:
        entries = [
            {
                "content": ins.describe(),
                "priority": "medium",
                "status": "completed" if i < done else "in_progress" if i == done else "pending",
            }
            for i, ins in enumerate(instructions)
        ]
        await self._update(session, {"sessionUpdate": "plan", "entries": entries})


def _glob(root: Path, pattern: str) -> list[Path]:
    """The files under ``root`` that ``pattern`` matches, sorted.

    ``**`` at the end matches every file below (pathlib's own ``**`` matches directories only).
    """
    if pattern == "**" or pattern.endswith("/**"):
        pattern += "/*"
    try:
        return sorted(p for p in root.glob(pattern) if p.is_file())
    except ValueError:  # a pattern pathlib refuses, such as "a/**b/**"
        return []


async def serve_demo_agent(stream: trio.abc.Stream) -> None:
    """Serve the demo agent over ``stream`` until it closes."""
    rpc = JsonRpcConnection(stream, name="client")
    DemoAgent(rpc).install()
    await rpc.serve()


def main() -> None:
    """Entry point: ACP over stdin/stdout."""
    import logging
    import sys

    # stdout carries the protocol: log lines go to stderr, and only warnings
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    async def run() -> None:
        stream = trio.StapledStream(trio.lowlevel.FdStream(1), trio.lowlevel.FdStream(0))
        await serve_demo_agent(stream)

    trio.run(run)
