"""A comparison's verdict: which agents succeeded, and which one of them wins.

A comparison exists to pick one. It succeeded when at least one agent did (see
:func:`~orchestrator.pipeline.results.agent_failure` for when an agent succeeds). The winner is
the succeeded agent whose verify command passed, then the one that passed it in the fewest
rounds (a comparison with rounds; see :func:`green_round`), then one that changed something
(an agent whose edits were all refused, or that did nothing, does not win by changing the
fewest lines), then the one with the fewest changed lines (added plus removed in its diff),
then the fastest; the order of the agents breaks a tie.

The live result of a comparison and the one rebuilt from the run store both come from
:func:`judge`, so ``compare --json``, ``show --json`` and the run's status always agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attrs import frozen

from .._words import count, seconds_text

__all__ = ["Verdict", "changed_lines", "green_round", "judge"]

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@frozen
class Verdict:
    """Which agents of a comparison succeeded (in the order given) and which one won."""

    succeeded: tuple[str, ...]
    #: None when no agent succeeded
    winner: str | None
    #: why the winner won: ``verify passed, 12 lines changed, 3.1 s``
    reason: str | None

    @property
    def status(self) -> Literal["succeeded", "failed"]:
        """The comparison's status: succeeded when any agent did."""
        return "succeeded" if self.succeeded else "failed"

    def to_json(self) -> dict[str, Any]:
        """The verdict's part of a comparison's ``--json`` object."""
        return {"succeeded": list(self.succeeded), "winner": self.winner}


def judge(agents: Sequence[Mapping[str, Any]]) -> Verdict:
    """The verdict over a comparison's agent objects (``name``, ``status``, ``verify``, ...)."""
    succeeded = [a for a in agents if a.get("status") == "succeeded"]
    if not succeeded:
        return Verdict((), None, None)

    def rank(agent: Mapping[str, Any]) -> tuple[bool, int, bool, int, float]:
        wall = agent.get("wallSeconds")
        return (
            not _verify_passed(agent),
            green_round(agent) or 1,
            not agent.get("changes"),
            changed_lines(str(agent.get("diff") or "")),
            float(wall) if isinstance(wall, (int, float)) else math.inf,
        )

    # min() keeps the first of equals: the order the agents were given breaks ties
    best = min(succeeded, key=rank)
    lines = changed_lines(str(best.get("diff") or ""))
    reason = [f"{count(lines, 'line')} changed" if best.get("changes") else "no file changed"]
    if _verify_passed(best):
        green = green_round(best)
        # in how many rounds, when the agent had rounds to pass it in
        reason.insert(0, "verify passed" + (f" in {count(green, 'round')}" if green else ""))
    wall = best.get("wallSeconds")
    if isinstance(wall, (int, float)):
        reason.append(seconds_text(wall))  # as the table shows it
    return Verdict(
        tuple(str(a.get("name")) for a in succeeded), str(best.get("name")), ", ".join(reason)
    )


def green_round(agent: Mapping[str, Any]) -> int | None:
    """The round in which an agent's check passed (its ``rounds``, the last one's check);
    None when it had no rounds (a verify command run once) or its last check did not pass."""
    rounds = agent.get("rounds")
    if not isinstance(rounds, Sequence) or not rounds or not isinstance(rounds[-1], Mapping):
        return None
    check = rounds[-1].get("check")
    if not isinstance(check, Mapping) or check.get("passed") is not True:
        return None
    return len(rounds)


def _verify_passed(agent: Mapping[str, Any]) -> bool:
    verify = agent.get("verify")
    return isinstance(verify, Mapping) and verify.get("exitCode") == 0


def changed_lines(diff: str) -> int:
    """Added plus removed lines in a unified diff.

    Lines are counted within hunks, by their headers' lengths, so a removed line that reads
    ``-- x`` (shown ``--- x``) counts, and file headers never do.
    """
    count = old = new = 0
    for line in diff.splitlines():
        if old > 0 or new > 0:
            if line.startswith("-"):
                old -= 1
                count += 1
            elif line.startswith("+"):
                new -= 1
                count += 1
            elif line.startswith(" ") or line == "":
                old -= 1
                new -= 1
            continue  # "\ No newline at end of file" and the like
        hunk = _HUNK.match(line)
        if hunk is not None:
            old = int(hunk.group(1) or 1)
            new = int(hunk.group(2) or 1)
    return count
