"""Real ACP agents from npm, run offline against the scripted model server.

Reusable pieces for tests that drive real agents (``test_real_agents.py``, and later
``compare`` and pipeline tests):

- :data:`QWEN`, :data:`CLAUDE`, :data:`GEMINI`: how each agent is installed, launched and configured
  (:meth:`RealAgent.spec` gives an :class:`AgentSpec` whose environment points the agent's
  model endpoint at the server, gives it a fresh HOME, and sets the proxy trap);
- :func:`require_installed`: skip with the reason when node or the agent is missing (a failure
  instead when ``$CI`` is set and npm exists);
- :func:`make_project` and the scenarios (:func:`task_scenario`, :func:`edit_scenario`,
  :func:`stall_scenario`): a small project and the scripted model turns that read, edit,
  write and run a command in it;
- :func:`permission_requests`, :func:`tagged_processes`, :class:`SocketWatch`: what the wire
  transcript, the process table and the agents' sockets say.

Installed by ``python tools/install_node_agents.py`` into ``.cache/node``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

import pytest
import trio
from attrs import define, field, frozen
from interop import node_cache_dir

from orchestrator.agents import AgentSpec
from orchestrator.policy import PolicySet
from orchestrator.testing.model_server import (
    Edit,
    ModelServer,
    Read,
    Reply,
    Scenario,
    Shell,
    Stall,
    Write,
)

__all__ = [
    "AGENTS",
    "CLAUDE",
    "EDIT_POLICY",
    "GEMINI",
    "PIPELINE_EDITED",
    "PIPELINE_FILES",
    "QWEN",
    "TAG_VAR",
    "Project",
    "RealAgent",
    "SocketWatch",
    "compare_scenario",
    "edit_scenario",
    "make_project",
    "permission_requests",
    "pipeline_marker",
    "pipeline_scenarios",
    "proxy_trap_env",
    "require_installed",
    "stall_scenario",
    "tagged_processes",
    "task_scenario",
    "write_policy_toml",
]

#: the variable that marks every process of one agent run (found again in /proc/*/environ)
TAG_VAR = "ORCHESTRATOR_TEST_AGENT_TAG"
_INSTALL_HINT = "install it with `python tools/install_node_agents.py`"


@frozen
class RealAgent:
    """One real agent: its npm package, how it is launched, and the environment it needs."""

    name: str
    package: str
    version: str
    #: the program in ``node_modules/.bin``
    bin: str
    #: arguments after the program
    args: tuple[str, ...]
    #: the model API it speaks to the server
    api: Literal["openai", "anthropic", "gemini"]
    #: seconds its start-up (``initialize`` and ``session/new``) may take
    startup_timeout: float = 120.0

    @property
    def program(self) -> Path:
        """The installed program (may be absent)."""
        return node_cache_dir() / "node_modules" / ".bin" / self.bin

    def installed_version(self) -> str | None:
        """The version installed in the node cache, or None."""
        manifest = node_cache_dir() / "node_modules" / Path(*self.package.split("/"))
        try:
            data = json.loads((manifest / "package.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) else None

    def missing(self) -> str | None:
        """Why the agent cannot run here, or None when it can."""
        if shutil.which("node") is None:
            return f"node is not on PATH: {self.name} cannot run"
        found = self.installed_version()
        if found is None or not self.program.exists():
            return f"{self.package}@{self.version} is not installed: {_INSTALL_HINT}"
        if found != self.version:
            return f"{self.package} {found} is installed, the tests need {self.version}: " + (
                _INSTALL_HINT
            )
        return None

    def command(self) -> tuple[str, ...]:
        """The argv that starts the agent in ACP mode."""
        return (str(self.program), *self.args)

    def prepare_home(self, home: Path) -> None:
        """Write the settings the agent reads from a fresh HOME (no login, no onboarding)."""
        home.mkdir(parents=True, exist_ok=True)
        if self.name == "qwen":
            settings = {
                "security": {"auth": {"selectedType": "openai"}},
                "model": {"name": "scripted-model"},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            }
            (home / ".qwen").mkdir(exist_ok=True)
            (home / ".qwen" / "settings.json").write_text(json.dumps(settings, indent=2))
        elif self.name == "claude":
            # the keys Claude Code checks before its first-run screens (read from its cli.js)
            state = {
                "hasCompletedOnboarding": True,
                "lastOnboardingVersion": "2.1.44",
                "customApiKeyResponses": {"approved": [CLAUDE_KEY[-20:]], "rejected": []},
            }
            (home / ".claude.json").write_text(json.dumps(state, indent=2))
        elif self.name == "gemini":
            # the keys Gemini CLI reads before its auth dialog, telemetry, update check and
            # trust prompt (read from its bundle); a fixed model skips the model router
            settings = {
                "security": {
                    "auth": {"selectedType": "gemini-api-key"},
                    "folderTrust": {"enabled": False},
                },
                "model": {"name": GEMINI_MODEL},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
                "ide": {"enabled": False},
                "tools": {"useRipgrep": False},
            }
            (home / ".gemini").mkdir(exist_ok=True)
            (home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2))

    def environment(self, server: ModelServer, home: Path, *, tag: str = "") -> dict[str, str]:
        """Variables for the agent: the model endpoint, a fresh HOME, the proxy trap, a tag."""
        env = {"HOME": str(home), **proxy_trap_env(server), TAG_VAR: tag or uuid.uuid4().hex}
        # the agents must not find the developer's configuration or credentials
        env["XDG_CONFIG_HOME"] = str(home / ".config")
        if self.name == "qwen":
            env.update(
                OPENAI_BASE_URL=f"{server.url}/v1",
                OPENAI_API_KEY="sk-scripted-model-server",
                OPENAI_MODEL="scripted-model",
            )
        elif self.name == "claude":
            env.update(
                ANTHROPIC_BASE_URL=server.url,  # the SDK appends /v1 itself
                ANTHROPIC_API_KEY=CLAUDE_KEY,
                IS_SANDBOX="1",  # we may run as root; the adapter refuses bypass mode otherwise
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                DISABLE_AUTOUPDATER="1",
                CLAUDE_CONFIG_DIR=str(home / ".claude"),
            )
        elif self.name == "gemini":
            env.update(
                GOOGLE_GEMINI_BASE_URL=server.url,  # the SDK appends /v1beta itself
                GEMINI_API_KEY="scripted-model-server",
                GEMINI_CLI_NO_RELAUNCH="true",  # no second node process for a larger heap
            )
        return env

    def spec(
        self, server: ModelServer, home: Path, *, tag: str = "", label: str | None = None
    ) -> AgentSpec:
        """An :class:`AgentSpec` for the library API, with HOME prepared."""
        self.prepare_home(home)
        return AgentSpec(
            label or self.name,
            self.command(),
            env=self.environment(server, home, tag=tag),
            description=f"{self.package}@{self.version} against the scripted model server",
            startup_timeout=self.startup_timeout,
        )


CLAUDE_KEY = "sk-ant-scripted-model-server-0000"

QWEN = RealAgent(
    "qwen",
    "@qwen-code/qwen-code",
    "0.24.4",
    "qwen",
    ("--acp", "--auth-type", "openai", "--approval-mode", "default"),
    "openai",
)
CLAUDE = RealAgent(
    "claude", "@zed-industries/claude-code-acp", "0.16.2", "claude-code-acp", (), "anthropic"
)
GEMINI = RealAgent(
    "gemini", "@google/gemini-cli", "0.61.0", "gemini", ("--acp",), "gemini", startup_timeout=180.0
)
GEMINI_MODEL = "gemini-2.5-flash"
AGENTS = (QWEN, CLAUDE, GEMINI)


def require_installed(agent: RealAgent) -> None:
    """Skip the test when the agent cannot run; with ``$CI`` and npm present, fail instead."""
    reason = agent.missing()
    if reason is None:
        return
    if os.environ.get("CI") and shutil.which("npm") is not None:
        pytest.fail(f"CI with npm but {reason}")
    pytest.skip(reason)


def proxy_trap_env(server: ModelServer) -> dict[str, str]:
    """Every proxy variable pointing at the server (which refuses to proxy), except loopback.

    Whatever a client sends through a proxy lands in :attr:`ModelServer.refused` instead of
    leaving the machine; the model endpoint itself (127.0.0.1) is reached directly.
    """
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = server.url
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


# --------------------------------------------------------------------------- the project


@frozen
class Project:
    """The small project the agents work on, and what the task changes in it."""

    root: Path

    #: file -> content before the task
    FILES: ClassVar[Mapping[str, str]] = {
        "greet.py": 'def greet(name):\n    return "Hello, " + name\n',
        "README.md": "# Demo\n\nSays hello.\n",
    }
    #: after the task
    EDITED: ClassVar[str] = 'def greet(name):\n    return "Hi, " + name\n'
    NEW_FILE: ClassVar[str] = "NOTES.md"
    NEW_CONTENT: ClassVar[str] = "# Notes\n\nWritten by a real agent.\n"
    #: the command run, and the line only its output contains (not the command itself)
    COMMAND: ClassVar[str] = "printf 'ran-%s\\n' terminal-42"
    OUTPUT: ClassVar[str] = "ran-terminal-42"

    def snapshot(self) -> dict[str, str]:
        """Every file under the root and its content."""
        return {
            str(p.relative_to(self.root)): p.read_text("utf-8")
            for p in sorted(self.root.rglob("*"))
            if p.is_file()
        }


def make_project(root: Path) -> Project:
    """Create the project under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in Project.FILES.items():
        (root / name).write_text(content, "utf-8")
    return Project(root)


def task_scenario(marker: str = "RA-TASK") -> Scenario:
    """Read greet.py, edit it, write NOTES.md, run a command, answer."""
    return Scenario(
        marker,
        (
            Read("greet.py"),
            Edit("greet.py", '"Hello, "', '"Hi, "'),
            Write(Project.NEW_FILE, Project.NEW_CONTENT),
            Shell(Project.COMMAND, "print a marker line"),
            Reply("Task complete."),
        ),
    )


def edit_scenario(marker: str = "RA-EDIT") -> Scenario:
    """Read greet.py and edit it, then answer (for the reject test).

    The read comes first: agents refuse to edit a file the model has not read.
    """
    edit = Edit("greet.py", '"Hello, "', '"Hi, "')
    return Scenario(marker, (Read("greet.py"), edit, Reply("Stopped here.")))


def compare_scenario(author: str, marker: str = "RA-COMPARE") -> Scenario:
    """Read greet.py, edit it, write NOTES.md, answer; the edits name ``author``.

    A comparison gives each agent its own server playing this with its own name, so that the
    branches differ and applying one of them is visible.
    """
    return Scenario(
        marker,
        (
            Read("greet.py"),
            Edit("greet.py", '"Hello, "', f'"Hi from {author}, "'),
            Write(Project.NEW_FILE, f"# Notes\n\nWritten by {author}.\n"),
            Reply(f"{author} finished."),
        ),
    )


#: the modules a pipeline fans out over, and their content before and after the edit
PIPELINE_FILES: Mapping[str, str] = {
    "mod_a.py": 'GREETING = "Hello"\n',
    "mod_b.py": 'GREETING = "Hello"\n',
}
PIPELINE_EDITED = 'GREETING = "Hi"\n'


def pipeline_marker(item: str) -> str:
    """The scenario marker of the pipeline's instance for file ``item``."""
    return f"RA-PIPE-{item}"


def pipeline_scenarios() -> list[Scenario]:
    """One scenario per file of :data:`PIPELINE_FILES`: read it, edit it, answer."""
    return [
        Scenario(
            pipeline_marker(name),
            (Read(name), Edit(name, '"Hello"', '"Hi"'), Reply(f"Edited {name}.")),
        )
        for name in PIPELINE_FILES
    ]


def stall_scenario(marker: str = "RA-STALL") -> Scenario:
    """A model answer that starts streaming and never ends (for cancel tests)."""
    return Scenario(marker, (Stall("Working on it"),))


#: allow the task's edits and its one command for every agent (Claude's adapter sends no
#: ``kind`` in its permission requests, so the rules match on paths and the command); reads
#: and searches by the read-only preset; the rest is rejected
EDIT_POLICY: dict[str, object] = {
    "preset": "read-only",
    "rules": [
        {"name": "project-files", "verdict": "allow", "paths": ["**"]},
        {"name": "printf", "verdict": "allow", "command": ["printf"]},
    ],
}


def edit_policy() -> PolicySet:
    """:data:`EDIT_POLICY` as a policy set."""
    return PolicySet.from_mapping(EDIT_POLICY)


def write_policy_toml(path: Path) -> Path:
    """:data:`EDIT_POLICY` as a TOML file for the command line's ``--policy``."""
    path.write_text(
        'preset = "read-only"\n\n'
        '[[rules]]\nname = "project-files"\nverdict = "allow"\npaths = ["**"]\n\n'
        '[[rules]]\nname = "printf"\nverdict = "allow"\ncommand = ["printf"]\n',
        "utf-8",
    )
    return path


# --------------------------------------------------------------------------- evidence


def transcript_frames(path: Path) -> list[dict[str, object]]:
    """The ND-JSON transcript's lines."""
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def permission_requests(path: Path) -> list[dict[str, object]]:
    """The ``session/request_permission`` requests the agent sent, from a transcript."""
    out = []
    for frame in transcript_frames(path):
        msg = frame.get("msg")
        if (
            frame.get("dir") == "recv"
            and isinstance(msg, dict)
            and msg.get("method") == "session/request_permission"
        ):
            out.append(msg)
    return out


def received_methods(path: Path) -> list[str]:
    """The methods of every request and notification the agent sent, in order."""
    out = []
    for frame in transcript_frames(path):
        msg = frame.get("msg")
        if frame.get("dir") == "recv" and isinstance(msg, dict) and "method" in msg:
            out.append(str(msg["method"]))
    return out


def tagged_processes(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``TAG_VAR=tag``."""
    needle = f"{TAG_VAR}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except OSError:
        pass
    return inodes


def _remote_addresses(pid: int, inodes: set[str]) -> set[str]:
    """Remote IP addresses of the TCP sockets among ``inodes`` (from /proc/PID/net/tcp*)."""
    out = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[9] not in inodes:
                continue
            remote_hex = fields[2].split(":")[0]
            if remote_hex == "0" * width:
                continue  # a listening socket
            out.add(_ip_from_hex(remote_hex))
    return out


def _ip_from_hex(value: str) -> str:
    raw = bytes.fromhex(value)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6 in /proc is four little-endian 32-bit words
    address = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(address.ipv4_mapped or address)


@define
class SocketWatch:
    """Samples the TCP peers of every process carrying a tag while a test runs.

    Best effort (a connection that opens and closes between samples is missed); the proxy
    trap is the exact proof, this is the second look.
    """

    tag: str
    interval: float = 0.1
    peers: set[str] = field(factory=set)
    #: every tagged process seen (proves the tag finds the agent's processes)
    pids: set[int] = field(factory=set)
    samples: int = 0

    def sample(self) -> None:
        """Record the peers of the tagged processes now."""
        for pid in tagged_processes(self.tag):
            self.pids.add(pid)
            self.peers |= _remote_addresses(pid, _socket_inodes(pid))
        self.samples += 1

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            await trio.to_thread.run_sync(self.sample)
            await trio.sleep(self.interval)

    @property
    def off_machine(self) -> set[str]:
        """Peers that are not loopback addresses."""
        return {p for p in self.peers if not ipaddress.ip_address(p).is_loopback}
