"""The offline demo behind ``./dev demo``: the built-in demo agent at work on a sample project.

The demo agent (rule-based, no model, no network) gets a task on ``examples/sample-project``. It
works in its own branch of the project (a copy under the state directory): it edits files
through the client's ``fs/*``, writes a new one to disk itself and runs the project's check in a
terminal; every permission request is decided by the ``trusted`` policy and audited. The
project itself is not touched: the changes come back as a diff (pass ``--apply`` to write them).

Run it yourself: ``python examples/demo.py [--apply] [--project DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from orchestrator import prompt_sync
from orchestrator.agent.turn import content_text
from orchestrator.protocol import types as t

SAMPLE = Path(__file__).resolve().parent / "sample-project"
TASK = """\
rename calc_total to compute_total in shop/*.py
replace "colour" with "color" in *.md
create docs/pricing.md with "# Pricing\\n\\nTotals include 20% VAT (compute_total).\\n"
run python check.py
"""


def tree_digest(root: Path) -> str:
    """A digest of every file under ``root`` (to show the project was not touched)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def show(update: t.SessionUpdate) -> None:
    """Stream the agent's reply and its tool calls as they arrive."""
    if isinstance(update, t.AgentMessageChunk):
        print(content_text(update.content), end="", flush=True)
    elif isinstance(update, t.ToolCall):
        print(f"  [tool] {update.kind}: {update.title}", flush=True)


def main() -> int:
    """Run the demo; 0 when the agent finished its turn."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=SAMPLE, help="the project to work on")
    parser.add_argument("--apply", action="store_true", help="write the changes to the project")
    args = parser.parse_args()
    before = tree_digest(args.project)
    print(f"== task for the demo agent on {args.project}\n{TASK}")
    run = prompt_sync(
        "demo", TASK, cwd=args.project, policy="trusted", apply=args.apply, on_update=show
    )
    print(f"\n== stop reason: {run.turn.stop_reason}")
    print("== permission decisions (audit trail)")
    for record in run.permissions:
        print(f"  {record.verdict:<9} {record.option_id or '-':<8} {record.rule}: {record.title}")
    print("== files changed in the agent's branch")
    for path, change in run.changes:
        print(f"  {change:<9} {path}")
    print("== diff\n" + run.diff)
    if run.applied:
        print(f"applied to {args.project}")
    else:
        untouched = tree_digest(args.project) == before
        print(
            f"the project is {'untouched' if untouched else 'CHANGED (unexpected!)'}; "
            f"the patch is in {run.run_dir}/changes.patch (--apply writes it)"
        )
    return 0 if run.turn.stop_reason == "end_turn" else 1


if __name__ == "__main__":
    sys.exit(main())
