"""The sandbox's rules, without a kernel: rulesets per ABI, the launcher's arguments, choices.

What the kernel does with them is in ``test_sandbox_kernel.py``; runs under ``--sandbox`` are in
``test_sandbox_cli.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.lowlevel

from orchestrator import _landlock
from orchestrator._landlock import (
    ACCESS_FS,
    ACCESS_NET_CONNECT_TCP,
    FILE_ACCESS,
    SCOPE_ABSTRACT_UNIX_SOCKET,
    SCOPE_SIGNAL,
    parse_rules,
    rule_access,
)
from orchestrator.agents import AgentSpec
from orchestrator.config import Config
from orchestrator.errors import SandboxUnavailable, UsageError
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import list_runs, prompt, run_pipeline
from orchestrator.runs.settings import RunSettings, restore_settings
from orchestrator.sandbox import (
    DEVICE_ACCESS,
    DEVICES,
    READ_ACCESS,
    WRITE_ACCESS,
    PathRule,
    Sandbox,
    build_ruleset,
    choose_sandbox,
    confined_environment,
    rights_json,
)
from orchestrator.testing import AgentScript, Say, Turn, scripted_agent_command
from orchestrator.testing.connector import memory_connector


def bits(*names: str) -> int:
    """The access bits of the named rights."""
    value = 0
    for name in names:
        value |= ACCESS_FS[name][0]
    return value


ABI1 = bits(*(n for n, (_, since) in ACCESS_FS.items() if since == 1))
WRITABLE = ("/work/branch", "/work/home", "/tmp/private")


def access_of(rules: tuple[PathRule, ...], path: str) -> int:
    """The access a ruleset grants beneath ``path`` (0 when it has no rule for it)."""
    return {r.path: r.access for r in rules}.get(path, 0)


# --------------------------------------------------------------------------- rulesets


def test_default_ruleset_reads_everything_and_writes_its_own_paths() -> None:
    """Default rules: read and execute under /, every right under its paths, devices rw."""
    rules = build_ruleset(Sandbox(), abi=7, writable=WRITABLE)
    assert rules.handled_fs == WRITE_ACCESS == (1 << 16) - 1
    assert access_of(rules.paths, "/") == READ_ACCESS == bits("execute", "read_file", "read_dir")
    for path in WRITABLE:
        assert access_of(rules.paths, path) == WRITE_ACCESS
    for device in DEVICES:
        assert access_of(rules.paths, device) == DEVICE_ACCESS
    assert rules.writable == WRITABLE
    assert rules.readable == ("/",)
    assert (rules.handled_net, rules.ports) == (0, ())  # no port rules: TCP is not handled
    assert rules.scoped == SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL


@pytest.mark.parametrize(
    ("abi", "missing"),
    [
        (1, ("refer", "truncate", "ioctl_dev")),
        (2, ("truncate", "ioctl_dev")),
        (3, ("ioctl_dev",)),
        (4, ("ioctl_dev",)),
        (5, ()),
        (7, ()),
    ],
)
def test_rights_an_older_abi_lacks_are_left_out(abi: int, missing: tuple[str, ...]) -> None:
    """Best effort: the handled rights and every rule shrink to what the ABI knows."""
    rules = build_ruleset(Sandbox(), abi=abi, writable=WRITABLE)
    assert rules.handled_fs == WRITE_ACCESS & ~bits(*missing)
    assert rules.handled_fs & ABI1 == ABI1
    assert all(rule.access & ~rules.handled_fs == 0 for rule in rules.paths)
    assert rules.scoped == (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    assert rights_json(abi)["fsMissing"] == list(missing)


def test_ports_handle_tcp_connect_only() -> None:
    """Listed ports: connect is handled (bind is not), and only those ports are allowed."""
    rules = build_ruleset(Sandbox(ports=(8080, 443, 443)), abi=4, writable=WRITABLE)
    assert (rules.handled_net, rules.ports) == (ACCESS_NET_CONNECT_TCP, (443, 8080))
    none = build_ruleset(Sandbox(ports=()), abi=4, writable=WRITABLE)
    assert (none.handled_net, none.ports) == (ACCESS_NET_CONNECT_TCP, ())


def test_ports_on_a_kernel_without_net_rules_are_refused() -> None:
    """Port rules are never dropped quietly: before ABI 4 the sandbox is refused."""
    with pytest.raises(SandboxUnavailable, match=r"needs Landlock ABI 4.*has ABI 3"):
        build_ruleset(Sandbox(ports=(443,)), abi=3, writable=WRITABLE)
    assert build_ruleset(Sandbox(), abi=3, writable=WRITABLE).handled_net == 0


def test_no_landlock_is_refused() -> None:
    """ABI 0 (no Landlock) builds no ruleset."""
    with pytest.raises(SandboxUnavailable):
        build_ruleset(Sandbox(), abi=0, writable=WRITABLE)


def test_read_allowlist_and_extra_writes_merge_per_path() -> None:
    """A read list replaces /, a path both read and written gets both, duplicates merge."""
    sandbox = Sandbox(read=("/usr", "/etc", "/work/branch/"), write=("~/.cache/x",))
    rules = build_ruleset(sandbox, abi=7, writable=WRITABLE)
    assert access_of(rules.paths, "/") == 0
    assert access_of(rules.paths, "/usr") == READ_ACCESS
    assert access_of(rules.paths, "/work/branch") == WRITE_ACCESS
    cache = os.path.expanduser("~/.cache/x")
    assert access_of(rules.paths, cache) == WRITE_ACCESS
    assert [r.path for r in rules.paths].count("/work/branch") == 1


def test_launcher_arguments_round_trip() -> None:
    """What the ruleset puts on the launcher's command line is what the launcher reads."""
    rules = build_ruleset(Sandbox(ports=(443,), write=("/with space",)), abi=7, writable=WRITABLE)
    argv = rules.command(["/bin/sh", "-c", "echo -- -p 1 /"])
    assert argv[:4] == [argv[0], "-I", "-S", _landlock.LAUNCHER]
    parsed = parse_rules(argv[4:])
    assert parsed.handled_fs == rules.handled_fs
    assert (parsed.handled_net, parsed.scoped) == (rules.handled_net, rules.scoped)
    assert parsed.paths == [(r.access, r.path) for r in rules.paths]
    assert parsed.ports == [443]
    assert parsed.command == ["/bin/sh", "-c", "echo -- -p 1 /"]


@pytest.mark.parametrize("argv", [[], ["-f", "ff"], ["-x", "1", "--", "true"], ["-p", "1"]])
def test_launcher_rejects_malformed_arguments(argv: list[str]) -> None:
    """No command, an unknown flag or a missing value is an error, never a guess."""
    with pytest.raises(ValueError):  # noqa: PT011
        parse_rules(argv)


def test_rules_on_files_keep_only_file_rights() -> None:
    """The kernel refuses directory rights on a file: the launcher keeps the file ones."""
    assert rule_access(WRITE_ACCESS, WRITE_ACCESS, is_dir=True) == WRITE_ACCESS
    assert rule_access(WRITE_ACCESS, WRITE_ACCESS, is_dir=False) == FILE_ACCESS
    assert rule_access(READ_ACCESS, ABI1, is_dir=False) == bits("execute", "read_file")


# --------------------------------------------------------------------------- values


def test_sandbox_paths_must_be_absolute_and_ports_real() -> None:
    """Relative paths, strings for lists and impossible ports are usage errors."""
    with pytest.raises(UsageError, match="absolute"):
        Sandbox(read=("usr",))
    with pytest.raises(UsageError, match="list of paths"):
        Sandbox(write="/tmp")
    for port in (0, 65536, True):
        with pytest.raises(UsageError, match="not a TCP port"):
            Sandbox(ports=(port,))
    assert Sandbox(home="~/h").home == os.path.expanduser("~/h")


def test_sandbox_json_round_trip() -> None:
    """The recorded form gives the same rules back."""
    sandbox = Sandbox(read=("/usr",), write=("/srv",), ports=(1, 2), home="/h")
    assert Sandbox.from_json(sandbox.to_json()) == sandbox
    assert Sandbox.from_json(Sandbox().to_json()) == Sandbox()


def test_choose_sandbox_most_specific_rules_and_no_turning_off() -> None:
    """Any layer confines; the most specific rules win; False never undoes another's True."""
    own, theirs, config = Sandbox(ports=(1,)), Sandbox(ports=(2,)), Sandbox(ports=(3,))
    assert choose_sandbox(None, False, None, rules=config) is None
    assert choose_sandbox(None, True, rules=config) is config
    assert choose_sandbox(True, None) == Sandbox()
    assert choose_sandbox(own, theirs, True, rules=config) is own
    assert choose_sandbox(True, theirs, rules=config) is theirs
    assert choose_sandbox(False, theirs) is theirs
    assert choose_sandbox(False, False, True, rules=config) is config


def test_confined_environment_points_home_and_temp_at_the_private_ones() -> None:
    """HOME, TMPDIR and the XDG directories move; the names the caller set on purpose stay."""
    env = confined_environment(
        {"HOME": "/root", "TMPDIR": "/tmp", "PATH": "/bin", "XDG_CONFIG_HOME": "/etc/x"},
        home="/h",
        tmp="/t",
        keep=("XDG_CONFIG_HOME",),
    )
    assert env["HOME"] == "/h" and env["PATH"] == "/bin"
    assert env["TMPDIR"] == env["TMP"] == env["TEMP"] == "/t"
    assert env["XDG_CACHE_HOME"] == "/h/.cache"
    assert env["XDG_CONFIG_HOME"] == "/etc/x"


# --------------------------------------------------------------------------- config and steps


def test_config_sandbox_tables(tmp_path: Path) -> None:
    """[sandbox] and an agent's sandbox table: rules with paths relative to the file."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[sandbox]\nenabled = false\nread = ["/usr", "lib"]\nports = [443]\n\n'
        '[agents.demo.sandbox]\nwrite = ["cache"]\n\n'
        "[agents.other]\ncommand = 'other'\nsandbox = true\n"
    )
    config = Config.from_file(path)
    assert config.sandboxed is False
    assert config.sandbox == Sandbox(read=("/usr", str(tmp_path / "lib")), ports=(443,))
    assert config.agents["demo"].sandbox == Sandbox(write=(str(tmp_path / "cache"),))
    assert config.agents["other"].sandbox is True
    on = Config.from_toml("sandbox = true\n")
    assert (on.sandboxed, on.sandbox) == (True, None)


def test_a_later_config_file_does_not_turn_the_sandbox_off() -> None:
    """A project file's `sandbox = false` leaves the user's sandbox on (its rules may change)."""
    user = Config.from_toml("sandbox = true\n[agents.demo]\nsandbox = true\n")
    project = Config.from_toml(
        "[sandbox]\nenabled = false\nports = [1]\n[agents.demo]\nsandbox = false\n", user
    )
    assert project.sandboxed is True
    assert project.sandbox == Sandbox(ports=(1,))
    assert project.agents["demo"].sandbox is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sandbox = 1\n", "sandbox: must be true, false or a table"),
        ("[sandbox]\nports = [70000]\n", "not a TCP port"),
        ("[sandbox]\nreads = []\n", "did you mean 'read'"),
        ("[sandbox]\nenabled = 'yes'\n", "sandbox.enabled: must be true or false"),
        ("[agents.demo.sandbox]\nenabled = true\n", "agents.demo.sandbox.enabled: unknown key"),
    ],
)
def test_config_sandbox_errors_name_the_key(text: str, message: str) -> None:
    """Bad sandbox settings are usage errors naming the file and the key."""
    with pytest.raises(UsageError, match=message):
        Config.from_toml(text, source="c.toml")


def test_step_sandbox_is_for_agent_steps() -> None:
    """A Python step has no process to confine; the value must be a bool or a Sandbox."""
    with pytest.raises(UsageError, match="sandbox only applies to agent steps"):

        @step(sandbox=True)
        def python_step() -> None: ...

    with pytest.raises(UsageError, match="sandbox must be None, True, False or a Sandbox"):
        step(agent="demo", sandbox=cast(Any, "yes"))(_task)

    @step(agent="demo", sandbox=Sandbox(ports=(443,)))
    def confined() -> str:
        return "go"

    node = Pipeline.from_steps([confined]).to_json()["nodes"][0]
    assert node["sandbox"]["ports"] == [443]


def test_resume_restores_or_replaces_the_recorded_sandbox() -> None:
    """A recorded sandbox is restored; a resume's own replaces it; none comes from the config."""
    rules = Sandbox(ports=(443,))
    recorded = RunSettings(sandbox=rules).to_json()
    config = Config.builtin()
    kept = restore_settings(recorded, config)
    assert (kept.settings.sandbox, kept.restored[-1]) == (rules, "sandbox")
    again = restore_settings(recorded, config, sandbox=True)  # True keeps the recorded rules
    assert again.settings.sandbox == rules
    other = restore_settings(recorded, config, sandbox=Sandbox())
    assert (other.settings.sandbox, "sandbox" in other.overridden) == (Sandbox(), True)
    plain = RunSettings().to_json()
    assert restore_settings(plain, config).settings.sandbox is None
    turned_on = restore_settings(plain, config, sandbox=True)
    assert (turned_on.settings.sandbox, "sandbox" in turned_on.overridden) == (Sandbox(), True)
    by_config = restore_settings(plain, Config.from_toml("sandbox = true\n"))
    assert by_config.settings.sandbox == Sandbox()


# --------------------------------------------------------------------------- refusals


def no_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel probe answers as a kernel built without Landlock does."""
    monkeypatch.setattr(
        "orchestrator.sandbox.abi_version",
        lambda: (0, "this kernel has no Landlock (landlock_create_ruleset: ENOSYS)"),
    )


async def test_library_refuses_before_recording_or_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    """prompt(sandbox=True) without Landlock: SandboxUnavailable, no run, no agent process."""
    no_landlock(monkeypatch)
    record = tmp_path / "record.jsonl"
    script = AgentScript(turns=(Turn(steps=(Say("hi"),)),), record_path=str(record))
    spec = AgentSpec("agent", tuple(scripted_agent_command(script, tmp_path)))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(SandboxUnavailable, match="cannot confine agents: this kernel has no"):
        await prompt(spec, "hi", cwd=workspace, sandbox=True)
    assert await list_runs() == []
    await trio.lowlevel.checkpoint()
    assert not record.exists()


async def test_an_agent_that_asks_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    """An agent whose spec asks for a sandbox is refused the same way, run flag or not."""
    no_landlock(monkeypatch)
    script = AgentScript(turns=(Turn(steps=(Say("hi"),)),))
    spec = AgentSpec("agent", tuple(scripted_agent_command(script, tmp_path)), sandbox=True)
    with pytest.raises(SandboxUnavailable):
        await prompt(spec, "hi", cwd=tmp_path)
    assert await list_runs() == []


async def test_ports_on_an_older_kernel_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    """Port rules on a Landlock ABI 3 kernel: refused before the run, never dropped."""
    monkeypatch.setattr("orchestrator.sandbox.abi_version", lambda: (3, None))
    script = AgentScript(turns=(Turn(steps=(Say("hi"),)),))
    spec = AgentSpec("agent", tuple(scripted_agent_command(script, tmp_path)))
    with pytest.raises(SandboxUnavailable, match="TCP ports"):
        await prompt(spec, "hi", cwd=tmp_path, sandbox=Sandbox(ports=(443,)))
    assert await list_runs() == []


async def test_an_in_memory_agent_cannot_be_confined(tmp_path: Path, state_dir: Path) -> None:
    """The in-memory connector refuses a sandbox rather than run the agent unconfined."""
    pipe = Pipeline.from_steps([step(agent="a", sandbox=True)(_task)])
    connector = memory_connector(lambda spec: AgentScript(turns=(Turn(steps=(Say("x"),)),)))
    outcome = await run_pipeline(
        pipe,
        {"task": "go"},
        cwd=tmp_path,
        config=Config(agents={"a": AgentSpec("a", ("unused",))}),
        connector=connector,
    )
    assert outcome.status == "failed"
    assert "cannot be confined" in str(outcome.steps["_task"].error)


def _task(task: str) -> str:
    return task
