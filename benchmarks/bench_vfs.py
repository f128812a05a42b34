"""Benchmark of the virtual filesystem on a generated tree.

Usage::

    python benchmarks/bench_vfs.py [--files 10000] [--mb 100] [--dir SCRATCH] [--repeat 5]

Measures, on a generated tree of ``--files`` files totalling ``--mb`` MB:

- materialize (snapshot excluded, and included) against ``cp -a`` of the same tree, with the
  default worker count and with 4 copy threads;
- harvest of an unchanged working directory (inotify-accelerated, and a full ``stat`` scan)
  against ``git status`` on the same tree committed to git;
- a merge of two branches each touching 1,000 files (half of them the same files, in different
  regions, so those need a line-level three-way merge), in files per second.

Runs are interleaved and repeated; the table shows medians. Results are also written as JSON to
``benchmarks/results/vfs.json``. The scratch directory decides the filesystem measured (default:
the system temporary directory).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.vfs import Branch, Workspace, materialize, merge_branches

RESULTS = Path(__file__).resolve().parent / "results" / "vfs.json"


def generate(root: Path, files: int, total_bytes: int, seed: int = 1) -> None:
    """A source-like tree: 100 files per directory, two levels, text lines, mtimes an hour old."""
    rnd = random.Random(seed)
    average = max(1, total_bytes // files)
    for i in range(files):
        directory = root / f"pkg{i // 1000:03d}" / f"mod{(i // 100) % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        size = rnd.randint(average // 2, average * 3 // 2)
        line = f"value_{i:06d} = compute({i}, 'some text to fill the line out')\n".encode()
        data = (line * (size // len(line) + 1))[:size]
        (directory / f"file{i:06d}.py").write_bytes(data)
    (root / ".gitignore").write_text("*.pyc\n__pycache__/\nbuild/\n")
    (root / "build").mkdir()
    (root / "build" / "artifact.bin").write_bytes(b"\0" * 1024)
    old = time.time() - 3600
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(dirpath, name), (old, old))


def timed(fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Seconds ``fn(*args, **kwargs)`` took."""
    started = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - started


def settle(path: Path | None = None) -> None:
    """Remove a copy and flush dirty pages so one run's writeback does not slow the next."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    os.sync()


def bench_materialize(ws: Path, scratch: Path, repeat: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {
        "cp -a": [],
        "snapshot": [],
        "materialize": [],
        "materialize, 4 threads": [],
    }
    workspace = Workspace.open(ws)
    for run in range(repeat + 1):  # the first round warms the page cache and is dropped
        copy = scratch / "cp"
        t_cp = timed(subprocess.run, ["cp", "-a", str(ws), str(copy)], check=True)
        settle(copy)
        started = time.perf_counter()
        snap = workspace.snapshot()
        t_snap = time.perf_counter() - started
        for key, workers in (("materialize", None), ("materialize, 4 threads", 4)):
            branch = Branch.from_tree(snap, f"{key}-{run}")
            target = scratch / "wd"
            t = timed(materialize, branch, target, workers=workers, watch=False)
            settle(target)
            if run:
                samples[key].append(t)
        if run:
            samples["cp -a"].append(t_cp)
            samples["snapshot"].append(t_snap)
    return samples


def bench_harvest(ws: Path, scratch: Path, repeat: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
    }
    env["GIT_COMMITTER_EMAIL"] = "b@b"
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
        subprocess.run(["git", *args], cwd=ws, env=env, check=True)
    snap = Workspace.open(ws).snapshot()
    workdir = materialize(Branch.from_tree(snap, "harvest"), scratch / "harvest")
    settle()
    status = ["git", "status", "--porcelain"]
    subprocess.run(status, cwd=ws, stdout=subprocess.DEVNULL, check=True)  # refreshes the index
    workdir.harvest(full=True)
    samples: dict[str, list[float]] = {"git status": [], "harvest": [], "harvest, full scan": []}
    reports = []
    for _ in range(repeat):
        samples["git status"].append(
            timed(subprocess.run, status, cwd=ws, stdout=subprocess.DEVNULL, check=True)
        )
        started = time.perf_counter()
        reports.append(workdir.harvest())
        samples["harvest"].append(time.perf_counter() - started)
        started = time.perf_counter()
        reports.append(workdir.harvest(full=True))
        samples["harvest, full scan"].append(time.perf_counter() - started)
    assert not any(r.changed for r in reports), "the unchanged tree harvested changes"
    watching = workdir.watching
    workdir.remove()
    return {"samples": samples, "inotify": watching}


def bench_merge(ws: Path, touched: int, repeat: int) -> dict[str, Any]:
    snap = Workspace.open(ws).snapshot()
    paths = sorted(snap.paths() - {".gitignore"})
    overlap = touched // 2
    a_paths = paths[:touched]
    b_paths = paths[touched - overlap : 2 * touched - overlap]
    samples: list[float] = []
    conflicts = 0
    for run in range(repeat):
        a, b = Branch.from_tree(snap, f"a{run}"), Branch.from_tree(snap, f"b{run}")
        for path in a_paths:
            data = snap.read(path)
            a.write(path, b"# edited by a\n" + data)
        for path in b_paths:
            data = snap.read(path)
            b.write(path, data + b"# edited by b\n")
        started = time.perf_counter()
        result = merge_branches([a, b])
        samples.append(time.perf_counter() - started)
        conflicts = len(result.conflicts)
    files = len(set(a_paths) | set(b_paths))
    return {
        "samples": samples,
        "files": files,
        "three_way": overlap,
        "touched_per_branch": touched,
        "conflicts": conflicts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument(
        "--dir", default=None, help="scratch directory (its filesystem is measured)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--touched", type=int, default=1000, help="files each merged branch touches"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated tree")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench-vfs-", dir=args.dir))
    ws = scratch / "workspace"
    try:
        print(f"generating {args.files} files / {args.mb:g} MB in {ws} ...", file=sys.stderr)
        generate(ws, args.files, int(args.mb * 1024 * 1024))
        settle()
        mat = bench_materialize(ws, scratch, args.repeat)
        harvest = bench_harvest(ws, scratch, args.repeat)
        merge = bench_merge(ws, min(args.touched, args.files // 2), args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    hs = harvest["samples"]
    both = [a + b for a, b in zip(mat["snapshot"], mat["materialize"], strict=True)]
    harvest_name = "harvest, unchanged (inotify)" if harvest["inotify"] else "harvest, unchanged"
    rows: list[tuple[str, list[float], list[float] | None]] = [
        ("cp -a (reference)", mat["cp -a"], None),
        ("materialize", mat["materialize"], mat["cp -a"]),
        ("materialize, 4 threads", mat["materialize, 4 threads"], mat["cp -a"]),
        ("snapshot + materialize", both, mat["cp -a"]),
        ("git status (reference)", hs["git status"], None),
        (harvest_name, hs["harvest"], hs["git status"]),
        ("harvest, unchanged, full scan", hs["harvest, full scan"], hs["git status"]),
        (f"merge 2 x {merge['touched_per_branch']} files", merge["samples"], None),
    ]
    fs = subprocess.run(["df", "-T", str(scratch.parent)], capture_output=True, text=True).stdout
    fstype = fs.splitlines()[-1].split()[1] if fs.strip() else "?"
    where = f"{fstype} ({scratch.parent})"
    print(f"\n{args.files} files, {args.mb:g} MB, {where}, {args.repeat} runs")
    print(f"{'measure':32} {'median s':>9} {'min s':>8} {'ratio':>6} {'(min)':>6}")
    table: dict[str, dict[str, float | None]] = {}
    for name, samples, reference in rows:
        median, best = statistics.median(samples), min(samples)
        ratio = median / statistics.median(reference) if reference else None
        ratio_min = best / min(reference) if reference else None
        table[name] = {"median": median, "min": best, "ratio": ratio, "ratio_min": ratio_min}
        shown = f"{ratio:6.2f} {ratio_min:6.2f}" if ratio and ratio_min else ""
        print(f"{name:32} {median:9.4f} {best:8.4f} {shown}")
    merge_time = statistics.median(merge["samples"])
    rate = merge["files"] / merge_time
    print(
        f"merge: {merge['files']} files ({merge['three_way']} line-level three-way) "
        f"in {merge_time:.3f} s = {rate:,.0f} files/s, {merge['conflicts']} conflicts"
    )
    results = {
        "files": args.files,
        "mb": args.mb,
        "repeat": args.repeat,
        "filesystem": fstype,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "table": table,
        "samples": {**mat, **hs, "merge": merge["samples"]},
        "harvest_inotify": harvest["inotify"],
        "merge": {k: v for k, v in merge.items() if k != "samples"} | {"files_per_second": rate},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
