"""One change over every file a glob matches: fan-out over items, verify, merge.

Each matching file goes to its own agent session, in its own branch; the branches merge (text
edits to different files never conflict) and a verify command runs on the merged files.

    orchestrator run pipelines/batch_replace.py --cwd ~/project --policy edit \\
        --set pattern='src/**/*.py' --set change='Replace os.path calls with pathlib' \\
        --set verify='python -m pytest -q'

Inputs: ``change`` (required: what to do to each file; ``{file}`` in it stands for the file's
path), ``pattern`` (the glob, default ``**/*.py``), ``verify`` (a shell command run on the
merged files, default ``true``) and ``agent`` (the agent that edits each file, default
``claude``: ``--set agent=codex``).

Offline, with the built-in demo agent (its instructions: orchestrator/demo/instructions.py):

    orchestrator run pipelines/batch_replace.py --policy edit --set agent=demo \\
        --set pattern='**/*.md' --set change='replace "colour" with "color" in {file}'

Add ``--apply`` to write the result when the verify command passed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator import StepContext, agent_input, step

PIPELINE_NAME = "batch-replace"


@step()
def files(ctx: StepContext, pattern: str = "**/*.py") -> list[str]:
    """The workspace files the glob matches (hidden directories left out)."""
    found = (p.relative_to(ctx.workspace) for p in ctx.workspace.glob(pattern) if p.is_file())
    return sorted(p.as_posix() for p in found if not any(s.startswith(".") for s in p.parts))


@step(
    agent=agent_input("agent", default="claude"),
    over="files",
    retries=1,
    timeout=900,
    idle_timeout=300,
)
def transform(item: str, change: str) -> str:
    """Apply the change to one file."""
    # the change on lines of its own: an instruction is never run together with this text
    return (
        f"Edit only the file {item}.\n\n{change.replace('{file}', item)}\n\n"
        "Keep the file's behaviour and style; do not touch any other file."
    )


@step(merge="fail")
def check(transform: object, workdir: Path, verify: str = "true") -> str:
    """Run the verify command on the merged files; a failure fails the run."""
    done = subprocess.run(verify, shell=True, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{verify!r} exited {done.returncode}:\n{done.stdout[-2000:]}")
    return done.stdout[-2000:]
