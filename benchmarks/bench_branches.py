"""Branch directory benchmark: a fan-out over one large repository, against its peers.

Run ``.venv/bin/python benchmarks/bench_branches.py`` (``--help`` for the flags). It generates a
git repository (``--files`` 10,000 files, ``--megabytes`` ~100 MB of deterministic text; made
once into ``--cache``, by default ``.cache/bench-branches`` of the repository) and, for each
fan-out N (1, 4, 16, 64), times in the same process and on the same filesystem:

- ``orchestrator run`` of a pipeline that fans out over N files of the repository with the
  built-in demo agent appending one line to each (``--policy edit``), at the default session
  limit and, for N = 16, with ``--max-sessions 1`` as well; its ``branches`` figures (made,
  reused, bytes copied, peak disk) come from the run's ``--json`` object;
- ``git worktree add`` per item (the same one-line edit in each), the worktrees removed at the
  end, as a peer that isolates each item in a checkout;
- ``cp -a`` of the working tree per item (the same edit), removed at the end.

Each measurement is repeated ``--repeat`` times, the kinds alternating (the machine may be
shared: medians are printed). It prints the wall time, the time per extra item over N = 1,
the peak disk (the run's own counter; the peers keep N copies), and the run's counters, checks
the targets (at the largest N the time per extra item under a tenth of one ``git worktree
add``; peak disk at most ``--max-sessions`` copies; N = 16 at the default session limit no
slower than with ``--max-sessions 1``) and writes JSON to ``benchmarks/results/``. ``--quick``
is a small version (200 files, 2 MB, N = 1 and 4, one repeat). The exit status is 1 only when
a run fails, never for a missed target. It is a script to run, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "branches.json"
DEFAULT_CACHE = ROOT / ".cache" / "bench-branches"
#: the session limit of ``orchestrator run`` when none is given
DEFAULT_SESSIONS = 8

PIPELINE = '''\
"""Fan out over the first N files of the repository; the demo agent edits each."""

from orchestrator import StepContext, step


@step()
def files(ctx: StepContext, n: str = "1") -> list[str]:
    """The first N files (sorted) of the source tree."""
    found = sorted(p.relative_to(ctx.workspace).as_posix() for p in ctx.workspace.rglob("*.txt"))
    return found[: int(n)]


@step(agent="demo", over="files")
def edit(item: str) -> str:
    """One line appended to one file."""
    return f'append "edited by the benchmark" to {item}'
'''

_WORDS = [
    "branch",
    "tree",
    "merge",
    "harvest",
    "agent",
    "session",
    "change",
    "file",
    "line",
    "copy",
    "budget",
    "trash",
    "disk",
    "pool",
    "reflink",
    "journal",
    "extent",
    "inode",
    "block",
    "commit",
    "index",
    "worktree",
    "checkout",
]


def _cli() -> str:
    """The console script next to this interpreter (the project's venv)."""
    found = Path(sys.executable).with_name("orchestrator")
    return str(found) if found.exists() else "orchestrator"


def make_repo(cache: Path, files: int, megabytes: float) -> Path:
    """The generated git repository (made once): ``files`` text files, ``megabytes`` in all."""
    repo = cache / f"repo-{files}-{megabytes:g}"
    if (repo / ".git").is_dir() and (repo / ".complete").exists():
        return repo
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    rng = random.Random(16)
    size = int(megabytes * 2**20 / files)
    for i in range(files):
        path = repo / "src" / f"d{i // 100:03d}" / f"f{i:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        words: list[str] = []
        length = 0
        while length < size:
            line = " ".join(rng.choice(_WORDS) for _ in range(10))
            words.append(line)
            length += len(line) + 1
        path.write_text("\n".join(words) + "\n")
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "generated"], cwd=repo, check=True)
    (repo / ".git" / "info" / "exclude").write_text(".complete\n")
    (repo / ".complete").write_text("")
    return repo


def tree_bytes(repo: Path) -> int:
    """Bytes of the working tree's files (``.git`` left out)."""
    total = 0
    for directory, dirs, names in os.walk(repo):
        if ".git" in dirs:
            dirs.remove(".git")
        total += sum(os.lstat(os.path.join(directory, n)).st_size for n in names)
    return total


def run_ours(
    repo: Path, work: Path, pipeline: Path, n: int, sessions: int | None
) -> dict[str, Any]:
    """``orchestrator run`` of the fan-out; its wall time and ``branches`` figures."""
    state = work / f"state-{n}-{sessions}"
    args = [_cli(), "run", str(pipeline), "--cwd", str(repo), "--policy", "edit", "--json"]
    args += ["--set", f"n={n}"]
    if sessions is not None:
        args += ["--max-sessions", str(sessions)]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    shutil.rmtree(state, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    result = json.loads(done.stdout)
    edited = result["steps"]["edit"]["instances"]
    if len(edited) != n or any(i["status"] != "succeeded" for i in edited.values()):
        raise RuntimeError(f"the run did not edit {n} files")
    return {"seconds": wall, "branches": result.get("branches")}


def _span(values: Iterable[int]) -> str:
    """``values`` as one figure, or as ``low-high`` when they differ."""
    seen = sorted(set(values))
    return str(seen[0]) if len(seen) == 1 else f"{seen[0]}-{seen[-1]}"


def _items(repo: Path, n: int) -> list[str]:
    return sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.txt"))[:n]


def run_worktrees(repo: Path, work: Path, n: int) -> dict[str, Any]:
    """``git worktree add`` per item, the edit in each, all removed at the end."""
    started = time.perf_counter()
    made = []
    for i, item in enumerate(_items(repo, n)):
        tree = work / f"wt-{i}"
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(tree)],
            cwd=repo,
            check=True,
            capture_output=True,
        )
        with open(tree / item, "a") as f:
            f.write("edited by the benchmark\n")
        made.append(tree)
    for tree in made:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)],
            cwd=repo,
            check=True,
            capture_output=True,
        )
    return {"seconds": time.perf_counter() - started}


def run_copies(repo: Path, work: Path, n: int) -> dict[str, Any]:
    """``cp -a`` of the working tree per item, the edit in each, all removed at the end."""
    started = time.perf_counter()
    made = []
    for i, item in enumerate(_items(repo, n)):
        tree = work / f"cp-{i}"
        tree.mkdir()
        subprocess.run(["cp", "-a", str(repo / "src"), str(tree / "src")], check=True)
        with open(tree / item, "a") as f:
            f.write("edited by the benchmark\n")
        made.append(tree)
    for tree in made:
        shutil.rmtree(tree)
    return {"seconds": time.perf_counter() - started}


def _median(samples: list[dict[str, Any]]) -> float:
    return float(statistics.median(s["seconds"] for s in samples))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, alternating kinds, ``args.repeat`` times."""
    repo = make_repo(args.cache, args.files, args.megabytes)
    size = tree_bytes(repo)
    work = Path(tempfile.mkdtemp(prefix="bench-branches-", dir=args.cache))
    pipeline = work / "fanout.py"
    pipeline.write_text(PIPELINE)
    kinds: list[tuple[str, int, int | None]] = []
    for n in args.n:
        if "ours" in args.kinds:
            kinds.append(("ours", n, None))
            if n == 16 or (args.quick and n == max(args.n)):
                kinds.append(("ours", n, 1))
        kinds += [(kind, n, None) for kind in ("worktree", "cp") if kind in args.kinds]
    samples: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(args.repeat):
            for kind, n, sessions in kinds:
                label = f"{kind} N={n}" + (f" sessions={sessions}" if sessions else "")
                if kind == "ours":
                    sample = run_ours(repo, work, pipeline, n, sessions)
                elif kind == "worktree":
                    sample = run_worktrees(repo, work, n)
                else:
                    sample = run_copies(repo, work, n)
                samples.setdefault(label, []).append(sample)
                print(f"  {label:<28} {sample['seconds']:7.2f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"repo": str(repo), "files": args.files, "tree_bytes": size, "samples": samples}


def report(found: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The table (printed) and the figures and targets (returned)."""
    samples = found["samples"]
    size = found["tree_bytes"]
    mb = 2**20
    rows = []
    print(
        f"Branch directories: {found['files']} files, {size / mb:.0f} MB, "
        f"{platform.system()} {os.cpu_count()} CPUs, median of {args.repeat}"
    )
    print(f"{'N':>4} {'kind':<22} {'wall s':>8} {'s/extra item':>13} {'peak MB':>9}  branches")
    first = min(args.n)
    for n in args.n:
        for kind in ("ours", "ours sessions=1", "worktree", "cp"):
            base_kind, _, sessions = kind.partition(" ")
            label = f"{base_kind} N={n}" + (f" {sessions}" if sessions else "")
            if label not in samples:
                continue
            wall = _median(samples[label])
            first_label = f"{base_kind} N={first}" + (f" {sessions}" if sessions else "")
            per_extra = (
                (wall - _median(samples[first_label])) / (n - first)
                if n > first and first_label in samples
                else None
            )
            branches = samples[label][-1].get("branches")
            if base_kind == "ours":
                # a release without the counter: unknown
                peak = max((s["branches"] or {}).get("peakBytes", 0) for s in samples[label])
            else:
                peak = n * size  # every item's copy stays until the end
            # every sample's counters: the runs may decide differently (a range when they do)
            counted = [s["branches"] for s in samples[label] if s.get("branches")]
            counters = (
                f"made {_span(c['made'] for c in counted)}, "
                f"reused {_span(c['reused'] for c in counted)}, "
                f"copied {_span(round(c['bytesCopied'] / mb) for c in counted)} MB"
                if counted
                else ""
            )
            per = f"{per_extra:13.3f}" if per_extra is not None else f"{'':>13}"
            name = {"ours": "orchestrator run"}.get(base_kind, base_kind)
            name += " --max-sessions 1" if sessions else ""
            name = {"worktree": "git worktree add", "cp": "cp -a"}.get(name, name)
            print(f"{n:>4} {name:<22} {wall:8.2f} {per} {peak / mb:9.0f}  {counters}")
            rows.append(
                {
                    "n": n,
                    "kind": label,
                    "seconds": wall,
                    "seconds_per_extra_item": per_extra,
                    "peak_bytes": peak,
                    "branches": branches,
                    "all_branches": counted,
                    "all_seconds": [s["seconds"] for s in samples[label]],
                }
            )
    targets = []
    last = max(args.n)
    adds = samples.get(f"worktree N={first}")
    one_add = _median(adds) / first if adds else None
    ours_last = next((r for r in rows if r["kind"] == f"ours N={last}"), None)
    if (
        one_add is not None
        and ours_last is not None
        and ours_last["seconds_per_extra_item"] is not None
    ):
        bound = one_add / 10
        got = ours_last["seconds_per_extra_item"]
        targets.append(
            (f"N={last}: s per extra item < 1/10 git worktree add", got, bound, got < bound)
        )
    for r in rows:
        if r["kind"].startswith("ours") and r["branches"]:
            limit = 1 if "sessions=1" in r["kind"] else DEFAULT_SESSIONS
            bound = limit * size * 1.01  # the agent's line on top of each copy
            targets.append(
                (
                    f"{r['kind']}: peak disk <= {limit} copies",
                    r["peak_bytes"],
                    bound,
                    r["peak_bytes"] <= bound,
                )
            )
    for n in args.n:
        default, single = f"ours N={n}", f"ours N={n} sessions=1"
        if default in samples and single in samples:
            a, b = _median(samples[default]), _median(samples[single])
            targets.append((f"N={n}: default sessions no slower than 1", a, b, a <= b))
    print("Targets")
    for name, got, bound, ok in targets:
        print(f"  {name:<48} {got:12.3f} vs {bound:12.3f}  {'PASS' if ok else 'FAIL'}")
    return {
        "tree_bytes": size,
        "files": found["files"],
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "rows": rows,
        "targets": [
            {"name": name, "value": got, "bound": bound, "pass": ok}
            for name, got, bound, ok in targets
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 if a run failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--megabytes", type=float, default=100.0)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="200 files, 2 MB, N = 1 and 4")
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=("ours", "worktree", "cp"),
        default=["ours", "worktree", "cp"],
        help="what to measure (default: all three)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.megabytes, args.n, args.repeat = 200, 2.0, [1, 4], 1
    args.cache.mkdir(parents=True, exist_ok=True)
    try:
        found = measure(args)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"bench_branches: {e}", file=sys.stderr)
        return 1
    figures = report(found, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
