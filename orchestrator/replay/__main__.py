"""``python -m orchestrator.replay SOURCE [--agent LABEL] [--step KEY]``: a replay agent on stdio.

``SOURCE`` is a replay record file (``orchestrator replay RUN --save FILE`` writes one), a wire
transcript file (``--transcript FILE``'s ND-JSON lines: its sessions are played in the order
they are opened, without the disk writes the agent made behind the client's back, which a
transcript does not hold), or a run id (or unique prefix) of the run store (``--state-dir``,
else the default). ``--step KEY`` plays only that step instance's sessions (``rename`` or
``rename[shop/cart.py]``); ``--agent`` names the agent to play when the source has several.
Anything wrong with the command line or the source: one line on stderr, exit 2, before any
frame is sent.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ..errors import OrchestratorError, UsageError
from .record import ReplayRecord


def _load(source: str, state_dir: str | None) -> ReplayRecord:
    """The record ``source`` names: a transcript file, else what ``orchestrator replay`` takes
    (a record file or a run of the store, told apart by
    :func:`~orchestrator.runs.replay.load_replay_record`)."""
    if os.path.isfile(source):
        with open(source, "rb") as f:
            head = f.read(4096).lstrip()
        first = head.split(b"\n", 1)[0]
        # an ND-JSON transcript line, not a record document
        if head.startswith(b"{") and b'"format"' not in first and b'"dir"' in first:
            from ..runs.replay_record import record_from_transcript

            return record_from_transcript(source)
    import trio

    from ..runs.replay import load_replay_record

    return trio.run(lambda: load_replay_record(source, state_dir=state_dir))


def _only_step(record: ReplayRecord, step: str) -> ReplayRecord:
    """``record`` with only the sessions of step instance ``step`` (a key or a step name)."""
    keys = [key for key in record.steps if key == step or key.partition("[")[0] == step]
    if not keys:
        known = ", ".join(sorted(record.steps)) or "none"
        raise UsageError(f"the record has no step instance {step!r} (it has: {known})")
    return ReplayRecord(record.run, record.agents, {key: record.steps[key] for key in keys})


def _agent_of(record: ReplayRecord, agent: str | None) -> str:
    labels = sorted({s.agent for sessions in record.steps.values() for s in sessions})
    if agent is not None:
        return agent
    if len(labels) == 1:
        return labels[0]
    raise UsageError(
        f"the record has the agents {', '.join(labels) or 'none'}: say which with --agent"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ACP over stdin/stdout; a bad command line or source exits 2."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.replay",
        description="Play back a recorded agent, speaking ACP on stdin/stdout.",
    )
    parser.add_argument("source", help="a replay record, a transcript file, or a run id")
    parser.add_argument("--agent", help="the label of the agent to play (when there are several)")
    parser.add_argument("--step", help="play only this step instance (KEY or STEP)")
    parser.add_argument("--state-dir", help="the state directory holding the run")
    parser.add_argument("--divergences", help="append each divergence to this file, a JSON line")
    parser.add_argument("--strict", action="store_true", help="stop a turn at its first divergence")
    parser.add_argument("--timing", choices=("fast", "recorded"), default="fast")
    args = parser.parse_args(argv)
    # stdout carries the protocol: log lines go to stderr, and only warnings
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    from .agent import run_replay_agent

    try:
        record = _load(args.source, args.state_dir)
        if args.step is not None:
            record = _only_step(record, args.step)
        agent = _agent_of(record, args.agent)
        run_replay_agent(
            record, agent, strict=args.strict, timing=args.timing, divergences=args.divergences
        )
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"error: cannot open {e.filename}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C: an agent ends quietly, as on its stdin's end
        sys.exit(130)


if __name__ == "__main__":
    main()
