"""A comparison's verdict (orchestrator.runs.verdict) and the rule for when an agent succeeded."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.pipeline.results import VerifyResult, agent_failure
from orchestrator.runs.verdict import changed_lines, green_round, judge

#: one file, 2 added and 1 removed, and a removed line that reads "-- x" (shown "--- x")
DIFF = """diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 keep
--- x
-old
+new
+more
\\ No newline at end of file
"""


def agent(name: str, status: str = "succeeded", **fields: Any) -> dict[str, Any]:
    """An agent object of a comparison's ``--json``."""
    return {"name": name, "status": status, "diff": "", "wallSeconds": 1.0, **fields}


def test_changed_lines_counts_within_hunks() -> None:
    """Added plus removed lines; file headers do not count, a removed '--- x' line does."""
    assert changed_lines(DIFF) == 4
    assert changed_lines("") == 0


def test_no_agent_succeeded_no_winner() -> None:
    """Nobody succeeded: the comparison failed, no winner."""
    verdict = judge([agent("a", "failed"), agent("b", "failed")])
    assert (verdict.succeeded, verdict.winner, verdict.status) == ((), None, "failed")
    assert verdict.to_json() == {"succeeded": [], "winner": None}


def test_verify_passed_then_fewest_lines_then_fastest() -> None:
    """Verify passing ranks first, then fewer changed lines, then shorter wall time."""
    passed, failed = {"exitCode": 0}, {"exitCode": 1}
    verdict = judge(
        [
            agent("small-unverified", verify=failed),
            agent("big", verify=passed, diff=DIFF),
            agent("slow", verify=passed, wallSeconds=9.0),
            agent("fast", verify=passed, wallSeconds=2.5),
            agent("lost", "failed", verify=passed),
        ]
    )
    assert verdict.succeeded == ("small-unverified", "big", "slow", "fast")
    assert verdict.winner == "fast"
    assert verdict.reason == "verify passed, no file changed, 2.5 s"
    assert verdict.status == "succeeded"


def rounds(*passed: bool) -> list[dict[str, Any]]:
    """An agent's ``rounds``, each with a check that passed or not."""
    return [{"turn": i + 1, "check": {"passed": p}} for i, p in enumerate(passed)]


def test_green_in_fewer_rounds_ranks_before_fewer_lines() -> None:
    """Among agents whose verify passed, the one that needed fewer rounds wins, however many
    more lines it changed; the reason says in how many rounds."""
    passed = {"exitCode": 0}
    edited = [{"path": "a.txt", "change": "modified"}]
    verdict = judge(
        [
            agent("second", verify=passed, changes=edited, rounds=rounds(False, True)),
            agent("first", verify=passed, changes=edited, diff=DIFF, rounds=rounds(True)),
        ]
    )
    assert (verdict.winner, verdict.reason) == (
        "first",
        "verify passed in 1 round, 4 lines changed, 1.0 s",
    )
    assert green_round(agent("x", rounds=rounds(False, False, True))) == 3
    assert green_round(agent("x", rounds=rounds(False, False))) is None
    assert green_round(agent("x", rounds=[{"turn": 1, "check": None}])) is None
    assert green_round(agent("x")) is None


def test_an_agent_that_changed_nothing_does_not_win_by_fewest_lines() -> None:
    """An agent whose edits were all refused (no change) ranks after one that changed a file,
    however few lines that one changed; verify passing still ranks first."""
    edited = [{"path": "a.txt", "change": "modified"}]
    verdict = judge([agent("idle", wallSeconds=0.1), agent("worker", diff=DIFF, changes=edited)])
    assert (verdict.winner, verdict.reason) == ("worker", "4 lines changed, 1.0 s")
    passed = {"exitCode": 0}
    verdict = judge([agent("worker", diff=DIFF, changes=edited), agent("idle", verify=passed)])
    assert (verdict.winner, verdict.reason) == ("idle", "verify passed, no file changed, 1.0 s")


def test_equal_agents_the_first_given_wins() -> None:
    """A full tie goes to the agent given first; without verify the reason does not claim it."""
    verdict = judge([agent("b"), agent("a")])
    assert (verdict.winner, verdict.reason) == ("b", "no file changed, 1.0 s")


@pytest.mark.parametrize(
    ("stop_reason", "verify", "error"),
    [
        ("end_turn", None, None),
        ("end_turn", VerifyResult("t", 0), None),
        ("end_turn", VerifyResult("t", 1), "verify failed: exit 1"),
        (
            "end_turn",
            VerifyResult("t", 124, "timed out after 600s", timed_out=True),
            "verify failed: timed out after 600s",
        ),
        ("max_tokens", None, "turn ended max_tokens"),
        ("cancelled", VerifyResult("t", 2), "turn ended cancelled; verify failed: exit 2"),
    ],
)
def test_an_agent_succeeds_only_if_its_turn_ended_and_verify_passed(
    stop_reason: str, verify: VerifyResult | None, error: str | None
) -> None:
    """end_turn and a passing verify (when there is one) succeed; anything else says why."""
    assert agent_failure(stop_reason, verify) == error
