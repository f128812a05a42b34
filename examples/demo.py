"""The offline demo behind ``./dev demo``: the built-in demo agent at work on a sample project.

It copies ``examples/sample-project`` to a temporary directory (the original is never touched),
runs ``orchestrator prompt`` there with the demo agent and the ``trusted`` policy, and prints
what changed as a unified diff. No API key, no network.

Run it yourself: ``python examples/demo.py [--keep]``.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from pathlib import Path

from orchestrator.cli import main as orchestrator

SAMPLE = Path(__file__).resolve().parent / "sample-project"
TASK = """\
rename calc_total to compute_total in shop/*.py
replace "colour" with "color" in *.md
append "- renamed calc_total to compute_total" to CHANGES.md
run python check.py
"""


def changed_files(before: Path, after: Path) -> str:
    """A unified diff of every text file that differs between two trees."""
    out: list[str] = []
    names = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    names |= {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    for name in sorted(names):
        if "__pycache__" in name.parts:
            continue
        a, b = before / name, after / name
        old = a.read_text().splitlines(keepends=True) if a.exists() else []
        new = b.read_text().splitlines(keepends=True) if b.exists() else []
        out += difflib.unified_diff(old, new, f"a/{name}", f"b/{name}")
    return "".join(out)


def main() -> int:
    """Run the demo; returns the CLI's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary project")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orchestrator-demo-"))
    project = work / "sample-project"
    shutil.copytree(SAMPLE, project)
    print(f"== task for the demo agent, in a copy at {project}\n{TASK}", flush=True)
    print("== the agent's reply (tool calls on stderr)", flush=True)
    code = orchestrator(
        ["prompt", "--agent", "demo", "--policy", "trusted", "--cwd", str(project), TASK]
    )
    print("\n== what changed", flush=True)
    print(changed_files(SAMPLE, project) or "(nothing)")
    if args.keep:
        print(f"(kept in {project})")
    else:
        shutil.rmtree(work)
    return code


if __name__ == "__main__":
    sys.exit(main())
