"""Rebuild the vendored ACP registry snapshot from a clone of agentclientprotocol/registry.

Usage::

    python tools/build_registry_snapshot.py GIT_DIR [--commit REV] [--out DIR]

``GIT_DIR`` is a clone (a checkout or a bare repository) of
https://github.com/agentclientprotocol/registry; ``REV`` defaults to ``HEAD``. The snapshot is
what the registry's own build publishes as ``registry.json``: ``{"version", "agents",
"extensions"}``, one entry per top-level directory holding an ``agent.json`` (or
``extension.json``), in directory order, skipping the directories the build skips
(``_not_yet_unsupported`` and dot directories); an entry whose directory has an ``icon.svg``
gets the icon's CDN address, as the build gives it. It is written to
``orchestrator/data/registry.json`` with ``registry.provenance.json`` beside it (repository,
commit, commit date, licence), which ``orchestrator agents --registry`` shows.

Read straight from git objects (``git ls-tree`` / ``git show``), so the clone needs no work
tree and nothing outside the named commit is read. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "orchestrator" / "data"
REPOSITORY = "https://github.com/agentclientprotocol/registry"
#: the format version the registry's build writes
FORMAT_VERSION = "1.0.0"
#: where the published registry serves icons (``<base>/<id>.svg``)
ICON_BASE = "https://cdn.agentclientprotocol.com/registry/v1/latest"
#: directories the registry's build does not publish
SKIPPED = {"_not_yet_unsupported", "dist"}


def _git(git_dir: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", git_dir, *args], capture_output=True, text=True, check=True)
    return done.stdout


def build(git_dir: str, commit: str = "HEAD") -> tuple[dict[str, Any], dict[str, Any]]:
    """The registry as the build publishes it, and its provenance, from ``commit``."""
    sha, date = _git(git_dir, "log", "-1", "--format=%H %cI", commit).split()
    files = set(_git(git_dir, "ls-tree", "-r", "--name-only", sha).splitlines())
    dirs = sorted({f.split("/", 1)[0] for f in files if "/" in f})
    agents: list[dict[str, Any]] = []
    extensions: list[dict[str, Any]] = []
    for name in dirs:
        if name in SKIPPED or name.startswith((".", "_")):
            continue
        for kind, into in (("agent.json", agents), ("extension.json", extensions)):
            if f"{name}/{kind}" not in files:
                continue
            entry = json.loads(_git(git_dir, "show", f"{sha}:{name}/{kind}"))
            if f"{name}/icon.svg" in files:
                entry["icon"] = f"{ICON_BASE}/{entry['id']}.svg"
            into.append(entry)
    licence = _git(git_dir, "show", f"{sha}:LICENSE").lstrip().splitlines()[0].strip()
    registry = {"version": FORMAT_VERSION, "agents": agents, "extensions": extensions}
    provenance = {
        "repository": REPOSITORY,
        "commit": sha,
        "date": date,
        "license": "Apache-2.0" if licence.startswith("Apache License") else licence,
        "built": "tools/build_registry_snapshot.py, as the registry's "
        ".github/workflows/build_registry.py publishes dist/registry.json",
    }
    return registry, provenance


def main(argv: list[str] | None = None) -> int:
    """Write the snapshot and its provenance; print one line saying what was written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", help="a clone of agentclientprotocol/registry")
    parser.add_argument("--commit", default="HEAD", help="the commit to read (default HEAD)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write")
    args = parser.parse_args(argv)
    registry, provenance = build(args.git_dir, args.commit)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in (("registry.json", registry), ("registry.provenance.json", provenance)):
        (args.out / name).write_text(json.dumps(data, indent=2) + "\n", "utf-8")
    print(
        f"{len(registry['agents'])} agents from {provenance['commit'][:12]}"
        f" ({provenance['date']}) into {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
