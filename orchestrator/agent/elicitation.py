"""``elicitation/create`` answered by policy: decline unless a rule says otherwise.

Rules come from the ``[[elicitation]]`` tables of a policy file (see :mod:`orchestrator.policy`)
or from Python. The first matching rule decides; none matching declines::

    [[elicitation]]
    name = "branch"
    message = "*branch*"        # glob on the message, case-insensitive (or message_regex)
    mode = "form"               # form | url; both when absent
    agents = ["claude*"]        # globs; also `steps`
    action = "accept"           # accept | decline | cancel
    values = { branch = "main", push = false }

An ``accept`` in form mode answers with the configured ``values`` (completed with the schema's
defaults, restricted to the requested properties). When a value does not fit its property (type,
enum, bounds, pattern) or a required property has no value, the answer is ``decline``: an agent
should never receive content its own schema rejects.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from attrs import define, field, frozen

from orchestrator.errors import UsageError
from orchestrator.policy import PolicySet

from .._log import get_logger
from ..protocol import types as t
from .services import SessionContext

__all__ = [
    "ElicitationAction",
    "ElicitationRecord",
    "ElicitationRule",
    "PolicyElicitationService",
    "form_content",
]

log = get_logger(__name__)

ElicitationAction = Literal["accept", "decline", "cancel"]

_KEYS = {"name", "action", "message", "message_regex", "mode", "agents", "steps", "values"}


def _globs(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _named(name: str | None, globs: tuple[str, ...]) -> bool:
    return not globs or (name is not None and any(fnmatch.fnmatchcase(name, g) for g in globs))


@frozen
class ElicitationRule:
    """How to answer matching elicitation requests."""

    action: ElicitationAction
    name: str = ""
    #: glob on the message, case-insensitive
    message: str | None = None
    #: regex searched in the message
    message_regex: str | None = None
    #: ``form`` or ``url``; None matches both
    mode: str | None = None
    agents: tuple[str, ...] = field(default=(), converter=_globs)
    steps: tuple[str, ...] = field(default=(), converter=_globs)
    #: the content of an ``accept`` answer in form mode
    values: Mapping[str, Any] = field(factory=dict)
    _message_re: re.Pattern[str] | None = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.action not in get_args(ElicitationAction):
            raise ValueError(f"unknown elicitation action {self.action!r}")
        try:
            pattern = re.compile(self.message_regex) if self.message_regex is not None else None
        except re.error as exc:
            raise ValueError(f"bad regex {self.message_regex!r}: {exc}") from exc
        object.__setattr__(self, "_message_re", pattern)

    @classmethod
    def from_mapping(
        cls, table: Mapping[str, Any], *, where: str = "elicitation"
    ) -> ElicitationRule:
        """Build from one ``[[elicitation]]`` table; bad tables raise :class:`UsageError`."""
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
        if "action" not in table:
            raise UsageError(f"{where}: a rule needs an action (accept, decline, cancel)")
        for key in ("name", "action", "message", "message_regex", "mode"):
            if key in table and not isinstance(table[key], str):
                raise UsageError(f"{where}: {key} must be a string")
        for key in ("agents", "steps"):
            value = table.get(key, [])
            if not isinstance(value, str | list) or not all(isinstance(v, str) for v in value):
                raise UsageError(f"{where}: {key} must be a string or an array of strings")
        if not isinstance(table.get("values", {}), Mapping):
            raise UsageError(f"{where}: values must be a table")
        try:
            return cls(**table)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{where}: {exc}") from exc

    def matches(self, mode: str, message: str, ctx: SessionContext) -> bool:
        """Whether this rule applies to a request of ``mode`` with ``message`` from ``ctx``."""
        return (
            (self.mode is None or self.mode == mode)
            and (self.message is None or fnmatch.fnmatchcase(message.lower(), self.message.lower()))
            and (self._message_re is None or self._message_re.search(message) is not None)
            and _named(ctx.agent, self.agents)
            and _named(ctx.step, self.steps)
        )


@frozen
class ElicitationRecord:
    """The audit record of one elicitation answer."""

    time: float
    agent: str
    session_id: str
    step: str | None
    mode: str
    message: str
    action: ElicitationAction
    rule: str
    #: the property names answered (values are not logged: they may be sensitive)
    fields: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON value."""
        return {
            "time": self.time,
            "agent": self.agent,
            "sessionId": self.session_id,
            "step": self.step,
            "mode": self.mode,
            "message": self.message,
            "action": self.action,
            "rule": self.rule,
            "fields": list(self.fields),
        }


def _fits(value: Any, schema: t.ElicitationPropertySchema) -> bool:
    """Whether ``value`` satisfies one property schema."""
    if isinstance(schema, t.StringPropertySchema):
        allowed = list(schema.enum or ()) + [o.const for o in schema.one_of or ()]
        return (
            isinstance(value, str)
            and (not allowed or value in allowed)
            and (schema.min_length is None or len(value) >= schema.min_length)
            and (schema.max_length is None or len(value) <= schema.max_length)
            and (schema.pattern is None or re.search(schema.pattern, value) is not None)
        )
    if isinstance(schema, t.NumberPropertySchema | t.IntegerPropertySchema):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return (
            (isinstance(value, int) or isinstance(schema, t.NumberPropertySchema))
            and (schema.minimum is None or value >= schema.minimum)
            and (schema.maximum is None or value <= schema.maximum)
        )
    if isinstance(schema, t.BooleanPropertySchema):
        return isinstance(value, bool)
    if isinstance(schema, t.MultiSelectPropertySchema):
        items = schema.items
        choices = (
            items.enum
            if isinstance(items, t.StringMultiSelectItems)
            else [o.const for o in items.any_of]
            if isinstance(items, t.TitledMultiSelectItems)
            else None
        )
        return (
            isinstance(value, list)
            and all(isinstance(v, str) and (choices is None or v in choices) for v in value)
            and (schema.min_items is None or len(value) >= schema.min_items)
            and (schema.max_items is None or len(value) <= schema.max_items)
        )
    return isinstance(value, str | int | float | bool)


def form_content(
    schema: t.ElicitationSchema, values: Mapping[str, Any]
) -> tuple[dict[str, t.ElicitationContentValue] | None, str]:
    """The accept content for ``schema`` from ``values`` and the schema's defaults.

    Returns ``(content, "")``, or ``(None, reason)`` when the answer would not fit the schema.
    """
    properties = schema.properties or {}
    content: dict[str, Any] = {}
    for name, prop in properties.items():
        value = values.get(name, getattr(prop, "default", None))
        if value is None:
            continue
        if not _fits(value, prop):
            return None, f"value for {name!r} does not fit its schema"
        content[name] = value
    missing = [name for name in schema.required or () if name not in content]
    if missing:
        return None, f"no value for required {missing}"
    return content, ""


def _rules(rules: Iterable[ElicitationRule]) -> tuple[ElicitationRule, ...]:
    return tuple(rules)


@define
class PolicyElicitationService:
    """Answers ``elicitation/create`` by rules (decline when none matches).

    Install with ``ClientServices(elicitation=PolicyElicitationService.from_policy(policy_set))``.
    ``records`` is the audit trail of every answer, in order.
    """

    rules: tuple[ElicitationRule, ...] = field(default=(), converter=_rules)
    records: list[ElicitationRecord] = field(factory=list)

    @classmethod
    def from_policy(cls, policy: PolicySet) -> PolicyElicitationService:
        """The service for a policy set's ``[[elicitation]]`` tables."""
        return cls(
            tuple(
                ElicitationRule.from_mapping(table, where=f"elicitation[{index}]")
                for index, table in enumerate(policy.elicitation)
            )
        )

    async def create_elicitation(
        self, request: t.CreateElicitationRequest, ctx: SessionContext
    ) -> t.CreateElicitationResponse:
        """Answer by the first matching rule; decline when none matches or the values misfit."""
        mode = request.mode
        message = "" if isinstance(request, t.UnknownCreateElicitationRequest) else request.message
        action: ElicitationAction = "decline"
        rule_name = "default"
        values: Mapping[str, Any] = {}
        content: dict[str, t.ElicitationContentValue] | None = None
        if not isinstance(request, t.UnknownCreateElicitationRequest):
            for index, rule in enumerate(self.rules):
                if rule.matches(mode, message, ctx):
                    action, rule_name = rule.action, rule.name or f"elicitation[{index}]"
                    values = rule.values
                    break
        if action == "accept" and isinstance(request, t.ElicitationFormMode):
            content, reason = form_content(request.requested_schema, values)
            if content is None:
                action, rule_name = "decline", f"{rule_name} ({reason})"
        record = ElicitationRecord(
            time=time.time(),
            agent=ctx.agent,
            session_id=ctx.session_id,
            step=ctx.step,
            mode=mode,
            message=message,
            action=action,
            rule=rule_name,
            fields=tuple(content or ()),
        )
        self.records.append(record)
        log.info("elicitation answered", **record.to_json())
        if action == "accept":
            return t.ElicitationAcceptAction(content=content)
        if action == "cancel":
            return t.CancelCreateElicitationResponse()
        return t.DeclineCreateElicitationResponse()
