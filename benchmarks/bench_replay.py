"""Replay benchmark: a long recorded agent turn, replayed as fast as possible.

Run ``.venv/bin/python benchmarks/bench_replay.py`` (``--help`` for the flags). It records a
pipeline run of one step whose agent (the scripted test agent, a real subprocess speaking ACP)
plays a long turn: ``--rounds`` (40) rounds of a model's latency, ``--think`` seconds (0.5: a
fast model's answer), then a thought, a file read through ``fs/*``, a tool call, a permission
request, a file write through ``fs/*``, a file written on disk behind the client's back, the
tool call's update, a message and the token usage; and a terminal command every
``--terminal-every`` (5) rounds. Then it replays the run (``replay_run``, the library face of
``orchestrator replay``) with its agent served by the replay agent, as fast as possible,
``--repeat`` (3) times, and checks each replay: succeeded, no divergence, the same diff as
the recording.

Figures, recorded and replayed (the best replay counts), and their ratios: the agent turn
(``session/prompt`` sent to answered, from the run's wire transcript), the agent step (its
start-up and session included) and the whole run. The target: the replayed turn at least 50
times faster than the recorded one. What is left of a replayed turn is the client's own work
(serving the requests again, running the commands again), which the recording paid too. It
prints a table and writes JSON to ``benchmarks/results/replay.json``. The exit status is 1 only
when a replay is wrong, never for a missed target. It is a script to run, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.runs import replay_run, run_pipeline
from orchestrator.store import open_run_store
from orchestrator.testing import (
    AgentScript,
    AskPermission,
    Location,
    PermissionToolCall,
    ReadFile,
    Say,
    Sleep,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Turn,
    Usage,
    WriteDisk,
    WriteFile,
    scripted_agent_command,
)

TARGET = 50.0  # the replayed turn, at least this many times faster than the recorded one

PIPELINE = '''\
"""One agent step: the long scripted turn."""

from orchestrator import step


@step(agent="long")
def work() -> str:
    """Go through every module."""
    return "Go through every module, and say what you did."
'''


def long_turn(rounds: int, think: float, every: int) -> AgentScript:
    """The scripted agent's one turn: ``rounds`` rounds of think, read, ask, write; a command
    every ``every`` rounds (0: none)."""
    steps: list[Any] = []
    for i in range(rounds):
        path = f"pkg/mod_{i:03d}.py"
        steps += [
            Sleep(think),
            Think(f"Module {i} next: reading it first.", chunks=4),
            ReadFile(path),
            ToolCall(f"edit-{i}", f"Edit {path}", kind="edit", locations=[Location(path)]),
            AskPermission(PermissionToolCall(f"edit-{i}", title=f"Edit {path}", kind="edit")),
            WriteFile(path, f"VALUE = {i + 1}\n"),
            WriteDisk(f"notes/mod_{i:03d}.md", f"# Module {i}\n\nIncremented.\n"),
            ToolUpdate(f"edit-{i}", status="completed"),
            *([Terminal(f"echo checked {i}")] if every and i % every == every - 1 else []),
            Say(f"Module {i} done. ", chunks=8),
            Usage(used=1000 * (i + 1), size=200_000),
        ]
    return AgentScript(turns=[Turn(steps=steps)])


def make_project(root: Path, rounds: int) -> None:
    """A package of ``rounds`` modules, one per round."""
    (root / "pkg").mkdir(parents=True)
    for i in range(rounds):
        (root / "pkg" / f"mod_{i:03d}.py").write_text(f"VALUE = {i}\n")


def step_seconds(result: Mapping[str, Any]) -> float:
    """The agent step's wall time: the agent's start and session included."""
    return float(result["steps"]["work"]["instances"]["work"]["wallSeconds"])


async def turn_seconds(state: Path, run_id: str) -> float:
    """The agent turn, from the run's wire transcript: ``session/prompt`` sent to answered."""
    async with open_run_store(state) as store:
        lines = await store.transcript(run_id)
    sent = [
        line
        for line in lines
        if line.get("dir") == "send" and (line.get("msg") or {}).get("method") == "session/prompt"
    ]
    if len(sent) != 1:
        raise SystemExit(f"run {run_id}: {len(sent)} prompts in the transcript, not one")
    prompt_id = sent[0]["msg"]["id"]
    answered = [
        line["t"]
        for line in lines
        if line.get("dir") == "recv"
        and (line.get("msg") or {}).get("id") == prompt_id
        and "method" not in line["msg"]
    ]
    return float(answered[0] - sent[0]["t"])


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Record the long turn once, replay it ``--repeat`` times; the figures (best replay)."""
    project = work / "project"
    make_project(project, args.rounds)
    pipeline = work / "long.py"
    pipeline.write_text(PIPELINE)
    state = work / "state"
    script = long_turn(args.rounds, args.think, args.terminal_every)
    command = scripted_agent_command(script, work)
    config = Config(agents={"long": AgentSpec(name="long", command=tuple(command))})

    started = time.perf_counter()
    recorded = await run_pipeline(
        pipeline, {}, cwd=project, policy="trusted", config=config, state_dir=state
    )
    recorded_run = time.perf_counter() - started
    if recorded.status != "succeeded":
        raise SystemExit(f"the recording failed: {recorded.result.get('error')}")
    recorded_figures = (
        await turn_seconds(state, recorded.run_id),
        step_seconds(recorded.result),
        recorded_run,
    )

    replays: list[tuple[float, float, float]] = []
    wrong: list[str] = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        again = await replay_run(recorded.run_id, state_dir=state)
        run = time.perf_counter() - started
        if again.status != "succeeded":
            wrong.append(f"a replay {again.status}: {again.result.get('error')}")
        elif again.result["replay"]["divergences"]:
            wrong.append(f"a replay diverged: {again.result['replay']['divergences'][:2]}")
        elif again.result["diff"] != recorded.result["diff"]:
            wrong.append("a replay's diff is not the recording's")
        replays.append((await turn_seconds(state, again.run_id), step_seconds(again.result), run))
    best = tuple(min(figures[i] for figures in replays) for i in range(3))
    names = ("turn", "step", "run")
    return {
        "rounds": args.rounds,
        "think": args.think,
        "terminalEvery": args.terminal_every,
        "recorded": dict(zip(names, recorded_figures, strict=True)),
        "replayed": dict(zip(names, best, strict=True)),
        "ratios": {name: recorded_figures[i] / best[i] for i, name in enumerate(names)},
        "wrong": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the long turn (40)")
    parser.add_argument(
        "--think", type=float, default=0.5, help="the model's seconds per round (0.5)"
    )
    parser.add_argument(
        "--terminal-every",
        type=int,
        default=5,
        help="a terminal command every N rounds (5; 0: none)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="replays; the best counts (3)")
    parser.add_argument(
        "--output",
        default=str(Path(__file__).parent / "results" / "replay.json"),
        help="where the JSON goes (benchmarks/results/replay.json)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        figures = trio.run(bench, args, Path(tmp))
    ok = figures["ratios"]["turn"] >= TARGET
    labels = {
        "turn": "agent turn (prompt sent to answered)",
        "step": "agent step (agent start-up included)",
        "run": "whole run (store, branches, merge)",
    }
    print(
        f"replay of a {args.rounds}-round turn: {args.think} s of model time per round, "
        f"a command every {args.terminal_every} rounds"
    )
    print(f"{'':38} {'recorded s':>11} {'replayed s':>11} {'ratio':>8}")
    for name, label in labels.items():
        was, now = figures["recorded"][name], figures["replayed"][name]
        print(f"{label:38} {was:11.3f} {now:11.3f} {figures['ratios'][name]:7.1f}x")
    print(f"target: the replayed turn >= {TARGET:.0f}x faster: {'PASS' if ok else 'FAIL'}")
    for problem in figures["wrong"]:
        print(f"WRONG: {problem}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), **figures}, indent=2)
    )
    return 1 if figures["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
