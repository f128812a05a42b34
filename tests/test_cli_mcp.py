"""``--mcp-server``, ``--mcp-header``, ``--mcp-env`` through the console script.

Scripted agents (subprocesses) record the ``mcpServers`` of each ``session/new``; the
command's output and the run store must keep the servers' secrets out.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from run_helpers import CLI, agent_command, as_json, record_events, run_cli

from orchestrator.store import open_run_store
from orchestrator.testing import AgentScript, Capabilities, Crash, ReadFile, Say, Turn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SECRET = "sekrit-4411"


def scripted(path: Path, *, http: bool = False) -> str:
    """A scripted agent's NAME=COMMAND for ``--agent``; it records what it receives."""
    script = AgentScript(
        name=path.stem,
        capabilities=Capabilities(mcp_http=http),
        turns=(Turn(steps=(Say("ok"),)),),
        record_path=str(path.with_suffix(".jsonl")),
    )
    path.write_bytes(orjson.dumps(script.to_json()))
    return f"{path.stem}={shlex.join(agent_command(path))}"


def sessions(path: Path) -> list[list[dict[str, Any]]]:
    """The mcpServers of each session/new the agent of ``path`` received."""
    events = record_events(path.with_suffix(".jsonl"))
    return [e["mcpServers"] for e in events if e["event"] == "session_new"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """An empty workspace."""
    root = tmp_path / "ws"
    root.mkdir()
    return root


async def test_prompt_gives_the_stdio_server_with_its_env(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prompt --mcp-server NAME=COMMAND --mcp-env``: the agent gets it (``SERVER:VAR`` with
    the value ``$VAR`` has), the output hides the secret value, and ``show --json`` does too."""
    monkeypatch.setenv("DOCS_TOKEN", SECRET)
    agent = tmp_path / "alpha.json"
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent),
        "--mcp-server",
        f"docs={sys.executable} -m docs_server --stdio",
        "--mcp-env",
        "docs:DOCS_TOKEN",
        "--mcp-env",
        "docs:MODE=fast",
        "--json",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert sessions(agent) == [
        [
            {
                "name": "docs",
                "command": sys.executable,
                "args": ["-m", "docs_server", "--stdio"],
                "env": [
                    {"name": "DOCS_TOKEN", "value": SECRET},
                    {"name": "MODE", "value": "fast"},
                ],
            }
        ]
    ]
    assert SECRET.encode() not in done.stdout + done.stderr
    shown = await run_cli(
        "show", as_json(done)["runId"], "--json", cwd=ws, state=tmp_path / "state"
    )
    assert shown.returncode == EXIT_OK and SECRET.encode() not in shown.stdout


async def test_compare_refuses_http_for_the_agent_without_the_capability(
    tmp_path: Path, ws: Path
) -> None:
    """``compare --mcp-server api=https://...``: the agent advertising mcpCapabilities.http
    gets the server and its header; the other fails before its session starts (exit 1,
    error naming the server)."""
    takes, refuses = tmp_path / "takes.json", tmp_path / "refuses.json"
    done = await run_cli(
        "compare",
        "--agent",
        scripted(takes, http=True),
        "--agent",
        scripted(refuses),
        "--mcp-server",
        "api=https://mcp.example/api",
        "--mcp-header",
        f"api:Authorization=Bearer {SECRET}",
        "--json",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert sessions(takes) == [
        [
            {
                "type": "http",
                "name": "api",
                "url": "https://mcp.example/api",
                "headers": [{"name": "Authorization", "value": f"Bearer {SECRET}"}],
            }
        ]
    ]
    assert sessions(refuses) == []
    result = as_json(done)
    entry = next(a for a in result["agents"] if a["name"] == "refuses")
    assert entry["status"] == "failed"
    assert "does not take http MCP servers" in entry["error"] and "api (http)" in entry["error"]
    assert SECRET.encode() not in done.stdout + done.stderr


async def test_prompt_refused_http_server_exits_2_with_one_line(tmp_path: Path, ws: Path) -> None:
    """``prompt`` to an agent that cannot take an HTTP server: exit 2, one line saying why,
    and no session was asked for."""
    agent = tmp_path / "plain.json"
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent),
        "--mcp-server",
        "api=https://mcp.example/api",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert "does not take http MCP servers" in stderr
    assert sessions(agent) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mcp-server", "docs"], "expected NAME=COMMAND, NAME=URL, NAME=sse+URL"),
        (["--mcp-server", "api=ftp://host/x"], "needs an http:// or https:// url"),
        (["--mcp-server", "docs=python 'unclosed"], "cannot split"),
        (["--mcp-header", "api"], "expected SERVER:NAME=VALUE"),
        (["--mcp-env", "docs"], "expected SERVER:VAR=VALUE or SERVER:VAR"),
        (["--mcp-env", "docs:MCP_UNSET_VARIABLE_7"], "$MCP_UNSET_VARIABLE_7 is not set"),
        (["--mcp-server", "docs=prog", "--mcp-header", "nope:X=1"], "no --mcp-server nope"),
        (["--mcp-server", "docs=prog", "--mcp-header", "docs:X=1"], "not a url or headers"),
        (
            ["--mcp-server", "x=https://h/x", "--mcp-header", "x:A=b\r\nInjected: 1"],
            "holds a line break",
        ),
        (["--mcp-server", "x=https://h/x", "--mcp-header", "x:Bad Name=1"], "not an HTTP token"),
        (["--mcp-server", "x=https://h/x", "--mcp-header", "x:A:B=1"], "not an HTTP token"),
        (
            ["--mcp-server", f"x={sys.executable}", "--mcp-env", "x:A B=1"],
            "holds '=', NUL or white space",
        ),
        (["--mcp-server", "x=http://[::1/x"], "Invalid IPv6 URL"),
        (["--mcp-server", "x=nosuchprogram-zz"], "program 'nosuchprogram-zz' is not on PATH"),
        (["--mcp-server", "x=./rel/prog"], "program './rel/prog' is no executable file"),
    ],
)
async def test_bad_mcp_options_are_one_line_usage_errors(
    tmp_path: Path, ws: Path, args: list[str], message: str
) -> None:
    """Each malformed option: exit 2, one line on stderr, no agent started."""
    agent = tmp_path / "never.json"
    done = await run_cli(
        "prompt", "--agent", scripted(agent), *args, "hello", cwd=ws, state=tmp_path / "state"
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert record_events(agent.with_suffix(".jsonl")) == []


async def test_run_and_config_servers(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run --mcp-server NAME`` takes a trusted config's [mcp_servers.NAME]; an agent's
    ``mcp_servers`` come first; the pipeline's step adds its own."""
    agent = tmp_path / "alpha.json"
    name, _, command = scripted(agent).partition("=")
    config = tmp_path / "user.toml"
    config.write_text(
        f"[mcp_servers.docs]\ncommand = {json.dumps([sys.executable, '-V'])}\n\n"
        f"[mcp_servers.own]\nurl = 'http://127.0.0.1:9/mcp'\n\n"
        f"[agents.{name}]\ncommand = {json.dumps(shlex.split(command))}\n"
        "mcp_servers = ['own']\n"
    )
    script = AgentScript(
        name=name,
        capabilities=Capabilities(mcp_http=True),
        turns=(Turn(steps=(Say("ok"),)),),
        record_path=str(agent.with_suffix(".jsonl")),
    )
    agent.write_bytes(orjson.dumps(script.to_json()))
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n"
        f"@step(agent={name!r}, mcp_servers=['extra=' + {sys.executable!r} + ' --x'])\n"
        "def work() -> str:\n    return 'go'\n"
    )
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    done = await run_cli(
        "run", str(pipeline), "--mcp-server", "docs", "--json", cwd=ws, state=tmp_path / "s"
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    [servers] = sessions(agent)
    assert [s["name"] for s in servers] == ["own", "docs", "extra"]


def crashing(path: Path, *, crash: bool) -> str:
    """A scripted agent taking HTTP servers whose turn crashes (or says ok), for resumes."""
    step = Crash() if crash else Say("ok")
    script = AgentScript(
        name=path.stem,
        capabilities=Capabilities(mcp_http=True),
        turns=(Turn(steps=(step,)),),
        record_path=str(path.with_suffix(".jsonl")),
    )
    path.write_bytes(orjson.dumps(script.to_json()))
    return f"{path.stem}={shlex.join(agent_command(path))}"


async def test_resume_without_the_secrets_warns_and_keeps_them_recorded(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume whose MCP secrets are not set warns on stderr (``--json`` too) naming each one,
    goes on without them, and leaves the record as it was: a later resume with the variables
    set gives the agent every one of them again."""
    state = tmp_path / "state"
    agent = tmp_path / "alpha.json"
    monkeypatch.setenv("MY_API_KEY", "k-" + SECRET)
    monkeypatch.setenv("SECRET_FROM_ENV", "e-" + SECRET)
    done = await run_cli(
        "prompt",
        "--agent",
        crashing(agent, crash=True),
        "--mcp-server",
        f"s={sys.executable} -V",
        "--mcp-env",
        "s:MY_API_KEY",
        "--mcp-env",
        "s:SECRET_FROM_ENV",
        "--mcp-server",
        "h=https://u:pw@h.example/x",
        "--mcp-header",
        f"h:Authorization=Bearer {SECRET}",
        "--json",
        "hello",
        cwd=ws,
        state=state,
    )
    assert done.returncode != EXIT_OK, done.stderr.decode()
    run_id = as_json(done)["runId"]
    async with open_run_store(state) as store:
        first = (await store.get_run(run_id)).options["settings"]["mcpServers"]
    monkeypatch.delenv("MY_API_KEY")
    monkeypatch.delenv("SECRET_FROM_ENV")
    again = await run_cli("resume", run_id, "--json", cwd=ws, state=state)
    stderr = again.stderr.decode()
    lost = ["h.headers.Authorization", "h.url", "s.env.MY_API_KEY", "s.env.SECRET_FROM_ENV"]
    warning = [line for line in stderr.splitlines() if "s.env.MY_API_KEY" in line]
    assert len(warning) == 1 and all(name in warning[0] for name in lost), stderr
    assert as_json(again)["restored"]["missingSecrets"] == lost
    assert any(all(name in w for name in lost) for w in as_json(again)["warnings"])
    sent = sessions(agent)[-1]
    assert {s["name"]: s.get("env", s.get("headers")) for s in sent} == {"s": [], "h": []}
    assert next(s for s in sent if s["name"] == "h")["url"] == "https://h.example/x"
    async with open_run_store(state) as store:
        kept = (await store.get_run(run_id)).options["settings"]["mcpServers"]
    assert kept == first
    monkeypatch.setenv("MY_API_KEY", "k-" + SECRET)
    monkeypatch.setenv("SECRET_FROM_ENV", "e-" + SECRET)
    crashing(agent, crash=False)
    last = await run_cli("resume", run_id, "--json", cwd=ws, state=state)
    assert last.returncode == EXIT_OK, last.stderr.decode()
    stdio = next(s for s in sessions(agent)[-1] if s["name"] == "s")
    assert stdio["env"] == [
        {"name": "MY_API_KEY", "value": "k-" + SECRET},
        {"name": "SECRET_FROM_ENV", "value": "e-" + SECRET},
    ]
    assert "s.env.MY_API_KEY" not in last.stderr.decode()


async def test_secrets_under_other_names_stay_out_of_the_store_and_transcript(
    tmp_path: Path, ws: Path
) -> None:
    """A URL's query values, a header outside the plain ones (``Signature``) and variables
    such as ``PGPASS`` and ``SESSION`` reach the agent, and nothing else: not the run store,
    the transcript, the output or ``show``."""
    state, agent = tmp_path / "state", tmp_path / "alpha.json"
    transcript = tmp_path / "wire.ndjson"
    values = ["qtok-5521", "qkey-5521", "sig-5521", "pg-5521", "sess-5521"]
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent, http=True),
        "--mcp-server",
        f"h=http://127.0.0.1:9/mcp?token={values[0]}&api_key={values[1]}",
        "--mcp-header",
        f"h:Signature={values[2]}",
        "--mcp-header",
        "h:Accept=application/json",
        "--mcp-server",
        f"db={sys.executable} -V",
        "--mcp-env",
        f"db:PGPASS={values[3]}",
        "--mcp-env",
        f"db:SESSION={values[4]}",
        "--transcript",
        str(transcript),
        "--json",
        "hello",
        cwd=ws,
        state=state,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    sent = json.dumps(sessions(agent))
    assert all(value in sent for value in values)
    shown = await run_cli("show", as_json(done)["runId"], "--json", cwd=ws, state=state)
    stored = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
    for place in (stored, transcript.read_bytes(), done.stdout + done.stderr, shown.stdout):
        assert not [value for value in values if value.encode() in place]
    assert b"application/json" in transcript.read_bytes()


async def test_show_lists_the_runs_mcp_servers_redacted(tmp_path: Path, ws: Path) -> None:
    """``show RUN`` lists the MCP servers each session had, secrets redacted: a line by step
    and agent in text, ``mcpServers`` in ``--json``."""
    state, agent = tmp_path / "state", tmp_path / "alpha.json"
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent, http=True),
        "--mcp-server",
        f"h=https://u:{SECRET}@h.example/x",
        "--mcp-header",
        f"h:Authorization=Bearer {SECRET}",
        "--json",
        "hello",
        cwd=ws,
        state=state,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    run_id = as_json(done)["runId"]
    text = await run_cli("show", run_id, cwd=ws, state=state)
    line = "MCP servers of prompt [alpha]: h (http: https://<redacted>@h.example/x"
    assert line + " Authorization=<redacted>)" in text.stdout.decode()
    shown = as_json(await run_cli("show", run_id, "--json", cwd=ws, state=state))
    assert shown["mcpServers"] == {
        "prompt": {
            "alpha": [
                {
                    "name": "h",
                    "type": "http",
                    "url": "https://<redacted>@h.example/x",
                    "headers": {"Authorization": "<redacted>"},
                }
            ]
        }
    }
    assert SECRET.encode() not in text.stdout + json.dumps(shown).encode()


async def test_compare_does_not_suggest_resume_after_usage_failures(
    tmp_path: Path, ws: Path
) -> None:
    """A comparison whose agents all failed as refused usage (an MCP server kind neither
    takes) does not suggest ``resume``, which would fail the same way."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    done = await run_cli(
        "compare",
        "--agent",
        scripted(one),
        "--agent",
        scripted(two),
        "--mcp-server",
        "api=https://mcp.example/api",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    out = done.stdout.decode()
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    assert "orchestrator resume" not in out + done.stderr.decode()
    assert "a resume would fail the same way" in out


async def test_a_long_refused_path_is_logged_bounded(tmp_path: Path, ws: Path) -> None:
    """An agent's refused fs path of 5,000 characters is logged cut, with its length."""
    agent = tmp_path / "long.json"
    script = AgentScript(
        name="long",
        turns=(Turn(steps=(ReadFile("x" * 5000), Say("ok"))),),
        record_path=str(agent.with_suffix(".jsonl")),
    )
    agent.write_bytes(orjson.dumps(script.to_json()))
    done = await run_cli(
        "prompt",
        "--agent",
        f"long={shlex.join(agent_command(agent))}",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    stderr = done.stderr.decode()
    [line] = [line for line in stderr.splitlines() if "fs request refused" in line]
    assert "x" * 201 not in line and "characters)" in line and len(line) < 1000, line


async def test_tokens_in_a_url_path_stay_out_of_the_store_and_transcript(
    tmp_path: Path, ws: Path
) -> None:
    """A path parameter (``/p;TOKEN``) and a token-like path segment (``/t/TOKEN/mcp``) reach
    the agent, and nothing else: not the run store, the transcript, the output or ``show``."""
    state, agent = tmp_path / "state", tmp_path / "alpha.json"
    transcript = tmp_path / "wire.ndjson"
    values = ["semi-tok-5521", "Xq7uT2vR9kLm4NpZ8sWc"]
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent, http=True),
        "--mcp-server",
        f"p=http://127.0.0.1:9/p;{values[0]}?a=x",
        "--mcp-server",
        f"t=http://127.0.0.1:9/t/{values[1]}/mcp",
        "--transcript",
        str(transcript),
        "--json",
        "hello",
        cwd=ws,
        state=state,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    sent = json.dumps(sessions(agent))
    assert all(value in sent for value in values)
    shown = await run_cli("show", as_json(done)["runId"], "--json", cwd=ws, state=state)
    stored = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
    for place in (stored, transcript.read_bytes(), done.stdout + done.stderr, shown.stdout):
        assert not [value for value in values if value.encode() in place]
    urls = [s["url"] for s in json.loads(shown.stdout)["mcpServers"]["prompt"]["alpha"]]
    assert urls == [
        "http://127.0.0.1:9/p;<redacted>?a=<redacted>",
        "http://127.0.0.1:9/t/<redacted>/mcp",
    ]
