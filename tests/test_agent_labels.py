"""Agents whose command lines read as the same label, through the console script.

Two scripted agents (real subprocesses) are started by different command lines that derive the
same label: ``python x/agent.py`` and ``python y/agent.py`` for a pipeline,
``python -m orchestrator.testing.scripted_agent x/s.json`` and ``... y/s.json`` for a
comparison. Each says who it is and writes its own file, so a step run by the wrong agent shows.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from run_helpers import CLI, as_json, run_cli, workspace

from orchestrator.testing import AgentScript, Say, Turn, WriteFile

EXIT_OK, EXIT_USAGE = 0, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

PYTHON = shlex.quote(sys.executable)

# runs the scripted agent on the script beside it, so the command line is `python x/agent.py`
AGENT_PY = """\
import sys
from pathlib import Path

from orchestrator.testing.scripted_agent import main

sys.exit(main([str(Path(__file__).with_name("s.json"))]))
"""

PIPELINE = f"""\
from orchestrator import step


@step(agent="{PYTHON} x/agent.py")
def first() -> str:
    return "who are you?"


@step(agent="{PYTHON} y/agent.py")
def second() -> str:
    return "who are you?"


@step(agent=["{PYTHON} y/agent.py", "{PYTHON} x/agent.py"])
def both(first: object, second: object) -> str:
    return "who are you, again?"
"""


def make_agents(root: Path) -> None:
    """``x/`` and ``y/`` under ``root``: each a script that says its name and writes
    ``<name>.txt``, and an ``agent.py`` that plays it."""
    for name in ("x", "y"):
        folder = root / name
        folder.mkdir()
        turn = Turn(steps=(Say(f"I am {name}"), WriteFile(path=f"{name}.txt", content=name)))
        script = AgentScript(name=name, turns=(turn,))
        (folder / "s.json").write_bytes(orjson.dumps(script.to_json()))
        (folder / "agent.py").write_text(AGENT_PY)


def instances(result: dict[str, Any]) -> dict[tuple[str, str], tuple[str, str, list[str]]]:
    """(step, instance key) -> (agent label, its text, the files it changed)."""
    out = {}
    for name, step in result["steps"].items():
        for key, inst in step["instances"].items():
            files = [c["path"] for c in inst.get("changes") or []]
            out[name, key] = (inst["agent"], inst["text"], files)
    return out


async def test_pipeline_steps_run_their_own_agents(tmp_path: Path, state_dir: Path) -> None:
    """Two command lines that both read as `agent` run their own commands, labelled
    `agent` and `agent-2` in definition order, on every run."""
    make_agents(tmp_path)
    ws = workspace(tmp_path)
    (tmp_path / "pipe.py").write_text(PIPELINE)
    runs = []
    for _ in range(2):
        done = await run_cli(
            "run", "pipe.py", "--cwd", str(ws), "--json", cwd=tmp_path, state=state_dir
        )
        assert done.returncode == EXIT_OK, done.stderr.decode()
        runs.append(instances(as_json(done)))
    expected = {
        ("first", "first"): ("agent", "I am x", ["x.txt"]),
        ("second", "second"): ("agent-2", "I am y", ["y.txt"]),
        # a fan-out is keyed by label; its branches already hold both files as written
        ("both", "agent-2"): ("agent-2", "I am y", []),
        ("both", "agent"): ("agent", "I am x", []),
    }
    for run in runs:
        assert run == expected
        assert list(run) == list(expected)


async def test_pipeline_refuses_one_label_for_two_commands(tmp_path: Path, state_dir: Path) -> None:
    """One NAME= label given to two different commands is a usage error before any agent
    starts, in one line."""
    make_agents(tmp_path)
    ws = workspace(tmp_path)
    (tmp_path / "pipe.py").write_text(
        PIPELINE.replace('agent="', 'agent="me=').replace('agent=["', 'agent=["me=')
    )
    done = await run_cli("run", "pipe.py", "--cwd", str(ws), cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE
    error = done.stderr.decode().strip()
    assert "agent label 'me' names two different agents" in error
    assert "x/agent.py" in error and "y/agent.py" in error
    assert len(error.splitlines()) == 1
    assert not (state_dir / "runs").exists() or not any((state_dir / "runs").iterdir())


async def test_compare_two_command_lines_with_one_derived_label(
    tmp_path: Path, state_dir: Path
) -> None:
    """compare runs two scripted agents that both read as `scripted_agent` side by side,
    each its own, and applies the one chosen by its label."""
    make_agents(tmp_path)
    ws = workspace(tmp_path)
    command = f"{PYTHON} -m orchestrator.testing.scripted_agent"
    done = await run_cli(
        "compare", "--agent", f"{command} x/s.json", "--agent", f"{command} y/s.json",
        "--cwd", str(ws), "--apply", "scripted_agent-2", "--json", "who are you?",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    agents = {a["name"]: (a["text"], [c["path"] for c in a["changes"]]) for a in result["agents"]}
    assert agents == {
        "scripted_agent": ("I am x", ["x.txt"]),
        "scripted_agent-2": ("I am y", ["y.txt"]),
    }
    assert result["applied"] == "scripted_agent-2"
    assert sorted(p.name for p in ws.iterdir()) == ["y.txt"]
