"""The hostile-agent kit against the orchestrator: every attack holds, and the probe sees holes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import as_json, run_cli

from orchestrator.errors import UsageError
from orchestrator.testing import Say, WriteDisk
from orchestrator.testing.hostile import ATTACKS, Attack, AttackResult, Layout, probe_policy

#: attacks that only a sandbox holds (the agent process itself is not confined without one)
SANDBOX = [a.name for a in ATTACKS.values() if a.needs == "sandbox"]
#: attacks that take seconds (a flood, a large file, a timeout)
HEAVY = {"request-flood", "chunk-flood", "huge-file", "hang", "deep-path", "deep-workspace"}
UNCONFINED = [
    pytest.param(a.name, marks=pytest.mark.slow) if a.name in HEAVY else a.name
    for a in ATTACKS.values()
    if a.needs != "sandbox"
]
TERMINAL = [a.name for a in ATTACKS.values() if a.needs == "terminal"]
#: terminal attacks that must hold even when every command is allowed
ANY_COMMAND = ["terminal-daemon", "terminal-secrets", "output-flood"]

NARROW = """\
[[rules]]
name = "echo and ls"
verdict = "allow"
kinds = ["execute"]
commands = ["echo", "ls"]
"""


def _held(result: AttackResult) -> None:
    assert result.held, result.summary()
    assert not result.left and not result.failures


@pytest.mark.parametrize("attack", UNCONFINED)
async def test_every_attack_holds_under_the_default_policy(attack: str) -> None:
    """Under the default policy (reject everything) each attack holds."""
    (result,) = await probe_policy(None, [attack])
    _held(result)


@pytest.mark.parametrize("attack", UNCONFINED)
async def test_every_attack_holds_under_edit(attack: str) -> None:
    """Under the ``edit`` preset (edits in the workspace allowed) each attack holds."""
    (result,) = await probe_policy("edit", [attack])
    _held(result)


@pytest.mark.parametrize("attack", TERMINAL)
async def test_terminal_attacks_hold_under_a_narrow_policy(attack: str, tmp_path: Path) -> None:
    """A policy allowing only echo and ls: no evasion, variable or daemon gets past it."""
    policy = tmp_path / "narrow.toml"
    policy.write_text(NARROW)
    (result,) = await probe_policy(policy, [attack])
    _held(result)


@pytest.mark.parametrize("attack", ANY_COMMAND)
async def test_terminal_attacks_that_hold_whatever_the_policy(attack: str) -> None:
    """Even under ``trusted`` (every command allowed) daemons are reaped, secrets stay out of
    terminals and output floods stay bounded."""
    (result,) = await probe_policy("trusted", [attack])
    _held(result)


@pytest.mark.parametrize("attack", SANDBOX)
async def test_the_sandbox_holds_the_agent_process(attack: str) -> None:
    """With a sandbox, the agent process itself cannot write outside its branch."""
    (result,) = await probe_policy(None, [attack], sandbox=True)
    _held(result)


async def test_the_probe_detects_a_hole() -> None:
    """Under ``trusted`` the evasion's program runs: the probe reports it, not held."""
    (result,) = await probe_policy("trusted", ["shell-evasion"])
    assert not result.held
    assert result.status == "succeeded"
    assert any("program the policy should have refused ran" in f for f in result.failures)
    assert "execute-semicolon" in result.granted
    assert not result.left


async def test_without_a_sandbox_the_agent_process_writes_outside() -> None:
    """The agent process is not confined without a sandbox: the probe says what it wrote."""
    (result,) = await probe_policy(None, ["agent-writes-outside"])
    assert not result.held
    assert any("by-agent.txt" in f for f in result.failures)


async def test_your_own_attack_through_the_probe(tmp_path: Path) -> None:
    """An Attack of your own runs like the catalogue's, on a copy of your workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "keep.txt").write_text("mine\n")

    def steps(layout: Layout) -> tuple[Say | WriteDisk, ...]:
        return (WriteDisk("made.txt", "by the agent\n"), Say("done"))

    mine = Attack(
        "my-attack",
        "writes a file itself, and claims another",
        "recording",
        "what it made is recorded",
        steps,
        must_record=("made.txt", "never-made.txt"),
    )
    (result,) = await probe_policy(None, [mine], workspace=workspace, state_dir=tmp_path / "st")
    assert result.status == "succeeded"
    assert result.failures == (
        "succeeded without recording a change the agent made: never-made.txt",
    )
    assert (workspace / "keep.txt").read_text() == "mine\n"  # only the copy was applied to
    assert not (workspace / "made.txt").exists()
    assert (tmp_path / "st" / "runs").is_dir()


async def test_an_unknown_attack_is_a_usage_error() -> None:
    """Naming an attack the catalogue lacks raises UsageError before anything runs."""
    with pytest.raises(UsageError, match="unknown attack 'nope'"):
        await probe_policy(None, ["nope"])


def test_the_catalogue_describes_each_attack() -> None:
    """Every attack has a name, a description, what it probes and how to tell it held."""
    assert len(ATTACKS) >= 20
    for name, attack in ATTACKS.items():
        assert attack.name == name
        assert attack.description and attack.probes and attack.held_when


def test_list_names_every_attack() -> None:
    """``python -m orchestrator.testing.hostile --list`` prints one line per attack."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.testing.hostile", "--list"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    lines = done.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines] == list(ATTACKS)


def test_an_unknown_attack_on_the_command_line_exits_2() -> None:
    """The agent refuses to start without a known attack, naming them."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.testing.hostile", "nope"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"path-dotdot" in done.stderr


async def test_as_an_agent_command_line_it_says_what_it_saw(
    tmp_path: Path, state_dir: Path
) -> None:
    """Through ``orchestrator prompt --agent "python -m orchestrator.testing.hostile ..."`` the
    agent ends its turn with its verdict: held so far, or what got through."""
    agent = f"{sys.executable} -m orchestrator.testing.hostile --root {tmp_path / 'attacks'}"
    held = await run_cli(
        "prompt", "--agent", f"{agent} path-dotdot", "--json", "x", cwd=tmp_path, state=state_dir
    )
    assert held.returncode == 0, held.stderr
    assert "hostile path-dotdot: held so far" in as_json(held)["text"]
    hole = await run_cli(
        "prompt",
        "--agent",
        f"{agent} shell-evasion",
        "--policy",
        "trusted",
        "--json",
        "x",
        cwd=tmp_path,
        state=state_dir,
    )
    assert hole.returncode == 0, hole.stderr
    text = as_json(hole)["text"]
    assert "hostile shell-evasion: NOT HELD" in text
    assert "a program the policy should have refused ran" in text
