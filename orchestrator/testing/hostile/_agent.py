"""The hostile agent as a program: it plays an attack on stdin/stdout, then says what it saw."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs
import orjson
import trio
from attrs import define, field

from orchestrator.errors import UsageError
from orchestrator.testing._steps import Session, StepRunner, TurnState
from orchestrator.testing.hostile._catalogue import ATTACKS, Attack
from orchestrator.testing.hostile._judge import judge_escapes, judge_record, unique
from orchestrator.testing.hostile._layout import Layout
from orchestrator.testing.script import AgentScript, Say, Step, Turn

__all__ = ["main", "script_for"]


#: the last step of every attack's turn: the agent says what it saw
_VERDICT = Say("verdict")


@define
class _JudgingRunner(StepRunner):
    """Plays the attack, then says (and records) what it saw get through."""

    layout: Layout = field(kw_only=True)
    attack: str = field(kw_only=True)

    async def run_step(self, session: Session, step: Step, state: TurnState) -> str | None:
        if step is not _VERDICT:
            return await super().run_step(session, step, state)
        events = self.record.events
        failures = unique(
            judge_record(events, self.layout) + judge_escapes(events, self.layout, session.cwd)
        )
        self.record.add("verdict", attack=self.attack, failures=failures)
        text = f"hostile {self.attack}: " + (
            "NOT HELD: " + "; ".join(failures) if failures else "held so far"
        )
        text += (
            f". Still to check after the run: its status (not succeeded when the agent "
            f"crashed or hung) and that no process is left (pgrep -f {self.layout.root})."
        )
        return await super().run_step(session, Say(text), state)


def script_for(attack: Attack, layout: Layout) -> AgentScript:
    """The attack as a script (one turn), its record in ``layout``."""
    return AgentScript(
        name=attack.name,
        title=f"Hostile agent: {attack.name}",
        turns=(Turn(steps=attack.steps(layout)),),
        record_path=str(layout.record),
    )


async def _serve_stdio(script: AgentScript, layout: Layout) -> int:
    # The scripted agent's own loop, with a runner that judges at the end of the turn.
    from orchestrator.testing._wire import AgentRecord, Wire
    from orchestrator.testing.scripted_agent import _Agent, _write_stderr

    turn = script.turns[0] if script.turns else Turn()
    judged = attrs.evolve(turn, steps=(*turn.steps, _VERDICT))
    script = attrs.evolve(script, turns=(judged, *script.turns[1:]))
    record = AgentRecord()
    stream = trio.StapledStream(trio.lowlevel.FdStream(1), trio.lowlevel.FdStream(0))
    with open(layout.record, "ab") as sink:  # noqa: ASYNC230
        record._sink = sink
        wire = Wire(stream, record, script.id_style)
        runner = _JudgingRunner(wire, record, layout=layout, attack=script.name)
        await _Agent(wire, runner, script, record, _write_stderr).run()
        record._sink = None
    return record.exit_code or 0


def _list() -> str:
    width = max(len(name) for name in ATTACKS)
    return "".join(f"{a.name:<{width}}  [{a.probes}]  {a.description}\n" for a in ATTACKS.values())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.testing.hostile ATTACK [--root DIR]``, or ``--list``.

    ``--script FILE`` plays an attack written out by :func:`probe_policy` (any
    :class:`Attack`, yours too) instead of one named from the catalogue.
    """
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.testing.hostile",
        description="An ACP agent that attacks its client on purpose (see --list).",
    )
    parser.add_argument("attack", nargs="?", help="the attack to play")
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    parser.add_argument("--root", help="the attacks' directory (default: a new temp directory)")
    parser.add_argument("--script", help="play this attack script (JSON) instead")
    args = parser.parse_args(argv)
    if args.list:
        sys.stdout.write(_list())
        return 0
    attack = ATTACKS.get(args.attack or "")
    if attack is None and args.script is None:
        known = ", ".join(ATTACKS)
        sys.stderr.write(f"hostile agent: name an attack ({known}), or --list\n")
        return 2
    # stdout carries the protocol: log lines must go to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG)
    layout = Layout(Path(args.root or tempfile.mkdtemp(prefix="hostile-")).resolve())
    try:
        if args.script is not None:
            script = AgentScript.from_json(orjson.loads(Path(args.script).read_bytes()))
        else:
            assert attack is not None
            layout.prepare()
            script = script_for(attack, layout)
    except (OSError, orjson.JSONDecodeError, UsageError) as exc:
        sys.stderr.write(f"hostile agent: {exc}\n")
        return 2
    sys.stderr.write(f"hostile agent: {script.name} (pid {os.getpid()}, root {layout.root})\n")
    sys.stderr.flush()
    return trio.run(_serve_stdio, script, layout)
