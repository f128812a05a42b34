"""Test doubles shared by several test files."""

from __future__ import annotations

from attrs import define, field

from orchestrator.agent.services import PermissionDecision, PermissionRecord, SessionContext
from orchestrator.protocol import types as t


@define
class AllowOnce:
    """A permission service that picks the agent's ``allow_once`` option, whatever its id."""

    #: the rule name put in the audit records
    rule: str = "test"
    #: every request it was asked, in order
    asked: list[t.RequestPermissionRequest] = field(factory=list)

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Allow once."""
        self.asked.append(request)
        option = next(o for o in request.options if o.kind == "allow_once")
        record = PermissionRecord.from_request(
            request, ctx, verdict="allow", option_id=option.option_id, rule=self.rule
        )
        return PermissionDecision(t.SelectedPermissionOutcome(option_id=option.option_id), record)
