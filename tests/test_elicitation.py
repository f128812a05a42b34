"""Tests for orchestrator.agent.elicitation: elicitation/create answered by policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from log_capture import capture_logs

from orchestrator.agent.elicitation import (
    ElicitationRule,
    PolicyElicitationService,
    form_content,
)
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.errors import UsageError
from orchestrator.policy import PolicySet
from orchestrator.protocol import types as t
from orchestrator.protocol.codec import structure

CTX = SessionContext(agent="claude", session_id="s1", cwd="/work/repo", step="plan")
SCHEMA = t.ElicitationSchema(
    type="object",
    properties={
        "branch": t.StringPropertySchema(enum=["main", "dev"]),
        "retries": t.IntegerPropertySchema(minimum=0, maximum=5, default=2),
        "ratio": t.NumberPropertySchema(maximum=1.0),
        "push": t.BooleanPropertySchema(),
        "tags": t.MultiSelectPropertySchema(items=t.StringMultiSelectItems(enum=["a", "b"])),
        "name": t.StringPropertySchema(pattern="^[a-z]+$", max_length=8),
    },
    required=["branch", "push"],
)


def form(message: str = "Which branch?") -> t.ElicitationFormMode:
    """A form-mode elicitation with SCHEMA."""
    return t.ElicitationFormMode(message=message, requested_schema=SCHEMA, session_id="s1")


def accept(**values: Any) -> ElicitationRule:
    """A rule accepting every request with ``values``."""
    return ElicitationRule("accept", name="answer", values=values)


async def test_declines_by_default() -> None:
    """Without rules every elicitation is declined, and recorded."""
    service = PolicyElicitationService()
    answer = await service.create_elicitation(form(), CTX)
    assert answer == t.DeclineCreateElicitationResponse()
    [record] = service.records
    assert (record.action, record.rule, record.mode, record.step) == (
        "decline",
        "default",
        "form",
        "plan",
    )


async def test_accepts_with_values_and_defaults() -> None:
    """Accept answers the configured values, completed by defaults, limited to the schema."""
    service = PolicyElicitationService([accept(branch="main", push=False, tags=["a"], extra=1)])
    with capture_logs() as logs:
        answer = await service.create_elicitation(form(), CTX)
    assert answer == t.ElicitationAcceptAction(
        content={"branch": "main", "retries": 2, "push": False, "tags": ["a"]}
    )
    assert service.records[0].fields == ("branch", "retries", "push", "tags")
    assert [entry["action"] for entry in logs if entry["event"] == "elicitation answered"] == [
        "accept"
    ]


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"branch": "prod", "push": True}, "'branch' does not fit"),
        ({"branch": "main", "push": "yes"}, "'push' does not fit"),
        ({"branch": "main", "push": True, "retries": 9}, "'retries' does not fit"),
        ({"branch": "main", "push": True, "retries": 1.5}, "'retries' does not fit"),
        ({"branch": "main", "push": True, "ratio": True}, "'ratio' does not fit"),
        ({"branch": "main", "push": True, "tags": ["c"]}, "'tags' does not fit"),
        ({"branch": "main", "push": True, "name": "Bad1"}, "'name' does not fit"),
        ({"branch": "main"}, "no value for required ['push']"),
    ],
)
async def test_values_that_do_not_fit_decline(values: dict[str, Any], reason: str) -> None:
    """An accept whose values break the agent's schema becomes a decline, saying why."""
    service = PolicyElicitationService([accept(**values)])
    assert await service.create_elicitation(form(), CTX) == t.DeclineCreateElicitationResponse()
    assert reason in service.records[0].rule


def test_form_content_accepts_numbers_and_choices() -> None:
    """Integers count as numbers, titled choices and one_of consts are honoured."""
    schema = t.ElicitationSchema(
        properties={
            "ratio": t.NumberPropertySchema(minimum=0),
            "pick": t.StringPropertySchema(one_of=[t.EnumOption(const="x", title="X")]),
            "many": t.MultiSelectPropertySchema(
                items=t.TitledMultiSelectItems(any_of=[t.EnumOption(const="p", title="P")])
            ),
        }
    )
    assert form_content(schema, {"ratio": 1, "pick": "x", "many": ["p"]}) == (
        {"ratio": 1, "pick": "x", "many": ["p"]},
        "",
    )


async def test_rules_match_on_message_mode_agent_and_step() -> None:
    """The first rule whose message, mode, agent and step match decides."""
    rules = [
        ElicitationRule("cancel", name="other agent", agents="codex"),
        ElicitationRule("cancel", name="url", mode="url"),
        ElicitationRule("decline", name="wrong step", steps="review"),
        ElicitationRule("cancel", name="regex", message_regex=r"\bdelete\b"),
        ElicitationRule(
            "accept", name="glob", message="*BRANCH*", values={"branch": "dev", "push": True}
        ),
    ]
    service = PolicyElicitationService(rules)
    assert await service.create_elicitation(form("Really delete it?"), CTX) == (
        t.CancelCreateElicitationResponse()
    )
    answer = await service.create_elicitation(form("which branch?"), CTX)
    assert isinstance(answer, t.ElicitationAcceptAction)
    url = t.ElicitationUrlMode(message="Log in", elicitation_id="e1", url="https://x")
    assert await service.create_elicitation(url, CTX) == t.CancelCreateElicitationResponse()
    assert [r.rule for r in service.records] == ["regex", "glob", "url"]


async def test_url_accept_and_unknown_mode() -> None:
    """URL mode can be accepted (no content); an unknown mode is always declined."""
    service = PolicyElicitationService([ElicitationRule("accept", mode="url")])
    url = t.ElicitationUrlMode(message="Log in", elicitation_id="e1", url="https://x")
    assert await service.create_elicitation(url, CTX) == t.ElicitationAcceptAction()
    unknown = structure({"mode": "voice", "message": "hi"}, t.CreateElicitationRequest)
    assert isinstance(unknown, t.UnknownCreateElicitationRequest)
    assert await service.create_elicitation(unknown, CTX) == t.DeclineCreateElicitationResponse()


async def test_from_policy_file(tmp_path: Path) -> None:
    """Rules load from a policy file's [[elicitation]] tables."""
    path = tmp_path / "p.toml"
    path.write_text(
        '[[elicitation]]\nmessage = "*branch*"\naction = "accept"\n'
        'values = { branch = "main", push = true }\n',
        encoding="utf-8",
    )
    service = PolicyElicitationService.from_policy(PolicySet.from_toml(path))
    answer = await service.create_elicitation(form(), CTX)
    assert answer == t.ElicitationAcceptAction(
        content={"branch": "main", "retries": 2, "push": True}
    )
    assert service.records[0].rule == "elicitation[0]"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"message": "x"}, "needs an action"),
        ({"action": "maybe"}, "unknown elicitation action"),
        ({"action": "accept", "colour": 1}, "unknown keys"),
        ({"action": "accept", "values": 3}, "values must be a table"),
        ({"action": "accept", "agents": [1]}, "agents must be"),
        ({"action": "accept", "message": 1}, "message must be a string"),
        ({"action": "accept", "message_regex": "("}, "bad regex"),
    ],
)
def test_bad_tables_are_usage_errors(table: dict[str, Any], message: str) -> None:
    """Mistakes in [[elicitation]] tables are reported as usage errors."""
    with pytest.raises(UsageError, match=message):
        PolicyElicitationService.from_policy(PolicySet(elicitation=(table,)))


def test_installs_in_client_services() -> None:
    """The service plugs into ClientServices and advertises form elicitation."""
    services = ClientServices(elicitation=PolicyElicitationService())
    assert services.capabilities().elicitation is not None
