"""The ACP registry against hostile input: redirects off the URL rule, servers that trickle,
registries nested deep or holding option-like packages, control characters and duplicate ids,
archives that fail, bombs and interrupted downloads, and odd ``--registry`` values."""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from run_helpers import CLI, CLI_LIMIT, one_line_error
from run_helpers import run_console as cli

from orchestrator import _agent_archive as archive
from orchestrator import registry as reg
from orchestrator.errors import AgentArchiveError, RegistryError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: an address of TEST-NET-1 (RFC 5737): nothing answers there
BLACKHOLE = "http://192.0.2.2:8932"
#: seconds a signalled process has to end
PROMPTLY = 10.0

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@contextmanager
def server(routes: Mapping[str, Route]) -> Iterator[tuple[str, threading.Event]]:
    """An HTTP server on 127.0.0.1 answering each path with its route; yields its base URL
    and an event set once any request arrived."""
    asked = threading.Event()
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.set()
            route = routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            route(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.stop = stop  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", asked
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def body(data: bytes) -> Route:
    """A route answering 200 with ``data``."""

    def route(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return route


def redirect(to: str) -> Route:
    """A route answering 302 to ``to`` (a path of this server or a URL)."""

    def route(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", to)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return route


def trickle(handler: http.server.BaseHTTPRequestHandler) -> None:
    """A route that sends one byte every 0.2 s until the client goes or the server stops."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(10**9))
    handler.end_headers()
    stop: threading.Event = handler.server.stop  # type: ignore[attr-defined]
    while not stop.wait(0.2):
        try:
            handler.wfile.write(b" ")
            handler.wfile.flush()
        except OSError:
            return


def entry(agent_id: str, **distribution: Any) -> dict[str, Any]:
    """A registry entry of ``agent_id`` with ``distribution``."""
    return {
        "id": agent_id,
        "name": agent_id.title(),
        "version": "1.2.3",
        "description": f"the {agent_id} agent",
        "distribution": distribution,
    }


def registry_json(*entries: dict[str, Any]) -> bytes:
    """A registry document holding ``entries``."""
    return json.dumps({"version": "1.0.0", "agents": list(entries)}).encode()


def registry_file(path: Path, *entries: dict[str, Any]) -> Path:
    """A registry file holding ``entries``."""
    path.write_bytes(registry_json(*entries))
    return path


def binary(archive_url: str, cmd: str = "./agent") -> dict[str, Any]:
    """A ``binary`` distribution for this platform."""
    return {str(reg.platform_key()): {"archive": archive_url, "cmd": cmd}}


def tar_gz(files: Mapping[str, bytes]) -> bytes:
    """A .tar.gz holding ``files`` (executable)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --------------------------------------------------------------------------- 1: redirects


async def test_a_redirect_to_plain_http_elsewhere_is_refused_before_connecting(
    tmp_path: Path,
) -> None:
    """A local registry URL answering 302 to plain HTTP on another host: refused, one line."""
    with server({"/to-lan": redirect(f"{BLACKHOLE}/r.json")}) as (base, _):
        line = one_line_error(await cli("agents", "--registry", f"{base}/to-lan", cwd=tmp_path))
    assert f"redirected to {BLACKHOLE}/r.json is not allowed" in line


async def test_a_redirect_loop_is_one_line(tmp_path: Path) -> None:
    """A registry URL that redirects to itself: one line naming the loop, exit 2."""
    with server({"/loop": redirect("/loop")}) as (base, _):
        line = one_line_error(await cli("agents", "--registry", f"{base}/loop", cwd=tmp_path))
    assert "redirect loop" in line


def test_a_redirect_within_the_rule_is_followed() -> None:
    """A redirect to another local URL is followed."""
    routes = {
        "/old": redirect("/r.json"),
        "/r.json": body(registry_json(entry("a", npx={"package": "a"}))),
    }
    with server(routes) as (base, _):
        found = reg.fetch_registry(f"{base}/old")
    assert [a.id for a in found.agents] == ["a"]


def test_an_archive_redirected_off_the_rule_is_refused(tmp_path: Path) -> None:
    """An archive URL answering 302 to plain HTTP on another host is not fetched."""
    with (
        server({"/x.tar.gz": redirect(f"{BLACKHOLE}/good.tar.gz")}) as (base, _),
        pytest.raises(AgentArchiveError, match=r"redirected to .* is not allowed"),
    ):
        archive.ensure(tmp_path, "k", f"{base}/x.tar.gz", "./agent", None)
    with (
        server({"/y": redirect("http://example.com/a.tar.gz")}) as (other, _),
        pytest.raises(AgentArchiveError, match=r"redirected to http://example\.com/"),
    ):
        archive.ensure(tmp_path, "k", f"{other}/y", "./agent", None)


# --------------------------------------------------------------------------- 2: deadlines


def test_a_trickling_registry_ends_at_its_deadline() -> None:
    """A server sending a byte now and then cannot hold the fetch past its total deadline."""
    failures: list[BaseException] = []

    def fetch(base: str) -> None:
        try:
            reg.fetch_registry(f"{base}/slow", timeout=1.0)
        except RegistryError as e:
            failures.append(e)

    with server({"/slow": trickle}) as (base, _):
        thread = threading.Thread(target=fetch, args=(base,), daemon=True)
        thread.start()
        thread.join(PROMPTLY)
        assert not thread.is_alive(), "the fetch outlived its deadline"
    assert len(failures) == 1 and "not done within 1 s" in str(failures[0])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_ends_a_registry_fetch_at_once(tmp_path: Path, signum: int) -> None:
    """Ctrl-C or SIGTERM during ``agents --registry URL`` of a trickling server: exit 130."""
    with server({"/slow": trickle}) as (base, asked):
        proc = await trio.lowlevel.open_process(
            [str(CLI), "agents", "--registry", f"{base}/slow"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with trio.fail_after(CLI_LIMIT):
                await trio.to_thread.run_sync(asked.wait)
            proc.send_signal(signum)
            with trio.fail_after(PROMPTLY):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == EXIT_INTERRUPTED


# --------------------------------------------------------------------------- 3: nesting


@pytest.mark.parametrize("opener", ["[", '{"a":'])
async def test_a_registry_nested_deep_is_one_line(tmp_path: Path, opener: str) -> None:
    """A registry nested 100,000 deep: one line, exit 2, in the listing and in registry:ID."""
    closer = "]" if opener == "[" else "}"
    deep = tmp_path / "deep.json"
    deep.write_text(opener * 100_000 + closer * 100_000)
    line = one_line_error(await cli("agents", "--registry", str(deep), cwd=tmp_path))
    assert "nested too deeply" in line
    done = await cli(
        "prompt", "--agent", "registry:x", "hi", cwd=tmp_path, env={reg.ENV_VAR: str(deep)}
    )
    assert "nested too deeply" in one_line_error(done)


# --------------------------------------------------------------------------- 4: fields


@pytest.mark.parametrize(
    ("kind", "fields", "said"),
    [
        ("npx", {"package": "-c=touch /tmp/PWNED"}, "npx package '-c=touch /tmp/PWNED'"),
        ("npx", {"package": "--registry=http://evil/ pkg"}, "npx package '--registry="),
        ("npx", {"package": "pkg\nx"}, "npx package"),
        ("uvx", {"package": "--from=/tmp/evil foo"}, "uvx package '--from=/tmp/evil foo'"),
        ("npx", {"package": "p", "args": [1, {"a": 2}, None]}, "npx args must be"),
        ("npx", {"package": "p", "env": {"A": 3}}, "npx env A must be a string"),
        ("npx", {"package": "p", "env": {"A=B": "x"}}, "npx env name 'A=B'"),
    ],
)
async def test_entries_with_unsafe_fields_cannot_run(
    tmp_path: Path, kind: str, fields: dict[str, Any], said: str
) -> None:
    """An option-like package, non-string args or env: listed as unable to run, and
    ``registry:ID`` is one line naming the id and the field."""
    path = registry_file(tmp_path / "r.json", entry("evil", **{kind: fields}))
    done = await cli("agents", "--registry", str(path), cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    listed = done.stdout.decode()
    assert "runs here" not in listed and "cannot run: " + said in listed
    line = one_line_error(
        await cli(
            "prompt", "--agent", "registry:evil", "hi", cwd=tmp_path, env={reg.ENV_VAR: str(path)}
        )
    )
    assert "registry agent 'evil' cannot run: " + said in line


@pytest.mark.parametrize(
    ("kind", "package"),
    [
        ("npx", "@zed-industries/claude-code-acp@0.16.0"),
        ("npx", "plain"),
        ("npx", "pkg@^1.2"),
        ("uvx", "fast-agent-mcp[extra,more]==0.4.1"),
        ("uvx", "kimi-cli@latest"),
    ],
)
def test_package_names_with_versions_are_accepted(kind: str, package: str) -> None:
    """Scoped npm names, versions, ranges, PyPI extras and pins pass the check."""
    agent = reg.parse_registry({"agents": [entry("ok", **{kind: {"package": package}})]}, "t")
    problem = agent.agents[0].problem(kind)
    assert problem is None or problem.endswith(" not found")


# --------------------------------------------------------------------------- 5: the listing


async def test_control_characters_in_the_listing_are_escaped(tmp_path: Path) -> None:
    """A CR/LF in a name or description cannot add a line of its own to the listing."""
    sly = entry("sly", npx={"package": "sly"})
    sly["name"] = "Sly\r\nregistry:fake  Fake 9 [npx]: runs here via npx"
    sly["description"] = "ok\nregistry:other"
    path = registry_file(tmp_path / "r.json", sly)
    done = await cli("agents", "--registry", str(path), cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 3, lines  # the heading, the agent, its description
    assert "Sly\\r\\nregistry:fake" in lines[1] and lines[2].endswith("ok\\nregistry:other")


async def test_two_entries_with_one_id_refuse_the_registry(tmp_path: Path) -> None:
    """The same id twice: the registry is refused, one line, exit 2."""
    path = registry_file(
        tmp_path / "r.json",
        entry("twin", npx={"package": "a"}),
        entry("twin", npx={"package": "b"}),
    )
    line = one_line_error(await cli("agents", "--registry", str(path), cwd=tmp_path))
    assert "the id 'twin' appears twice" in line


@pytest.mark.parametrize(
    "url", ["ftp://example.com/a.tar.gz", "http://10.255.255.1/a.tar.gz"], ids=["ftp", "lan"]
)
async def test_an_archive_launch_refuses_is_not_listed_as_running(tmp_path: Path, url: str) -> None:
    """The listing asks launch's own check: an archive URL it refuses cannot run."""
    path = registry_file(tmp_path / "r.json", entry("far", binary=binary(url)))
    done = await cli("agents", "--registry", str(path), cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert f"cannot run: binary archive {url} is not allowed" in done.stdout.decode()
    line = one_line_error(
        await cli(
            "prompt", "--agent", "registry:far", "hi", cwd=tmp_path, env={reg.ENV_VAR: str(path)}
        )
    )
    assert f"registry agent 'far' cannot run: binary archive {url} is not allowed" in line


# --------------------------------------------------------------------------- 6: launch errors


async def launch(tmp_path: Path, target: dict[str, Any]) -> str:
    """``prompt --agent registry:bin`` of a binary entry ``target``: its stderr (it failed)."""
    path = registry_file(tmp_path / "r.json", entry("bin", binary=target))
    env = {reg.ENV_VAR: str(path), "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}
    project = tmp_path / "project"
    project.mkdir()
    done = await cli("prompt", "--agent", "registry:bin", "hi", cwd=project, env=env)
    assert done.returncode not in (EXIT_OK, EXIT_INTERRUPTED), done
    said = done.stderr.decode()
    assert "Traceback" not in said and "exit status 127" not in said, said
    return said


async def test_a_failed_download_is_the_error_itself(tmp_path: Path) -> None:
    """An archive that is not found: the error says so, not only an exit status."""
    with server({}) as (base, _):
        said = await launch(tmp_path, binary(f"{base}/missing.tar.gz"))
    assert f"cannot fetch archive {base}/missing.tar.gz: Not Found" in said.splitlines()[0]


async def test_a_file_that_is_no_program_is_one_line(tmp_path: Path) -> None:
    """``file:///etc/passwd`` as the archive: it cannot be run, said in one line."""
    said = await launch(tmp_path, binary("file:///etc/passwd"))
    assert "cannot run './agent' of file:///etc/passwd: Exec format error" in said.splitlines()[0]


async def test_a_cmd_missing_from_the_archive_is_said_plainly(tmp_path: Path) -> None:
    """An archive without the entry's ``cmd``: the error names it."""
    with server({"/a.tar.gz": body(tar_gz({"other": b"#!/bin/sh\n"}))}) as (base, _):
        said = await launch(tmp_path, binary(f"{base}/a.tar.gz", "./bin/agent"))
    assert f"the archive {base}/a.tar.gz has no './bin/agent' in it" in said.splitlines()[0]


async def test_a_cmd_leaving_the_archive_is_named_as_the_entry_says(tmp_path: Path) -> None:
    """``cmd: ../../../../../bin/sh`` is refused as written, not resolved against the cwd."""
    line = one_line_error(
        await cli(
            "prompt",
            "--agent",
            "registry:bin",
            "hi",
            cwd=tmp_path,
            env={
                reg.ENV_VAR: str(
                    registry_file(
                        tmp_path / "r.json",
                        entry(
                            "bin",
                            binary=binary("https://example.com/a.tgz", "../../../../../bin/sh"),
                        ),
                    )
                )
            },
        )
    )
    assert "binary cmd '../../../../../bin/sh' is not a path inside the archive" in line


async def test_a_binary_not_yet_downloaded_is_not_called_installed(tmp_path: Path) -> None:
    """``agents --check registry:ID`` of an archive not in the cache: it downloads on first use,
    and the failed download is the check's cause."""
    with server({}) as (base, _):
        path = registry_file(tmp_path / "r.json", entry("bin", binary=binary(f"{base}/a.tar.gz")))
        env = {reg.ENV_VAR: str(path), "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}
        done = await cli("agents", "--check", "registry:bin", cwd=tmp_path, env=env)
    out = done.stdout.decode()
    assert "(installed)" not in out and "downloads its registry archive on first use" in out
    assert f"cannot fetch archive {base}/a.tar.gz: Not Found" in out


# --------------------------------------------------------------------------- 7: the cache


def test_an_interrupted_download_leaves_no_work_directory(tmp_path: Path) -> None:
    """SIGTERM during an archive download: its work directory is removed."""
    cache = tmp_path / "cache"
    with server({"/a.tar.gz": trickle}) as (base, asked):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator._agent_archive",
                f"--cache={cache}",
                "--key=drip-1",
                f"--archive={base}/a.tar.gz",
                "--cmd=./agent",
            ],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert asked.wait(CLI_LIMIT)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(PROMPTLY) == 128 + signal.SIGTERM
        finally:
            proc.kill()
            proc.wait()
    assert [p.name for p in cache.iterdir()] == []


def test_work_directories_left_behind_are_swept(tmp_path: Path) -> None:
    """What a launcher killed outright left is removed by the next download of that agent."""
    data = tar_gz({"agent": b"#!/bin/sh\n"})
    stale = tmp_path / ".drip-1.abcd1234"
    (stale / "unpacked").mkdir(parents=True)
    with server({"/a.tar.gz": body(data)}) as (base, _):
        archive.ensure(tmp_path, "drip-1", f"{base}/a.tar.gz", "./agent", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drip-1"]


@pytest.mark.parametrize(
    ("cap", "value", "files", "said"),
    [
        ("MAX_UNPACKED", 1000, {"agent": b"x" * 2000}, "unpacks to 2000 bytes, more than 1000"),
        ("MAX_MEMBERS", 2, {"agent": b"", "b": b"", "c": b""}, "has more than 2 members"),
        ("MAX_DOWNLOAD", 100, {"agent": os.urandom(2000)}, "is larger than 100 bytes"),
    ],
)
def test_archives_over_the_caps_are_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cap: str,
    value: int,
    files: dict[str, bytes],
    said: str,
) -> None:
    """Unpacked size, member count and download size each have a cap, refused in one line."""
    monkeypatch.setattr(archive, cap, value)
    cache = tmp_path / "cache"
    with (
        server({"/a.tar.gz": body(tar_gz(files))}) as (base, _),
        pytest.raises(AgentArchiveError, match=said),
    ):
        archive.ensure(cache, "k", f"{base}/a.tar.gz", "./agent", None)
    assert [p.name for p in cache.iterdir()] == []


# --------------------------------------------------------------------------- 8: --registry


async def test_a_file_url_is_read_and_other_schemes_refused(tmp_path: Path) -> None:
    """``--registry file:///PATH`` reads the file; ``ftp://`` is refused by name."""
    path = registry_file(tmp_path / "r.json", entry("a", npx={"package": "a"}))
    done = await cli("agents", "--registry", path.as_uri(), "--json", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert [row["id"] for row in json.loads(done.stdout)["agents"]] == ["a"]
    line = one_line_error(
        await cli("agents", "--registry", "ftp://example.com/r.json", cwd=tmp_path)
    )
    assert "ftp:// is not a registry source" in line


async def test_a_fifo_is_refused(tmp_path: Path) -> None:
    """A FIFO as the registry: refused at once as no regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with trio.fail_after(PROMPTLY):
        line = one_line_error(await cli("agents", "--registry", str(fifo), cwd=tmp_path))
    assert "not a regular file" in line


async def test_url_credentials_are_never_printed(tmp_path: Path) -> None:
    """A registry URL with a user and password: the error does not show them."""
    done = await cli("agents", "--registry", "http://user:s3cret@127.0.0.1:9/r.json", cwd=tmp_path)
    line = one_line_error(done)
    assert "s3cret" not in line and "user" not in line and "***@127.0.0.1:9" in line


async def test_registry_without_a_value_reads_the_variable(tmp_path: Path) -> None:
    """``--registry`` alone lists what ``registry:ID`` reads: ``$ORCHESTRATOR_REGISTRY``."""
    path = registry_file(tmp_path / "r.json", entry("mine", npx={"package": "mine"}))
    done = await cli("agents", "--registry", "--json", cwd=tmp_path, env={reg.ENV_VAR: str(path)})
    assert done.returncode == EXIT_OK, done.stderr.decode()
    document = json.loads(done.stdout)
    assert document["registry"]["source"] == str(path)
    assert [row["id"] for row in document["agents"]] == ["mine"]


async def test_a_url_in_the_variable_is_refused_alike(tmp_path: Path) -> None:
    """``$ORCHESTRATOR_REGISTRY`` naming a URL: ``--registry`` alone and ``registry:ID`` both
    refuse it with the same line (resolving an agent never waits on the network)."""
    env = {reg.ENV_VAR: "https://user:pw@example.com/r.json"}
    listed = one_line_error(await cli("agents", "--registry", cwd=tmp_path, env=env))
    run = one_line_error(await cli("prompt", "--agent", "registry:a", "hi", cwd=tmp_path, env=env))
    assert listed == run and "must name a registry file" in run and "pw" not in run


# --------------------------------------------------------------------------- 9: one URL


async def test_help_and_readme_name_the_same_registry_url(tmp_path: Path) -> None:
    """``agents --help`` names the URL the README names, the one constant."""
    done = await cli("agents", "--help", cwd=tmp_path)
    assert reg.OFFICIAL_URL in done.stdout.decode()
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert reg.OFFICIAL_URL in readme and "cdn.agentclientprotocol.com" not in readme


# --------------------------------------------------------------------------- 10: more odd input


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "file-url"])
async def test_a_directory_as_the_registry_is_one_line(tmp_path: Path, as_url: bool) -> None:
    """A directory (by path or ``file://``), in ``--registry``, in the variable and in
    ``registry:ID``: one line saying it is no regular file, exit 2."""
    where = tmp_path.as_uri() if as_url else str(tmp_path)
    (tmp_path / "proj").mkdir()
    lines = [
        one_line_error(await cli("agents", "--registry", where, cwd=tmp_path)),
        one_line_error(await cli("agents", "--registry", cwd=tmp_path, env={reg.ENV_VAR: where})),
        one_line_error(
            await cli(
                "prompt", "--agent", "registry:x", "--cwd", "proj", "hi",
                cwd=tmp_path, env={reg.ENV_VAR: where},
            )
        ),
    ]  # fmt: skip
    assert all("not a regular file" in line for line in lines), lines


async def test_a_url_with_credentials_is_refused_not_mangled(tmp_path: Path) -> None:
    """``http://u:pw@127.0.0.1:PORT/ok``: refused in one line before any request (no name
    lookup of ``u:pw@127.0.0.1``), the password never shown."""
    ok = body(registry_json(entry("a", npx={"package": "a"})))
    with server({"/ok": ok}) as (base, asked):
        port = base.rsplit(":", 1)[1]
        url = f"http://u:pw@127.0.0.1:{port}/ok"
        line = one_line_error(await cli("agents", "--registry", url, cwd=tmp_path))
        assert not asked.is_set()
        plain = await cli("agents", "--registry", f"{base}/ok", cwd=tmp_path)
    assert "a URL must not carry credentials" in line, line
    assert "pw" not in line and "Name or service" not in line
    assert plain.returncode == EXIT_OK, plain.stderr.decode()


async def test_a_redirect_to_a_file_url_is_refused_by_the_rule(tmp_path: Path) -> None:
    """A registry URL answering 302 to ``file:///etc/passwd``: the rule's refusal, not a
    redirect loop."""
    with server({"/to-file": redirect("file:///etc/passwd")}) as (base, _):
        line = one_line_error(await cli("agents", "--registry", f"{base}/to-file", cwd=tmp_path))
    assert "redirected to file:///etc/passwd is not allowed: a URL must be https://" in line


@pytest.mark.parametrize(
    ("kind", "package", "version", "said"),
    [
        ("npx", "pkg@--evil", "1.0.0", "npx package 'pkg@--evil'"),
        ("npx", "@s/pkg@-x", "1.0.0", "npx package '@s/pkg@-x'"),
        ("uvx", "pkg@--evil", "1.0.0", "uvx package 'pkg@--evil'"),
        ("uvx", "pkg==-1", "1.0.0", "uvx package 'pkg==-1'"),
        ("npx", "pkg", "--evil", "npx version '--evil'"),
        ("npx", "pkg", "1.0 x", "npx version '1.0 x'"),
        ("uvx", "pkg", "-1", "uvx version '-1'"),
    ],
)
async def test_option_like_versions_cannot_run(
    tmp_path: Path, kind: str, package: str, version: str, said: str
) -> None:
    """A version (in the package or the entry's ``version``, which is appended) starting with
    ``-`` or holding a space: listed as unable to run, and ``registry:ID`` refuses it."""
    evil = entry("evil", **{kind: {"package": package}})
    evil["version"] = version
    path = registry_file(tmp_path / "r.json", evil)
    done = await cli("agents", "--registry", str(path), cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    listed = done.stdout.decode()
    assert "runs here" not in listed and "cannot run: " + said in listed, listed
    line = one_line_error(
        await cli(
            "prompt", "--agent", "registry:evil", "hi", cwd=tmp_path, env={reg.ENV_VAR: str(path)}
        )
    )
    assert "registry agent 'evil' cannot run: " + said in line
