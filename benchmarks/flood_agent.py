"""A minimal, fast ACP agent for client benchmarks (standard library only).

Run as ``python benchmarks/flood_agent.py [--count N]``; it speaks ACP v1 on stdin/stdout with
plain blocking I/O. It answers ``initialize`` and ``session/new``; on ``session/prompt`` the
first text block chooses what the turn does:

- ``flood [N]``: N ``session/update`` ``agent_message_chunk`` notifications (texts of 20-40
  characters, pre-encoded, written in big batches), then ``end_turn``;
- ``rtt [N]``: N sequential ``fs/read_text_file`` requests to the client, each waiting for its
  answer before the next, then ``end_turn``; any error answer or unexpected id fails the prompt
  with -32603, so a client that gets the round trips wrong cannot look fast.

N defaults to ``--count`` (200,000). The agent exits at EOF on stdin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, BinaryIO

__all__ = ["SESSION_ID", "chunk_texts", "expected_chars", "main"]

SESSION_ID = "3f2b8c1e-9d4a-4e6b-a7c5-0e1f2d3c4b5a"
_BATCH_LINES = 1024
_VARIANTS = 64
_WORDS = (
    "the",
    "client",
    "reads",
    "each",
    "update",
    "line",
    "and",
    "builds",
    "a",
    "typed",
    "value",
    "from",
    "it",
    "before",
    "handing",
    "over",
)


def chunk_texts() -> list[str]:
    """The cycle of message chunk texts the flood repeats, 20 to 40 characters each."""
    texts: list[str] = []
    for i in range(_VARIANTS):
        size = 20 + (i * 7) % 21
        words: list[str] = []
        j = i
        while len(" ".join(words)) < size:
            words.append(_WORDS[j % len(_WORDS)])
            j += 3
        text = " ".join(words)[:size]
        # some chunks end a line, as real agents' chunks do (an escaped character on the wire)
        texts.append(text[:-1] + "\n" if i % 8 == 7 else text)
    return texts


def expected_chars(count: int) -> int:
    """The total text length of a flood of ``count`` chunks."""
    lengths = [len(text) for text in chunk_texts()]
    full, rest = divmod(count, len(lengths))
    return full * sum(lengths) + sum(lengths[:rest])


def _encode(obj: Any) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def _flood_lines(session_id: str) -> list[bytes]:
    return [
        _encode(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": session_id,
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": text},
                    },
                },
            }
        )
        for text in chunk_texts()
    ]


class _Agent:
    """The agent's state: its streams, its sessions, and its requests' ids."""

    def __init__(self, inp: BinaryIO, out: BinaryIO, default_count: int) -> None:
        self.inp = inp
        self.out = out
        self.default_count = default_count
        self.sessions = 0
        self.next_id = 0
        self.cancelled = False

    def send(self, obj: Any) -> None:
        self.out.write(_encode(obj))
        self.out.flush()

    def answer(self, request_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def fail(self, request_id: Any, code: int, message: str) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})

    def serve(self) -> None:
        """Answer the client's messages until EOF."""
        while True:
            line = self.inp.readline()
            if not line:
                return
            if line.strip():
                self.handle(json.loads(line))

    def handle(self, msg: dict[str, Any]) -> None:
        """One message from the client (outside a round-trip wait)."""
        method = msg.get("method")
        if method is None:
            return  # a stray response: nothing of ours is pending here
        request_id = msg.get("id")
        params = msg.get("params") or {}
        if method == "session/cancel":
            self.cancelled = True
        elif request_id is None:
            return
        elif method == "initialize":
            version = min(int(params.get("protocolVersion", 1)), 1)
            self.answer(
                request_id,
                {
                    "protocolVersion": version,
                    "agentCapabilities": {"loadSession": False},
                    "authMethods": [],
                    "agentInfo": {"name": "flood-agent", "version": "1.0.0"},
                },
            )
        elif method == "session/new":
            self.sessions += 1
            session_id = SESSION_ID if self.sessions == 1 else f"{SESSION_ID}-{self.sessions}"
            self.answer(request_id, {"sessionId": session_id})
        elif method == "session/prompt":
            self.prompt(request_id, params)
        else:
            self.fail(request_id, -32601, f"Method not found: {method}")

    def prompt(self, request_id: Any, params: dict[str, Any]) -> None:
        blocks = params.get("prompt") or [{}]
        words = str(blocks[0].get("text", "")).split()
        mode = words[0] if words else "flood"
        count = int(words[1]) if len(words) > 1 else self.default_count
        session_id = str(params.get("sessionId"))
        self.cancelled = False
        if mode == "flood":
            self.flood(session_id, count)
        elif mode == "rtt":
            error = self.round_trips(session_id, count)
            if error:
                self.fail(request_id, -32603, error)
                return
        else:
            self.fail(request_id, -32602, f"unknown mode {mode!r} (flood N or rtt N)")
            return
        self.answer(request_id, {"stopReason": "cancelled" if self.cancelled else "end_turn"})

    def flood(self, session_id: str, count: int) -> None:
        lines = _flood_lines(session_id)
        batch = b"".join(lines[i % len(lines)] for i in range(_BATCH_LINES))
        full, rest = divmod(count, _BATCH_LINES)
        write = self.out.write
        for _ in range(full):
            write(batch)
        write(b"".join(lines[i % len(lines)] for i in range(rest)))
        self.out.flush()

    def round_trips(self, session_id: str, count: int) -> str | None:
        """``count`` sequential fs reads; a description of the first failure, if any."""
        template = (
            '{"jsonrpc":"2.0","id":%d,"method":"fs/read_text_file",'
            '"params":{"sessionId":"' + session_id + '","path":"/bench/src/module_%d.py"}}\n'
        ).encode()
        for i in range(count):
            request_id = self.next_id
            self.next_id += 1
            self.out.write(template % (request_id, i))
            self.out.flush()
            while True:
                line = self.inp.readline()
                if not line:
                    raise SystemExit(0)
                msg = json.loads(line)
                if "method" in msg:
                    self.handle(msg)  # a request or notification of the client's
                    continue
                if msg.get("id") != request_id:
                    return f"round trip {i}: answer for id {msg.get('id')!r}, not {request_id}"
                result = msg.get("result")
                if not isinstance(result, dict) or not isinstance(result.get("content"), str):
                    return f"round trip {i}: bad answer {msg!r}"
                break
        return None


def main(argv: list[str] | None = None) -> int:
    """Serve one client on stdin/stdout until EOF."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="default N (200,000)")
    args = parser.parse_args(argv)
    agent = _Agent(sys.stdin.buffer, sys.stdout.buffer, args.count)
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        agent.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
