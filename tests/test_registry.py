"""The ACP registry: the bundled snapshot listed by ``agents --registry``, bad registries,
``registry:ID`` resolved for npx, uvx and binary entries, binary archives fetched from a local
server (a checksum mismatch refused), and an agent that needs a login failing at once."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import sys
import tarfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from run_helpers import agent_command, one_line_error
from run_helpers import run_console as cli

from orchestrator import registry as reg
from orchestrator._agent_archive import ensure
from orchestrator.agent.launch import open_agent
from orchestrator.agents import resolve_agent
from orchestrator.cli.output import output_schema
from orchestrator.errors import AgentArchiveError, LoginRequired, RegistryError
from orchestrator.testing import AgentScript
from orchestrator.testing.script import AuthMethod

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LIMIT = 30.0


def snapshot() -> dict[str, Any]:
    """The bundled snapshot, as shipped."""
    data = resources.files("orchestrator") / "data" / "registry.json"
    document: dict[str, Any] = json.loads(data.read_text("utf-8"))
    return document


@contextmanager
def serve(files: Mapping[str, bytes]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving ``files`` by path; yields its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def archive_of(files: Mapping[str, str]) -> bytes:
    """A .tar.gz holding ``files`` (executable)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: a "binary" agent: a script that becomes the demo agent
DEMO_AGENT = f'#!/bin/sh\nexec {sys.executable} -m orchestrator.demo "$@"\n'


def registry_file(path: Path, *entries: dict[str, Any]) -> Path:
    """A registry file holding ``entries``."""
    path.write_text(json.dumps({"version": "1.0.0", "agents": list(entries), "extensions": []}))
    return path


def entry(agent_id: str, **distribution: Any) -> dict[str, Any]:
    """A registry entry of ``agent_id`` with ``distribution``."""
    return {
        "id": agent_id,
        "name": agent_id.title(),
        "version": "1.2.3",
        "description": f"the {agent_id} agent",
        "distribution": distribution,
    }


# --------------------------------------------------------------------------- the listing


async def test_the_snapshot_is_listed_with_its_provenance(tmp_path: Path) -> None:
    """``agents --registry`` lists every agent of the snapshot and where it was built from."""
    done = await cli("agents", "--registry", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    out = done.stdout.decode()
    provenance = json.loads(
        (resources.files("orchestrator") / "data" / "registry.provenance.json").read_text()
    )
    first = out.splitlines()[0]
    assert provenance["commit"][:12] in first and "agentclientprotocol/registry" in first
    agents = snapshot()["agents"]
    assert len(agents) >= 10
    for agent in agents:
        assert f"registry:{agent['id']} " in out
        assert f"{agent['name']} {agent['version']}" in out
    assert "registry:claude-code-acp" in out and "[npx]" in out and "[binary]" in out


async def test_the_snapshot_as_json_validates_and_says_what_runs_here(tmp_path: Path) -> None:
    """``--registry builtin --json``: schema-valid rows, one per agent, with what runs here."""
    done = await cli("agents", "--registry", "builtin", "--json", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    document = json.loads(done.stdout)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    assert document["registry"]["source"] == "builtin"
    assert document["registry"]["provenance"]["license"] == "Apache-2.0"
    rows = {row["id"]: row for row in document["agents"]}
    assert list(rows) == [a["id"] for a in snapshot()["agents"]]
    claude = rows["claude-code-acp"]
    assert claude["distributions"] == ["npx"]
    assert claude["agent"] == "registry:claude-code-acp"
    assert claude["runnable"] is True and claude["runWith"] == "npx"  # npx is on PATH here


async def test_a_registry_file_without_npx_says_why_it_cannot_run(tmp_path: Path) -> None:
    """An entry whose only kind cannot start here is listed with the reason."""
    path = registry_file(
        tmp_path / "r.json",
        entry("py-agent", uvx={"package": "py-agent"}),
        entry("far-away", binary={"windows-aarch64": {"archive": "https://x/a.zip", "cmd": "a"}}),
    )
    empty = tmp_path / "empty-path"
    empty.mkdir()
    done = await cli(
        "agents", "--registry", str(path), "--json", cwd=tmp_path, env={"PATH": str(empty)}
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    rows = {row["id"]: row for row in json.loads(done.stdout)["agents"]}
    assert rows["py-agent"]["runnable"] is False
    assert rows["py-agent"]["whyNot"] == "uvx not found"
    assert rows["far-away"]["whyNot"] == f"no binary for {reg.platform_key()}"


async def test_a_registry_fetched_from_a_url(tmp_path: Path) -> None:
    """A registry URL is fetched and listed like a file."""
    body = json.dumps({"version": "1.0.0", "agents": [entry("web", npx={"package": "w"})]})
    with serve({"/registry.json": body.encode()}) as base:
        done = await cli("agents", "--registry", f"{base}/registry.json", "--json", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    document = json.loads(done.stdout)
    assert document["registry"]["source"] == f"{base}/registry.json"
    assert [row["id"] for row in document["agents"]] == ["web"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read registry"),
        ("{not json", "is not JSON"),
        ('{"agents": 3}', 'not an ACP registry (no "agents" list)'),
        ('{"agents": [{"id": "x"}]}', "agents[0] has no 'name' string"),
        ('{"agents": [{"id": "X y", "name": "n", "version": "1", "description": "d"}]}', "id"),
        (json.dumps({"agents": [entry("a", npx={"args": []})]}), "npx has no package"),
        (json.dumps({"agents": [entry("a", binary={"linux-x86_64": {"cmd": "a"}})]}), "archive"),
    ],
    ids=["missing", "not-json", "no-agents", "no-name", "bad-id", "no-package", "no-archive"],
)
async def test_a_bad_registry_file_is_one_line_exit_2(
    tmp_path: Path, content: str | None, said: str
) -> None:
    """A file that cannot be read or is no registry: one line on stderr, exit 2."""
    path = tmp_path / "registry.json"
    if content is not None:
        path.write_text(content)
    line = one_line_error(await cli("agents", "--registry", str(path), cwd=tmp_path))
    assert said in line


async def test_bad_registry_urls_are_one_line_exit_2(tmp_path: Path) -> None:
    """Plain HTTP off this machine, a 404 and a body over the cap: one line each, exit 2."""
    line = one_line_error(
        await cli("agents", "--registry", "http://example.invalid/r.json", cwd=tmp_path)
    )
    assert "must be https://" in line
    with serve({}) as base:
        line = one_line_error(await cli("agents", "--registry", f"{base}/r.json", cwd=tmp_path))
    assert "cannot fetch registry" in line and "Not Found" in line


def test_a_registry_over_the_size_cap_is_refused() -> None:
    """More bytes than the cap: refused without parsing."""
    with (
        serve({"/r.json": b" " * 2048}) as base,
        pytest.raises(RegistryError, match="larger than 1024 bytes"),
    ):
        reg.fetch_registry(f"{base}/r.json", max_bytes=1024)


async def test_an_unknown_registry_id_is_exit_2_with_a_suggestion(tmp_path: Path) -> None:
    """``--agent registry:ID`` with an id the snapshot lacks: one line naming a close id."""
    line = one_line_error(
        await cli("prompt", "--agent", "registry:claude-code", "hi", cwd=tmp_path)
    )
    assert "no agent 'claude-code' in the registry builtin" in line
    assert "did you mean 'claude-code-acp'?" in line


# --------------------------------------------------------------------------- registry:ID


def test_npx_entries_run_pinned_through_npx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot's npx entry runs as ``npx -y PACKAGE@VERSION ARGS`` with its env."""
    monkeypatch.delenv(reg.ENV_VAR, raising=False)
    spec = resolve_agent("registry:qwen-code")
    assert spec.name == "qwen-code"
    assert spec.command == (
        "npx",
        "-y",
        "@qwen-code/qwen-code@0.9.1",
        "--acp",
        "--experimental-skills",
    )
    auggie = resolve_agent("aug=registry:auggie")
    assert auggie.name == "aug"
    assert auggie.command[:3] == ("npx", "-y", "@augmentcode/auggie@0.15.0")
    assert dict(auggie.env) == {"AUGMENT_DISABLE_AUTO_UPDATE": "1"}


def test_registry_entries_from_the_file_the_variable_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$ORCHESTRATOR_REGISTRY`` names the registry; unpinned packages get the version."""
    path = registry_file(
        tmp_path / "r.json",
        entry("node-one", npx={"package": "@scope/node-one", "args": ["--acp"]}),
        entry("py-one", uvx={"package": "py-one", "args": ["acp"], "env": {"A": "1"}}),
        entry("py-pinned", uvx={"package": "py-pinned==1.2.3"}),
    )
    monkeypatch.setenv(reg.ENV_VAR, str(path))
    assert resolve_agent("registry:node-one").command == (
        "npx",
        "-y",
        "@scope/node-one@1.2.3",
        "--acp",
    )
    # uvx or not on PATH, a uvx entry runs through uvx (absent, it fails to start saying so)
    py = reg.registry_spec(reg.load_registry(path).get("py-one"))
    assert py.command == ("uvx", "py-one@1.2.3", "acp")
    assert dict(py.env) == {"A": "1"}
    pinned = reg.registry_spec(reg.load_registry(path).get("py-pinned"))
    assert pinned.command[:2] == ("uvx", "py-pinned==1.2.3")
    with pytest.raises(RegistryError, match="no agent 'gemini' in the registry"):
        resolve_agent("registry:gemini")


def test_a_binary_entry_starts_through_the_archive_launcher(tmp_path: Path) -> None:
    """A binary entry for this platform runs the archive launcher with its URL, cmd and args."""
    target = {"archive": "https://example.invalid/a.tar.gz", "cmd": "./a", "args": ["acp"]}
    agent = reg.parse_registry(
        {"agents": [entry("bin", binary={str(reg.platform_key()): target})]}, "test"
    ).agents[0]
    spec = reg.registry_spec(agent, cache_dir=str(tmp_path))
    assert spec.command[:3] == (sys.executable, "-m", "orchestrator._agent_archive")
    argv = list(spec.command)
    assert f"--archive={target['archive']}" in argv
    assert "--cmd=./a" in argv
    assert f"--cache={tmp_path}" in argv
    assert argv[-2:] == ["--", "acp"]
    elsewhere = reg.parse_registry(
        {"agents": [entry("bin", binary={"windows-aarch64": target})]}, "test"
    ).agents[0]
    if reg.platform_key() != "windows-aarch64":
        with pytest.raises(RegistryError, match="cannot run: no binary for"):
            reg.registry_spec(elsewhere)


# --------------------------------------------------------------------------- binary archives


def test_an_archive_is_fetched_once_and_a_checksum_mismatch_refused(tmp_path: Path) -> None:
    """A wrong SHA-256 is refused with nothing cached; the right one unpacks, once."""
    data = archive_of({"agent": DEMO_AGENT})
    digest = hashlib.sha256(data).hexdigest()
    cache = tmp_path / "cache"
    with serve({"/a.tar.gz": data}) as base:
        url = f"{base}/a.tar.gz"
        with pytest.raises(AgentArchiveError, match=r"SHA-256 \w+, the registry says 0+: refused"):
            ensure(cache, "demo-1", url, "./agent", "0" * 64)
        assert list(cache.iterdir()) == []  # nothing kept, not even a partial download
        program = ensure(cache, "demo-1", url, "./agent", digest)
    assert program == cache / "demo-1" / "agent" and os.access(program, os.X_OK)
    # the server is gone: the cached copy serves, and the digest it was fetched with is kept
    assert ensure(cache, "demo-1", url, "./agent", digest) == program
    with pytest.raises(AgentArchiveError, match=r"remove \S+ to fetch it again"):
        ensure(cache, "demo-1", url, "./agent", "1" * 64)


async def test_a_binary_agent_of_a_registry_completes_a_turn(tmp_path: Path) -> None:
    """``--agent registry:ID`` of a binary entry: downloaded from the server, run, one turn."""
    data = archive_of({"bin/agent": DEMO_AGENT})
    with serve({"/demo.tar.gz": data}) as base:
        target = {
            "archive": f"{base}/demo.tar.gz",
            "cmd": "./bin/agent",
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        path = registry_file(
            tmp_path / "r.json", entry("demo-bin", binary={str(reg.platform_key()): target})
        )
        project = tmp_path / "project"
        project.mkdir()
        state = tmp_path / "state"
        env = {reg.ENV_VAR: str(path), "ORCHESTRATOR_STATE_DIR": str(state)}
        done = await cli(
            "prompt", "--agent", "registry:demo-bin", "--json", "hello", cwd=project, env=env
        )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["stopReason"] == "end_turn" and result["agent"]["name"] == "demo-bin"
    assert (
        state / "cache" / "agents" / f"demo-bin-1.2.3-{reg.platform_key()}" / "bin" / "agent"
    ).is_file()


# --------------------------------------------------------------------------- login required


async def test_an_agent_needing_a_terminal_login_fails_at_once_naming_it(tmp_path: Path) -> None:
    """session/new answers -32000, the agent offers only a terminal login: LoginRequired names
    it and its command, and ``authenticate`` is never sent."""
    record = tmp_path / "agent.jsonl"
    setup = AuthMethod(
        "setup", "Configure the provider", "Interactive setup", "terminal", ("--setup",)
    )
    script = AgentScript(auth_methods=(setup,), require_auth=True, record_path=str(record))
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script.to_json()))
    command = agent_command(path)
    with trio.fail_after(LIMIT):
        async with open_agent(command, name="needs-login", cwd=tmp_path) as conn:
            with pytest.raises(LoginRequired) as info:
                await conn.new_session(tmp_path)
    error = info.value
    expected = " ".join([*command, "--setup"])
    assert [m["id"] for m in error.methods] == ["setup"]
    assert error.methods[0]["command"] == expected
    assert f"log in with `{expected}`" in str(error)
    assert "setup: Configure the provider, Interactive setup" in str(error)
    received = [json.loads(line) for line in record.read_text().splitlines()]
    methods = [e["message"].get("method") for e in received if e["event"] == "recv"]
    assert "authenticate" not in methods and methods.count("session/new") == 1


async def test_the_one_agent_method_beside_a_terminal_login_is_used(tmp_path: Path) -> None:
    """An agent method and a terminal login offered (Hermes does): the agent method is the
    only one a client can send, so it is used and the session opens."""
    record = tmp_path / "agent.jsonl"
    methods = (
        AuthMethod("openrouter", "openrouter runtime credentials"),
        AuthMethod("setup", "Configure", None, "terminal", ("--setup",)),
    )
    script = AgentScript(auth_methods=methods, require_auth=True, record_path=str(record))
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script.to_json()))
    with trio.fail_after(LIMIT):
        async with open_agent(agent_command(path), name="hermes-like", cwd=tmp_path) as conn:
            session = await conn.new_session(tmp_path)
    assert session.session_id
    received = [json.loads(line) for line in record.read_text().splitlines()]
    sent = [e["message"] for e in received if e["event"] == "recv"]
    assert [m["params"]["methodId"] for m in sent if m.get("method") == "authenticate"] == [
        "openrouter"
    ]


async def test_a_login_required_run_says_what_to_run(tmp_path: Path) -> None:
    """Through ``prompt``: the run fails at once with the methods and the command to run."""
    methods = (
        AuthMethod("oauth", "Sign in", "opens a browser"),
        AuthMethod("key", "API key"),
    )
    script = AgentScript(auth_methods=methods, require_auth=True)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script.to_json()))
    agent = "locked=" + " ".join(agent_command(path))
    project = tmp_path / "project"
    project.mkdir()
    done = await cli(
        "prompt", "--agent", agent, "hello", cwd=project,
        env={"ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    said = done.stderr.decode()
    assert "authentication required; offered: oauth, key" in said
    assert "oauth: Sign in, opens a browser" in said
    assert "choose one with the agent's auth_method" in said


def test_an_archive_command_outside_the_archive_is_refused(tmp_path: Path) -> None:
    """A ``cmd`` that is absolute or climbs out of the archive is refused before any fetch."""
    for cmd in ("/bin/sh", "../../bin/sh", "./../x"):
        with pytest.raises(AgentArchiveError, match="not a path inside the archive"):
            ensure(tmp_path, "k", "https://example.invalid/a.tar.gz", cmd, None)
    assert list(tmp_path.iterdir()) == []


def test_registry_agents_say_what_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """An npx agent of the registry needs Node.js, and its description names the registry."""
    monkeypatch.delenv(reg.ENV_VAR, raising=False)
    spec = resolve_agent("registry:gemini")
    assert spec.needs.runtime == "Node.js (npx)"
    assert spec.description.startswith("Gemini CLI 0.27.3 from the ACP registry (builtin)")
