"""The ceiling of the client benchmark: a bare standard-library read-and-parse loop.

No framework and no typed values: ``subprocess`` pipes, ``json.loads`` per line, a dict lookup
to count updates (and their text length), ``json.dumps`` to answer ``fs/read_text_file``. Run by
``bench_client.py`` in a fresh process; it prints one JSON result line (see ``--help``).

``multi`` reads all agents' pipes from one ``selectors`` loop, so it pays no thread switches.

This module also holds the few standard-library helpers every client process shares
(:class:`Probe`, :data:`FILE_CONTENT`), so importing it costs the other clients nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["AGENT", "FILE_CONTENT", "Probe", "main"]

AGENT = Path(__file__).with_name("flood_agent.py")
#: what every client answers to fs/read_text_file
FILE_CONTENT = "def main() -> None:\n    print('hello')\n"
_PROMPT_ID = 2


class Probe:
    """Clocks of one client process: wall, CPU, and time spent in garbage collection.

    ``mark(name)`` records them under ``name``; :meth:`report` gives the turn's figures between
    the ``sent`` and ``end`` marks. GC is timed in CPU seconds with ``gc.callbacks`` (a call per
    collection), so time the process spends preempted is not counted as GC.
    """

    def __init__(self, track_gc: bool = True) -> None:
        self.gc_seconds = 0.0
        self.collections = [0, 0, 0]
        self._gc_start = 0.0
        self.marks: dict[str, tuple[float, float, float, list[int]]] = {}
        if track_gc:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.process_time()
        else:
            self.gc_seconds += time.process_time() - self._gc_start
            self.collections[info["generation"]] += 1

    def mark(self, name: str) -> None:
        """Record the clocks now under ``name`` (a later mark of the same name replaces it)."""
        now = (time.monotonic(), time.process_time(), self.gc_seconds, list(self.collections))
        self.marks[name] = now

    def report(self) -> dict[str, Any]:
        """``t_sent``/``t_end`` (monotonic), and the turn's CPU and GC seconds."""
        sent, end = self.marks["sent"], self.marks["end"]
        return {
            "t_sent": sent[0],
            "t_end": end[0],
            "cpu": end[1] - sent[1],
            "gc": end[2] - sent[2],
            "gc_collections": [b - a for a, b in zip(sent[3], end[3], strict=True)],
        }


def _request(request_id: int, method: str, params: Any) -> bytes:
    msg = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return (json.dumps(msg) + "\n").encode()


def _handshake(requests: list[bytes], write: IO[bytes], read_line: Any) -> str:
    """Send initialize and session/new, each awaited; return the session id."""
    session_id = ""
    for request_id, data in enumerate(requests):
        write.write(data)
        write.flush()
        while True:
            msg = json.loads(read_line())
            if msg.get("id") == request_id and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"agent refused: {msg['error']}")
                session_id = msg["result"].get("sessionId", session_id)
                break
    return session_id


def _setup_requests(cwd: str) -> list[bytes]:
    init = {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
        "clientInfo": {"name": "bare", "version": "0"},
    }
    return [
        _request(0, "initialize", init),
        _request(1, "session/new", {"cwd": cwd, "mcpServers": []}),
    ]


def _prompt(session_id: str, text: str) -> bytes:
    params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
    return _request(_PROMPT_ID, "session/prompt", params)


def _spawn(python: str, agent: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [python, str(agent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=os.getcwd()
    )


def run_one(python: str, agent: Path, text: str, probe: Probe) -> dict[str, Any]:
    """One agent, one turn: the ``for line in proc.stdout`` loop."""
    proc = _spawn(python, agent)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    session_id = _handshake(_setup_requests(os.getcwd()), stdin, stdout.readline)
    updates = chars = round_trips = 0
    texts: list[str] = []
    probe.mark("sent")
    stdin.write(_prompt(session_id, text))
    stdin.flush()
    stop_reason = None
    for line in stdout:
        msg = json.loads(line)
        method = msg.get("method")
        if method == "session/update":
            update = msg["params"]["update"]
            if update["sessionUpdate"] == "agent_message_chunk":
                updates += 1
                chunk = update["content"]["text"]
                chars += len(chunk)
                texts.append(chunk)
        elif method == "fs/read_text_file":
            answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": FILE_CONTENT}}
            stdin.write((json.dumps(answer) + "\n").encode())
            stdin.flush()
            round_trips += 1
        elif msg.get("id") == _PROMPT_ID:
            if "error" in msg:
                raise RuntimeError(f"prompt failed: {msg['error']}")
            stop_reason = msg["result"]["stopReason"]
            break
    probe.mark("end")
    stdin.close()
    proc.wait()
    return {
        "updates": updates,
        "chars": chars,
        "round_trips": round_trips,
        "stop_reason": stop_reason,
        "text": "".join(texts),
    }


class _Pipe:
    """One agent's stdout read with os.read, split into lines by hand."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""
        self.done = False

    def read_line(self) -> bytes:
        """Blocking: the next line (for the handshake)."""
        while b"\n" not in self.buffer:
            data = os.read(self.fd, 65536)
            if not data:
                raise RuntimeError("agent closed its stdout")
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def run_many(python: str, agents: int, agent: Path, text: str, probe: Probe) -> dict[str, Any]:
    """``agents`` agents flooding at once, all read from one selector loop."""
    pipes = [_Pipe(_spawn(python, agent)) for _ in range(agents)]
    sessions: list[str] = []
    for pipe in pipes:
        assert pipe.proc.stdin is not None
        sessions.append(_handshake(_setup_requests(os.getcwd()), pipe.proc.stdin, pipe.read_line))
    updates = chars = 0
    selector = selectors.DefaultSelector()
    probe.mark("sent")
    for pipe, session_id in zip(pipes, sessions, strict=True):
        assert pipe.proc.stdin is not None
        pipe.proc.stdin.write(_prompt(session_id, text))
        pipe.proc.stdin.flush()
        selector.register(pipe.fd, selectors.EVENT_READ, pipe)
    running = agents
    while running:
        for key, _ in selector.select():
            pipe = key.data
            data = os.read(pipe.fd, 262144)
            if not data:
                raise RuntimeError("an agent closed its stdout mid-turn")
            *lines, pipe.buffer = (pipe.buffer + data).split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if msg.get("method") == "session/update":
                    update = msg["params"]["update"]
                    if update["sessionUpdate"] == "agent_message_chunk":
                        updates += 1
                        chars += len(update["content"]["text"])
                elif msg.get("id") == _PROMPT_ID:
                    if "error" in msg:
                        raise RuntimeError(f"prompt failed: {msg['error']}")
                    selector.unregister(pipe.fd)
                    running -= 1
    probe.mark("end")
    for pipe in pipes:
        assert pipe.proc.stdin is not None
        pipe.proc.stdin.close()
    for pipe in pipes:
        pipe.proc.wait()
    return {"updates": updates, "chars": chars}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario and print its result as one JSON line."""
    parser = argparse.ArgumentParser(description="bare stdlib ACP client (benchmark ceiling)")
    parser.add_argument("--scenario", choices=["flood", "rtt", "multi", "cli"], required=True)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--agent", type=Path, default=AGENT, help="the flood agent script")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the agent")
    args = parser.parse_args(argv)
    probe = Probe(track_gc=args.scenario != "cli")  # the CLI case: nothing but the client
    if args.scenario == "multi":
        result = run_many(args.python, args.agents, args.agent, f"flood {args.count}", probe)
    else:
        mode = "rtt" if args.scenario == "rtt" else "flood"
        result = run_one(args.python, args.agent, f"{mode} {args.count}", probe)
        text = result.pop("text")
        if args.scenario == "cli":  # like `orchestrator prompt --json`: the reply as JSON
            out = {"stopReason": result["stop_reason"], "text": text}
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
            return 0 if result["stop_reason"] == "end_turn" else 1
    result.update(probe.report())
    sys.stdout.write(json.dumps({"client": "bare", "scenario": args.scenario, **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
