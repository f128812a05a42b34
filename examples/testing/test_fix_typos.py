"""Tests of the fix_typos pipeline, offline: no agent process, no model, no network.

The fixtures come from acp-orchestrator's pytest plugin (installed with the package).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator import run_pipeline_sync
from orchestrator.testing import AgentScript, InProcessAgents, Say, TempProjects, Turn

PIPELINE = Path(__file__).with_name("fix_typos.py")

REVIEWER = AgentScript(
    turns=(
        # taken when the prompt asks to review Markdown files
        Turn((Say("Looks good."),), when_prompt_matches=r"^Review the change to \S+\.md\b"),
        # any other prompt: the reviewer refuses, which fails its step
        Turn(stop_reason="refusal"),
    )
)


def test_the_docs_are_fixed_and_reviewed(
    orchestrator_project: TempProjects,
    orchestrator_agents: InProcessAgents,
    orchestrator_state_dir: Path,
) -> None:
    """The demo agent fixes README.md only, the reviewer approves, the fix is applied."""
    project = orchestrator_project(
        {"README.md": "The colour of the badge.\n", "badge.py": "colour = 'red'\n"}, git=True
    )
    orchestrator_agents.add("reviewer", REVIEWER)

    run = run_pipeline_sync(
        PIPELINE, cwd=project, policy="edit", apply=True, connector=orchestrator_agents
    )

    assert run.status == "succeeded"
    assert (project / "README.md").read_text() == "The color of the badge.\n"
    assert (project / "badge.py").read_text() == "colour = 'red'\n"
    [reviewer] = orchestrator_agents.records["reviewer"]
    assert reviewer.first("prompt")["turn"] == 0  # the turn the regular expression picked
    assert (orchestrator_state_dir / "runs" / run.run_id).is_dir()  # the test's own state


def test_nothing_is_applied_when_the_review_fails(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """With no Markdown file to fix, the reviewer is asked about nothing and refuses."""
    project = orchestrator_project({"notes.txt": "The colour.\n"})
    orchestrator_agents.add("reviewer", REVIEWER)

    run = run_pipeline_sync(
        PIPELINE, cwd=project, policy="edit", apply=True, connector=orchestrator_agents
    )

    assert run.status == "failed"
    assert (project / "notes.txt").read_text() == "The colour.\n"
