"""``orchestrator agents``: the agent table, and with ``--check`` a real handshake with each.

A check starts the agent in a temporary directory, completes ``initialize`` and opens one
session (``session/new``, authenticating as a run would), then stops it. What the agent told
is kept whatever step failed, and a failure names its likely cause and the next step: a login
to run, a variable to set, what the agent wrote on stderr, a timeout, an install.

Exit codes: 0 listed, or every checked agent passed; 1 a checked agent failed or needs a login;
2 bad usage (an unknown agent name among them).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._fetch import OFFICIAL_REGISTRY_URL
from .output import emit_json, say, terminal_text

if TYPE_CHECKING:
    from ..agent.connection import AgentConnection
    from ..agents import AgentSpec
    from ..protocol import types as t

EXIT_OK, EXIT_FAILED = 0, 1

AGENTS_EXAMPLES = f"""\
examples:
  orchestrator agents                  # the table: installed, via npx, or not installed
  orchestrator agents --check          # handshake with each installed agent
  orchestrator agents --check claude   # this one, fetched through npx if need be
  orchestrator agents --check --json
  orchestrator agents --registry       # the ACP registry's agents ($ORCHESTRATOR_REGISTRY,
                                       # else the bundled snapshot)
  orchestrator agents --registry URL   # e.g. the registry's latest build:
      {OFFICIAL_REGISTRY_URL}

exit codes:
  0    listed; with --check: every checked agent passed
  1    with --check: an agent failed or needs a login (each says why and what to do)
  2    bad usage (an unknown agent name: a close one is suggested)
"""

#: seconds ``session/new`` may take once ``initialize`` answered
SESSION_NEW_TIMEOUT = 60.0
#: how much of an agent's stderr a failed check shows: its last lines, at most this many...
STDERR_LINES = 10
#: ...and at most this many characters
STDERR_CHARS = 2000

#: check statuses
OK, NEEDS_LOGIN, FAILED = "ok", "needs login", "failed"


def add_parser(sub: Any) -> None:
    """Add ``agents`` to the ``orchestrator`` parser's subcommands."""
    p = sub.add_parser(
        "agents",
        help="list known agents; --check: handshake with them",
        description="List the known agents and whether each is installed; with --check, start "
        "each installed one (or each NAME given), complete initialize and session/new, and "
        "show what it offers or why it failed and what to do.",
        epilog=AGENTS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="start each installed agent (each NAME given, npx ones included) and handshake",
    )
    p.add_argument(
        "--registry",
        nargs="?",
        const="",
        metavar="FILE|URL",
        help="list the agents of an ACP registry instead (default: the file "
        "$ORCHESTRATOR_REGISTRY names, else the snapshot bundled with the orchestrator, also "
        "named 'builtin'); run one with --agent registry:ID",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="only these agents (known names or commands)"
    )


async def cmd_agents(args: argparse.Namespace) -> int:
    """``orchestrator agents``."""
    import trio

    from .trust import project_config

    if args.registry is not None:
        from .registry import list_registry

        return await list_registry(args.registry, as_json=args.json)
    config = await project_config(".", None)
    named = bool(args.names)
    # a name given twice is checked once, where it first appears
    names = list(dict.fromkeys(args.names)) or list(config.agents)
    specs = [config.resolve_agent(name).resolved(os.getcwd()) for name in names]
    rows = [_listing(spec) for spec in specs]
    if args.check:
        checks: list[dict[str, Any] | None] = [None] * len(specs)

        async def check(i: int, spec: AgentSpec) -> None:
            checks[i] = await check_agent(spec)

        async with trio.open_nursery() as nursery:
            for i, (spec, row) in enumerate(zip(specs, rows, strict=True)):
                if row["installed"]:
                    nursery.start_soon(check, i, spec)
                elif named:  # asked for by name: fetched through its launcher, or not there
                    if row["available"]:
                        nursery.start_soon(check, i, spec)
                    else:
                        checks[i] = _not_installed(spec, row)
        for row, result in zip(rows, checks, strict=True):
            if result is not None:
                row.update(result)
    if args.json:
        emit_json({"agents": rows})
    elif args.check:
        _print_checks(rows)
    else:
        _print_table(rows)
    failed = any(row.get("check", {}).get("status", OK) != OK for row in rows)
    return EXIT_FAILED if failed else EXIT_OK


# --------------------------------------------------------------------------- the table


def _listing(spec: AgentSpec) -> dict[str, Any]:
    """The agent's row without a check: what it is, and whether it can start here."""
    import shutil

    from .._agent_archive import cached_program
    from .._agentlabels import package_runner
    from ..agent.quirks import known_agent_quirks

    launcher = package_runner(spec.command)
    # a package runner on PATH says nothing about the agent: it is fetched on first use
    installed = launcher is None and spec.executable_found()
    program = cached_program(spec.command)
    if program is not None and not program.is_file():  # a registry binary not yet downloaded
        launcher, installed = ARCHIVE_LAUNCHER, False
    return {
        "name": spec.name,
        "command": shlex.join(spec.command),
        "installed": installed,
        "launcher": launcher,
        "available": installed
        or (launcher is not None and shutil.which(spec.command[0]) is not None),
        "install": spec.install,
        "description": spec.description,
        "writes": spec.writes,
        "sessionsPerProcess": spec.sessions_per_process,
        "notes": spec.notes,
        # for a known agent: the quirks it may show (they apply by what it reports, not by name)
        "knownQuirks": [q.id for q in known_agent_quirks(spec.name)],
        "needs": spec.needs.to_json(),
    }


#: the launcher of a registry binary agent, as ``agents`` names it
ARCHIVE_LAUNCHER = "its registry archive"


def _availability(row: Mapping[str, Any]) -> str:
    if row["installed"]:
        return "installed"
    if row["launcher"] == ARCHIVE_LAUNCHER:
        return "downloads its registry archive on first use"
    if row["available"]:
        return f"via {row['launcher']} (downloads on first use)"
    if row["launcher"]:
        return f"not installed ({row['launcher']} not found)"
    return "not installed"


def _print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    name_width = max((len(row["name"]) for row in rows), default=0)
    states = [_availability(row) for row in rows]
    state_width = max((len(state) for state in states), default=0)
    for row, state in zip(rows, states, strict=True):
        say(f"{row['name']:<{name_width}}  {state:<{state_width}}  {row['command']}")
        for label, value in _row_notes(row):
            say(f"{'':<{name_width}}  {label}: {value}")
    quirky = [row for row in rows if row["knownQuirks"]]
    if quirky:
        say("\nquirks (they apply by the name and version the agent reports in initialize):")
        for row in quirky:
            say(f"  {row['name']:<{name_width}}  {', '.join(row['knownQuirks'])}")


def _row_notes(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The lines shown under an agent's row: what it needs (more may follow)."""
    from ..agents import AgentNeeds

    summary = AgentNeeds.from_json(row.get("needs")).summary()
    return [("needs", summary)] if summary else []


# --------------------------------------------------------------------------- the check


async def check_agent(spec: AgentSpec) -> dict[str, Any]:
    """Start ``spec``, complete ``initialize`` and ``session/new``, and say how it went.

    Returns the row's check fields: what ``initialize`` told (``protocolVersion``,
    ``agentName``, ``agentTitle``, ``version``, ``capabilities``, ``authMethods``; null where
    not learned), ``sessionNew`` (``ok``, ``needs login``, ``failed``, or null: not reached),
    and ``check``: ``status`` (``ok``, ``needs login``, ``failed``), the ``step`` that failed
    (``start``, ``initialize``, ``session/new``), the ``error``, its likely ``cause``, the
    ``nextStep``, and the agent's ``stderrTail`` (its last lines; null when it wrote nothing).
    """
    import tempfile

    from ..agent.client import ClientOptions, open_agent_on_stream
    from ..agent.process import open_agent_process
    from ..errors import (
        AuthenticationError,
        AuthRequired,
        ConnectionClosed,
        OrchestratorError,
        ProtocolVersionMismatch,
    )

    facts: dict[str, Any] = _facts(None)
    methods: list[t.AuthMethod] = []
    step = "start"
    stderr = ""
    error: OrchestratorError | None = None
    options = ClientOptions(init_timeout=spec.startup_timeout, auth_method=spec.auth_method)
    with tempfile.TemporaryDirectory(prefix="orchestrator-check-") as tmp:
        try:
            async with open_agent_process(
                spec.command, name=spec.name, env=dict(spec.env) or None, cwd=spec.cwd or tmp
            ) as proc:
                try:
                    step = "initialize"
                    async with open_agent_on_stream(
                        proc.stream, name=spec.name, options=options, close_error=proc.exit_error
                    ) as conn:
                        facts, methods = _facts(conn.init), conn.auth_methods
                        step = "session/new"
                        await _open_session(conn, tmp)
                finally:
                    stderr = proc.stderr_tail()
        except ProtocolVersionMismatch as e:
            error = e
            facts = _facts(e.response)
            methods = list(e.response.auth_methods or []) if e.response else []
        except OrchestratorError as e:
            error = e
    if error is None:
        return {**facts, "sessionNew": OK, "check": _check(OK, None, None)}
    if isinstance(error, ConnectionClosed) and error.stderr_tail:
        stderr = error.stderr_tail  # read to its end once the agent exited
    needs_login = step == "session/new" and isinstance(error, AuthRequired | AuthenticationError)
    status = NEEDS_LOGIN if needs_login else FAILED
    cause, next_step = _diagnose(spec, step, error, methods, has_stderr=_tail(stderr) is not None)
    return {
        **facts,
        "sessionNew": status if step == "session/new" else None,
        "check": {
            **_check(status, step, _error_text(spec, error)),
            "cause": cause,
            "nextStep": next_step,
            "stderrTail": _tail(stderr),
        },
    }


async def _open_session(conn: AgentConnection, cwd: str) -> None:
    """``session/new`` in ``cwd``, authenticating first if the agent asks, as a run does."""
    import trio

    try:
        with trio.fail_after(SESSION_NEW_TIMEOUT):
            await conn.new_session(cwd)
    except trio.TooSlowError:
        from ..errors import AgentHung

        raise AgentHung(
            f"no answer to session/new within {SESSION_NEW_TIMEOUT:g}s", agent=conn.name
        ) from None


def _check(status: str, step: str | None, error: str | None) -> dict[str, Any]:
    return {
        "status": status,
        "step": step,
        "error": error,
        "cause": None,
        "nextStep": None,
        "stderrTail": None,
    }


def _facts(init: t.InitializeResponse | None) -> dict[str, Any]:
    """What an ``initialize`` answer told, as the row's JSON fields (all null without one)."""
    from ..agent.quirks import quirks_for
    from ..protocol.codec import unstructure

    if init is None:
        return {
            "protocolVersion": None,
            "agentName": None,
            "agentTitle": None,
            "version": None,
            "quirks": None,
            "capabilities": None,
            "authMethods": None,
        }
    info = init.agent_info
    return {
        "protocolVersion": init.protocol_version,
        "agentName": info.name if info else None,
        "agentTitle": info.title if info else None,
        "version": info.version if info else None,
        "quirks": list(quirks_for(info).ids),
        "capabilities": unstructure(init.agent_capabilities)
        if init.agent_capabilities is not None
        else {},
        "authMethods": [unstructure(m) for m in init.auth_methods or []],
    }


def _not_installed(spec: AgentSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    """The check of an agent asked for by name whose program is not here (nothing started)."""
    program = row["launcher"].split()[0] if row["launcher"] else spec.command[0]
    return {
        **_facts(None),
        "sessionNew": None,
        "check": {
            **_check(FAILED, "start", f"{program!r} not found"),
            "cause": f"not installed: {program} is not on PATH",
            "nextStep": _install_step(spec),
        },
    }


def _install_step(spec: AgentSpec) -> str:
    if spec.install:
        return f"install it: {spec.install}"
    return f"install {spec.command[0]}, or put it on PATH"


def _error_text(spec: AgentSpec, error: BaseException) -> str:
    """The error's first line, without the agent's name in front (its block names it)."""
    text = _first_line(error)
    for prefix in (f"agent {spec.name!r}: ", f"{spec.name}: "):
        text = text.removeprefix(prefix)
    return text


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _tail(stderr: str) -> str | None:
    """The last lines of ``stderr``, bounded (:data:`STDERR_LINES`, :data:`STDERR_CHARS`)."""
    lines = [line.rstrip() for line in stderr.strip("\n").splitlines()][-STDERR_LINES:]
    text = "\n".join(lines).strip("\n")
    if len(text) > STDERR_CHARS:
        text = "..." + text[-STDERR_CHARS:]
    return text or None


# --------------------------------------------------------------------------- cause, next step


def _diagnose(
    spec: AgentSpec,
    step: str,
    error: BaseException,
    methods: Sequence[t.AuthMethod],
    *,
    has_stderr: bool,
) -> tuple[str, str]:
    """The likely cause of a failed check, and what to do about it (``has_stderr``: whether
    the check shows what the agent wrote on stderr)."""
    from .._agent_archive import cached_program
    from ..errors import (
        AgentHung,
        AgentStartError,
        AuthenticationError,
        AuthRequired,
        ConnectionClosed,
        JsonRpcError,
        ProtocolVersionMismatch,
    )

    command = shlex.join(spec.command)
    variables, login = _credentials(spec)
    environ = {**os.environ, **spec.env}
    # any one of an agent's key variables serves: they count as missing only when all are
    missing = [] if any(environ.get(v) for v in variables) else list(variables)
    unset = ""
    if missing:
        unset = (
            f"none of {', '.join(missing)} is set"
            if len(missing) > 1
            else f"{missing[0]} is not set"
        )
    if step == "start":
        if isinstance(error.__cause__, PermissionError):
            return (
                f"{spec.command[0]} cannot be run: permission denied",
                f"make {spec.command[0]} executable, or fix the agent's command",
            )
        return f"not installed: {spec.command[0]} was not found", _install_step(spec)
    if isinstance(error, AuthRequired | AuthenticationError):
        cause = "the agent needs a login before it opens a session"
        if unset and not spec.auth_method:
            cause += f", and {unset}"
        return cause, _login_steps(spec, methods, missing, login)
    if isinstance(error, ProtocolVersionMismatch):
        how = f" ({spec.install})" if spec.install else ""
        return (
            "it speaks another version of ACP than this orchestrator (version 1)",
            f"install a release of the agent that speaks ACP version 1{how}",
        )
    launcher = _launcher_note(spec)
    if isinstance(error, ConnectionClosed):
        status = f" (exit status {error.exit_status})" if error.exit_status is not None else ""
        when = "before answering initialize" if step == "initialize" else f"during {step}"
        cause = f"the agent exited{status} {when}"
        hint = f"run `{command}` yourself to see all it prints"
        if error.malformed:  # what it wrote instead of an answer tells the most
            cause += f"; instead of JSON-RPC it wrote on stdout: {error.malformed}"
            hint = (
                "an ACP agent writes only JSON-RPC messages on stdout (its logs go to stderr): "
                + hint
            )
        if has_stderr:
            hint = f"read its stderr below, or {hint}"
        if unset:
            hint = f"set {' or '.join(missing)} (it may need an API key); or {hint}"
        return cause, hint
    if (
        step == "initialize"
        and isinstance(error.__cause__, JsonRpcError)
        and cached_program(spec.command) is not None
    ):  # the archive launcher answers initialize with why it could not become the agent
        return (
            error.__cause__.message,
            "check the registry entry's archive and cmd (or the network), then try again",
        )
    if step == "initialize" and isinstance(error.__cause__, JsonRpcError):
        return (
            "its answer to initialize does not follow ACP",
            f"make sure `{command}` starts an ACP agent (protocol version 1): run it yourself "
            "to see what it answers",
        )
    if isinstance(error, AgentStartError | AgentHung):
        cause = _error_text(spec, error)
        if step == "initialize":
            cause = f"{cause} (its startup_timeout)"
        hint = (
            f"it may be waiting for a login or a prompt on its terminal{launcher}: run "
            f"`{command}` yourself to see what it does"
        )
        if step == "initialize":
            hint += f", or raise startup_timeout (now {spec.startup_timeout:g}s) in the config"
        return cause, hint
    return (
        f"{step} failed: {_error_text(spec, error)}",
        f"run `{command}` yourself to see what it prints",
    )


def _credentials(spec: AgentSpec) -> tuple[tuple[str, ...], str | None]:
    """The API key variables and the login command of ``spec`` (its :attr:`needs`, else those
    of the known agent of its name, or of its command when relabelled)."""
    from ..agents import KNOWN_AGENTS

    needs = spec.needs
    if not needs and spec.name in KNOWN_AGENTS:
        needs = KNOWN_AGENTS[spec.name].needs
    for known in KNOWN_AGENTS.values():
        if not needs and known.command == spec.command:
            needs = known.needs
    return needs.api_keys, needs.login


def _launcher_note(spec: AgentSpec) -> str:
    from .._agentlabels import package_runner

    launcher = package_runner(spec.command)
    return f" (or {launcher} may still be downloading it)" if launcher else ""


_COMMAND_IN_TEXT = re.compile(r"`([^`\n]+)`")


def _login_steps(
    spec: AgentSpec, methods: Sequence[t.AuthMethod], missing: Sequence[str], login: str | None
) -> str:
    """What to do to log in: the agent's own auth methods first, then the API key variables."""
    from ..protocol import types as t

    steps: list[str] = []
    others: list[str] = []  # methods the agent performs itself, through `authenticate`
    for method in methods:
        if isinstance(method, t.AuthMethodTerminal):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (method.env or {}).items())
            argv = shlex.join([*spec.command, *(method.args or [])])
            steps.append(f"run `{env + ' ' if env else ''}{argv}` in a terminal ({method.name})")
            continue
        if isinstance(method, t.UnknownAuthMethod):
            raw = method.raw
            ident, name, text = raw.get("id"), raw.get("name"), raw.get("description")
        else:
            ident, name, text = method.id, method.name, method.description
        said = ": ".join(str(part) for part in (name, text) if part)
        found = _COMMAND_IN_TEXT.search(said)
        if found:  # "Run `claude /login` in the terminal"
            step = f"run `{found.group(1)}`"
            if step not in steps:
                steps.append(step)
        elif isinstance(ident, str):
            others.append(f"{ident} ({said})" if said else ident)
    if not methods and login:
        steps.append(f"run `{login}`")
    if missing:
        steps.append(f"set {' or '.join(missing)}")
    if others and spec.auth_method is None:
        first = others[0].split(" ", 1)[0]
        steps.append(
            f"name the method the agent should authenticate with: auth_method = {first!r} in "
            f"[agents.{spec.name}] of a config file (offered: {', '.join(others)})"
        )
    if not steps:
        steps.append("log in as its documentation says, then check again")
    return ", or ".join(steps)


# --------------------------------------------------------------------------- text output


def _print_checks(rows: Sequence[Mapping[str, Any]]) -> None:
    """One block per checked agent, like ``gh auth status``: what it is and offers, or why it
    failed and what to do; then the agents not checked, and a count."""
    counts: dict[str, int] = {}
    for row in rows:
        check = row.get("check")
        if check is None:
            continue
        counts[check["status"]] = counts.get(check["status"], 0) + 1
        head = check["status"] if check["step"] is None else f"{check['status']} at {check['step']}"
        say(f"{row['name']}: {head}")
        for label, value in _details(row):
            _field(label, value)
        say("")
    fetched = [row["name"] for row in rows if "check" not in row and row["available"]]
    missing = [row["name"] for row in rows if "check" not in row and not row["available"]]
    if fetched:
        launchers = sorted({row["launcher"] for row in rows if row["name"] in fetched})
        say(
            f"not checked, via {' or '.join(launchers)} (downloads on first use): "
            f"{', '.join(fetched)}; name one to fetch and check it "
            f"(orchestrator agents --check {fetched[0]})"
        )
    if missing:
        say(
            f"not checked, not installed: {', '.join(missing)}; name one to see how to install "
            f"it (orchestrator agents --check {missing[0]})"
        )
    checked = sum(counts.values())
    parts = [f"{n} {status}" for status, n in counts.items()]
    say(f"checked {checked}: {', '.join(parts)}" if checked else "no agent checked")


def _install_hint(row: Mapping[str, Any]) -> str:
    return f"install: {row['install']}" if row["install"] else "not on PATH"


def _details(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The lines of a checked agent's block, as (label, value)."""
    check = row["check"]
    out: list[tuple[str, str]] = [("command", f"{row['command']} ({_availability(row)})")]
    if row["protocolVersion"] is None:
        if check["step"] != "start":
            out.append(("agent", "unknown: initialize did not complete"))
    else:
        name = " ".join(str(p) for p in (row["agentName"], row["version"]) if p) or "unnamed"
        out.append(("agent", f"{name} (protocol version {row['protocolVersion']})"))
        if row["agentTitle"]:
            out.append(("title", row["agentTitle"]))
        out += _capabilities(row["capabilities"] or {})
        out.append(("auth methods", _auth_methods(row["authMethods"] or [])))
        out.append(("quirks", ", ".join(row["quirks"] or ()) or "none"))
    if row["sessionNew"] is not None:
        out.append(("session/new", row["sessionNew"]))
    if check["error"]:
        out.append(("error", check["error"]))
    if check["cause"]:
        out.append(("cause", check["cause"]))
    if check["nextStep"]:
        out.append(("next step", check["nextStep"]))
    if check["stderrTail"]:
        out.append(("stderr", check["stderrTail"]))
    return out


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _capabilities(caps: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The capabilities a user compares agents by, each said yes or no."""
    prompt = caps.get("promptCapabilities") or {}
    mcp = caps.get("mcpCapabilities") or {}
    sessions = [k for k, v in (caps.get("sessionCapabilities") or {}).items()
                if v is not None and not k.startswith("_")]  # fmt: skip
    return [
        ("load session", _yes(caps.get("loadSession"))),
        (
            "prompt",
            f"image {_yes(prompt.get('image'))}, audio {_yes(prompt.get('audio'))}, "
            f"embedded context {_yes(prompt.get('embeddedContext'))}",
        ),
        ("MCP servers", f"http {_yes(mcp.get('http'))}, sse {_yes(mcp.get('sse'))}"),
        ("sessions", ", ".join(sessions) if sessions else "new and prompt only"),
    ]


def _auth_methods(methods: Sequence[Mapping[str, Any]]) -> str:
    if not methods:
        return "none"
    said = []
    for method in methods:
        parts = [str(p) for p in (method.get("name"), method.get("description")) if p]
        said.append(f"{method.get('id')}" + (f" ({': '.join(parts)})" if parts else ""))
    return "; ".join(said)


#: the width of a block's labels
_LABEL = 14


def _field(label: str, value: str) -> None:
    """``  label  value``; a value of several lines is indented under the first."""
    first, *rest = terminal_text(value).split("\n") or [""]
    say(f"  {label:<{_LABEL}}{first}")
    for line in rest:
        say(f"  {'':<{_LABEL}}{line}")
