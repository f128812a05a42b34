"""Tests of the TOML config files: layering, field-wise overrides, paths and errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.agents import KNOWN_AGENTS, AgentSpec, builtin_agents
from orchestrator.config import CONFIG_ENV, PROJECT_FILE, Config, user_config_path
from orchestrator.errors import UsageError

EXAMPLE = """
[limits]
max_sessions = 8          # global limit of live sessions
[agents.claude]           # override part of a known agent
env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:8080" }
[agents.mine]             # a new agent
command = "python my_agent.py --acp"
sessions_per_process = 1
policy = "read-only"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty home directory, so no real user config is ever read."""
    path = tmp_path / "home"
    path.mkdir()
    return path


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), **extra}


# --------------------------------------------------------------------------- format


def test_the_documented_example_loads() -> None:
    """The README's example: a limit, an override of claude, and a new agent."""
    config = Config.from_toml(EXAMPLE, source="example.toml")
    assert config.max_sessions == 8
    assert config.sources == ("example.toml",)
    claude = config.agents["claude"]
    assert claude.env == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080"}
    mine = config.agents["mine"]
    assert mine.command == ("python", "my_agent.py", "--acp")
    assert (mine.sessions_per_process, mine.policy) == (1, "read-only")
    assert list(config.agents) == [*builtin_agents(), "mine"]


def test_builtin_config_is_the_table_without_limits() -> None:
    """With no files, the config is the built-in table, no global limit, no sources."""
    config = Config.builtin()
    assert dict(config.agents) == builtin_agents()
    assert (config.max_sessions, config.sources) == (None, ())


def test_override_merges_field_wise() -> None:
    """Fields an override leaves out keep the built-in's values."""
    config = Config.from_toml("[agents.gemini]\nstartup_timeout = 30\nmax_sessions = 2\n")
    gemini, builtin = config.agents["gemini"], KNOWN_AGENTS["gemini"]
    assert (gemini.startup_timeout, gemini.max_sessions) == (30.0, 2)
    assert gemini.command == builtin.command
    assert (gemini.description, gemini.install, gemini.notes) == (
        builtin.description,
        builtin.install,
        builtin.notes,
    )
    assert gemini.writes == builtin.writes


def test_env_overrides_merge_key_wise_across_layers() -> None:
    """A later layer adds or replaces env variables without dropping the earlier ones."""
    user = Config.from_toml('[agents.claude]\nenv = { A = "1", B = "1" }\n', source="user")
    project = Config.from_toml('[agents.claude]\nenv = { B = "2" }\n', user, source="project")
    assert project.agents["claude"].env == {"A": "1", "B": "2"}


def test_command_may_be_a_list() -> None:
    """A list command is taken as the argv, with no splitting."""
    config = Config.from_toml('[agents.x]\ncommand = ["my agent", "--acp"]\n')
    assert config.agents["x"].command == ("my agent", "--acp")


def test_every_field_can_be_set() -> None:
    """All the spec's fields are accepted with their types."""
    text = """
    [agents.full]
    command = "agent --acp"
    env = { K = "v" }
    description = "d"
    install = "pip install agent"
    sessions_per_process = 1
    startup_timeout = 2.5
    auth_method = "api-key"
    policy = "/etc/policy.toml"
    max_sessions = 3
    max_restarts = 0
    cwd = "/srv/agent"
    writes = "disk"
    notes = "n"
    terminal_env = ["NPM_TOKEN", "JAVA_*"]
    """
    spec = Config.from_toml(text).agents["full"]
    assert spec == AgentSpec(
        "full",
        ("agent", "--acp"),
        {"K": "v"},
        "d",
        "pip install agent",
        sessions_per_process=1,
        startup_timeout=2.5,
        auth_method="api-key",
        policy="/etc/policy.toml",
        max_sessions=3,
        max_restarts=0,
        cwd="/srv/agent",
        writes="disk",
        notes="n",
        terminal_env=("NPM_TOKEN", "JAVA_*"),
    )


def test_resolve_agent_goes_through_the_config() -> None:
    """Names in the config resolve to its specs; labels and command lines still work."""
    config = Config.from_toml(EXAMPLE)
    assert config.resolve_agent("mine") == config.agents["mine"]
    assert config.resolve_agent("claude").env == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080"}
    relabelled = config.resolve_agent("two=mine")
    assert relabelled == config.agents["mine"].with_name("two")
    assert config.resolve_agent("demo") == builtin_agents()["demo"]
    assert config.resolve_agent("other --acp").command == ("other", "--acp")


def test_resolve_agents_labels_a_run_through_the_config() -> None:
    """Config names are labels the user gave: a command line reading as one steps aside, and
    the command line of a configured agent is that agent."""
    config = Config.from_toml('[agents.my_agent]\ncommand = "python z/my_agent.py"\n' + EXAMPLE)
    specs = config.resolve_agents(
        ["python x/my_agent.py", "my_agent", "python my_agent.py --acp", "mine"]
    )
    assert [s.name for s in specs] == ["my_agent-2", "my_agent", "mine", "mine"]
    assert specs[0].command == ("python", "x/my_agent.py")
    assert specs[2] == specs[3] == config.agents["mine"]


def test_resolve_agents_refuses_a_config_name_for_another_command() -> None:
    """NAME=COMMAND reusing a configured name for a different command is a usage error."""
    config = Config.from_toml(EXAMPLE)
    with pytest.raises(UsageError, match="agent label 'mine' names two different agents"):
        config.resolve_agents(["mine", "mine=python other.py"])


def test_resolve_agents_resolves_paths_against_base(tmp_path: Path) -> None:
    """With a base, relative script paths become absolute before agents are compared."""
    write(tmp_path / "tools" / "agent.py", "")
    [spec] = Config.builtin().resolve_agents(["python tools/agent.py"], base=tmp_path)
    assert (spec.name, spec.command) == ("agent", ("python", f"{tmp_path}/tools/agent.py"))


def test_demo_can_be_overridden() -> None:
    """The demo agent is part of the table a config file can change."""
    config = Config.from_toml("[agents.demo]\nmax_sessions = 1\n")
    assert config.resolve_agent("demo").max_sessions == 1


# --------------------------------------------------------------------------- paths


def test_project_paths_resolve_against_the_project(tmp_path: Path) -> None:
    """Relative paths in a project file's command, cwd and policy name the project's files."""
    project = tmp_path / "project"
    write(project / "tools" / "agent.py", "")
    write(
        project / PROJECT_FILE,
        '[agents.local]\ncommand = "./venv/bin/python tools/agent.py --acp missing/x"\n'
        'cwd = "work"\npolicy = "policies/ro.toml"\n',
    )
    spec = Config.from_file(project / PROJECT_FILE).agents["local"]
    assert spec.command == (
        f"{project}/./venv/bin/python",
        f"{project}/tools/agent.py",
        "--acp",
        "missing/x",
    )
    assert spec.cwd == f"{project}/work"
    assert spec.policy == f"{project}/policies/ro.toml"


def test_overriding_one_field_does_not_touch_the_builtin_command(tmp_path: Path) -> None:
    """A layer resolves only the paths it sets (npx package names are not paths)."""
    write(tmp_path / "@agentclientprotocol" / "claude-agent-acp", "")
    write(tmp_path / PROJECT_FILE, "[agents.claude]\nmax_sessions = 1\n")
    spec = Config.from_file(tmp_path / PROJECT_FILE).agents["claude"]
    assert spec.command == KNOWN_AGENTS["claude"].command


def test_from_toml_without_root_keeps_paths_as_written() -> None:
    """Text with no file behind it has no directory to resolve against."""
    spec = Config.from_toml('[agents.x]\ncommand = "./x"\ncwd = "w"\n').agents["x"]
    assert (spec.command, spec.cwd) == (("./x",), "w")


# --------------------------------------------------------------------------- layering


def test_project_beats_user_beats_builtin(tmp_path: Path, home: Path) -> None:
    """Each layer overrides the one below, field by field; sources list the files in order."""
    user = write(
        home / ".config" / "acp-orchestrator" / "config.toml",
        "[limits]\nmax_sessions = 4\n"
        '[agents.claude]\nmax_sessions = 2\nauth_method = "user-method"\n'
        '[agents.mine]\ncommand = "mine --user"\nnotes = "from user"\n',
    )
    project = tmp_path / "project"
    write(
        project / PROJECT_FILE,
        "[limits]\nmax_sessions = 6\n"
        "[agents.claude]\nmax_sessions = 3\n"
        '[agents.mine]\ncommand = "mine --project"\n',
    )
    config = Config.load(project, environ=env_for(home), trusted=True)
    assert config.sources == (str(user), str(project / PROJECT_FILE))
    assert config.max_sessions == 6
    claude = config.agents["claude"]
    assert (claude.max_sessions, claude.auth_method) == (3, "user-method")
    assert claude.command == KNOWN_AGENTS["claude"].command
    mine = config.agents["mine"]
    assert (mine.command, mine.notes) == (("mine", "--project"), "from user")


def test_the_backlog_and_record_limits_layer_like_max_sessions(tmp_path: Path, home: Path) -> None:
    """The limits on what an agent leaves unanswered and on what is kept of a turn are read
    from [limits], unset ones stay None, and the project file wins key by key."""
    assert Config.builtin().max_requests_in_flight is None
    write(
        home / ".config" / "acp-orchestrator" / "config.toml",
        "[limits]\nmax_requests_in_flight = 500\nmax_unsent_bytes = 1048576\n",
    )
    write(
        tmp_path / PROJECT_FILE, "[limits]\nmax_unsent_bytes = 2048\nmax_turn_record_bytes = 4096\n"
    )
    config = Config.load(tmp_path, environ=env_for(home))
    limits = (config.max_requests_in_flight, config.max_unsent_bytes, config.max_turn_record_bytes)
    assert limits == (500, 2048, 4096)
    assert config.max_sessions is None


def test_user_limit_stays_when_project_sets_none(tmp_path: Path, home: Path) -> None:
    """A project file without [limits] keeps the user's limit."""
    write(home / ".config" / "acp-orchestrator" / "config.toml", "[limits]\nmax_sessions = 4\n")
    write(tmp_path / PROJECT_FILE, "[agents.claude]\nmax_sessions = 1\n")
    assert Config.load(tmp_path, environ=env_for(home)).max_sessions == 4


def test_no_files_gives_the_builtin_config(tmp_path: Path, home: Path) -> None:
    """Missing default files are not errors."""
    assert Config.load(tmp_path, environ=env_for(home)) == Config.builtin()
    assert Config.load(environ=env_for(home)) == Config.builtin()


def test_project_file_is_not_searched_in_parents(tmp_path: Path, home: Path) -> None:
    """Only the directory given is looked at, not the ones above it."""
    write(tmp_path / PROJECT_FILE, "[limits]\nmax_sessions = 1\n")
    child = tmp_path / "sub"
    child.mkdir()
    assert Config.load(child, environ=env_for(home)).max_sessions is None
    assert Config.load(tmp_path, environ=env_for(home)).max_sessions == 1


def test_orchestrator_config_names_the_user_file(tmp_path: Path, home: Path) -> None:
    """$ORCHESTRATOR_CONFIG wins over XDG and HOME."""
    chosen = write(tmp_path / "chosen.toml", "[limits]\nmax_sessions = 9\n")
    write(tmp_path / "xdg" / "acp-orchestrator" / "config.toml", "[limits]\nmax_sessions = 1\n")
    environ = env_for(home, **{CONFIG_ENV: str(chosen), "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert user_config_path(environ) == chosen
    config = Config.load(environ=environ)
    assert (config.max_sessions, config.sources) == (9, (str(chosen),))


def test_missing_orchestrator_config_file_is_an_error(tmp_path: Path, home: Path) -> None:
    """A file named explicitly must exist."""
    environ = env_for(home, **{CONFIG_ENV: str(tmp_path / "nope.toml")})
    with pytest.raises(UsageError, match=r"ORCHESTRATOR_CONFIG.*nope\.toml"):
        Config.load(environ=environ)


def test_xdg_config_home_is_used(tmp_path: Path, home: Path) -> None:
    """$XDG_CONFIG_HOME/acp-orchestrator/config.toml is the user file when set."""
    user = write(
        tmp_path / "xdg" / "acp-orchestrator" / "config.toml", "[limits]\nmax_sessions = 5\n"
    )
    environ = env_for(home, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    assert user_config_path(environ) == user
    assert Config.load(environ=environ).max_sessions == 5


def test_relative_xdg_config_home_is_ignored(home: Path) -> None:
    """The XDG spec says a relative XDG_CONFIG_HOME is invalid; HOME's default is used."""
    environ = env_for(home, XDG_CONFIG_HOME="relative/dir")
    assert user_config_path(environ) == home / ".config" / "acp-orchestrator" / "config.toml"


def test_home_default_location(home: Path) -> None:
    """Without the variables, the user file is ~/.config/acp-orchestrator/config.toml."""
    user = write(
        home / ".config" / "acp-orchestrator" / "config.toml", "[limits]\nmax_sessions = 3\n"
    )
    assert user_config_path(env_for(home)) == user
    assert Config.load(environ=env_for(home)).max_sessions == 3


def test_user_file_paths_resolve_against_its_directory(tmp_path: Path, home: Path) -> None:
    """A relative path in the user file is relative to that file, not to the current directory."""
    user = write(tmp_path / "conf" / "config.toml", '[agents.x]\ncommand = "./bin/agent"\n')
    config = Config.load(environ=env_for(home, **{CONFIG_ENV: str(user)}))
    assert config.agents["x"].command == (f"{tmp_path}/conf/./bin/agent",)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("colour = 1\n", "colour", "unknown key"),
        ("[limits]\nmax_session = 3\n", "limits.max_session", "did you mean 'max_sessions'"),
        ("[limits]\nmax_sessions = 0\n", "limits.max_sessions", ">= 1"),
        ("[limits]\nmax_sessions = -2\n", "limits.max_sessions", ">= 1"),
        ("[limits]\nmax_sessions = 2.5\n", "limits.max_sessions", "a number"),
        ("[limits]\nmax_unsent_bytes = 0\n", "limits.max_unsent_bytes", ">= 1"),
        ('[limits]\nmax_turn_record_bytes = "4M"\n', "limits.max_turn_record_bytes", "a string"),
        ('limits = "many"\n', "limits", "must be a table"),
        ("[agents.claude]\ncomand = 'x'\n", "agents.claude.comand", "did you mean 'command'"),
        ("[agents.claude]\nsessions_per_process = -1\n", "sessions_per_process", ">= 1"),
        ("[agents.claude]\nmax_restarts = -1\n", "agents.claude.max_restarts", ">= 0"),
        ("[agents.claude]\nmax_sessions = true\n", "agents.claude.max_sessions", "a boolean"),
        ('[agents.claude]\nstartup_timeout = "1m"\n', "startup_timeout", "number of seconds"),
        ("[agents.claude]\nstartup_timeout = -1\n", "startup_timeout", "positive"),
        ("[agents.claude]\nstartup_timeout = inf\n", "startup_timeout", "positive"),
        ('[agents.claude]\nwrites = "sometimes"\n', "agents.claude.writes", "fs, disk, both"),
        ("[agents.claude]\nenv = { PORT = 8080 }\n", "agents.claude.env.PORT", "a string"),
        ('[agents.claude]\nenv = "A=1"\n', "agents.claude.env", "must be a table"),
        ("[agents.claude]\ndescription = 1\n", "agents.claude.description", "a string"),
        ('[agents.claude]\nauth_method = ""\n', "agents.claude.auth_method", "empty"),
        ('[agents.claude]\ncommand = ""\n', "agents.claude.command", "program"),
        ("[agents.claude]\ncommand = []\n", "agents.claude.command", "program"),
        ("[agents.claude]\ncommand = [1]\n", "agents.claude.command", "list of strings"),
        ('[agents.claude]\ncommand = "a \'b"\n', "agents.claude.command", "cannot split"),
        ('[agents.claude]\npolicy = "readonly"\n', "agents.claude.policy", "neither a preset"),
        ('[agents.claude]\ncwd = ""\n', "agents.claude.cwd", "empty"),
        ('[agents.claude]\nterminal_env = "A"\n', "agents.claude.terminal_env", "list of"),
        ('[agents.claude]\nterminal_env = [""]\n', "agents.claude.terminal_env", "names"),
        ('[agents.mine]\ndescription = "no command"\n', "agents.mine", "needs a command"),
        ('[agents."a b"]\ncommand = "x"\n', 'agents."a b"', "agent name"),
        ('[agents."x=y"]\ncommand = "x"\n', 'agents."x=y"', "agent name"),
        ('agents = { claude = "npx x" }\n', "agents.claude", "must be a table"),
    ],
)
def test_bad_config_names_the_file_and_the_key(text: str, key: str, message: str) -> None:
    """Every mistake is a usage error that says which file, which key and what is wrong."""
    with pytest.raises(UsageError) as caught:
        Config.from_toml(text, source="/etc/orch.toml")
    error = str(caught.value)
    assert error.startswith("/etc/orch.toml: ")
    assert key in error
    assert message in error


def test_bad_toml_names_the_file_and_the_place(tmp_path: Path) -> None:
    """A syntax error says which file and where in it."""
    path = write(tmp_path / PROJECT_FILE, "[agents.claude\nmax_sessions = 1\n")
    with pytest.raises(UsageError, match=re.escape(PROJECT_FILE) + r": invalid TOML: .*line 1"):
        Config.from_file(path)


def test_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    """A config path that is a directory, or not UTF-8, is reported with its path."""
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(UsageError, match=r"dir\.toml"):
        Config.from_file(tmp_path / "dir.toml")
    (tmp_path / "latin.toml").write_bytes(b"notes = '\xe9'\n")
    with pytest.raises(UsageError, match=r"latin\.toml"):
        Config.from_file(tmp_path / "latin.toml")


def test_project_file_errors_name_the_project_file(tmp_path: Path, home: Path) -> None:
    """Loading the layers reports the project file's path when it is the faulty one."""
    write(home / ".config" / "acp-orchestrator" / "config.toml", "[limits]\nmax_sessions = 2\n")
    write(tmp_path / PROJECT_FILE, "[agents.claude]\nmax_sessions = -1\n")
    with pytest.raises(
        UsageError, match=re.escape(f"{tmp_path}/{PROJECT_FILE}: agents.claude.max_sessions")
    ):
        Config.load(tmp_path, environ=env_for(home))


def test_a_failed_layer_changes_nothing() -> None:
    """Layers are values: a base config is never modified by a later, failing layer."""
    base = Config.from_toml("[limits]\nmax_sessions = 2\n", source="user")
    with pytest.raises(UsageError):
        Config.from_toml("[agents.claude]\nmax_sessions = 0\n", base, source="project")
    assert base.max_sessions == 2
    assert base.agents["claude"] == KNOWN_AGENTS["claude"]


def test_with_agents_adds_to_the_table_and_keeps_the_rest() -> None:
    """with_agents adds or replaces entries; limits, sources and other agents stay."""
    base = Config(agents={"a": AgentSpec("a", ("a",))}, max_sessions=3, sources=("x.toml",))
    more = base.with_agents({"b": AgentSpec("b", ("b",)), "a": AgentSpec("a", ("a2",))})
    assert {n: s.command for n, s in more.agents.items()} == {"a": ("a2",), "b": ("b",)}
    assert (more.max_sessions, more.sources) == (3, ("x.toml",))
    assert base.agents["a"].command == ("a",)
