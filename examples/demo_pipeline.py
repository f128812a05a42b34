"""The demo pipeline: two built-in demo agents, a fan-out, a merge with a conflict.

It runs with no API keys and no model: every agent here is the built-in rule-based demo agent
(``orchestrator.demo``), which follows edit instructions written in its prompt.

1. ``files`` (Python) lists the modules of the sample project's ``shop`` package.
2. ``rename`` fans out over those files: one demo agent session per file, each in its own
   branch, renames ``calc_total`` to ``compute_total`` in its file.
3. ``docs`` fans out over two agents, ``alice`` and ``bob`` (both the demo agent under two
   labels). Starting from the merged renames, each edits the README differently, on the same
   line, so their branches conflict.
4. ``check`` merges the two ``docs`` branches with ``merge="ours"``: the conflict is reported
   (with base, ours and theirs) and settled by taking alice's side; then it runs the project's
   ``check.py`` in a directory holding the merged files.

Run it with ``./dev demo`` (which also writes an HTML and Markdown report), or::

    orchestrator run examples/demo_pipeline.py --cwd examples/sample-project --policy trusted
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator import StepContext, step

PIPELINE_NAME = "demo"


@step()
def files(ctx: StepContext) -> list[str]:
    """The Python modules of the shop package."""
    return sorted(p.relative_to(ctx.workspace).as_posix() for p in ctx.workspace.glob("shop/*.py"))


@step(agent="demo", over="files")
def rename(item: str) -> str:
    """Rename a function in one file (one branch per file)."""
    return f"rename calc_total to compute_total in {item}\n"


@step(agent=["alice=demo", "bob=demo"])
def docs(rename: object, ctx: StepContext) -> str:
    """Two agents document the change, each their own way (their README edits conflict)."""
    if ctx.agent == "alice":
        return (
            'replace "colour" with "color" in README.md\n'
            'create docs/pricing.md with "# Pricing\\n\\nTotals come from compute_total.\\n"\n'
        )
    return (
        'replace "The colour of" with "The badge colour of" in README.md\n'
        'append "- Renamed calc_total to compute_total." to CHANGES.md\n'
    )


@step(merge="ours")
def check(docs: object, workdir: Path) -> str:
    """Merge the documentation branches (alice's side wins the conflict), then run the check."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "check.py"], cwd=workdir, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"check.py failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()
