"""Tests of agent specs: known names, command lines, NAME=COMMAND labels, the table, profiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest

from orchestrator._agentlabels import package_runner
from orchestrator.agents import (
    KNOWN_AGENTS,
    WRITE_MODES,
    AgentNeeds,
    AgentSpec,
    builtin_agents,
    label_agents,
    resolve_agent,
)
from orchestrator.errors import UnknownAgent, UsageError
from orchestrator.mcp import McpServer
from orchestrator.sandbox import Sandbox


def test_known_name_gives_its_spec() -> None:
    """A known name resolves to the built-in launch command."""
    assert resolve_agent("claude") == KNOWN_AGENTS["claude"]


def test_demo_agent_runs_with_this_interpreter() -> None:
    """The built-in demo agent is always known and runs with the current Python."""
    spec = resolve_agent("demo")
    assert spec.command[0] == sys.executable
    assert spec.command[1:] == ("-m", "orchestrator.demo")


def test_command_line_is_split_without_a_shell() -> None:
    """A command line is split like a shell would, into an argv."""
    spec = resolve_agent("npx -y '@scope/some agent' --acp")
    assert spec.command == ("npx", "-y", "@scope/some agent", "--acp")
    assert spec.name == "some-agent"  # a label is safe in keys and file names


def test_label_equals_command() -> None:
    """NAME=COMMAND labels a command line, and can relabel a known agent."""
    assert resolve_agent("mine=python agent.py") == AgentSpec("mine", ("python", "agent.py"))
    relabelled = resolve_agent("fast=claude")
    assert relabelled.name == "fast"
    assert relabelled.command == KNOWN_AGENTS["claude"].command


def test_known_name_colon_model_runs_that_model_under_its_own_label() -> None:
    """NAME:MODEL of a known agent is that agent on MODEL, labelled NAME:MODEL (or LABEL=)."""
    sonnet = resolve_agent("claude:sonnet")
    assert (sonnet.name, sonnet.model) == ("claude:sonnet", "sonnet")
    assert sonnet.command == KNOWN_AGENTS["claude"].command
    fast = resolve_agent("fast=claude:opus")
    assert (fast.name, fast.model, fast.command) == ("fast", "opus", sonnet.command)
    # two models of one agent are two agents of a run, labelled apart
    labels = label_agents(["claude:sonnet", "claude:opus", "claude"])
    assert [(s.name, s.model) for s in labels] == [
        ("claude:sonnet", "sonnet"),
        ("claude:opus", "opus"),
        ("claude", None),
    ]


@pytest.mark.parametrize(
    "text",
    ["python x.py", "python tools/a:b.py", "nosuchagent:big", "node:20 agent.js"],
)
def test_a_colon_outside_a_known_name_keeps_the_command_line(text: str) -> None:
    """Only a known name takes :MODEL; any other text with a colon stays a command line."""
    spec = resolve_agent(text)
    assert spec.model is None
    assert spec.command == tuple(text.split())


def test_equals_inside_an_argument_is_not_a_label() -> None:
    """An '=' after a space or slash belongs to the command, not to a label."""
    spec = resolve_agent("/usr/bin/env FOO=1 agent")
    assert spec.command == ("/usr/bin/env", "FOO=1", "agent")


@pytest.mark.parametrize("text", ["", "   ", "bad 'quote"])
def test_bad_agent_text_is_a_usage_error(text: str) -> None:
    """Empty or unparsable --agent values are refused clearly."""
    with pytest.raises(UsageError):
        resolve_agent(text)


def test_relative_paths_in_the_command_are_made_absolute(tmp_path: Path) -> None:
    """An agent runs in its branch directory, so relative paths are resolved where typed."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "agent.py").write_text("")
    spec = resolve_agent("./venv/bin/python tools/agent.py --acp acp https://x/y missing/z")
    resolved = spec.resolved(tmp_path)
    assert resolved.command == (
        f"{tmp_path}/./venv/bin/python",
        f"{tmp_path}/tools/agent.py",
        "--acp",
        "acp",
        "https://x/y",
        "missing/z",
    )
    assert resolved.name == spec.name
    assert resolve_agent("claude").resolved(tmp_path) == KNOWN_AGENTS["claude"]


# --------------------------------------------------------------------------- the table

TABLE_AGENTS = [
    "claude",
    "codex",
    "gemini",
    "qwen",
    "opencode",
    "copilot",
    "auggie",
    "qoder",
    "kiro",
    "hermes",
    "openclaw",
]


def test_table_has_the_agents_the_readme_promises() -> None:
    """Every agent of the brief is known by its short name, and demo is not in the table."""
    assert list(KNOWN_AGENTS) == TABLE_AGENTS
    assert "demo" not in KNOWN_AGENTS
    assert list(builtin_agents()) == [*TABLE_AGENTS, "demo"]


@pytest.mark.parametrize("name", TABLE_AGENTS)
def test_table_entries_are_well_formed(name: str) -> None:
    """Each entry is keyed by its name, runs a program by name (no shell), and says how to
    install it and what it is."""
    spec = KNOWN_AGENTS[name]
    assert spec.name == name
    assert spec.command and all(arg and arg == arg.strip() for arg in spec.command)
    assert "/" not in spec.command[0]  # found on PATH, so `agents` can say "installed"
    assert spec.description and spec.install and spec.notes
    assert spec.writes in WRITE_MODES
    assert spec.sessions_per_process in (None, 1)
    assert spec.startup_timeout > 0 and spec.max_restarts >= 0
    assert spec.policy is None and spec.cwd is None
    # no environment but Qwen Code's own switch to connect MCP servers before session/new ends
    assert spec.env == ({"QWEN_CODE_LEGACY_MCP_BLOCKING": "1"} if name == "qwen" else {})


def test_claude_and_codex_adapters_serve_many_sessions_per_process() -> None:
    """The Claude and Codex adapters multiplex sessions; their npx packages are the new ones."""
    for name, package in (
        ("claude", "@agentclientprotocol/claude-agent-acp"),
        ("codex", "@agentclientprotocol/codex-acp"),
    ):
        spec = KNOWN_AGENTS[name]
        assert spec.sessions_per_process is None
        assert spec.command == ("npx", "-y", package)
        assert package in spec.install


def test_demo_stays_built_in_and_rule_based() -> None:
    """The demo agent keeps its command and is known even with a custom table."""
    spec = resolve_agent("demo", {})
    assert spec.command == (sys.executable, "-m", "orchestrator.demo")
    assert spec == builtin_agents()["demo"]


# --------------------------------------------------------------------------- the spec


def test_new_fields_have_documented_defaults() -> None:
    """A bare spec serves any number of sessions, waits 120 s for initialize, restarts 3 times."""
    spec = AgentSpec("x", ("x",))
    assert spec.sessions_per_process is None
    assert spec.startup_timeout == 120.0
    assert (spec.auth_method, spec.policy, spec.max_sessions, spec.cwd) == (None,) * 4
    assert spec.max_restarts == 3
    assert (spec.writes, spec.notes) == ("unknown", "")


def test_positional_fields_keep_their_order() -> None:
    """name, command, env, description, install stay the first positional fields."""
    spec = AgentSpec("x", ["x", "y"], {"A": "1"}, "desc", "pip install x")
    assert spec.command == ("x", "y")
    assert (spec.env, spec.description, spec.install) == ({"A": "1"}, "desc", "pip install x")


def test_profile_fields_are_keyword_only() -> None:
    """The new fields cannot be passed by position (the positional surface stays stable)."""
    with pytest.raises(TypeError):
        AgentSpec("x", ("x",), {}, "", "", 1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sessions_per_process", 0),
        ("max_sessions", -1),
        ("max_restarts", -1),
        ("startup_timeout", 0),
        ("startup_timeout", float("inf")),
        ("sessions_per_process", True),
        ("writes", "sometimes"),
    ],
)
def test_bad_field_values_are_usage_errors(field: str, value: object) -> None:
    """Out-of-range numbers and unknown write modes are refused with the field's name."""
    with pytest.raises(UsageError, match=field):
        AgentSpec("x", ("x",), **{field: value})  # type: ignore[arg-type]


def test_empty_command_is_a_usage_error() -> None:
    """A spec needs a program to run."""
    with pytest.raises(UsageError, match="command"):
        AgentSpec("x", ())
    with pytest.raises(UsageError, match="command"):
        AgentSpec("x", ("",))


def test_with_name_keeps_every_other_field() -> None:
    """Relabelling a spec changes only its name."""
    spec = AgentSpec("a", ("a",), sessions_per_process=1, policy="edit", writes="disk", notes="n")
    renamed = spec.with_name("b")
    assert renamed.name == "b"
    assert attrs.evolve(renamed, name="a") == spec


def test_relabel_keeps_the_whole_profile() -> None:
    """NAME=known relabels the known agent with all its fields."""
    assert resolve_agent("fast=qoder") == KNOWN_AGENTS["qoder"].with_name("fast")


def test_resolved_keeps_every_field(tmp_path: Path) -> None:
    """Resolving paths rewrites only the command, cwd and a policy file; the rest is kept."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "agent.py").write_text("")
    spec = AgentSpec(
        "mine",
        ("python", "tools/agent.py"),
        {"A": "1"},
        "d",
        "i",
        sessions_per_process=1,
        startup_timeout=5.0,
        auth_method="key",
        policy="policies/ro.toml",
        max_sessions=2,
        max_restarts=0,
        cwd="work",
        writes="fs",
        notes="n",
    )
    resolved = spec.resolved(tmp_path)
    assert resolved.command == ("python", f"{tmp_path}/tools/agent.py")
    assert resolved.cwd == f"{tmp_path}/work"
    assert resolved.policy == f"{tmp_path}/policies/ro.toml"
    same = attrs.evolve(resolved, command=spec.command, cwd=spec.cwd, policy=spec.policy)
    assert same == spec


def test_resolved_leaves_preset_policies_and_absolute_paths(tmp_path: Path) -> None:
    """A preset name is not a path, and absolute paths stay; nothing to do returns self."""
    spec = AgentSpec("x", ("/bin/x",), policy="read-only", cwd="/srv/x")
    assert spec.resolved(tmp_path) is spec


def test_to_json_has_every_field_in_camel_case() -> None:
    """`agents --json` gets the whole profile, with JSON-friendly values."""
    spec = AgentSpec(
        "mine",
        ("python", "a.py"),
        {"BASE_URL": "http://127.0.0.1:1"},
        "d",
        "i",
        sessions_per_process=1,
        max_sessions=4,
        writes="disk",
        notes="quirky",
        terminal_env=["NPM_TOKEN"],
        sandbox=Sandbox(ports=(443,)),
        model="big",
        mode="plan",
        needs=AgentNeeds(runtime="Node.js", login="x login", api_keys=["X_KEY"]),
        mcp_servers=[McpServer.http("api", "https://h/mcp", {"Authorization": "Bearer b"})],
    )
    data = spec.to_json()
    assert data == {
        "name": "mine",
        "command": ["python", "a.py"],
        "env": {"BASE_URL": "http://127.0.0.1:1"},
        "description": "d",
        "install": "i",
        "sessionsPerProcess": 1,
        "startupTimeout": 120.0,
        "authMethod": None,
        "policy": None,
        "maxSessions": 4,
        "maxRestarts": 3,
        "cwd": None,
        "writes": "disk",
        "notes": "quirky",
        "terminalEnv": ["NPM_TOKEN"],
        "sandbox": {"read": ["/"], "write": [], "ports": [443], "home": None},
        "model": "big",
        "mode": "plan",
        "needs": {
            "runtime": "Node.js",
            "login": "x login",
            "apiKeys": ["X_KEY"],
            "service": None,
            "other": None,
        },
        "mcpServers": [
            {
                "name": "api",
                "type": "http",
                "url": "https://h/mcp",
                "headers": {"Authorization": "<redacted>"},
            }
        ],
    }
    assert json.loads(json.dumps(data)) == data
    assert AgentNeeds.from_json(data["needs"]) == spec.needs


def test_to_json_redacts_secret_looking_env_values() -> None:
    """API keys in a spec's env do not end up in listings, unless asked for."""
    spec = AgentSpec("x", ("x",), {"OPENAI_API_KEY": "sk-1", "GH_TOKEN": "t", "MODEL": "m"})
    assert spec.to_json()["env"] == {
        "OPENAI_API_KEY": "<redacted>",
        "GH_TOKEN": "<redacted>",
        "MODEL": "m",
    }
    assert spec.to_json(redact=False)["env"]["OPENAI_API_KEY"] == "sk-1"


def test_to_json_redacts_passwords_and_url_credentials() -> None:
    """Passwords by other names and URLs holding credentials are hidden; plain URLs are not."""
    env = {
        "MYSQL_PWD": "p",
        "MY_DB_PASS": "p",
        "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x",
        "HTTPS_PROXY": "http://user:pass@proxy:3128",
        "ALL_PROXY": "socks5://tok@proxy:1080",
        "HTTP_PROXY": "http://proxy:3128",
        "BASE_URL": "http://127.0.0.1:1/v1",
        "PWD": "/work",
    }
    shown = AgentSpec("x", ("x",), env).to_json()["env"]
    hidden = {"MYSQL_PWD", "MY_DB_PASS", "SLACK_WEBHOOK_URL", "HTTPS_PROXY", "ALL_PROXY"}
    assert {k for k, v in shown.items() if v == "<redacted>"} == hidden
    assert "pass" not in json.dumps(shown)


def test_every_known_agent_serializes() -> None:
    """The whole built-in table goes through to_json and JSON."""
    rows = [spec.to_json() for spec in builtin_agents().values()]
    assert [row["name"] for row in rows] == [*TABLE_AGENTS, "demo"]
    json.dumps(rows)


# --------------------------------------------------------------------------- labels


@pytest.mark.parametrize(
    ("command", "label"),
    [
        ("python x/agent.py", "agent"),
        ("python3 -u ./tools/agent.py --acp", "agent"),
        (f"{sys.executable} x/agent.py", "agent"),
        ("/usr/bin/node /opt/foo/node_modules/@scope/pkg/dist/cli.js --acp", "pkg"),
        ("node /opt/foo/node_modules/plain-pkg/bin/run.js", "plain-pkg"),
        ("node /opt/tool/dist/index.js", "tool"),
        ("npx -y @zed-industries/claude-code-acp", "claude-code-acp"),
        ("npx -y @scope/pkg@1.2.3 --acp", "pkg"),
        ("uvx hermes-agent[acp]", "hermes-agent"),
        ("uvx --from hermes-agent hermes acp", "hermes"),
        ("uv run --with x python -m tools.agent", "agent"),
        ("npm exec -- my-agent --acp", "my-agent"),
        ("python -m orchestrator.testing.scripted_agent s.json", "scripted_agent"),
        ("python -m mypkg.__main__", "mypkg"),
        ("python -c 'from mypkg.acp import main; main()'", "acp"),
        ("sh -c 'cd /srv && exec python serve_agent.py --acp'", "serve_agent"),
        ("bash -c 'echo starting >&2; my-agent --acp 2>/tmp/log'", "my-agent"),
        ("bash scripts/run-agent.sh", "run-agent"),
        ("env FOO=1 node agent.mjs", "agent"),
        ("/usr/bin/env -u HOME python3.12 agent.py", "agent"),
        ("timeout 600 nohup gemini --acp", "gemini"),
        ("/usr/local/bin/gemini --acp", "gemini"),
        ("python -c 'print(1)'", "agent"),
        ("python", "agent"),
    ],
)
def test_derived_label_names_what_runs(command: str, label: str) -> None:
    """A command line reads as the package or script it runs, never as its interpreter,
    launcher or shell."""
    assert resolve_agent(command).name == label


def test_name_equals_command_keeps_the_name() -> None:
    """A label given with NAME=COMMAND is kept as written."""
    assert resolve_agent("mine=python x/agent.py").name == "mine"


def test_identity_is_command_environment_and_directory() -> None:
    """Specs are the same agent when command, env and cwd agree, whatever their labels."""
    a = AgentSpec("a", ("run", "x"), {"K": "1", "L": "2"}, cwd="/w")
    assert a.identity == AgentSpec("b", ("run", "x"), {"L": "2", "K": "1"}, cwd="/w").identity
    assert a.identity == attrs.evolve(a, policy="edit", max_sessions=2).identity
    assert a.identity != attrs.evolve(a, command=("run", "y")).identity
    assert a.identity != attrs.evolve(a, env={"K": "1"}).identity
    assert a.identity != attrs.evolve(a, cwd="/v").identity


def test_different_agents_with_one_derived_label_get_distinct_labels() -> None:
    """Different commands reading as one label are numbered in the order given."""
    texts = ["python x/agent.py", "python y/agent.py", "python z/agent.py"]
    specs = label_agents(texts)
    assert [s.name for s in specs] == ["agent", "agent-2", "agent-3"]
    assert [s.command[1] for s in specs] == ["x/agent.py", "y/agent.py", "z/agent.py"]
    assert [s.name for s in label_agents(texts[::-1])] == ["agent", "agent-2", "agent-3"]
    assert label_agents(texts) == specs


def test_the_same_agent_keeps_one_label(tmp_path: Path) -> None:
    """One agent named twice, or by a relative and an absolute path, has one label."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "agent.py").write_text("")
    texts = ["python x/agent.py", "python y/agent.py", f"python {tmp_path}/x/agent.py"]
    specs = label_agents([*texts, texts[0]], base=tmp_path)
    assert [s.name for s in specs] == ["agent", "agent-2", "agent", "agent"]
    assert specs[0] == specs[2] == specs[3]


def test_a_command_line_takes_the_label_given_to_its_agent() -> None:
    """A command line running an agent labelled elsewhere in the run uses that label."""
    demo = " ".join(resolve_agent("demo").command)
    assert [s.name for s in label_agents([demo, "demo"])] == ["demo", "demo"]
    assert [s.name for s in label_agents([demo, "me=demo"])] == ["me", "me"]


def test_given_labels_are_kept_and_derived_ones_step_aside() -> None:
    """A label given with NAME= (even later in the run) keeps its name; a derived label
    that would take it is numbered instead."""
    specs = label_agents(["python x/agent.py", "agent=python y/agent.py"])
    assert [s.name for s in specs] == ["agent-2", "agent"]
    assert specs[1].command == ("python", "y/agent.py")


def test_two_labels_for_one_agent_stay_two_agents() -> None:
    """alice=demo and bob=demo are the user's two agents, run alike."""
    specs = label_agents(["alice=demo", "bob=demo"])
    assert [s.name for s in specs] == ["alice", "bob"]
    assert specs[0].identity == specs[1].identity


def test_one_given_label_for_two_commands_is_a_usage_error() -> None:
    """NAME=COMMAND clashing with another command under that name is refused in one line."""
    with pytest.raises(UsageError, match="agent label 'me' names two different agents") as e:
        label_agents(["me=python x/agent.py", "me=python y/agent.py"])
    assert "x/agent.py" in str(e.value) and "y/agent.py" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="'claude' names two different agents"):
        label_agents(["claude", "claude=python mine.py"])


def test_specs_given_as_objects_keep_their_names() -> None:
    """An AgentSpec passed as is counts as a label the user gave."""
    mine = AgentSpec("agent", ("python", "z/agent.py"))
    specs = label_agents(["python x/agent.py", mine])
    assert [s.name for s in specs] == ["agent-2", "agent"]
    assert specs[1] == mine


@pytest.mark.parametrize(
    ("text", "meant"),
    [("claud", "claude"), ("Codex", "codex"), ("gemni", "gemini"), ("fast=claud", "claude")],
)
def test_a_mistyped_known_name_is_an_unknown_agent(
    text: str, meant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A word close to a known name, and no program on PATH, names the agent it meant."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UnknownAgent) as e:
        resolve_agent(text)
    word = text.partition("=")[2] or text
    assert (e.value.name, e.value.suggestion) == (word, meant)
    assert str(e.value) == f"unknown agent {word!r}; did you mean {meant!r}?"
    assert isinstance(e.value, UsageError)


def test_a_program_on_path_or_a_far_word_is_still_a_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only a near miss is refused: a program on PATH runs, and other words stay commands."""
    program = tmp_path / "claud"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_agent("claud").command == ("claud",)
    assert resolve_agent("zzz").command == ("zzz",)
    assert resolve_agent("./claud").command == ("./claud",)
    assert resolve_agent("my=claud --acp").command == ("claud", "--acp")


@pytest.mark.parametrize(
    ("command", "runner"),
    [
        ("npx -y @agentclientprotocol/claude-agent-acp", "npx"),
        ("uvx hermes-agent", "uvx"),
        ("npm exec -- my-agent", "npm exec"),
        ("uv tool run hermes", "uv tool run"),
        ("pipx run some-agent", "pipx run"),
        ("FOO=1 bunx agent", "bunx"),
        ("gemini --acp", None),
        ("uv run agent.py", None),
        ("node /opt/agent.js", None),
    ],
)
def test_package_runners_are_told_apart(command: str, runner: str | None) -> None:
    """Commands that fetch their agent on first use name their runner; others name none."""
    assert package_runner(command.split()) == runner
