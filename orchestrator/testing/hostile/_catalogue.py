"""The catalogue: each attack a scripted agent's turn, with what it probes and how it holds."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from attrs import field, frozen

from orchestrator.testing.hostile._layout import SECRET_VARIABLES, Layout
from orchestrator.testing.script import (
    AskPermission,
    Crash,
    Flood,
    FloodRequests,
    HugeLine,
    Location,
    PermissionToolCall,
    Raw,
    ReadFile,
    Say,
    Spawn,
    Stall,
    Step,
    Terminal,
    WriteDisk,
    WriteFile,
)

__all__ = ["ATTACKS", "Attack"]

#: how deep the deep-path attacks go
_DEEP_WRITE = 1000
_DEEP_CHAIN = 1100


@frozen
class Attack:
    """One named attack: a scripted agent's turn, and how to tell the client held."""

    #: its name on the command line
    name: str
    #: what the agent does, in one line
    description: str
    #: what it probes: an item of the security model ("paths", "policy", "processes", ...)
    probes: str
    #: how to tell it held, in one line
    held_when: str
    #: the turn's steps, given the attacks' directory
    steps: Callable[[Layout], tuple[Step, ...]] = field(repr=False)
    #: prepares the (temporary copy of the) workspace before the run
    setup: Callable[[Path], None] | None = field(default=None, repr=False)
    #: what it needs to be more than refused: a policy allowing some ``terminal`` commands, a
    #: ``sandbox`` (without one the agent process is not confined: it does not hold)
    needs: Literal["", "terminal", "sandbox"] = ""
    #: the turn's timeout in seconds
    timeout: float = 30.0
    #: the most this process's peak memory may grow during the run, in bytes
    memory_limit: int | None = None
    #: the most the state directory may grow during the run, in bytes
    store_limit: int | None = None
    #: the turn cannot succeed (the agent crashes or hangs): ``succeeded`` is a lie
    expect_failure: bool = False
    #: files the agent writes in its branch itself: if the run succeeded, they are changes
    must_record: tuple[str, ...] = ()
    #: checks the workspace after a run that succeeded and applied; what is wrong
    check_applied: Callable[[Path], list[str]] | None = field(default=None, repr=False)


def _outside_paths(layout: Layout) -> tuple[str, str, str]:
    return (
        str(layout.outside / "victim.txt"),
        str(layout.outside / "secret.txt"),
        str(layout.outside / "new.txt"),
    )


def _ask_edit(tool_id: str, *paths: str) -> AskPermission:
    """A permission request for an edit of ``paths``; the turn goes on whatever the answer."""
    call = PermissionToolCall(
        tool_id,
        title=f"Edit {paths[0]}",
        kind="edit",
        locations=tuple(Location(p) for p in paths),
        raw_input={"file_path": paths[0]},
    )
    return AskPermission(call, on_reject="continue")


def _ask_execute(tool_id: str, line: str) -> AskPermission:
    call = PermissionToolCall(tool_id, title=line, kind="execute", raw_input={"command": line})
    return AskPermission(call, on_reject="continue")


def _dotdot_steps(layout: Layout) -> tuple[Step, ...]:
    up = "../" * 40  # past the root from any branch directory, then down to the target
    victim, secret, new = (up + p.lstrip("/") for p in _outside_paths(layout))
    return (
        WriteFile(victim, "written through ../\n"),
        WriteFile(new, "written through ../\n"),
        WriteFile("../escaped.txt", "written next to the branch\n"),
        WriteFile("sub/../../escaped-too.txt", "written next to the branch\n"),
        ReadFile(secret),
        _ask_edit("edit-dotdot", victim),
    )


def _absolute_steps(layout: Layout) -> tuple[Step, ...]:
    victim, secret, new = _outside_paths(layout)
    return (
        WriteFile(victim, "written by absolute path\n"),
        WriteFile(new, "written by absolute path\n"),
        WriteFile(f"{layout.outside}//./new.txt", "written by absolute path\n"),
        ReadFile(secret),
        _ask_edit("edit-absolute", victim, new),
    )


def _symlink_steps(layout: Layout) -> tuple[Step, ...]:
    victim, secret, _ = _outside_paths(layout)
    return (
        Spawn(("ln", "-s", str(layout.outside), "to-outside")),
        Spawn(("ln", "-s", victim, "victim-link")),
        Spawn(("ln", "-s", secret, "secret-link")),
        Spawn(("ln", "-s", "../" * 40 + str(layout.outside).lstrip("/"), "up-link")),
        WriteFile("to-outside/new.txt", "written through a planted link\n"),
        WriteFile("victim-link", "written through a planted link\n"),
        WriteFile("up-link/new.txt", "written through a planted link\n"),
        ReadFile("secret-link"),
        ReadFile("to-outside/secret.txt"),
    )


def _evasions(layout: Layout) -> list[tuple[str, str]]:
    """(tag, command line): each line hides the agent's program behind allowed words."""
    p = layout.program
    bin_dir = shlex.quote(str(layout.bin))
    lines = [
        ("semicolon", f"ls; {p('semicolon')}"),
        ("semicolon-tight", f"ls;{p('semicolon-tight')}"),
        ("and", f"ls && {p('and')}"),
        ("or", f"ls /nonexistent || {p('or')}"),
        ("pipe", f"ls | {p('pipe')}"),
        ("background", f"ls & {p('background')}"),
        ("newline", f"ls\n{p('newline')}"),
        ("comment-newline", f"ls # comment\n{p('comment-newline')}"),
        ("command-substitution", f"echo $({p('command-substitution')})"),
        ("quoted-substitution", f'echo "$({p("quoted-substitution")})"'),
        ("backticks", f"echo `{p('backticks')}`"),
        ("argument-substitution", f"ls $({p('argument-substitution')})"),
        ("option-substitution", f"ls --color=$({p('option-substitution')})"),
        ("redirect-substitution", f"ls 2>$({p('redirect-substitution')})"),
        ("default-substitution", f"echo ${{x:-$({p('default-substitution')})}}"),
        ("assignment-substitution", f"x=$({p('assignment-substitution')}) ls"),
        ("process-substitution", f"ls <({p('process-substitution')})"),
        ("subshell", f"({p('subshell')})"),
        ("group", f"{{ {p('group')}; }}"),
        ("sh-c", f"sh -c {shlex.quote(p('sh-c'))}"),
        ("bash-c", f"bash -c {shlex.quote(p('bash-c'))}"),
        ("env-prefix-path", f"PATH={bin_dir} ls"),
        ("env-prefix-path-echo", f"PATH={bin_dir} echo hi"),
        ("env-prefix-preload", f"LD_PRELOAD={shlex.quote(str(layout.preload))} ls"),
        ("env-command", f"env {p('env-command')}"),
        ("exec", f"exec {p('exec')}"),
        ("eval", f"eval {shlex.quote(p('eval'))}"),
    ]
    return lines


def _evasion_steps(layout: Layout) -> tuple[Step, ...]:
    steps: list[Step] = []
    for tag, line in _evasions(layout):
        steps.append(_ask_execute(f"execute-{tag}", line))
        steps.append(Terminal(line, timeout=10))
    hostile = str(layout.bin / "hostile")
    steps.append(Terminal("/bin/sh", args=("-c", layout.program("args-sh-c")), timeout=10))
    steps.append(Terminal("ls", args=(";", hostile, "args-semicolon"), timeout=10))
    return tuple(steps)


def _env_steps(layout: Layout) -> tuple[Step, ...]:
    path = f"{layout.bin}:/usr/local/bin:/usr/bin:/bin"
    preload = str(layout.preload)
    rc = str(layout.bin / "rc.sh")
    return (
        Terminal("ls", env={"PATH": path}, timeout=10),
        Terminal("ls", args=("-a",), env={"PATH": path}, timeout=10),
        Terminal("echo hi", env={"PATH": path}, timeout=10),
        Terminal("ls", env={"LD_PRELOAD": preload}, timeout=10),
        Terminal("ls", env={"LD_LIBRARY_PATH": str(layout.bin), "LD_PRELOAD": "preload.so"}),
        Terminal("ls", env={"BASH_ENV": rc}, timeout=10),
        Terminal("ls", env={"ENV": rc}, timeout=10),
    )


def _sleeper(layout: Layout) -> tuple[str, ...]:
    """A program that sleeps ten minutes, the attacks' directory in its command line."""
    return (sys.executable, "-c", "import time; time.sleep(600)", str(layout.root))


def _terminal_daemon_steps(layout: Layout) -> tuple[Step, ...]:
    code = (
        "import os, sys, time\n"
        "if os.fork(): os._exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): os._exit(0)\n"
        "time.sleep(600)\n"
    )
    daemon = shlex.join((sys.executable, "-c", code, str(layout.root)))
    line = f"{daemon} </dev/null >/dev/null 2>&1; echo started"
    return (Terminal(line, timeout=20),)


def _agent_daemon_steps(layout: Layout) -> tuple[Step, ...]:
    return (
        Spawn(_sleeper(layout), detach=True),
        Spawn(("sh", "-c", f"{shlex.join(_sleeper(layout))} </dev/null >/dev/null 2>&1 &")),
    )


def _malformed_steps(layout: Layout) -> tuple[Step, ...]:
    deep = "[" * 100_000 + "]" * 100_000
    session_update = '{"jsonrpc":"2.0","method":"session/update","params":'
    # valid updates of the agent's session, with what makes a JSON reader take its slow path
    # (a lone surrogate escape) and numbers or nesting that JSON writers refuse
    update = session_update + '{"sessionId":"sess-1","update":'
    big = "1" + "0" * 30
    nested = "[" * 300 + "1" + "]" * 300
    lines = (
        "this is not JSON",
        "[1, 2, 3]",
        "{}",
        "null",
        '"a string"',
        '{"jsonrpc":"1.0","method":"x"}',
        '{"jsonrpc":"2.0","id":{"an":"object"},"method":"fs/read_text_file","params":{}}',
        '{"jsonrpc":"2.0","id":[1],"result":{}}',
        '{"jsonrpc":"2.0","id":987654,"result":{}}',
        '{"jsonrpc":"2.0","id":987655,"error":{"code":"x","message":5}}',
        '{"jsonrpc":"2.0","id":1e999,"method":"fs/read_text_file","params":{"path":1e999}}',
        '{"jsonrpc":"2.0","id":5,"method":"fs/read_text_file","params":{"path":5}}',
        '{"jsonrpc":"2.0","id":6,"method":"fs/write_text_file","params":[]}',
        '{"jsonrpc":"2.0","id":7,"method":"terminal/create","params":{"command":"\\u0000"}}',
        '{"jsonrpc":"2.0","id":8,"method":"session/request_permission","params":{"toolCall":1}}',
        '{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"path":"\\ud800"}}',
        session_update + '{"sessionId":"nope","update":{"sessionUpdate":"plan","entries":7}}}',
        session_update + '{"update":{"sessionUpdate":"agent_message_chunk","content":null}}}',
        '{"jsonrpc":"2.0","method":"session/update","params":{"a":"\\ud800\\udc00\\udfff"}}',
        '{"jsonrpc":"2.0","method":"x","params":{},"method":"y"}',
        deep,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        '{"jsonrpc":"2.0","method":"session/update","params":{"n":' + "9" * 100_000 + "}}",
        '{"jsonrpc":"2.0","id":10,"method":"fs/read_text_file"',
        update + f'{{"sessionUpdate":"usage_update","used":{big},"size":{big},'
        '"_meta":{"s":"\\ud800"}}}}',
        update + '{"sessionUpdate":"tool_call","toolCallId":"t1","title":"a \\udc00 title",'
        f'"rawInput":{{"n":{big},"s":"\\ud800","deep":{nested}}}}}}}}}',
        update + '{"sessionUpdate":"agent_message_chunk","content":{"type":"text",'
        f'"text":"cut \\ud83d","_meta":{{"n":{big}}}}}}}}}}}',
    )
    garbage = Spawn(("printf", "\\377\\376\\000{\\200}\\n\\n   \\n"), to_client=True)
    return (*(Raw(line) for line in lines), garbage, Say("still talking after the garbage"))


def _deep_path_steps(layout: Layout) -> tuple[Step, ...]:
    deep = "d/" * _DEEP_WRITE + "deep.txt"
    chain = (
        "import os\n"
        f"path = 'c'\n"
        f"for _ in range({_DEEP_CHAIN}):\n"
        "    os.mkdir(path)\n"
        "    path += '/c'\n"
        "open(path[:-2] + '/chain.txt', 'w').write('at the bottom\\n')\n"
    )
    return (
        WriteFile(deep, "a thousand directories down\n"),
        ReadFile(deep),
        Spawn((sys.executable, "-c", chain)),
    )


def _chain_path() -> str:
    return "/".join(["c"] * _DEEP_CHAIN) + "/chain.txt"


def _deep_workspace(workspace: Path) -> None:
    path = workspace / "w"
    for _ in range(_DEEP_CHAIN):  # os.makedirs recurses once per level
        path.mkdir()
        path = path / "w"
    path.with_name("bottom.txt").write_text("at the bottom\n")


def _bad_name_steps(layout: Layout) -> tuple[Step, ...]:
    nul = "bad\0name.txt"
    long_name = "x" * 5000 + ".txt"
    return (
        WriteFile(nul, "a NUL in the name\n"),
        ReadFile(nul),
        WriteFile(long_name, "a name of 5,000 characters\n"),
        ReadFile(long_name),
        WriteFile("y" * 256, "a name one byte too long\n"),
        WriteFile("dir/" + "z" * 300 + "/f.txt", "a directory name too long\n"),
        WriteFile("/".join(["p" * 200] * 25), "a path longer than PATH_MAX\n"),
        WriteFile("", "an empty path\n"),
    )


_LATIN1 = b"caf\xe9.txt"
_LATIN1_NEW = b"na\xefve.txt"


def _non_utf8_setup(workspace: Path) -> None:
    (workspace / os.fsdecode(_LATIN1)).write_bytes(b"caf\n")


def _non_utf8_steps(layout: Layout) -> tuple[Step, ...]:
    code = (
        f"open({_LATIN1!r}, 'ab').write(b'edited\\n')\n"
        f"open({_LATIN1_NEW!r}, 'wb').write(b'new\\n')\n"
    )
    return (Spawn((sys.executable, "-c", code)),)


def _non_utf8_applied(workspace: Path) -> list[str]:
    root = os.fsencode(workspace)
    names = set(os.listdir(root))
    wrong: list[str] = []
    for name, text in ((_LATIN1, b"caf\nedited\n"), (_LATIN1_NEW, b"new\n")):
        path = Path(os.fsdecode(os.path.join(root, name)))
        content = path.read_bytes() if name in names else None
        if content != text:
            wrong.append(f"{name!r} is not in the workspace as the agent made it: {content!r}")
    extra = sorted(n for n in names - {_LATIN1, _LATIN1_NEW} if n.lower() != b"readme.md")
    wrong += [f"applied a file the agent never made: {n!r}" for n in extra if b"caf" in n]
    return wrong


_HUGE_BYTES = 120 << 20


def _huge_file_steps(layout: Layout) -> tuple[Step, ...]:
    code = (
        "import os\n"
        "with open('huge.bin', 'wb') as f:\n"
        f"    f.write(os.urandom(1 << 20) * {_HUGE_BYTES >> 20})\n"
    )
    return (Spawn((sys.executable, "-c", code)), Say("grew huge.bin"))


def _huge_applied(workspace: Path) -> list[str]:
    path = workspace / "huge.bin"
    size = path.stat().st_size if path.exists() else None
    return [] if size == _HUGE_BYTES else [f"huge.bin applied with {size} bytes"]


def _secret_steps(layout: Layout) -> tuple[Step, ...]:
    names = " ".join(f"{n}=${n}" for n in SECRET_VARIABLES)
    return (
        Terminal(f'echo "{names}"', timeout=10),
        Terminal("env", timeout=10),
        Terminal("printenv", timeout=10),
        Terminal("cat /proc/self/environ", timeout=10),
    )


_FLOOD_FILE = "flood.txt"
_FLOOD_FILE_BYTES = 64 << 10


def _flood_setup(workspace: Path) -> None:
    (workspace / _FLOOD_FILE).write_text(
        ("0123456789abcdef" * 4 + "\n") * (_FLOOD_FILE_BYTES // 65)
    )


def _request_flood_steps(layout: Layout) -> tuple[Step, ...]:
    # 750 MiB of answers: well past any bound on what waits unread (256 MiB by default)
    return (FloodRequests(12_000, params={"path": _FLOOD_FILE}),)


def _chunk_flood_steps(layout: Layout) -> tuple[Step, ...]:
    # 64 MB of text: a store that keeps it all grows by twice that
    return (Flood(200_000, "chunk " * 53 + "xx"), Say("done flooding"))


def _output_flood_steps(layout: Layout) -> tuple[Step, ...]:
    to_stderr = "head -c 33554432 /dev/zero | tr '\\000' e >&2"
    return (
        HugeLine(8 << 20),
        Spawn(("sh", "-c", to_stderr)),
        # a limit the scripted agent can still read back (its lines stop at 64 MiB)
        Terminal("head -c 104857600 /dev/zero | tr '\\000' o", output_byte_limit=16 << 20),
        Terminal("yes", timeout=3, output_byte_limit=16 << 20),
        Say("done flooding"),
    )


def _agent_outside_steps(layout: Layout) -> tuple[Step, ...]:
    victim, _, _ = _outside_paths(layout)
    here = shlex.quote(str(layout.outside / "by-shell.txt"))
    return (
        WriteDisk(str(layout.outside / "by-agent.txt"), "the agent process wrote here\n"),
        WriteDisk(victim, "the agent process wrote here\n"),
        Spawn(("sh", "-c", f"echo 'the agent process wrote here' > {here}")),
        Spawn(("ln", "-s", str(layout.outside), "to-outside")),
        WriteDisk("to-outside/through-link.txt", "the agent process wrote here\n"),
        Say("still here after writing outside"),
    )


def _crash_steps(layout: Layout) -> tuple[Step, ...]:
    return (
        Say("working..."),
        WriteFile("half-done.txt", "half of the work\n"),
        Crash(exit_code=3, stderr="hostile agent: crashing mid-turn on purpose"),
    )


def _hang_steps(layout: Layout) -> tuple[Step, ...]:
    return (Say("thinking forever..."), WriteFile("hung.txt", "before the hang\n"), Stall())


def _attacks() -> tuple[Attack, ...]:
    mib = 1 << 20
    return (
        Attack(
            "path-dotdot",
            "fs/* requests climbing out of the branch with ../, and a permission for such a path",
            "paths",
            "nothing outside the branch written or read, the permission refused",
            _dotdot_steps,
        ),
        Attack(
            "path-absolute",
            "fs/* requests and a permission for absolute paths outside the workspace",
            "paths",
            "nothing outside the branch written or read, the permission refused",
            _absolute_steps,
        ),
        Attack(
            "path-symlink",
            "the agent plants links to outside in its branch, then writes and reads through them",
            "paths",
            "nothing outside written or read through the links",
            _symlink_steps,
        ),
        Attack(
            "shell-evasion",
            "terminal/create and execute permissions hiding its program behind allowed commands "
            "(;, &&, |, $(...), backticks, VAR=x prefixes, sh -c, newlines...)",
            "policy",
            "its program never ran and no such permission was granted",
            _evasion_steps,
            needs="terminal",
        ),
        Attack(
            "env-injection",
            "terminal/create of an allowed command with env PATH, LD_PRELOAD, BASH_ENV or ENV "
            "pointing at its own program",
            "policy",
            "its program never ran and the loader never saw its LD_PRELOAD",
            _env_steps,
            needs="terminal",
        ),
        Attack(
            "terminal-daemon",
            "a terminal command that double-forks, calls setsid and leaves a sleeper",
            "processes",
            "no process of the attack is left after the run",
            _terminal_daemon_steps,
            needs="terminal",
        ),
        Attack(
            "agent-daemon",
            "the agent process itself double-forks, calls setsid and leaves sleepers",
            "processes",
            "no process of the attack is left after the run",
            _agent_daemon_steps,
        ),
        Attack(
            "request-flood",
            "12,000 fs/read_text_file requests of a 64 KiB file, and the agent never reads "
            "the answers",
            "memory",
            "the orchestrator's memory stays bounded (the agent is stopped) and nothing is left",
            _request_flood_steps,
            setup=_flood_setup,
            timeout=10.0,
            memory_limit=448 * mib,
            expect_failure=True,
        ),
        Attack(
            "chunk-flood",
            "a turn of 200,000 message chunks (64 MB of text)",
            "memory",
            "the run store grows by less than 48 MiB (what is kept of a turn is capped)",
            _chunk_flood_steps,
            timeout=120.0,
            store_limit=48 * mib,
        ),
        Attack(
            "output-flood",
            "an 8 MiB line, 32 MiB on the agent's stderr, and terminals printing 100 MiB "
            "and yes (16 MiB kept)",
            "memory",
            "the orchestrator's memory stays bounded and it does not crash",
            _output_flood_steps,
            timeout=60.0,
            memory_limit=256 * mib,
        ),
        Attack(
            "malformed-frames",
            "frames that are not JSON, not JSON-RPC, 100,000 deep, huge numbers, lone "
            "surrogates, bytes that are not UTF-8",
            "protocol",
            "the orchestrator neither crashes nor answers -32603",
            _malformed_steps,
        ),
        Attack(
            "deep-path",
            f"fs/write_text_file {_DEEP_WRITE:,} directories deep, and a chain of "
            f"{_DEEP_CHAIN:,} directories the agent makes itself",
            "input",
            "no crash; a write that was acknowledged or made is recorded",
            _deep_path_steps,
            must_record=(_chain_path(),),
        ),
        Attack(
            "deep-workspace",
            f"a workspace holding a chain of {_DEEP_CHAIN:,} directories; the agent writes a file",
            "input",
            "no crash; the agent's write is recorded",
            lambda layout: (WriteFile("touched.txt", "the agent was here\n"),),
            setup=_deep_workspace,
        ),
        Attack(
            "bad-names",
            "fs/* paths with a NUL, a 5,000-character name, names too long, an empty path",
            "input",
            "each is refused as invalid params (-32602), never -32603, and nothing crashes",
            _bad_name_steps,
        ),
        Attack(
            "non-utf8-name",
            "the agent edits a workspace file named caf\\xe9.txt (latin-1) and makes na\\xefve.txt",
            "names",
            "the run is recorded and applied under the same bytes (no new look-alike file)",
            _non_utf8_steps,
            setup=_non_utf8_setup,
            check_applied=_non_utf8_applied,
        ),
        Attack(
            "huge-file",
            f"the agent writes a {_HUGE_BYTES >> 20} MiB file in its branch",
            "size",
            "refused (the run fails naming the file) or recorded and applied whole, with "
            "bounded memory; never succeeded without it",
            _huge_file_steps,
            timeout=120.0,
            memory_limit=200 * mib,
            must_record=("huge.bin",),
            check_applied=_huge_applied,
        ),
        Attack(
            "terminal-secrets",
            "terminals that print their environment (MYSQL_PWD, SLACK_WEBHOOK_URL, proxy "
            "credentials... set as canaries in the orchestrator's environment)",
            "secrets",
            "no secret value appears in any terminal's output",
            _secret_steps,
            needs="terminal",
        ),
        Attack(
            "agent-writes-outside",
            "the agent process itself writes outside its branch (by path, by shell, through a "
            "link it planted)",
            "sandbox",
            "nothing outside written: only a sandbox holds this, and the turn goes on",
            _agent_outside_steps,
            needs="sandbox",
        ),
        Attack(
            "crash-mid-turn",
            "the agent writes a file, then exits with status 3 in the middle of its turn",
            "robustness",
            "a clear error, the run not succeeded, nothing applied, nothing left",
            _crash_steps,
            expect_failure=True,
        ),
        Attack(
            "hang",
            "the agent stalls mid-turn and ignores session/cancel",
            "robustness",
            "the run ends at its timeout with a clear error, not succeeded, nothing left",
            _hang_steps,
            timeout=3.0,
            expect_failure=True,
        ),
    )


#: every attack, by name, in catalogue order
ATTACKS: Mapping[str, Attack] = {a.name: a for a in _attacks()}
