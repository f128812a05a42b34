"""Sandbox benchmark: what starting a process confined by Landlock adds, and a whole prompt.

Run ``.venv/bin/python benchmarks/bench_sandbox.py`` (``--help`` for the flags). It times, as
fresh subprocesses, ``--repeat`` (20) runs each of, directly and behind the launcher
(``python -I -S orchestrator/_landlock.py RULES -- COMMAND``, the rules of a default sandbox):

- ``/bin/true``: the launcher's own cost (an interpreter start, ``ctypes``, four system calls);
- ``python -c pass``: an interpreter whose start opens many files, each checked by Landlock;
- ``node -e 0``: how the npm agents start (when ``node`` is on PATH).

and ``--prompts`` (5) runs of ``orchestrator prompt --agent demo`` on a small workspace, with and
without ``--sandbox`` (the kernel probe, the private directories, the launcher, the confined
agent and its turn). One unmeasured warm-up run of each comes first. Figures are the median
wall time and the median CPU time of the process tree (user + system, the cross-check on a busy
machine); ``added`` is confined minus direct.

It prints a table and writes JSON (default ``benchmarks/results/sandbox.json``). Without
Landlock in the kernel it says so and exits 2. It is a script to run and read, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_startup import console_script, time_command

from orchestrator.errors import SandboxUnavailable
from orchestrator.sandbox import Sandbox, build_ruleset, kernel_abi

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "sandbox.json"


def commands() -> list[tuple[str, list[str]]]:
    """The programs whose start is timed, by name."""
    out = [("/bin/true", ["/bin/true"]), ("python -c pass", [sys.executable, "-c", "pass"])]
    node = shutil.which("node")
    if node is not None:
        out.append(("node -e 0", [node, "-e", "0"]))
    return out


def summary(direct: dict[str, Any], confined: dict[str, Any]) -> dict[str, Any]:
    """The two timings side by side, and what confinement added (medians)."""
    return {
        "direct": direct,
        "confined": confined,
        "added": confined["median"] - direct["median"],
        "added_cpu": confined["cpu_median"] - direct["cpu_median"],
        "ok": direct["ok"] and confined["ok"],
    }


def prompt_runs(repeat: int, root: Path) -> dict[str, Any]:
    """``orchestrator prompt --agent demo`` with and without ``--sandbox``."""
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("colour\n")
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(root / "state")}
    base = [*console_script(), "prompt", "--agent", "demo", "--cwd", str(workspace), "--json"]
    task = 'replace "colour" with "color" in *.md'
    return summary(
        time_command([*base, task], repeat, env),
        time_command([*base, "--sandbox", task], repeat, env),
    )


def main(argv: list[str] | None = None) -> int:
    """Time everything, print the table, write the JSON; 1 if a command failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs per command (default 20)")
    parser.add_argument("--prompts", type=int, default=5, help="prompt runs each (default 5)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    try:
        abi = kernel_abi()
    except SandboxUnavailable as e:
        print(f"no sandbox here: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    results: dict[str, Any] = {"starts": {}}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        root = Path(tmp)
        ruleset = build_ruleset(Sandbox(), abi=abi, writable=[tmp])
        for name, argv in commands():
            results["starts"][name] = summary(
                time_command(argv, args.repeat, env),
                time_command(ruleset.command(argv), args.repeat, env),
            )
        if args.prompts > 0:
            results["prompt"] = prompt_runs(args.prompts, root)
    results["machine"] = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "landlock_abi": abi,
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    rows = [*results["starts"].items()]
    if "prompt" in results:
        rows.append(("prompt --agent demo", results["prompt"]))
    print(f"Landlock ABI {abi}; medians of {args.repeat} starts, {args.prompts} prompts")
    print(f"{'command':<22} {'direct':>9} {'confined':>9} {'added':>9} {'added cpu':>10}")
    for name, row in rows:
        ms = [1000 * row["direct"]["median"], 1000 * row["confined"]["median"]]
        print(
            f"{name:<22} {ms[0]:>7.1f}ms {ms[1]:>7.1f}ms {1000 * row['added']:>7.1f}ms "
            f"{1000 * row['added_cpu']:>8.1f}ms"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {args.output}")
    failed = [name for name, row in rows if not row["ok"]]
    for name in failed:
        print(f"FAILED: {name}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
