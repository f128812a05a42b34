"""Install the official TypeScript ACP SDK (its example agent) for the interop tests.

Usage::

    python tools/install_node_agents.py [CACHE_DIR]

The package ``@agentclientprotocol/sdk`` at a pinned version goes into ``CACHE_DIR``
(default: the argument, else ``$ORCHESTRATOR_NODE_CACHE``, else ``<repo>/.cache/node``).
Running it again is a no-op when that version is already there. The last line printed is
the path of ``dist/examples/agent.js``. Without node or npm there is nothing to do: the
script says so and exits 0, and the tests that need node skip themselves.

Standard library only, so it runs before any virtualenv exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "PACKAGE",
    "VERSION",
    "default_cache_dir",
    "example_agent_path",
    "install",
    "installed_version",
    "main",
]

PACKAGE = "@agentclientprotocol/sdk"
VERSION = "1.9.0"
ENV_VAR = "ORCHESTRATOR_NODE_CACHE"
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    """``$ORCHESTRATOR_NODE_CACHE`` if set, else ``<repo>/.cache/node``."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache" / "node"


def package_dir(cache_dir: Path) -> Path:
    """Where npm puts the package inside ``cache_dir``."""
    return cache_dir / "node_modules" / Path(*PACKAGE.split("/"))


def example_agent_path(cache_dir: Path) -> Path:
    """The runnable example agent shipped by the SDK."""
    return package_dir(cache_dir) / "dist" / "examples" / "agent.js"


def installed_version(cache_dir: Path) -> str | None:
    """The version of the SDK installed in ``cache_dir``, or None."""
    try:
        manifest = json.loads((package_dir(cache_dir) / "package.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    version = manifest.get("version") if isinstance(manifest, dict) else None
    return version if isinstance(version, str) else None


def install(cache_dir: Path) -> Path:
    """Install the pinned SDK into ``cache_dir`` unless present; return the example's path.

    Raises ``FileNotFoundError`` when npm is not on PATH and ``subprocess.CalledProcessError``
    when npm fails.
    """
    agent = example_agent_path(cache_dir)
    if installed_version(cache_dir) == VERSION and agent.is_file():
        return agent
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm")
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A private package.json keeps npm from walking up into some parent project.
    manifest = cache_dir / "package.json"
    if not manifest.exists():
        manifest.write_text(
            json.dumps({"name": "orchestrator-node-agents", "private": True}, indent=2) + "\n",
            "utf-8",
        )
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(cache_dir),
            "--save-exact",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",  # the SDK needs no install scripts; run none
            f"{PACKAGE}@{VERSION}",
        ],
        check=True,
        stdout=sys.stderr,  # keep stdout for the one path we print
    )
    if not agent.is_file():
        raise FileNotFoundError(str(agent))
    return agent


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cache_dir = Path(args[0]).expanduser().resolve() if args else default_cache_dir()
    if installed_version(cache_dir) == VERSION and example_agent_path(cache_dir).is_file():
        print(f"{PACKAGE}@{VERSION} already installed in {cache_dir}", file=sys.stderr)
        print(example_agent_path(cache_dir))
        return 0
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        print(
            f"{' and '.join(missing)} not found on PATH: nothing to install "
            "(the tests that need the TypeScript example agent will be skipped)",
            file=sys.stderr,
        )
        return 0
    try:
        agent = install(cache_dir)
    except subprocess.CalledProcessError as exc:
        print(f"npm install failed with exit status {exc.returncode}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"installation incomplete: {exc} is missing", file=sys.stderr)
        return 1
    print(agent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
