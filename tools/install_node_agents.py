"""Install the node packages the tests run: the TypeScript ACP SDK and real ACP agents.

Usage::

    python tools/install_node_agents.py [--sdk-only] [--check | --for-tests] [CACHE_DIR]

Into ``CACHE_DIR`` (default: the argument, else ``$ORCHESTRATOR_NODE_CACHE``, else
``<repo>/.cache/node``), at pinned versions:

- ``@agentclientprotocol/sdk`` (its example agent, for the interop tests);
- the real agents of ``tests/test_real_agents.py`` (:data:`AGENTS`): Qwen Code
  (``@qwen-code/qwen-code``) and Claude Code's ACP adapter (``@zed-industries/claude-code-acp``,
  which brings Claude Code itself as ``@anthropic-ai/claude-agent-sdk``) and Gemini CLI
  (``@google/gemini-cli``, started with ``--acp``); skipped with ``--sdk-only``;
- the agents of the bundled ACP registry snapshot that the tests run by registry id through
  ``npx`` (:data:`NPX_AGENTS`), at the version the snapshot names: installed into npm's own
  cache (``CACHE_DIR/npm-cache``, by ``npm exec``), where ``npx`` finds them offline with
  ``npm_config_cache`` pointing there and ``npm_config_offline=true``; skipped with
  ``--sdk-only``.

Running it again is a no-op for what is already there at the pinned version; it is quiet on
success apart from the last line printed, the path of the SDK's ``dist/examples/agent.js``.
Without node or npm there is nothing to do: the script says so and exits 0, and the tests that
need node skip themselves. ``--check`` installs nothing: it prints one line per package
(``NAME VERSION ok`` / ``missing`` / ``has OTHER``) and exits 1 unless all are in place.

``--for-tests`` is what ``./dev test`` and ``./dev check`` run (:func:`for_tests`): the same
install, but a failure is an error only in CI (``$CI`` set, npm present); elsewhere it is a
warning, the tests that need the packages skip with their reason, and the failure is recorded
(``.failed`` in the cache) so that later runs with the same pinned versions do not wait for npm
again. Running the script without ``--for-tests`` always tries, and clears that record.

Standard library only, so it runs before any virtualenv exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "AGENTS",
    "NPX_AGENTS",
    "PACKAGE",
    "VERSION",
    "NodeAgent",
    "agent_bin",
    "check",
    "default_cache_dir",
    "example_agent_path",
    "for_tests",
    "install",
    "install_agents",
    "installed_version",
    "main",
    "npx_cache_dir",
    "pinned_specs",
]

PACKAGE = "@agentclientprotocol/sdk"
VERSION = "1.9.0"
ENV_VAR = "ORCHESTRATOR_NODE_CACHE"
#: in the cache: the pinned packages of the last install that failed outside CI, and why
FAILED = ".failed"
REPO_ROOT = Path(__file__).resolve().parent.parent


class NodeAgent(NamedTuple):
    """A real ACP agent from npm: its package, pinned version and the program it installs."""

    name: str
    package: str
    version: str
    bin: str


#: Real agents, pinned. Qwen Code declares node >= 22 but runs on node 20 (checked with 20.20);
#: the adapter 0.16.2 bundles Claude Code 2.1.44 (``@anthropic-ai/claude-agent-sdk`` 0.2.44);
#: Gemini CLI ships one bundle (node >= 20) and needs none of its optional native parts.
AGENTS: tuple[NodeAgent, ...] = (
    NodeAgent("qwen", "@qwen-code/qwen-code", "0.24.4", "qwen"),
    NodeAgent("claude", "@zed-industries/claude-code-acp", "0.16.2", "claude-code-acp"),
    NodeAgent("gemini", "@google/gemini-cli", "0.61.0", "gemini"),
)


#: Agents run through ``npx`` as the ACP registry says (``registry:ID``), at the version of
#: the bundled snapshot (orchestrator/data/registry.json): ``claude-code-acp`` 0.16.0 is the
#: one of its npx agents whose pinned version npm serves here (its qwen-code 0.9.1, gemini
#: 0.27.3, auggie 0.15.0, qoder 0.1.26 and copilot 1.425.0 are not on the npm mirror).
NPX_AGENTS: tuple[NodeAgent, ...] = (
    NodeAgent("claude-code-acp", "@zed-industries/claude-code-acp", "0.16.0", "claude-code-acp"),
)


def default_cache_dir() -> Path:
    """``$ORCHESTRATOR_NODE_CACHE`` if set, else ``<repo>/.cache/node``."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache" / "node"


def package_dir(cache_dir: Path, package: str = PACKAGE) -> Path:
    """Where npm puts ``package`` (default: the SDK) inside ``cache_dir``."""
    return cache_dir / "node_modules" / Path(*package.split("/"))


def agent_bin(cache_dir: Path, agent: NodeAgent) -> Path:
    """The program an agent package installs (``node_modules/.bin/NAME``)."""
    return cache_dir / "node_modules" / ".bin" / agent.bin


def example_agent_path(cache_dir: Path) -> Path:
    """The runnable example agent shipped by the SDK."""
    return package_dir(cache_dir) / "dist" / "examples" / "agent.js"


def installed_version(cache_dir: Path, package: str = PACKAGE) -> str | None:
    """The version of ``package`` (default: the SDK) installed in ``cache_dir``, or None."""
    try:
        manifest = json.loads((package_dir(cache_dir, package) / "package.json").read_text("utf-8"))
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
    _npm_install(cache_dir, [f"{PACKAGE}@{VERSION}"])
    if not agent.is_file():
        raise FileNotFoundError(str(agent))
    return agent


def _agent_ready(cache_dir: Path, agent: NodeAgent) -> bool:
    return (
        installed_version(cache_dir, agent.package) == agent.version
        and agent_bin(cache_dir, agent).exists()
    )


def install_agents(cache_dir: Path, agents: tuple[NodeAgent, ...] = AGENTS) -> list[Path]:
    """Install the pinned real agents missing from ``cache_dir``; return their programs.

    Raises like :func:`install`.
    """
    missing = [a for a in agents if not _agent_ready(cache_dir, a)]
    if missing:
        _npm_install(cache_dir, [f"{a.package}@{a.version}" for a in missing])
    for agent in agents:
        if not _agent_ready(cache_dir, agent):
            raise FileNotFoundError(str(agent_bin(cache_dir, agent)))
    return [agent_bin(cache_dir, a) for a in agents]


def npx_cache_dir(cache_dir: Path) -> Path:
    """npm's cache for the :data:`NPX_AGENTS` (``npm_config_cache`` of the tests)."""
    return cache_dir / "npm-cache"


def npx_versions(cache_dir: Path, package: str) -> set[str]:
    """The versions of ``package`` that ``npx`` has installed in the npm cache."""
    found = set()
    for manifest in npx_cache_dir(cache_dir).glob(f"_npx/*/node_modules/{package}/package.json"):
        try:
            version = json.loads(manifest.read_text("utf-8")).get("version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            found.add(version)
    return found


def prime_npx(cache_dir: Path, agents: tuple[NodeAgent, ...] = NPX_AGENTS) -> None:
    """Have ``npm exec`` install each of ``agents`` missing from the npm cache (it runs
    ``node -e 0``, not the agent). Raises like :func:`install`."""
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm")
    for agent in agents:
        if agent.version in npx_versions(cache_dir, agent.package):
            continue
        subprocess.run(
            [
                npm,
                "exec",
                "--yes",
                "--cache",
                str(npx_cache_dir(cache_dir)),
                "--loglevel=error",
                "--ignore-scripts",
                f"--package={agent.package}@{agent.version}",
                "--",
                "node",
                "-e",
                "0",
            ],
            check=True,
            stdout=sys.stderr,
            cwd=cache_dir,
        )
        if agent.version not in npx_versions(cache_dir, agent.package):
            raise FileNotFoundError(f"{agent.package}@{agent.version} in the npm cache")


def check(cache_dir: Path, *, sdk_only: bool = False) -> list[tuple[str, str, str]]:
    """(package, pinned version, state) per package: ``ok``, ``missing`` or ``has VERSION``."""
    wanted = [(PACKAGE, VERSION)]
    if not sdk_only:
        wanted += [(a.package, a.version) for a in AGENTS]
    rows = []
    for package, version in wanted:
        found = installed_version(cache_dir, package)
        state = "ok" if found == version else "missing" if found is None else f"has {found}"
        rows.append((package, version, state))
    if not sdk_only:
        for agent in NPX_AGENTS:
            state = "ok" if agent.version in npx_versions(cache_dir, agent.package) else "missing"
            rows.append((f"{agent.package} (npx)", agent.version, state))
    return rows


def pinned_specs(*, sdk_only: bool = False) -> list[str]:
    """``PACKAGE@VERSION`` of every pinned package (the SDK first)."""
    specs = [f"{PACKAGE}@{VERSION}"]
    if not sdk_only:
        specs += [f"{a.package}@{a.version}" for a in (*AGENTS, *NPX_AGENTS)]
    return specs


def _install_all(cache_dir: Path, *, sdk_only: bool) -> Path:
    agent = install(cache_dir)
    if not sdk_only:
        install_agents(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        prime_npx(cache_dir)
    return agent


def _failure(exc: Exception) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"npm install failed with exit status {exc.returncode}"
    return f"installation incomplete: {exc} is missing"


def for_tests(
    cache_dir: Path,
    *,
    ci: bool,
    sdk_only: bool = False,
    which: Callable[[str], str | None] = shutil.which,
    installer: Callable[[Path], object] | None = None,
) -> tuple[int, str]:
    """Set up the pinned packages before the tests: (exit status, a line to show or "").

    The exit status is 1 only when the install failed in CI (``ci``) with npm present: there
    the tests that need these packages must run. Elsewhere a failure (npm unreachable, say) is
    a warning, those tests skip with their reason, and the failure is recorded in the cache so
    that the next test run with the same pins goes straight on instead of waiting for npm
    again. ``installer`` (default: the npm install of every pinned package) is for the tests.
    """
    pins = "\n".join(pinned_specs(sdk_only=sdk_only)) + "\n"
    failed = cache_dir / FAILED
    if all(state == "ok" for _, _, state in check(cache_dir, sdk_only=sdk_only)):
        return 0, ""
    missing = [tool for tool in ("node", "npm") if which(tool) is None]
    if missing:
        return 0, (
            f"{' and '.join(missing)} not found on PATH: the tests that need node agents skip"
        )
    retry = "retry with `python tools/install_node_agents.py`"
    if not ci:
        try:
            recorded = failed.read_text("utf-8")
        except OSError:
            recorded = ""
        pinned, _, reason = recorded.partition("\n\n")
        if pinned + "\n" == pins:
            return 0, (
                f"the last install of the node agents failed ({reason.strip()}): the tests "
                f"that need them skip; {retry}"
            )
    try:
        (installer or (lambda d: _install_all(d, sdk_only=sdk_only)))(cache_dir)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        reason = _failure(exc)
        if ci:
            return 1, f"{reason} (required in CI, where npm is present)"
        cache_dir.mkdir(parents=True, exist_ok=True)
        failed.write_text(pins.rstrip("\n") + "\n\n" + reason + "\n", "utf-8")
        return 0, f"warning: {reason}: the tests that need node agents skip; {retry}"
    failed.unlink(missing_ok=True)
    return 0, ""


def _npm_install(cache_dir: Path, specs: list[str]) -> None:
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
            "--loglevel=error",  # quiet on success
            # none of these packages needs an install script (native parts come prebuilt as
            # optional dependencies); run none
            "--ignore-scripts",
            *specs,
        ],
        check=True,
        stdout=sys.stderr,  # keep stdout for the one path we print
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    sdk_only = "--sdk-only" in args
    only_check = "--check" in args
    rest = [a for a in args if a not in ("--sdk-only", "--check", "--for-tests")]
    cache_dir = Path(rest[0]).expanduser().resolve() if rest else default_cache_dir()
    if "--for-tests" in args:
        code, message = for_tests(cache_dir, ci=bool(os.environ.get("CI")), sdk_only=sdk_only)
        if message:
            print(message, file=sys.stderr)
        return code
    if only_check:
        rows = check(cache_dir, sdk_only=sdk_only)
        for package, version, state in rows:
            print(f"{package} {version} {state}")
        return 0 if all(state == "ok" for _, _, state in rows) else 1
    if all(state == "ok" for _, _, state in check(cache_dir, sdk_only=sdk_only)):
        print(f"pinned packages already installed in {cache_dir}", file=sys.stderr)
        print(example_agent_path(cache_dir))
        return 0
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        print(
            f"{' and '.join(missing)} not found on PATH: nothing to install "
            "(the tests that need node agents will be skipped)",
            file=sys.stderr,
        )
        return 0
    try:
        agent = _install_all(cache_dir, sdk_only=sdk_only)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(_failure(exc), file=sys.stderr)
        return 1
    (cache_dir / FAILED).unlink(missing_ok=True)
    print(agent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
