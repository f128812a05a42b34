"""A project's ``.orchestrator.toml`` starts programs only once the user trusted it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from run_helpers import as_json, run_cli

from orchestrator.config import PROJECT_FILE, Config
from orchestrator.errors import UsageError
from orchestrator.trust import TrustStore, file_digest

EXIT_OK, EXIT_USAGE = 0, 2

# what a hostile repository's config runs: it leaves a marker, then fails like a broken agent
EVIL = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran'); sys.exit(1)"


@pytest.fixture
def cloned(tmp_path: Path) -> Path:
    """A workspace as cloned: a README and a config that redefines the demo agent."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    return ws


def hostile_config(ws: Path, marker: Path, *, name: str = "demo") -> None:
    """Make agent ``name`` of the workspace's config a program that leaves ``marker``."""
    command = json.dumps([sys.executable, "-c", EVIL, str(marker)])
    (ws / PROJECT_FILE).write_text(f"[agents.{name}]\ncommand = {command}\nmax_sessions = 2\n")


# --------------------------------------------------------------------------- the record


def test_status_follows_the_bytes(tmp_path: Path) -> None:
    """A trusted file is trusted with its bytes; other bytes are 'changed'; revoke forgets it."""
    store = TrustStore(tmp_path / "trusted.json")
    file = tmp_path / PROJECT_FILE
    file.write_text("[limits]\n")
    assert store.status(file, file.read_bytes()) == "untrusted"
    entry = store.trust(file)
    assert entry.digest == file_digest(b"[limits]\n")
    assert store.status(file, b"[limits]\n") == "trusted"
    assert store.status(file, b"[limits]\nmax_sessions = 1\n") == "changed"
    assert [e.path for e in store.entries()] == [str(file.resolve())]
    assert store.revoke(file) is True
    assert store.revoke(file) is False
    assert store.status(file, b"[limits]\n") == "untrusted"


def test_trust_names_the_real_directory(tmp_path: Path) -> None:
    """A trust given through a symlinked directory holds for the directory it leads to."""
    store = TrustStore(tmp_path / "trusted.json")
    real = tmp_path / "real"
    real.mkdir()
    (real / PROJECT_FILE).write_text("")
    (tmp_path / "link").symlink_to(real)
    store.trust(tmp_path / "link" / PROJECT_FILE)
    assert store.status(real / PROJECT_FILE, b"") == "trusted"


async def test_a_link_to_a_trusted_file_is_not_trusted(tmp_path: Path, state_dir: Path) -> None:
    """A project whose config links to another project's trusted file runs nothing of its own.

    The linked file's relative command would resolve against the linking project's directory:
    its own `tools/evil.py`, never trusted.
    """
    good, clone = tmp_path / "good", tmp_path / "clone"
    for project in (good, clone):
        (project / "tools").mkdir(parents=True)
        marker = tmp_path / f"ran-{project.name}"
        (project / "tools" / "agent.py").write_text(
            f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
        )
    (good / PROJECT_FILE).write_text('[agents.mine]\ncommand = "python3 tools/agent.py"\n')
    (clone / PROJECT_FILE).symlink_to(good / PROJECT_FILE)
    assert (await run_cli("trust", cwd=good, state=state_dir)).returncode == EXIT_OK
    done = await run_cli("prompt", "--agent", "mine", "hi", cwd=clone, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    assert "is not trusted to start programs" in done.stderr.decode()
    assert not (tmp_path / "ran-clone").exists()


def test_a_damaged_record_trusts_nothing(tmp_path: Path) -> None:
    """A record that is not the JSON we write is an error, not an empty or a full trust."""
    store = TrustStore(tmp_path / "trusted.json")
    store.path.write_text('{"files": [1]}')
    with pytest.raises(UsageError, match="damaged"):
        store.status(tmp_path / PROJECT_FILE, b"")


# --------------------------------------------------------------------------- the config


def test_untrusted_project_keys_are_ignored(tmp_path: Path, cloned: Path) -> None:
    """Untrusted: command, env, cwd and policy are not used; harmless keys are."""
    (cloned / PROJECT_FILE).write_text(
        '[limits]\nmax_sessions = 3\n[agents.demo]\ncommand = "evil"\nenv = { X = "1" }\n'
        'cwd = "/"\npolicy = "trusted"\nterminal_env = ["MYSQL_PWD"]\nmax_sessions = 2\n'
        'notes = "ours"\n'
    )
    builtin = Config.builtin().agents["demo"]
    config = Config.load(cloned, environ={"HOME": str(tmp_path)})
    demo = config.agents["demo"]
    assert (demo.command, demo.env, demo.cwd, demo.policy, demo.terminal_env) == (
        builtin.command,
        builtin.env,
        builtin.cwd,
        builtin.policy,
        builtin.terminal_env,
    )
    assert (demo.max_sessions, demo.notes, config.max_sessions) == (2, "ours", 3)
    source = str(cloned / PROJECT_FILE)
    keys = ("command", "env", "cwd", "policy", "terminal_env")
    assert config.ignored == tuple(f"{source}: agents.demo.{key}" for key in keys)


def test_an_agent_only_an_untrusted_file_defines_is_refused(tmp_path: Path, cloned: Path) -> None:
    """Its name is neither an agent nor taken as a command line to run."""
    (cloned / PROJECT_FILE).write_text('[agents.mine]\ncommand = "mine --acp"\n')
    config = Config.load(cloned, environ={"HOME": str(tmp_path)})
    assert "mine" not in config.agents
    with pytest.raises(UsageError, match="not trusted to start programs"):
        config.resolve_agent("mine")


def test_trusted_then_edited(tmp_path: Path, cloned: Path, state_dir: Path) -> None:
    """A trusted file's commands are used until it is edited; then they are ignored again."""
    (cloned / PROJECT_FILE).write_text('[agents.mine]\ncommand = "mine --acp"\n')
    TrustStore.at(state_dir).trust(cloned / PROJECT_FILE)
    env = {"HOME": str(tmp_path)}
    assert Config.load(cloned, environ=env).agents["mine"].command == ("mine", "--acp")
    (cloned / PROJECT_FILE).write_text('[agents.mine]\ncommand = "other --acp"\n')
    assert "mine" not in Config.load(cloned, environ=env).agents


def test_the_user_file_is_trusted(tmp_path: Path) -> None:
    """The user's own config file starts what it names with no trust step."""
    user = tmp_path / "user.toml"
    user.write_text('[agents.mine]\ncommand = "mine --acp"\n')
    config = Config.load(environ={"HOME": str(tmp_path), "ORCHESTRATOR_CONFIG": str(user)})
    assert config.agents["mine"].command == ("mine", "--acp") and config.ignored == ()


# --------------------------------------------------------------------------- the commands


@pytest.mark.parametrize("command", ["prompt", "run", "compare"])
async def test_an_untrusted_config_starts_nothing(
    command: str, tmp_path: Path, cloned: Path, state_dir: Path
) -> None:
    """prompt, run and compare use the built-in demo, not the cloned config's program."""
    marker = tmp_path / "ran"
    hostile_config(cloned, marker)
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n@step(agent='demo')\ndef work(task: str) -> str:\n"
        "    return task\n"
    )
    args = {
        "prompt": ("prompt", "--agent", "demo", "--json", "hello"),
        "run": ("run", str(pipeline), "--set", "task=hello", "--json", "--no-progress"),
        "compare": ("compare", "--agent", "demo", "--json", "--no-progress", "hello"),
    }[command]
    done = await run_cli(*args, cwd=cloned, state=state_dir)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert not marker.exists()
    stderr = done.stderr.decode()
    assert f"{PROJECT_FILE} is not trusted to start programs" in stderr
    assert "agents.demo.command was ignored; `orchestrator trust` trusts it" in stderr
    assert "Traceback" not in stderr


async def test_trust_then_the_command_runs(tmp_path: Path, cloned: Path, state_dir: Path) -> None:
    """After `orchestrator trust` the config's program is started; after an edit, not again."""
    marker = tmp_path / "ran"
    hostile_config(cloned, marker, name="mine")
    refused = await run_cli("prompt", "--agent", "mine", "hi", cwd=cloned, state=state_dir)
    assert refused.returncode == EXIT_USAGE
    assert "agent 'mine' is defined in" in refused.stderr.decode()
    assert not marker.exists()

    trusted = await run_cli("trust", "--json", cwd=cloned, state=state_dir)
    assert trusted.returncode == EXIT_OK, trusted.stderr.decode()
    entry = as_json(trusted)
    assert entry["path"] == str((cloned / PROJECT_FILE).resolve())
    assert entry["allows"] == ["agents.mine"]
    started = await run_cli("prompt", "--agent", "mine", "hi", cwd=cloned, state=state_dir)
    assert started.returncode != EXIT_OK  # the program is no agent, but it was started
    assert marker.read_text() == "ran"

    marker.unlink()
    with (cloned / PROJECT_FILE).open("a") as f:
        f.write("# pulled\n")
    again = await run_cli("prompt", "--agent", "mine", "hi", cwd=cloned, state=state_dir)
    assert again.returncode == EXIT_USAGE
    assert "changed since it was trusted" in again.stderr.decode()
    assert not marker.exists()


async def test_trust_list_and_remove(cloned: Path, state_dir: Path, tmp_path: Path) -> None:
    """--list shows each trusted file with its state; --remove takes the trust back."""
    hostile_config(cloned, tmp_path / "ran")
    assert (await run_cli("trust", str(cloned), cwd=tmp_path, state=state_dir)).returncode == 0
    listed = as_json(await run_cli("trust", "--list", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["path"], r["status"]) for r in listed["trusted"]] == [
        (str((cloned / PROJECT_FILE).resolve()), "trusted")
    ]
    removed = await run_cli("trust", "--remove", "--json", cwd=cloned, state=state_dir)
    assert as_json(removed)["removed"] is True
    listed = as_json(await run_cli("trust", "--list", "--json", cwd=tmp_path, state=state_dir))
    assert listed["trusted"] == []


async def test_trust_without_a_config_is_bad_usage(tmp_path: Path, state_dir: Path) -> None:
    """Trusting a directory with no config file is one line and exit 2."""
    done = await run_cli("trust", cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.decode().strip() == f"orchestrator: error: no {PROJECT_FILE} in ."


def test_untrusted_sandbox_rules_are_ignored(tmp_path: Path, cloned: Path) -> None:
    """An untrusted file cannot open paths or ports of the sandbox, for the run or an agent."""
    (cloned / PROJECT_FILE).write_text(
        '[sandbox]\nwrite = ["/"]\nports = [22]\n[agents.demo]\nsandbox = { write = ["/etc"] }\n'
    )
    config = Config.load(cloned, environ={"HOME": str(tmp_path)})
    assert (config.sandbox, config.sandboxed) == (None, False)
    assert config.agents["demo"].sandbox == Config.builtin().agents["demo"].sandbox
    source = str(cloned / PROJECT_FILE)
    assert set(config.ignored) == {f"{source}: sandbox", f"{source}: agents.demo.sandbox"}


async def test_a_refused_state_directory_is_not_made_by_the_trust_lookup(
    cloned: Path, tmp_path: Path
) -> None:
    """A state directory inside the workspace is refused before the config's trust is read."""
    hostile_config(cloned, tmp_path / "ran")
    done = await run_cli("prompt", "--agent", "demo", "hi", cwd=cloned, state=cloned / ".state")
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    assert not (cloned / ".state").exists()


def test_untrusted_limits_only_go_down(tmp_path: Path, cloned: Path) -> None:
    """An untrusted file may lower the limits on what an agent costs, not raise them."""
    (cloned / PROJECT_FILE).write_text(
        "[limits]\nmax_unsent_bytes = 999999999999\nmax_requests_in_flight = 5\n"
        'max_file_size = "900M"\n'
    )
    config = Config.load(cloned, environ={"HOME": str(tmp_path)})
    assert (config.max_unsent_bytes, config.max_requests_in_flight) == (None, 5)
    assert config.max_file_size is None
    source = str(cloned / PROJECT_FILE)
    assert set(config.ignored) == {
        f"{source}: limits.max_unsent_bytes",
        f"{source}: limits.max_file_size",
    }
    trusted = Config.load(cloned, environ={"HOME": str(tmp_path)}, trusted=True)
    assert trusted.max_unsent_bytes == 999999999999
