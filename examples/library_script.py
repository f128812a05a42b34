"""The library from a plain script: compare two demo agents, then run a pipeline and apply it.

    python examples/library_script.py [PROJECT]

PROJECT defaults to a temporary copy of ``examples/sample-project`` (the copy is changed, the
original never is).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from orchestrator import apply_run_sync, compare_sync, run_pipeline_sync

HERE = Path(__file__).resolve().parent


def main() -> int:
    """Compare, run, apply; 0 when everything succeeded."""
    project = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if project is None:
        project = Path(tempfile.mkdtemp()) / "sample-project"
        shutil.copytree(HERE / "sample-project", project)
    side = compare_sync(
        ["a=demo", "b=demo"],
        'replace "colour" with "color" in README.md',
        cwd=project,
        policy="edit",
        verify="grep -q color README.md",
    )
    for agent in side.agents:  # typed entries (AgentOutcome), in the order given
        print(agent.name, agent.status, "verify passed:", agent.verify_passed, agent.changed_files)
    print("winner:", side.winner)
    run = run_pipeline_sync(HERE / "demo_pipeline.py", cwd=project, policy="trusted")
    # typed steps (StepOutcome) by name; run.result stays the raw --json object
    steps = {name: step.status for name, step in run.steps.items()}
    print(
        "pipeline:", run.status, steps, "conflicts:", [c["path"] for c in run.result["conflicts"]]
    )
    print("check:", run.steps["check"].value)
    applied = apply_run_sync(run.run_id)
    print("applied:", applied.applied, sorted(applied.written))
    return 0 if side.exit_code == 0 and run.exit_code == 0 and applied.applied else 1


if __name__ == "__main__":
    sys.exit(main())
