"""Tests for orchestrator.protocol.methods: the generated method table against the schema.

The table comes from the defs that carry ``x-method``; it is checked here against what the
JSON-RPC envelope unions route (``ClientRequest`` holds what the client sends, so the agent
handles it, and so on), and its stability flag against the stable ``schema.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from orchestrator.protocol import types as t
from orchestrator.protocol.methods import NOTIFICATIONS, REQUESTS, MethodInfo

SCHEMA_DIR = Path(t.__file__).parent / "schema"
DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())["$defs"]
STABLE_DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.json").read_text())["$defs"]
# envelope union -> the side that handles the methods it routes
SIDE_OF_ENVELOPE = {
    "ClientRequest": "agent",
    "ClientNotification": "agent",
    "AgentRequest": "client",
    "AgentNotification": "client",
    "ProxyRequest": "proxy",
    "ProxyNotification": "proxy",
}


def refs_in(node: Any) -> set[str]:
    """Names of the defs a schema node refers to, at any depth."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        own = {ref.rsplit("/", 1)[-1]} if isinstance(ref, str) else set()
        return own.union(*(refs_in(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs_in(v) for v in node))
    return set()


def routed(envelope: str) -> set[tuple[str, str]]:
    """(kind, method) of every method def an envelope union routes."""
    out = set()
    for name in refs_in(DEFS[envelope]):
        if "x-method" in DEFS[name]:
            kind = "notification" if name.endswith("Notification") else "request"
            out.add((kind, DEFS[name]["x-method"]))
    return out


def methods_of(defs: dict[str, Any]) -> set[str]:
    """Every wire method name a schema's defs carry in ``x-method``."""
    return {d["x-method"] for d in defs.values() if "x-method" in d}


def expected_side(info: MethodInfo) -> str:
    """The side of the envelope that routes the method; ``$/cancel_request`` is routed by none
    (either side sends it): protocol."""
    key = (info.kind, info.name)
    sides = {side for env, side in SIDE_OF_ENVELOPE.items() if key in routed(env)}
    if not sides:
        return "protocol"
    return sides.pop() if len(sides) == 1 else "both"


ALL_INFOS: list[MethodInfo] = [*REQUESTS.values(), *NOTIFICATIONS.values()]


def test_tables_cover_every_schema_method() -> None:
    """REQUESTS and NOTIFICATIONS together name exactly the x-method names of the schema."""
    assert set(REQUESTS) | set(NOTIFICATIONS) == methods_of(DEFS)


def test_stable_methods_are_a_subset() -> None:
    """The stable schema has no method the unstable one lacks."""
    assert methods_of(STABLE_DEFS) <= methods_of(DEFS)


def test_keys_are_wire_names() -> None:
    """Each table entry is keyed by its own wire name and has the table's kind."""
    for name, info in REQUESTS.items():
        assert (info.name, info.kind) == (name, "request")
    for name, info in NOTIFICATIONS.items():
        assert (info.name, info.kind) == (name, "notification")


@pytest.mark.parametrize("info", ALL_INFOS, ids=lambda i: f"{i.kind}:{i.name}")
def test_side_matches_the_envelopes(info: MethodInfo) -> None:
    """The side is the one whose envelope union routes the method to it."""
    assert info.side == expected_side(info)


def test_sides_of_known_methods() -> None:
    """Spot checks: session/prompt is served by the agent, session/update by the client."""
    assert REQUESTS["session/prompt"].side == "agent"
    assert NOTIFICATIONS["session/cancel"].side == "agent"
    assert NOTIFICATIONS["session/update"].side == "client"
    assert REQUESTS["session/request_permission"].side == "client"
    assert NOTIFICATIONS["$/cancel_request"].side == "protocol"


@pytest.mark.parametrize("info", ALL_INFOS, ids=lambda i: f"{i.kind}:{i.name}")
def test_unstable_flag_matches_stable_schema(info: MethodInfo) -> None:
    """A method is unstable exactly when the stable schema.json does not carry it."""
    assert info.unstable == (info.name not in methods_of(STABLE_DEFS))


def _is_params_type(tp: Any) -> bool:
    return attrs.has(tp) or tp in t.TAGGED_UNIONS or tp in t.UNTAGGED_UNIONS or tp is Any


@pytest.mark.parametrize("info", ALL_INFOS, ids=lambda i: f"{i.kind}:{i.name}")
def test_params_and_result_types_exist(info: MethodInfo) -> None:
    """Params are a class or union; requests have a result type, notifications none."""
    assert _is_params_type(info.params)
    if info.kind == "request":
        assert _is_params_type(info.result)
    else:
        assert info.result is None


@pytest.mark.parametrize("name", sorted(n for n, d in DEFS.items() if "x-method" in d))
def test_schema_defs_with_x_method_are_in_the_table(name: str) -> None:
    """Each def carrying x-method is the params or result type of that method, same side."""
    schema = DEFS[name]
    method = schema["x-method"]
    if name.endswith("Notification"):
        info = NOTIFICATIONS[method]
        assert info.params is getattr(t, name)
    else:
        info = REQUESTS[method]
        role = "params" if name.endswith("Request") else "result"
        assert getattr(info, role) is getattr(t, name)
    assert info.side == schema["x-side"]


def test_unstable_methods_use_unstable_types() -> None:
    """Stable methods take stable params; a method whose params are unstable is unstable."""
    for info in ALL_INFOS:
        (params,) = [
            n
            for n, d in DEFS.items()
            if d.get("x-method") == info.name and getattr(t, n) is info.params
        ]
        assert (params in t.UNSTABLE) == info.unstable, info.name
