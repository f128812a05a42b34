"""The demo behind ``./dev demo``: a real pipeline of demo agents on a sample project.

It runs ``examples/demo_pipeline.py`` on ``examples/sample-project`` with the built-in demo agent
(rule-based: no API keys, no model): a fan-out over files, a fan-out over two agents, a merge
with one reported conflict, and a check run on the merged files. Every agent works in its own
branch (a copy under the state directory); permission requests are decided by the ``trusted``
policy and audited. The project itself is not touched: the changes stay in the run store (pass
``--apply`` to write them), and an HTML and a Markdown report are written.

Run it yourself: ``python examples/demo.py [--apply] [--project DIR] [--report DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

from orchestrator import render_report, run_pipeline_sync
from orchestrator.cli import configure_logging
from orchestrator.cli.live import open_view
from orchestrator.errors import UsageError

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "sample-project"
PIPELINE = HERE / "demo_pipeline.py"


def tree_digest(root: Path) -> str:
    """A digest of every file under ``root`` (to show the project was not touched)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _shown(path: Path) -> str:
    """``path`` as the user would type it here: relative below this directory, else absolute."""
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
    return str(path) if shown.startswith("..") else shown


def orchestrator_command() -> tuple[str, str]:
    """How to run ``orchestrator`` from here, and a hint when it is not on PATH (else "").

    ``./dev demo`` runs this script with ``.venv/bin/python``, whose bin directory holds the
    console script but is on PATH only once the venv is activated.
    """
    script = Path(sys.executable).parent / "orchestrator"
    found = shutil.which("orchestrator")
    if found is not None or not script.is_file():
        return "orchestrator", ""
    shown = _shown(script)
    bin_dir = Path(shown).parent
    return shown, (
        f"(`orchestrator` is not on PATH: activate the venv with `. {bin_dir}/activate`, "
        "or install the command with `pipx install .` or `uv tool install .`)"
    )


def python_command() -> str:
    """How to run this interpreter from here: ``python`` when that is it, else its path."""
    found = shutil.which("python")
    if found is not None and Path(found).absolute() == Path(sys.executable).absolute():
        return "python"
    return _shown(Path(sys.executable))


def main() -> int:
    """Run the demo pipeline; 0 when it succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=SAMPLE, help="the project to work on")
    parser.add_argument("--apply", action="store_true", help="write the changes to the project")
    parser.add_argument("--report", type=Path, help="report directory (default: in the run's)")
    args = parser.parse_args()
    if not args.project.is_dir():
        print(f"{parser.prog}: error: {args.project} is not a directory", file=sys.stderr)
        return 2
    configure_logging(0, as_json=False)
    before = tree_digest(args.project)
    print(f"== demo pipeline {PIPELINE.name} on {args.project}", flush=True)
    view = open_view("demo pipeline")
    try:
        run = run_pipeline_sync(
            PIPELINE, cwd=args.project, policy="trusted", apply=args.apply, on_event=view
        )
    except UsageError as e:  # refused input: one line, as the command line does
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if view is not None:
            view.close()
    result = run.result
    print("== steps")
    for name, state in result["steps"].items():
        keys = [k for k in state["instances"] if k != name]
        fan = f" (fan-out: {', '.join(keys)})" if keys else ""
        print(f"  {name:<8} {state['status']}{fan}")
    print("== conflicts found while merging")
    for c in result["conflicts"]:
        print(
            f"  {c['path']} at step {c['step']}: {c['kind']} between {' and '.join(c['branches'])}"
        )
        print(f"    settled by merge={c['resolution']!r}")
    print("== the run's merged diff\n" + run.diff)
    report = render_report(result, args.report or Path(run.run_dir) / "report")
    print(f"== report: {report.html}\n           {report.markdown}")
    if result.get("applied"):
        print(f"applied to {args.project}")
    else:
        untouched = tree_digest(args.project) == before
        command, hint = orchestrator_command()
        print(
            f"the project is {'untouched' if untouched else 'CHANGED (unexpected!)'}; "
            f"apply the changes with: {command} apply {run.run_id}"
        )
        print(
            "or run the demo on a copy of the project and write its changes there: "
            f"{python_command()} {_shown(HERE / 'demo.py')} --project COPY --apply"
        )
        if hint:
            print(hint)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
