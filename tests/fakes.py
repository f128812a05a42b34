"""Test doubles shared by several test files."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from attrs import define, field

from orchestrator.agent.services import PermissionDecision, PermissionRecord, SessionContext
from orchestrator.protocol import types as t
from orchestrator.vfs import Workdir


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


@contextmanager
def lock_held_by_another_thread(wd: Workdir) -> Iterator[None]:
    """Hold the workdir's lock from another thread, as a harvest in a worker thread does."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with wd._lock:
            held.set()
            release.wait(10)  # bounded: a blocking read would otherwise deadlock

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        yield
    finally:
        release.set()
        thread.join(30)
    assert not thread.is_alive()
