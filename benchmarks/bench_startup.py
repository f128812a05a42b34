"""Start-up benchmark: how long the ``orchestrator`` command takes before it does anything.

Run ``.venv/bin/python benchmarks/bench_startup.py`` (``--help`` for the flags). It times, as
fresh subprocesses, ``--repeat`` (20) runs each of:

- ``python -c pass``: the interpreter's own start, the floor;
- ``python -c "import orchestrator.cli"``: the command line module and what it imports;
- ``orchestrator --help`` and ``orchestrator run --help``: the installed console script.

One unmeasured warm-up run of each comes first. The figure is the median wall time of
``orchestrator --help`` against the target (< 0.3 s), with the median CPU time of the process
(user + system) beside it as the cross-check on a busy machine. Then ``python -X importtime
-c "import orchestrator.cli"`` runs ``--repeat`` times and the modules costing most (median
cumulative and self time) are listed.

Byte code: an installed package has its ``.pyc`` files, but a development shell may set
``PYTHONDONTWRITEBYTECODE``, and then every start compiles the orchestrator's modules from
source again. By default (``--bytecode cached``) the commands run with byte-code writing on and
``PYTHONPYCACHEPREFIX`` pointing at a temporary directory, so the warm-up run fills a cache of
the benchmark's own and the source tree is left alone; ``--bytecode inherit`` keeps the
environment as it is.

It prints a table and writes JSON (default ``benchmarks/results/startup.json``). The exit status
is 1 only when a measured command failed, never for a missed target: it is a script to run and
read, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "parse_importtime"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "startup.json"
#: the target for ``orchestrator --help``, seconds of wall time (median)
TARGET_SECONDS = 0.3
IMPORT_CLI = "import orchestrator.cli"


def console_script() -> list[str]:
    """The ``orchestrator`` console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "orchestrator"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "orchestrator"]


def child_env(bytecode: str, cache: Path) -> dict[str, str]:
    """The measured commands' environment (see the module doc for ``bytecode``)."""
    env = dict(os.environ)
    if bytecode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(argv: Sequence[str], repeat: int, env: dict[str, str]) -> dict[str, Any]:
    """Wall and CPU times of ``repeat`` runs of ``argv`` after one warm-up; whether all exited 0.

    CPU time (the child's user + system) is the figure to read on a busy machine, where wall
    time also measures the other load.
    """
    warm = subprocess.run(argv, capture_output=True, env=env, check=False)
    seconds: list[float] = []
    cpu: list[float] = []
    failures: list[str] = []
    if warm.returncode != 0:
        failures.append(warm.stderr.decode(errors="replace")[-2000:])
    for _ in range(repeat):
        cpu_before = _children_cpu()
        start = time.perf_counter()
        done = subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False
        )
        seconds.append(time.perf_counter() - start)
        cpu.append(_children_cpu() - cpu_before)
        if done.returncode != 0:
            failures.append(done.stderr.decode(errors="replace")[-2000:])
    return {
        "argv": list(argv),
        "seconds": [round(s, 5) for s in seconds],
        "cpu_seconds": [round(c, 5) for c in cpu],
        "median": statistics.median(seconds),
        "min": min(seconds),
        "max": max(seconds),
        "cpu_median": statistics.median(cpu),
        "ok": not failures,
        "failures": failures[:3],
    }


def parse_importtime(text: str) -> list[dict[str, Any]]:
    """The modules of a ``-X importtime`` report: name, depth, self and cumulative microseconds.

    Lines look like ``import time:       123 |       4567 |     package.module``; the indent
    of the name is its nesting depth (two spaces a level). Other lines are ignored.
    """
    modules: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3:
            continue
        self_us, cumulative_us, name = parts
        try:
            own, total = int(self_us), int(cumulative_us)
        except ValueError:
            continue  # the header line: "self [us] | cumulative | imported package"
        stripped = name.rstrip()
        depth = (len(stripped) - len(stripped.lstrip()) - 1) // 2
        modules.append(
            {"module": stripped.strip(), "depth": depth, "self_us": own, "cumulative_us": total}
        )
    return modules


def import_costs(statement: str, repeat: int, env: dict[str, str]) -> dict[str, Any]:
    """``python -X importtime -c STATEMENT`` run ``repeat`` times; per-module medians."""
    runs: list[list[dict[str, Any]]] = []
    failures: list[str] = []
    for _ in range(max(repeat, 1)):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", statement],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            failures.append(done.stderr[-2000:])
            continue
        runs.append(parse_importtime(done.stderr))
    by_module: dict[str, dict[str, Any]] = {}
    for run in runs:
        for entry in run:
            slot = by_module.setdefault(
                entry["module"], {"module": entry["module"], "depth": entry["depth"], "self": []}
            )
            slot.setdefault("cumulative", []).append(entry["cumulative_us"])
            slot["self"].append(entry["self_us"])
    modules = [
        {
            "module": m["module"],
            "depth": m["depth"],
            "self_ms": statistics.median(m["self"]) / 1000,
            "cumulative_ms": statistics.median(m["cumulative"]) / 1000,
        }
        for m in by_module.values()
    ]
    modules.sort(key=lambda m: m["cumulative_ms"], reverse=True)
    # what importing the statement's own top-level modules costs (nested imports are inside)
    top_level = [m for m in modules if m["depth"] == 0]
    return {
        "statement": statement,
        "runs": len(runs),
        "modules": modules,
        "module_count": len(modules),
        "top_level_ms": sum(m["cumulative_ms"] for m in top_level),
        "ok": not failures,
        "failures": failures[:3],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def table(document: dict[str, Any], top: int) -> str:
    """The human-readable summary."""
    machine = document["machine"]
    lines = [
        f"Start-up benchmark: Python {machine['python_version']}, {machine['cpus']} CPUs, "
        f"load {machine['load'][0]:.1f}, median of {document['repeat']} runs each, "
        f"byte code {document['bytecode']}",
        "",
    ]
    rows = [("command", "median", "min", "max", "cpu", "target")]
    for label, timing in document["commands"].items():
        target = ""
        if label == "orchestrator --help":
            verdict = "PASS" if timing["median"] < TARGET_SECONDS else "FAIL"
            cpu_verdict = "PASS" if timing["cpu_median"] < TARGET_SECONDS else "FAIL"
            target = f"< {TARGET_SECONDS:g} s  {verdict} ({cpu_verdict} on cpu)"
        if not timing["ok"]:
            target = (target + "  (command failed)").strip()
        rows.append(
            (
                label,
                _ms(timing["median"]),
                _ms(timing["min"]),
                _ms(timing["max"]),
                _ms(timing["cpu_median"]),
                target,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    imports = document["imports"]
    lines += [
        "",
        f'Top {top} imports by cumulative time: python -X importtime -c "{imports["statement"]}" '
        f"({imports['module_count']} modules, medians of {imports['runs']} runs)",
        "",
        f"{'cumulative':>11}  {'self':>9}  module",
    ]
    for m in imports["modules"][:top]:
        indent = "  " * m["depth"]
        lines.append(
            f"{m['cumulative_ms']:>8.1f} ms  {m['self_ms']:>6.1f} ms  {indent}{m['module']}"
        )
    by_self = sorted(imports["modules"], key=lambda m: m["self_ms"], reverse=True)[:top]
    lines += ["", f"Top {top} by self time:", ""]
    for m in by_self:
        lines.append(f"{m['self_ms']:>8.1f} ms  {m['module']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every measured command worked (whatever the target says)."""
    parser = argparse.ArgumentParser(description="start-up time of the orchestrator command")
    parser.add_argument("--repeat", type=int, default=20, help="runs per command (default: 20)")
    parser.add_argument("--top", type=int, default=15, help="imports listed (default: 15)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument(
        "--bytecode",
        choices=("cached", "inherit"),
        default="cached",
        help="cached: .pyc files in a private cache (default); inherit: the environment as is",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-startup-pyc-") as cache:
        return _run(args, child_env(args.bytecode, Path(cache)))


def _run(args: argparse.Namespace, env: dict[str, str]) -> int:
    cli = console_script()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        f'python -c "{IMPORT_CLI}"': [sys.executable, "-c", IMPORT_CLI],
        "orchestrator --help": [*cli, "--help"],
        "orchestrator run --help": [*cli, "run", "--help"],
    }
    timings: dict[str, dict[str, Any]] = {}
    for label, command in commands.items():
        print(f"timing {label} ...", file=sys.stderr, end="", flush=True)
        timings[label] = time_command(command, args.repeat, env)
        print(f" {_ms(timings[label]['median'])}", file=sys.stderr)
    print("import times ...", file=sys.stderr, flush=True)
    imports = import_costs(IMPORT_CLI, args.repeat, env)
    help_median = timings["orchestrator --help"]["median"]
    document: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "repeat": args.repeat,
        "bytecode": args.bytecode,
        "machine": {
            "python": sys.version,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
        },
        "target": {
            "command": "orchestrator --help",
            "figure": "median",
            "max_seconds": TARGET_SECONDS,
            "pass": help_median < TARGET_SECONDS,
            "cpu_pass": timings["orchestrator --help"]["cpu_median"] < TARGET_SECONDS,
        },
        "commands": timings,
        "imports": imports,
    }
    print(table(document, args.top))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results written to {args.output}", file=sys.stderr)
    ok = all(t["ok"] for t in timings.values()) and imports["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
