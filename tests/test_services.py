"""Tests of orchestrator.agent.services: the default services and the advertised capabilities."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from attrs import define, field
from jsonschema import Draft202012Validator

import orchestrator
from orchestrator.agent.services import (
    ClientServices,
    DeclineElicitation,
    PermissionRecord,
    RejectAllPermissions,
    SessionContext,
    reject_outcome,
)
from orchestrator.protocol import types as t
from orchestrator.protocol.codec import unstructure

CTX = SessionContext("claude", "sess-1", "/work/project", step="implement")


def option(option_id: str, kind: t.PermissionOptionKind) -> t.PermissionOption:
    """A permission option of a kind."""
    return t.PermissionOption(option_id=option_id, name=option_id.title(), kind=kind)


ALLOW_ONCE = option("allow", "allow_once")
ALLOW_ALWAYS = option("allow-always", "allow_always")
REJECT_ONCE = option("reject", "reject_once")
REJECT_ALWAYS = option("reject-always", "reject_always")


def permission_request(options: list[t.PermissionOption]) -> t.RequestPermissionRequest:
    """A permission request about an execute tool call."""
    call = t.ToolCallUpdate(tool_call_id="call-1", title="rm -rf build", kind="execute")
    return t.RequestPermissionRequest(session_id="sess-1", tool_call=call, options=options)


@functools.cache
def _schema_validator(name: str) -> Draft202012Validator:
    path = Path(orchestrator.__file__).parent / "protocol" / "schema" / "schema.json"
    defs = orjson.loads(path.read_bytes())["$defs"]
    return Draft202012Validator({"$defs": defs, "$ref": f"#/$defs/{name}"})


def assert_valid(name: str, value: Any) -> None:
    """Check a wire value against one definition of the official ACP schema."""
    errors = list(_schema_validator(name).iter_errors(value))
    assert not errors, f"{name}: {errors[0].message}"


@define
class MemoryFs:
    """A minimal file system service."""

    files: dict[str, str] = field(factory=dict)

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve a file's text."""
        await trio.lowlevel.checkpoint()
        return t.ReadTextFileResponse(content=self.files[request.path])

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Store a file's text."""
        await trio.lowlevel.checkpoint()
        self.files[request.path] = request.content
        return t.WriteTextFileResponse()


class NoTerminals:
    """A terminal service stub (only its presence matters here)."""

    async def create(
        self, request: t.CreateTerminalRequest, ctx: SessionContext
    ) -> t.CreateTerminalResponse:
        """Not used."""
        raise NotImplementedError

    async def output(
        self, request: t.TerminalOutputRequest, ctx: SessionContext
    ) -> t.TerminalOutputResponse:
        """Not used."""
        raise NotImplementedError

    async def wait_for_exit(
        self, request: t.WaitForTerminalExitRequest, ctx: SessionContext
    ) -> t.WaitForTerminalExitResponse:
        """Not used."""
        raise NotImplementedError

    async def kill(
        self, request: t.KillTerminalRequest, ctx: SessionContext
    ) -> t.KillTerminalResponse:
        """Not used."""
        raise NotImplementedError

    async def release(
        self, request: t.ReleaseTerminalRequest, ctx: SessionContext
    ) -> t.ReleaseTerminalResponse:
        """Not used."""
        raise NotImplementedError


class CancelElicitation:
    """An elicitation service stub that cancels everything."""

    async def create_elicitation(
        self, request: t.CreateElicitationRequest, ctx: SessionContext
    ) -> t.CreateElicitationResponse:
        """Cancel."""
        await trio.lowlevel.checkpoint()
        return t.CancelCreateElicitationResponse()


# --------------------------------------------------------------------------- reject_outcome


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([ALLOW_ONCE, REJECT_ALWAYS, REJECT_ONCE], "reject"),
        ([REJECT_ALWAYS, ALLOW_ALWAYS, ALLOW_ONCE], "reject-always"),
        ([REJECT_ONCE], "reject"),
    ],
)
def test_reject_outcome_prefers_reject_once_then_reject_always(
    options: list[t.PermissionOption], expected: str
) -> None:
    """reject_once wins over reject_always, wherever each is in the list."""
    outcome, option_id = reject_outcome(options)
    assert option_id == expected
    assert outcome == t.SelectedPermissionOutcome(option_id=expected)


@pytest.mark.parametrize("options", [[ALLOW_ONCE, ALLOW_ALWAYS], [ALLOW_ONCE], []])
def test_reject_outcome_never_chooses_an_allow_option(options: list[t.PermissionOption]) -> None:
    """Without a reject option the outcome is cancelled, never an allow option."""
    outcome, option_id = reject_outcome(options)
    assert option_id is None
    assert outcome == t.CancelledRequestPermissionOutcome()
    assert unstructure(outcome) == {"outcome": "cancelled"}


def test_reject_outcome_matches_by_kind_not_by_id() -> None:
    """Options are chosen by kind: an agent's own ids and names are irrelevant."""
    options = [option("reject", "allow_once"), option("abort", "reject_once")]
    assert reject_outcome(options)[1] == "abort"


# --------------------------------------------------------------------------- RejectAllPermissions


async def test_reject_all_answers_the_reject_option_with_a_record() -> None:
    """The default service selects the reject option and records who asked about what."""
    before = time.time()
    decision = await RejectAllPermissions().request_permission(
        permission_request([ALLOW_ONCE, REJECT_ONCE]), CTX
    )
    assert decision.outcome == t.SelectedPermissionOutcome(option_id="reject")
    record = decision.record
    assert before <= record.time <= time.time()
    assert (record.agent, record.session_id, record.step) == ("claude", "sess-1", "implement")
    assert (record.tool_call_id, record.kind, record.title) == ("call-1", "execute", "rm -rf build")
    assert (record.verdict, record.option_id, record.rule) == ("reject", "reject", "default")
    assert_valid("RequestPermissionResponse", {"outcome": unstructure(decision.outcome)})


async def test_reject_all_without_reject_option_answers_cancelled() -> None:
    """Offered only allow options, the default service answers cancelled (still a reject)."""
    decision = await RejectAllPermissions(rule="ci").request_permission(
        permission_request([ALLOW_ONCE]), CTX
    )
    assert decision.outcome == t.CancelledRequestPermissionOutcome()
    assert (decision.record.verdict, decision.record.option_id) == ("reject", None)
    assert decision.record.rule == "ci"


def test_permission_record_json() -> None:
    """A permission record's JSON form has every field under its wire-style name."""
    record = PermissionRecord(
        time=1.5,
        agent="claude",
        session_id="sess-1",
        tool_call_id="call-1",
        kind="execute",
        title="make",
        verdict="allow",
        option_id="allow",
        rule="trusted",
        step="build",
        paths=("/p/a",),
        command="make test",
    )
    assert record.to_json() == {
        "time": 1.5,
        "agent": "claude",
        "sessionId": "sess-1",
        "step": "build",
        "toolCallId": "call-1",
        "kind": "execute",
        "title": "make",
        "paths": ["/p/a"],
        "command": "make test",
        "verdict": "allow",
        "optionId": "allow",
        "rule": "trusted",
    }
    orjson.dumps(record.to_json())


# --------------------------------------------------------------------------- elicitation


async def test_decline_elicitation_declines() -> None:
    """DeclineElicitation answers every elicitation with decline."""
    request = t.ElicitationFormMode(
        message="Your name?",
        requested_schema=t.ElicitationSchema(),
        session_id="sess-1",
    )
    response = await DeclineElicitation().create_elicitation(request, CTX)
    assert isinstance(response, t.DeclineCreateElicitationResponse)
    assert unstructure(response) == {"action": "decline"}
    assert_valid("CreateElicitationResponse", unstructure(response))


# --------------------------------------------------------------------------- ClientServices


#: what every client advertises: notices are kept in each turn's result, whatever the services
NOTICES: dict[str, Any] = {"session": {"notices": {}}}


def test_default_services() -> None:
    """By default nothing is offered and permission requests are rejected."""
    services = ClientServices()
    assert (services.fs, services.terminal, services.elicitation) == (None, None, None)
    assert isinstance(services.permission, RejectAllPermissions)


@pytest.mark.parametrize(
    ("services", "expected"),
    [
        (
            ClientServices(),
            {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False, **NOTICES},
        ),
        (
            ClientServices(fs=MemoryFs()),
            {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False, **NOTICES},
        ),
        (
            ClientServices(terminal=NoTerminals()),
            {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": True, **NOTICES},
        ),
        (
            ClientServices(elicitation=CancelElicitation()),
            {
                "fs": {"readTextFile": False, "writeTextFile": False},
                "terminal": False,
                "elicitation": {"form": {}},
                **NOTICES,
            },
        ),
        (
            ClientServices(fs=MemoryFs(), terminal=NoTerminals(), elicitation=CancelElicitation()),
            {
                "fs": {"readTextFile": True, "writeTextFile": True},
                "terminal": True,
                "elicitation": {"form": {}},
                **NOTICES,
            },
        ),
    ],
    ids=["none", "fs", "terminal", "elicitation", "all"],
)
def test_capabilities_advertise_exactly_the_installed_services(
    services: ClientServices, expected: dict[str, Any]
) -> None:
    """capabilities() advertises exactly the services installed, in schema-valid form."""
    wire = unstructure(services.capabilities())
    assert wire == expected
    assert_valid("ClientCapabilities", wire)


def test_permission_service_is_not_a_capability() -> None:
    """Installing a permission service changes no advertised capability."""
    custom = ClientServices(permission=RejectAllPermissions(rule="strict"))
    assert custom.capabilities() == ClientServices().capabilities()
