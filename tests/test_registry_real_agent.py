"""An agent of the bundled ACP registry snapshot, run by its registry id through ``npx`` as the
registry says, completes a turn offline.

``registry:claude-code-acp`` is ``npx -y @zed-industries/claude-code-acp@0.16.0`` in the
snapshot. ``python tools/install_node_agents.py`` puts that version in npm's cache under the
node cache (``npm-cache``); the run points ``npm_config_cache`` there with
``npm_config_offline=true``, so npx resolves the package without the network. The model is the
scripted model server on 127.0.0.1, and every proxy variable points at it (it refuses to
proxy): whatever tried to leave the machine is listed as refused, and the TCP peers of every
process of the run are sampled as a second look.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import trio
from interop import node_cache_dir
from real_agents import (
    CLAUDE,
    Project,
    RealAgent,
    SocketWatch,
    make_project,
    tagged_processes,
    task_scenario,
    write_policy_toml,
)
from test_registry import snapshot

from orchestrator.testing.model_server import open_model_server

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

LIMIT = 180.0
TASK = "Please do RA-TASK in this project."
REGISTRY_ID = "claude-code-acp"
#: Claude Code's adapter as the snapshot pins it (the environment it needs is CLAUDE's)
ADAPTER = RealAgent(
    "claude", "@zed-industries/claude-code-acp", "0.16.0", "claude-code-acp", (), "anthropic"
)


def npm_cache() -> Path:
    """npm's cache that ``tools/install_node_agents.py`` fills for npx."""
    return node_cache_dir() / "npm-cache"


def primed_versions() -> set[str]:
    """The versions of the adapter npx has installed in that cache."""
    found = set()
    for manifest in npm_cache().glob(f"_npx/*/node_modules/{ADAPTER.package}/package.json"):
        found.add(json.loads(manifest.read_text("utf-8"))["version"])
    return found


def require_primed() -> None:
    """Skip (fail under CI with npm) unless node and the pinned adapter are in npm's cache."""
    reason = None
    if shutil.which("npx") is None:
        reason = "npx is not on PATH"
    elif ADAPTER.version not in primed_versions():
        reason = (
            f"{ADAPTER.package}@{ADAPTER.version} is not in {npm_cache()}: install it with "
            "`python tools/install_node_agents.py`"
        )
    if reason is None:
        return
    if os.environ.get("CI") and shutil.which("npm") is not None:
        pytest.fail(f"CI with npm but {reason}")
    pytest.skip(reason)


def test_the_snapshot_pins_the_adapter_the_test_runs() -> None:
    """The snapshot's entry is the npx package and version this test primes."""
    entry = next(a for a in snapshot()["agents"] if a["id"] == REGISTRY_ID)
    assert entry["distribution"] == {"npx": {"package": f"{ADAPTER.package}@{ADAPTER.version}"}}
    assert CLAUDE.package == ADAPTER.package  # the same adapter, so the same environment


async def test_a_registry_agent_completes_a_turn_offline_by_its_id(
    tmp_path: Path, state_dir: Path
) -> None:
    """``prompt --agent registry:claude-code-acp``: npx from the primed cache, the scripted
    model on 127.0.0.1, the task done, nothing proxied off the machine."""
    require_primed()
    project: Project = make_project(tmp_path / "project")
    before = project.snapshot()
    tag = uuid.uuid4().hex
    policy = write_policy_toml(tmp_path / "policy.toml")
    async with open_model_server([task_scenario()]) as server:
        home = tmp_path / "home"
        ADAPTER.prepare_home(home)
        env = {
            **os.environ,
            **ADAPTER.environment(server, home, tag=tag),
            "npm_config_cache": str(npm_cache()),
            "npm_config_offline": "true",
            "npm_config_update_notifier": "false",
        }
        env.pop("ORCHESTRATOR_REGISTRY", None)  # the bundled snapshot
        command = [
            str(Path(sys.executable).parent / "orchestrator"),
            "prompt",
            "--agent",
            f"registry:{REGISTRY_ID}",
            "--json",
            "--cwd",
            str(project.root),
            "--policy",
            str(policy),
            "--state-dir",
            str(state_dir),
            TASK,
        ]
        watch = SocketWatch(tag)
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run)
                done = await trio.run_process(
                    command, env=env, capture_stdout=True, capture_stderr=True, check=False
                )
                nursery.cancel_scope.cancel()
    stderr = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, stderr
    result = json.loads(done.stdout)
    assert result["stopReason"] == "end_turn"
    assert result["agent"]["name"] == REGISTRY_ID
    # the agent that answered is the adapter at the snapshot's version, which npx started
    assert result["agent"]["reportedName"] == ADAPTER.package
    assert result["agent"]["version"] == ADAPTER.version
    changes = {c["path"]: c["change"] for c in result["changes"]}
    assert changes == {"greet.py": "modified", Project.NEW_FILE: "added"}
    assert [r.step for r in server.requests if r.scenario == "RA-TASK"][:5] == [0, 1, 2, 3, 4]
    # what tried the proxy variables was refused there; no tagged process (the orchestrator,
    # npm, node) had a TCP peer off the machine
    assert all(r.host not in ("127.0.0.1", "localhost") for r in server.refused)
    assert watch.samples > 0 and watch.pids
    assert watch.off_machine == set(), watch.off_machine
    assert project.snapshot() == before
    assert tagged_processes(tag) == []
