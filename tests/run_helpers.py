"""Helpers shared by the tests that run pipelines: through the API and through the console script.

Imported by plain name (``from run_helpers import workspace``), like ``conftest`` and ``fakes``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import trio

from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.sandbox import kernel_abi
from orchestrator.testing import AgentScript, Turn, scripted_agent_command
from orchestrator.trust import TrustStore

#: the installed console script (tests that need it skip when it is missing)
CLI = Path(sys.executable).parent / "orchestrator"
#: seconds one console-script command may take (it starts its agents as Python subprocesses)
CLI_LIMIT = 90.0


# --------------------------------------------------------------------------- runs through the API


def spec_for(script: AgentScript, directory: Path, name: str) -> AgentSpec:
    """An agent named ``name`` that plays ``script`` as a real subprocess."""
    folder = directory / f"agent-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return AgentSpec(name, tuple(scripted_agent_command(script, folder)))


def config(*specs: AgentSpec) -> Config:
    """A config whose agent table holds exactly ``specs``."""
    return Config(agents={s.name: s for s in specs})


def workspace(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A workspace directory holding ``files``."""
    root = tmp_path / "ws"
    root.mkdir()
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    return root


# --------------------------------------------------------------------------- the console script


def agent_command(script: Path) -> list[str]:
    """The command line of the scripted agent playing the script file ``script``."""
    return [sys.executable, "-m", "orchestrator.testing.scripted_agent", str(script)]


def write_script(script: Path, turn: Turn) -> Path:
    """Write a one-turn script for an agent named after the file; its record goes beside it."""
    record = script.with_suffix(".jsonl")
    body = AgentScript(name=script.stem, turns=(turn,), record_path=str(record))
    script.write_bytes(orjson.dumps(body.to_json()))
    return script


def prompts(script: Path) -> int:
    """How many prompts the agent of ``script`` received, over all its processes."""
    record = script.with_suffix(".jsonl")
    if not record.exists():
        return 0
    # only whole lines: the agent may be appending one while we read
    *lines, _partial = record.read_bytes().split(b"\n")
    return sum(orjson.loads(line)["event"] == "prompt" for line in lines if line.strip())


def record_events(record: Path) -> list[dict[str, Any]]:
    """The events a subprocess agent wrote to its record file so far (whole lines only)."""
    if not record.exists():
        return []
    # only whole lines: the agent may be appending one while we read
    *lines, _partial = record.read_bytes().split(b"\n")
    return [_loads(line) for line in lines if line.strip()]


def _loads(line: bytes) -> Any:
    """One JSON value; the standard library reads the lone surrogate escapes orjson refuses."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def timeline(record: Path) -> list[str]:
    """An agent's record in order: ``recv METHOD`` for each message it received, else the event."""
    out = []
    for e in record_events(record):
        message = e.get("message")
        if e["event"] == "recv" and isinstance(message, dict) and "method" in message:
            out.append(f"recv {message['method']}")
        elif e["event"] != "recv":
            out.append(e["event"])
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def run_cli(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the console script to its end and capture its output."""
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), *args],
            cwd=cwd,
            env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def run_console(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the console script with ``args`` to its end; ``env`` is added to this one's."""
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def one_line_error(done: subprocess.CompletedProcess[bytes]) -> str:
    """The single stderr line of a refused command (exit 2, nothing on stdout)."""
    assert done.returncode == 2, done.stderr.decode()
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def as_json(done: subprocess.CompletedProcess[bytes]) -> Any:
    """The command's standard output, parsed as JSON."""
    return json.loads(done.stdout)


def write_agent(path: Path, *turns: Turn) -> Path:
    """A script file for one scripted agent playing ``turns``; its record goes beside it."""
    record = path.with_suffix(".jsonl")
    script = AgentScript(name=path.stem, turns=turns, record_path=str(record))
    try:
        path.write_bytes(orjson.dumps(script.to_json()))
    except orjson.JSONEncodeError:  # a lone surrogate: written as its escape
        path.write_text(json.dumps(script.to_json()), encoding="ascii")
    return path


def project_config(project: Path, text: str) -> None:
    """Write the project's ``.orchestrator.toml`` and trust it, as its user would."""
    (project / ".orchestrator.toml").write_text(text)
    TrustStore.at().trust(project / ".orchestrator.toml")


def configure(project: Path, **agents: Path) -> None:
    """Name scripted agents (by their script files) in the project's ``.orchestrator.toml``."""
    lines: list[str] = []
    for name, script in agents.items():
        lines += [f"[agents.{name}]", f"command = {json.dumps(agent_command(script))}", ""]
    project_config(project, "\n".join(lines))


def landlock_missing() -> str | None:
    """Why this kernel cannot confine agents with Landlock (None: it can)."""
    try:
        kernel_abi()
    except Exception as e:
        return str(e)
    return None


def immutable(path: Path, on: bool) -> bool:
    """Make ``path`` immutable (or not) with chattr; whether that worked (root on a file
    system that has the flag)."""
    try:
        done = subprocess.run(
            ["chattr", "+i" if on else "-i", str(path)], capture_output=True, check=False
        )
    except FileNotFoundError:
        return False
    return done.returncode == 0
