"""The library from asyncio: two prompts at once, then one stopped by a timeout.

    python examples/asyncio_prompt.py

Works on a temporary copy of ``examples/sample-project`` with the built-in demo agent.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from orchestrator import RunEvent, aio

HERE = Path(__file__).resolve().parent


def show(event: RunEvent) -> None:
    """Print the start and the end of each run (called on the event loop)."""
    if event.type in ("run_started", "run_finished"):
        print(f"{event.type:<13} {event.run_id} {event.data.get('status', '')}".rstrip())


async def main() -> None:
    """Two prompts side by side, each on its own branch; then a turn cut short."""
    project = Path(tempfile.mkdtemp()) / "sample-project"
    shutil.copytree(HERE / "sample-project", project)
    rename, note = await asyncio.gather(
        aio.prompt(
            "demo",
            "rename calc_total to compute_total in shop/*.py",
            cwd=project,
            policy="edit",
            on_event=show,
        ),
        aio.prompt(
            "demo",
            'append "- Totals are computed once." to CHANGES.md',
            cwd=project,
            policy="edit",
            on_event=show,
        ),
    )
    print(rename.status, note.status)
    print(rename.diff + note.diff)

    # the timeout cancels the run: the agent's turn gets session/cancel, the agent is stopped,
    # nothing is applied, and the run is recorded interrupted (`orchestrator resume` goes on)
    try:
        await asyncio.wait_for(
            aio.prompt("demo", "run sleep 30", cwd=project, policy="trusted", apply=True), 1.0
        )
    except TimeoutError:
        [last] = await aio.list_runs(limit=1)
        print("timed out: run", last.run_id, last.status)


if __name__ == "__main__":
    asyncio.run(main())
