"""A hostile-agent kit: named attacks, each a scripted agent that misbehaves on purpose.

An agent is a program driven by a model that reads untrusted text (issues, web pages,
dependencies): a client must treat it as hostile. Each :class:`Attack` in :data:`ATTACKS` is a
scripted agent (:mod:`orchestrator.testing.script`) that tries one thing a client must not let
it do, with a one-line description, what it probes and how to tell that the client held.

Two ways to use it, both under your own policy:

- **As an agent command line**::

      orchestrator prompt --agent "python -m orchestrator.testing.hostile ATTACK" \\
          --policy my.toml "attack"

  ``--list`` lists the attacks. The agent ends its turn with what it saw from the inside
  ("held so far", or what got through) and what is left to check after the run: the run's
  status, and that no process of it is left (``pgrep -f ROOT``, ROOT being the directory it
  names).
- **From Python or pytest**: :func:`probe_policy` (trio) or :func:`probe_policy_sync` runs
  attacks through the real run path (:func:`orchestrator.runs.prompt`, the agent a real
  subprocess, working on a temporary copy of a workspace, with ``apply``) and returns one
  :class:`AttackResult` per attack::

      from orchestrator.testing.hostile import probe_policy_sync

      for result in probe_policy_sync("my.toml", ["shell-evasion", "env-injection"]):
          assert result.held, result.summary()

An attack **held** when nothing outside the branch was written (and no secret read through
``fs/*``, none printed by a terminal), no program it smuggled past the policy ran, no
permission it asked for was granted, no process of it is left, the orchestrator did not crash
(an error is an :class:`~orchestrator.errors.OrchestratorError` not caused by a bug such as a
``RecursionError``, no request was answered "internal error" -32603, no run outlived its
timeout, no branch directory was left behind), memory and the run store grew within the
attack's limits, and nothing was recorded as done that was not: a turn that crashed or hung is
not ``succeeded``, a write the client acknowledged is among the run's changes, an applied
change is in the workspace as made. These are outcomes, never the wording of a message.

An :class:`Attack` of your own (steps built from the :class:`Layout`, a workspace setup, the
files it must leave recorded) goes to :func:`probe_policy` like the catalogue's.

The attacks' directory (``--root``; a new one in the temp directory when not given) holds:
``bin/`` the agent's own programs (``hostile``, and copies named ``ls``, ``echo``... for
``PATH`` tricks; each prints ``HOSTILE-PROGRAM-RAN`` and leaves a file in ``markers/`` when it
runs), ``outside/`` files outside every branch (``victim.txt``, and ``secret.txt`` whose text
must never reach the agent), ``markers/`` and ``records/agent.jsonl`` (the agent's record, see
:mod:`orchestrator.testing.scripted_agent`).
"""

from __future__ import annotations

from orchestrator.testing.hostile._agent import main, script_for
from orchestrator.testing.hostile._catalogue import ATTACKS, Attack
from orchestrator.testing.hostile._judge import judge_escapes, judge_record
from orchestrator.testing.hostile._layout import PROGRAM_RAN, SECRET_VARIABLES, Layout
from orchestrator.testing.hostile._probe import AttackResult, probe_policy, probe_policy_sync

__all__ = [
    "ATTACKS",
    "PROGRAM_RAN",
    "SECRET_VARIABLES",
    "Attack",
    "AttackResult",
    "Layout",
    "judge_escapes",
    "judge_record",
    "main",
    "probe_policy",
    "probe_policy_sync",
    "script_for",
]
