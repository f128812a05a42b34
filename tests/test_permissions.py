"""Tests for orchestrator.agent.permissions: the policy-backed permission service."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from log_capture import capture_logs

from orchestrator.agent.permissions import (
    Escalation,
    PolicyPermissionService,
    command_key,
    policy_command_check,
    query_from_request,
)
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.cli.escalation import terminal_prompt_escalation
from orchestrator.errors import CommandRefused
from orchestrator.policy import Answer, Policy, PolicySet, Rule
from orchestrator.protocol import types as t

ROOT = "/work/repo"
CTX = SessionContext(agent="claude", session_id="s1", cwd=ROOT, step="build")
OPTIONS = [
    t.PermissionOption(option_id="allow_always", name="Always Allow", kind="allow_always"),
    t.PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    t.PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]
POLICY = PolicySet(
    run=Policy.preset(
        "edit",
        Rule("allow_always", name="tests", kinds="execute", command="pytest"),
        Rule("reject_always", name="no push", kinds="execute", command="git push"),
        Rule("ask", name="ask to run", kinds="execute"),
    ),
    ask_timeout=30,
)


def bash(command: str, call_id: str = "call-1", **raw: Any) -> t.RequestPermissionRequest:
    """A Claude-like Bash permission request."""
    return t.RequestPermissionRequest(
        session_id=CTX.session_id,
        tool_call=t.ToolCallUpdate(
            tool_call_id=call_id,
            kind="execute",
            title="Bash",
            raw_input={"command": command, **raw},
        ),
        options=OPTIONS,
    )


def edit(path: str, call_id: str = "call-1") -> t.RequestPermissionRequest:
    """A Claude-like Edit permission request."""
    return t.RequestPermissionRequest(
        session_id=CTX.session_id,
        tool_call=t.ToolCallUpdate(
            tool_call_id=call_id, kind="edit", title="Edit", raw_input={"file_path": path}
        ),
        options=OPTIONS,
    )


def checked(check: Any, line: str, ctx: SessionContext = CTX, **env: str) -> str:
    """A terminal command check's verdict: ``allow``, or ``reject`` when it refused."""
    try:
        return str(check(line, env, ctx))
    except CommandRefused:
        return "reject"


def selected(outcome: t.RequestPermissionOutcome) -> str | None:
    """The option id of a selected outcome, None for cancelled."""
    if isinstance(outcome, t.SelectedPermissionOutcome):
        return outcome.option_id
    assert isinstance(outcome, t.CancelledRequestPermissionOutcome)
    return None


def answering(answer: Answer | None, calls: list[Escalation]) -> Any:
    """An escalation callback that records its calls and answers ``answer``."""

    async def escalate(escalation: Escalation) -> Answer | None:
        calls.append(escalation)
        await trio.lowlevel.checkpoint()
        return answer

    return escalate


async def test_allowed() -> None:
    """An edit inside the workspace is allowed with the agent's allow_once option."""
    service = PolicyPermissionService(POLICY)
    decision = await service.request_permission(edit(f"{ROOT}/src/a.py"), CTX)
    assert selected(decision.outcome) == "allow"
    record = decision.record
    assert (record.verdict, record.option_id, record.rule) == (
        "allow",
        "allow",
        "run/edit: edit in workspace",
    )
    assert record.paths == (f"{ROOT}/src/a.py",)
    assert service.records == [record]


async def test_rejected() -> None:
    """An edit outside the workspace is rejected with the reject option."""
    service = PolicyPermissionService(POLICY)
    decision = await service.request_permission(edit("/etc/passwd"), CTX)
    assert selected(decision.outcome) == "reject"
    assert (decision.record.verdict, decision.record.rule) == ("reject", "outside-workspace")


async def test_escalated_answer_is_used() -> None:
    """An ask verdict goes to the callback, whose answer decides."""
    calls: list[Escalation] = []
    service = PolicyPermissionService(POLICY, escalate=answering("allow", calls))
    decision = await service.request_permission(bash("make all"), CTX)
    assert selected(decision.outcome) == "allow"
    assert decision.record.rule == "run/ask to run (ask: allow)"
    [escalation] = calls
    assert (escalation.command, escalation.rule, escalation.ctx) == (
        "make all",
        "run/ask to run",
        CTX,
    )


async def test_escalation_times_out(autojump_clock: trio.testing.MockClock) -> None:
    """No answer within the ask timeout rejects, after exactly that long."""

    async def never(escalation: Escalation) -> Answer | None:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    service = PolicyPermissionService(POLICY, escalate=never)
    start = trio.current_time()
    decision = await service.request_permission(bash("make all"), CTX)
    assert trio.current_time() - start == pytest.approx(30)
    assert selected(decision.outcome) == "reject"
    assert decision.record.rule == "run/ask to run (ask: no answer in 30s)"


async def test_escalation_without_callback_or_failing() -> None:
    """Ask without a callback, with a failing one, or with a non-answer rejects."""

    async def broken(escalation: Escalation) -> Answer | None:
        raise RuntimeError("boom")

    for service, suffix in [
        (PolicyPermissionService(POLICY), "(ask: no escalation configured)"),
        (PolicyPermissionService(POLICY, escalate=broken), "(ask: escalation failed)"),
        (PolicyPermissionService(POLICY, escalate=answering(None, [])), "(ask: no answer)"),
    ]:
        decision = await service.request_permission(bash("make"), CTX)
        assert selected(decision.outcome) == "reject"
        assert decision.record.rule == f"run/ask to run {suffix}"


async def test_cancelled_while_pending(autojump_clock: trio.testing.MockClock) -> None:
    """Cancelling a pending escalation propagates Cancelled and records "cancelled"."""
    waiting = trio.Event()

    async def slow(escalation: Escalation) -> Answer | None:
        waiting.set()
        await trio.sleep(10)
        return "allow"

    service = PolicyPermissionService(POLICY, escalate=slow)
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def ask() -> None:
            with scope:
                await service.request_permission(bash("make"), CTX)
                raise AssertionError("not cancelled")

        nursery.start_soon(ask)
        await waiting.wait()
        scope.cancel()
    assert scope.cancelled_caught
    [record] = service.records
    assert (record.verdict, record.option_id, record.rule) == ("cancelled", None, "cancelled")
    assert record.command == "make"


async def test_request_after_cancel_is_cancelled() -> None:
    """A request whose scope is already cancelled (after session/cancel) is recorded cancelled."""
    service = PolicyPermissionService(POLICY)
    with trio.CancelScope() as scope:
        scope.cancel()
        await service.request_permission(edit(f"{ROOT}/a.py"), CTX)
    assert scope.cancelled_caught
    assert [r.verdict for r in service.records] == ["cancelled"]


async def test_always_is_remembered_per_session() -> None:
    """An "always" answer answers the same command later in the session from memory."""
    calls: list[Escalation] = []
    service = PolicyPermissionService(POLICY, escalate=answering("allow_always", calls))
    first = await service.request_permission(bash("make all", "c1"), CTX)
    second = await service.request_permission(bash("make all", "c2"), CTX)
    assert len(calls) == 1
    assert selected(first.outcome) == selected(second.outcome) == "allow_always"
    assert second.record.rule == "remembered: run/ask to run (ask: allow_always)"
    # a rule's own allow_always is remembered too, and memory is per session
    await service.request_permission(bash("pytest", "c3"), CTX)
    again = await service.request_permission(bash("pytest", "c4"), CTX)
    assert again.record.rule == "remembered: run/tests"
    other = SessionContext(agent="claude", session_id="s2", cwd=ROOT)
    elsewhere = await service.request_permission(bash("make all", "c5"), other)
    assert len(calls) == 2
    assert elsewhere.record.rule == "run/ask to run (ask: allow_always)"
    service.forget_session("s1")
    await service.request_permission(bash("make all", "c6"), CTX)
    assert len(calls) == 3


async def test_remembered_reject_and_outside_is_never_remembered() -> None:
    """reject_always is remembered; a remembered allow never beats the workspace or a reject."""
    service = PolicyPermissionService(POLICY, escalate=answering("allow_always", []))
    await service.request_permission(bash("git push"), CTX)
    later = await service.request_permission(bash("git push"), CTX)
    assert (later.record.verdict, later.record.rule) == ("reject", "remembered: run/no push")
    edits = Rule("allow_always", name="edits", kinds="edit")
    policy = PolicySet(run=Policy([Rule("reject", name="secrets", paths=".env"), edits]))
    service = PolicyPermissionService(policy)
    await service.request_permission(edit(f"{ROOT}/a.py"), CTX)
    remembered = await service.request_permission(edit(f"{ROOT}/b.py"), CTX)
    assert remembered.record.rule == "remembered: run/edits"
    outside = await service.request_permission(edit("/etc/hosts"), CTX)
    assert (outside.record.verdict, outside.record.rule) == ("reject", "outside-workspace")
    secret = await service.request_permission(edit(f"{ROOT}/.env"), CTX)
    assert (secret.record.verdict, secret.record.rule) == ("reject", "run/secrets")


async def test_audit_trail_complete_in_order_and_logged() -> None:
    """Every decision is one record and one log line, in order, with the deciding rule."""
    service = PolicyPermissionService(POLICY, escalate=answering("reject", []))
    with capture_logs() as logs:
        await service.request_permission(edit(f"{ROOT}/src/a.py", "c1"), CTX)
        await service.request_permission(bash("pytest -x", "c2"), CTX)
        await service.request_permission(bash("make", "c3"), CTX)
        await service.request_permission(edit("../x", "c4"), CTX)
    rows = service.audit_json()
    assert [(r["toolCallId"], r["verdict"], r["optionId"], r["rule"]) for r in rows] == [
        ("c1", "allow", "allow", "run/edit: edit in workspace"),
        ("c2", "allow", "allow_always", "run/tests"),
        ("c3", "reject", "reject", "run/ask to run (ask: reject)"),
        ("c4", "reject", "reject", "outside-workspace"),
    ]
    first = rows[0]
    assert first["agent"] == "claude"
    assert first["sessionId"] == "s1"
    assert first["step"] == "build"
    assert first["kind"] == "edit"
    assert first["title"] == "Edit"
    assert first["paths"] == [f"{ROOT}/src/a.py"]
    assert rows[1]["command"] == "pytest -x"
    assert all(isinstance(r["time"], float) for r in rows)
    decisions = [entry for entry in logs if entry["event"] == "permission decision"]
    assert [d["toolCallId"] for d in decisions] == ["c1", "c2", "c3", "c4"]


def test_query_from_request_takes_locations_and_diffs() -> None:
    """Locations and diff paths both reach the policy; options keep their ids and kinds."""
    request = t.RequestPermissionRequest(
        session_id="s1",
        tool_call=t.ToolCallUpdate(
            tool_call_id="c",
            kind="edit",
            locations=[t.ToolCallLocation(path=f"{ROOT}/a.py")],
            content=[t.Diff(path=f"{ROOT}/b.py", new_text="x")],
        ),
        options=OPTIONS,
    )
    q = query_from_request(request, CTX)
    assert q.locations == (f"{ROOT}/a.py", f"{ROOT}/b.py")
    assert [(o.option_id, o.kind) for o in q.options][1] == ("allow", "allow_once")
    assert (q.root, q.agent, q.step) == (ROOT, "claude", "build")


def test_installs_in_client_services() -> None:
    """The service plugs into ClientServices as the permission service."""
    services = ClientServices(permission=PolicyPermissionService(POLICY))
    assert isinstance(services.permission, PolicyPermissionService)


async def test_check_command_honours_approvals() -> None:
    """Commands allowed by a permission answer may start in a terminal: once, or always."""
    calls: list[Escalation] = []
    service = PolicyPermissionService(POLICY, escalate=answering("allow", calls))
    check = service.check_command
    other = SessionContext(agent="claude", session_id="s2", cwd=ROOT)
    assert checked(check, "pytest -q") == "allow"  # the policy alone allows
    assert checked(check, "make all") == "reject"  # ask counts as reject
    await service.request_permission(bash("make  all"), CTX)
    assert checked(check, "make all", other) == "reject"
    with capture_logs() as logs:
        assert checked(check, "bash -lc 'make all'") == "allow"
    assert logs[0]["rule"] == "approved once in this session"
    assert checked(check, "make all") == "reject"
    service.escalate = answering("allow_always", calls)
    await service.request_permission(bash("make dist"), CTX)
    assert [checked(check, "make dist") for _ in range(3)] == ["allow"] * 3
    service.forget_session("s1")
    assert checked(check, "make dist") == "reject"


async def test_an_approval_never_covers_what_the_request_env_changes() -> None:
    """An approved command line may not start with a variable no rule allows (PATH, CC)."""
    service = PolicyPermissionService(POLICY, escalate=answering("allow_always", []))
    await service.request_permission(bash("make all"), CTX)
    assert checked(service.check_command, "make all", PATH="/tmp/x") == "reject"
    assert checked(service.check_command, "make all", LD_PRELOAD="/tmp/x.so") == "reject"
    assert checked(service.check_command, "make all", CC="./cc") == "reject"
    assert checked(service.check_command, "make all", LANG="C") == "allow"
    assert [r.rule for r in service.records[1:]] == [
        "command-environment: PATH not allowed by run/ask to run",
        "command-environment: LD_PRELOAD not allowed by run/ask to run",
        "command-environment: CC not allowed by run/ask to run",
        "approved always in this session",
    ]


def test_a_refused_terminal_command_is_audited() -> None:
    """A refusal raises CommandRefused with its audit record, kept in the service's records."""
    service = PolicyPermissionService(POLICY)
    with pytest.raises(CommandRefused) as caught:
        service.check_command("ls", {"PATH": "/tmp/evil"}, CTX)
    assert caught.value.message == "terminal command rejected by policy: ls"
    assert caught.value.code == -32602
    [record] = service.records
    assert record is caught.value.record
    assert (record.tool_call_id, record.kind, record.verdict, record.option_id) == (
        "terminal/create",
        "execute",
        "reject",
        None,
    )
    assert (record.agent, record.session_id, record.step) == ("claude", "s1", "build")
    assert record.command == "ls"
    assert record.rule == "command-environment: PATH not allowed by run/ask to run"
    assert "/tmp/evil" not in str(record.to_json())  # names, never values


def test_command_key() -> None:
    """Command lines compare re-quoted and without sh -c wrappers."""
    assert command_key("make  all") == command_key("bash -lc 'make all'") == "make all"
    assert command_key('sh -c "ls | head"') == command_key("ls | head")
    assert command_key("echo 'unbalanced") == "echo 'unbalanced"


def test_policy_command_check() -> None:
    """The terminal command check allows what the policy allows; ask counts as reject."""
    check = policy_command_check(POLICY)
    assert checked(check, "pytest -q") == "allow"
    assert checked(check, "git push") == "reject"
    assert checked(check, "make") == "reject"
    assert checked(check, "bash -lc 'pytest -x'") == "allow"
    assert checked(check, "pytest && git push") == "reject"
    assert checked(check, "pytest", PYTHONPATH="/tmp/x") == "reject"
    with pytest.raises(CommandRefused) as caught:
        check("PYTHONSTARTUP=/tmp/x.py pytest", {}, CTX)
    assert caught.value.record.rule == (
        "command-environment: PYTHONSTARTUP not allowed by run/tests"
    )


# --------------------------------------------------------------------------- terminal prompt


async def escalation_for(command: str, **raw: Any) -> Escalation:
    """An Escalation for a bash command under POLICY."""
    q = query_from_request(bash(command, **raw), CTX)
    return Escalation(q, POLICY.evaluate(q), CTX)


async def read_until(fd: int, marker: bytes) -> bytes:
    """Read the pty master until ``marker`` shows up."""
    seen = b""
    while marker not in seen:
        await trio.lowlevel.wait_readable(fd)
        seen += os.read(fd, 4096)
    return seen


async def test_terminal_prompt_asks_on_the_tty() -> None:
    """The prompt shows the request on the tty and maps the typed answer; junk re-asks."""
    master, slave = os.openpty()
    try:
        os.set_blocking(master, False)
        escalation = await escalation_for("CFLAGS=-O2 make all", env={"CC": "clang"})
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                answers: list[Answer | None] = []

                async def ask() -> None:
                    answers.append(
                        await terminal_prompt_escalation(escalation, tty=os.ttyname(slave))
                    )

                nursery.start_soon(ask)
                shown = await read_until(master, b"Allow?")
                assert b"command: CFLAGS=-O2 make all" in shown
                assert b"sets: CC, CFLAGS" in shown  # what the request sets, seen by the human
                os.write(master, b"what\n")
                await read_until(master, b"Allow?")
                os.write(master, b"a\n")
        assert answers == ["allow_always"]
    finally:
        os.close(master)
        os.close(slave)


async def test_terminal_prompt_is_cancellable() -> None:
    """Cancelling the prompt withdraws the question and lets Cancelled through."""
    master, slave = os.openpty()
    try:
        os.set_blocking(master, False)
        escalation = await escalation_for("make all")
        with trio.fail_after(10):
            with trio.move_on_after(0.3) as scope:
                await terminal_prompt_escalation(escalation, tty=os.ttyname(slave))
            assert scope.cancelled_caught
            await read_until(master, b"question withdrawn")
    finally:
        os.close(master)
        os.close(slave)


async def test_terminal_prompt_without_tty_answers_none(tmp_path: Any) -> None:
    """Without a terminal there is no answer (and the policy then rejects)."""
    escalation = await escalation_for("make all")
    assert await terminal_prompt_escalation(escalation, tty=str(tmp_path / "no-tty")) is None


async def test_a_symlink_out_of_the_session_directory_is_outside(tmp_path: Any) -> None:
    """An edit, or a command, through a link in the session directory to /tmp is rejected."""
    (tmp_path / "outlink").symlink_to("/tmp")
    (tmp_path / "src").mkdir()
    (tmp_path / "srclink").symlink_to("src")
    ctx = SessionContext(agent="claude", session_id="s1", cwd=str(tmp_path))
    service = PolicyPermissionService(PolicySet.from_preset("trusted"))
    for path in (f"{tmp_path}/outlink/x", "outlink/x", f"{tmp_path}/srclink/../outlink/y"):
        decision = await service.request_permission(edit(path), ctx)
        assert (decision.record.rule, selected(decision.outcome)) == ("outside-workspace", "reject")
    inside = await service.request_permission(edit("srclink/a.py"), ctx)
    assert inside.record.paths == (f"{tmp_path}/src/a.py",)
    assert selected(inside.outcome) == "allow"
    assert checked(service.check_command, "cat outlink/x", ctx) == "reject"
    assert checked(service.check_command, "cat srclink/a.py", ctx) == "allow"


def test_an_allowed_terminal_command_is_audited() -> None:
    """An allowed start is a record too (verdict allow, its rule), handed to the session."""
    audited: list[Any] = []
    ctx = SessionContext(agent="claude", session_id="s1", cwd=ROOT, audit=audited.append)
    service = PolicyPermissionService(POLICY)
    assert service.check_command("pytest -q", {}, ctx) == "allow"
    assert policy_command_check(POLICY)("pytest -x", {}, ctx) == "allow"
    assert service.records == audited[:1]
    assert [(r.tool_call_id, r.verdict, r.option_id, r.rule, r.command) for r in audited] == [
        ("terminal/create", "allow", None, "run/tests", "pytest -q"),
        ("terminal/create", "allow", None, "run/tests", "pytest -x"),
    ]


@pytest.mark.parametrize(
    ("env", "verdict"),
    [
        ({"CLAUDECODE": "1"}, "allow"),
        ({"CI_MODE": "true"}, "allow"),
        ({"CC": "./evil"}, "reject"),
        ({"TAR_OPTIONS": "--checkpoint-action=exec=x"}, "reject"),
        ({"LD_BIND_NOW": "1"}, "reject"),
        ({"NODE_TLS_REJECT_UNAUTHORIZED": "0"}, "reject"),
        ({"GIT_SSL_NO_VERIFY": "1"}, "reject"),
    ],
)
def test_a_plain_switch_in_the_request_env_needs_no_rule(
    tmp_path: Path, env: dict[str, str], verdict: str
) -> None:
    """An agent's marker (CLAUDECODE=1) passes; other values, loader or TLS switches do not."""
    service = PolicyPermissionService(
        PolicySet.from_mapping(
            {"rules": [{"verdict": "allow", "kinds": ["execute"], "commands": ["printf"]}]}
        )
    )
    ctx = SessionContext(session_id="s", cwd=str(tmp_path), agent="a")
    if verdict == "allow":
        assert service.check_command("printf 'x\\n'", env, ctx) == "allow"
    else:
        with pytest.raises(CommandRefused):
            service.check_command("printf 'x\\n'", env, ctx)
