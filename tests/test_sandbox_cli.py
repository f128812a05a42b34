"""``--sandbox`` end to end: a hostile agent and its terminal commands confined by the kernel.

The console script runs as a subprocess with a HOME of its own, against a scripted agent (a
subprocess) that writes outside its branch directory, into a directory beside the workspace and
into the user's HOME, itself and through a terminal command whose script the policy cannot see
into. Under ``--sandbox`` Landlock refuses those writes (EACCES) and the turn goes on; without it
they land, which is what the sandbox is for. A kernel without Landlock is simulated with a
seccomp filter (``helpers/no_landlock.py``) that makes its system calls fail as they do there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from attrs import frozen
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    landlock_missing,
    record_events,
    write_agent,
)

from orchestrator.testing import ErrorReply, Say, Terminal, Turn, WriteDisk

EXIT_OK, EXIT_USAGE = 0, 2
NO_LANDLOCK = Path(__file__).parent / "helpers" / "no_landlock.py"


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
    pytest.mark.skipif(landlock_missing() is not None, reason=str(landlock_missing())),
]


@frozen
class Scene:
    """The places of a hostile run: the workspace, what lies outside it, the agent's files."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def outside(self) -> Path:
        """A directory next to the workspace."""
        return self.root / "outside"

    @property
    def home(self) -> Path:
        """The HOME of the orchestrator's process (the user's)."""
        return self.root / "home"

    @property
    def agents(self) -> Path:
        """Where the agent's script and its record live (made writable by the config)."""
        return self.root / "agents"

    @property
    def record(self) -> Path:
        return self.agents / "hostile.jsonl"

    @property
    def escapes(self) -> list[Path]:
        """Every file the agent and its terminal command try to create outside the branch."""
        return [
            self.outside / "agent.txt",
            self.home / "agent.txt",
            self.outside / "terminal.txt",
            self.home / "terminal.txt",
        ]


def hostile_turn(scene: Scene) -> Turn:
    """Writes outside the branch (itself, then a terminal command), then inside; then answers."""
    script = (
        f"echo escaped > {scene.outside / 'terminal.txt'}\n"
        f"echo escaped > {scene.home / 'terminal.txt'}\n"
        'echo own > "$HOME/own.txt" && echo home-is-writable\n'
        "echo kept > term.txt\n"
    )
    return Turn(
        steps=(
            WriteDisk(str(scene.outside / "agent.txt"), "escaped"),
            WriteDisk(str(scene.home / "agent.txt"), "escaped"),
            WriteDisk("inside.txt", "kept\n"),
            # the policy sees `/bin/sh escape.sh`, never the paths the script writes to
            WriteDisk("escape.sh", script),
            Terminal("/bin/sh", args=("escape.sh",)),
            Say("done"),
        )
    )


def make_scene(tmp_path: Path, turn: Turn | None = None) -> Scene:
    """The directories, the agent's script (``turn``, else the hostile one), and a user config
    naming the agent."""
    scene = Scene(tmp_path)
    for directory in (scene.workspace, scene.outside, scene.home, scene.agents):
        directory.mkdir()
    (scene.workspace / "a.txt").write_text("a\n")
    script = write_agent(scene.agents / "hostile.json", turn or hostile_turn(scene))
    (scene.root / "config.toml").write_text(
        # rules for when a run asks for a sandbox: the agent's record is written beside it
        f"[sandbox]\nenabled = false\nwrite = [{json.dumps(str(scene.agents))}]\n\n"
        f"[agents.hostile]\ncommand = {json.dumps(agent_command(script))}\n"
    )
    return scene


async def orchestrator(
    scene: Scene, *args: str, wrap: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    """The console script (behind ``wrap``, if any), with the scene's HOME, config and state."""
    env = {
        **os.environ,
        "HOME": str(scene.home),
        "ORCHESTRATOR_CONFIG": str(scene.root / "config.toml"),
        "ORCHESTRATOR_STATE_DIR": str(scene.root / "state"),
    }
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [*wrap, str(CLI), *args],
            cwd=scene.root,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def events(scene: Scene, kind: str) -> list[dict[str, Any]]:
    """The agent's recorded events of one kind."""
    return [e for e in record_events(scene.record) if e["event"] == kind]


PROMPT = ("prompt", "--agent", "hostile", "--policy", "trusted", "--cwd", "ws", "--json")


async def test_sandboxed_agent_cannot_write_outside_its_branch(tmp_path: Path) -> None:
    """Under --sandbox the kernel refuses the writes outside; the turn goes on and is applied."""
    scene = make_scene(tmp_path)
    done = await orchestrator(scene, *PROMPT, "--sandbox", "--apply", "go")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert (result["status"], result["stopReason"], result["text"]) == (
        "succeeded",
        "end_turn",
        "done",
    )
    assert [p for p in scene.escapes if p.exists()] == []
    writes = {e["path"]: e.get("error") for e in events(scene, "disk_write")}
    for path in (scene.outside / "agent.txt", scene.home / "agent.txt"):
        assert str(writes[str(path)]).startswith("[Errno 13] Permission denied"), writes
    [terminal] = events(scene, "terminal")
    assert terminal["exitStatus"] == {"exitCode": 0}
    output = terminal["output"]
    assert output.count("Permission denied") == 2, output
    assert "home-is-writable" in output  # its own HOME, which is not the user's
    # what it wrote in its branch, itself and through the terminal, was harvested and applied
    assert (scene.workspace / "inside.txt").read_text() == "kept\n"
    assert (scene.workspace / "term.txt").read_text() == "kept\n"
    assert result["applied"] is True
    sandbox = result["sandbox"]
    assert sandbox["landlockAbi"] >= 1
    rules = sandbox["confined"]["prompt"]["hostile"]
    assert rules["write"] == [str(scene.agents)]
    assert (rules["read"], rules["ports"]) == (["/"], None)
    assert rules["home"] == str(scene.root / "state" / "sandbox" / "hostile" / "home")
    shown = await orchestrator(scene, "show", result["runId"])
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    lines = shown.stdout.decode().splitlines()
    assert f"sandbox: Landlock ABI {sandbox['landlockAbi']}" in lines
    assert any(line.startswith("  prompt/hostile: writes its branch") for line in lines), lines


async def test_without_sandbox_the_same_writes_land(tmp_path: Path) -> None:
    """The control: unconfined, the agent and its terminal command write outside its branch."""
    scene = make_scene(tmp_path)
    done = await orchestrator(scene, *PROMPT, "go")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert [p for p in scene.escapes if not p.exists()] == []
    assert as_json(done)["sandbox"] is None


@pytest.mark.parametrize("error", ["ENOSYS", "EOPNOTSUPP"])
async def test_kernel_without_landlock_refuses_before_any_agent_starts(
    tmp_path: Path, error: str
) -> None:
    """No Landlock (or disabled): one line, exit 2, no run recorded, the agent never started."""
    scene = make_scene(tmp_path)
    wrap = (sys.executable, str(NO_LANDLOCK), error, "--")
    done = await orchestrator(scene, *PROMPT, "--sandbox", "go", wrap=wrap)
    assert done.returncode == EXIT_USAGE
    err = done.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("orchestrator: error: cannot confine agents: ")
    assert "Landlock" in err
    assert as_json(done)["error"]["type"] == "SandboxUnavailable"
    assert not scene.record.exists()  # the agent never ran
    listed = await orchestrator(scene, "runs", "--json")
    assert as_json(listed)["runs"] == []
    # the same machine without --sandbox runs the agent as before
    plain = await orchestrator(scene, *PROMPT, "go", wrap=wrap)
    assert plain.returncode == EXIT_OK, plain.stderr.decode()


def check_confined(scene: Scene, result: dict[str, Any], step: str) -> None:
    """The hostile turn ran confined: nothing outside, its branch writes kept, recorded so."""
    assert [p for p in scene.escapes if p.exists()] == []
    assert "hostile" in result["sandbox"]["confined"][step]
    [terminal] = events(scene, "terminal")
    assert terminal["output"].count("Permission denied") == 2, terminal["output"]


async def failed_then_hostile(scene: Scene, *flags: str) -> str:
    """A prompt whose turn fails (the run can be resumed); the agent is hostile from then on."""
    done = await orchestrator(scene, *PROMPT, *flags, "go")
    assert done.returncode == 1, done.stderr.decode()
    write_agent(scene.agents / "hostile.json", hostile_turn(scene))
    return str(as_json(done)["runId"])


async def test_resume_keeps_the_recorded_sandbox(tmp_path: Path) -> None:
    """A run started with --sandbox is resumed confined, without being told again."""
    scene = make_scene(tmp_path, Turn(error=ErrorReply(-32603, "model unavailable")))
    run_id = await failed_then_hostile(scene, "--sandbox")
    done = await orchestrator(scene, "resume", run_id, "--json")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    check_confined(scene, result, "prompt")
    assert "sandbox" in result["restored"]["restored"]


async def test_resume_with_sandbox_confines_a_run_that_was_not(tmp_path: Path) -> None:
    """resume --sandbox confines the agents of a run started without it, and records that."""
    scene = make_scene(tmp_path, Turn(error=ErrorReply(-32603, "model unavailable")))
    run_id = await failed_then_hostile(scene)
    done = await orchestrator(scene, "resume", run_id, "--sandbox", "--json")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    check_confined(scene, result, "prompt")
    assert "sandbox" in result["restored"]["overridden"]
    shown = as_json(await orchestrator(scene, "show", run_id, "--json"))
    assert shown["sandbox"] == result["sandbox"]


async def test_compare_confines_the_agent_and_its_verify_command(tmp_path: Path) -> None:
    """compare --sandbox: the verify command runs what the agent wrote, confined likewise."""
    scene = make_scene(tmp_path)
    verify = f"echo escaped > {scene.outside / 'verify.txt'}; cat inside.txt"
    done = await orchestrator(
        scene,
        *("compare", "--agent", "hostile", "--policy", "trusted", "--cwd", "ws", "--json"),
        *("--sandbox", "--verify", verify, "go"),
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    check_confined(scene, result, "compare")
    assert not (scene.outside / "verify.txt").exists()
    [agent] = result["agents"]
    assert "Permission denied" in agent["verify"]["output"]
    assert agent["verify"]["output"].endswith("kept")  # it read the agent's branch


PIPELINE = """\
from orchestrator import step


@step(agent="hostile", sandbox=True)
def edit(task: str) -> str:
    return task
"""


async def test_a_step_asks_for_the_sandbox_itself(tmp_path: Path) -> None:
    """@step(sandbox=True) confines its agent in a run that was not asked to."""
    scene = make_scene(tmp_path)
    (scene.root / "pipe.py").write_text(PIPELINE)
    done = await orchestrator(
        scene, "run", "pipe.py", "--set", "task=go", "--policy", "trusted", "--cwd", "ws", "--json"
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    check_confined(scene, result, "edit")
    assert result["graph"]["nodes"][0]["sandbox"] is True
