"""Tests for orchestrator.protocol.methods: the generated method table against meta.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from orchestrator.protocol import types as t
from orchestrator.protocol.methods import NOTIFICATIONS, REQUESTS, MethodInfo

SCHEMA_DIR = Path(t.__file__).parent / "schema"
META: dict[str, Any] = json.loads((SCHEMA_DIR / "meta.json").read_text())
META_UNSTABLE: dict[str, Any] = json.loads((SCHEMA_DIR / "meta.unstable.json").read_text())
DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())["$defs"]
TABLES = ("agentMethods", "clientMethods", "protocolMethods")
SIDE_OF_TABLE = {"agentMethods": "agent", "clientMethods": "client", "protocolMethods": "protocol"}


def methods_of(meta: dict[str, Any]) -> set[str]:
    """Every wire method name listed in a meta file."""
    return {name for table in TABLES for name in meta[table].values()}


def expected_side(name: str) -> str:
    """agentMethods -> agent, clientMethods -> client, protocolMethods -> protocol; both tables
    -> both."""
    sides = {SIDE_OF_TABLE[table] for table in TABLES if name in META_UNSTABLE[table].values()}
    return sides.pop() if len(sides) == 1 else "both"


ALL_INFOS: list[MethodInfo] = [*REQUESTS.values(), *NOTIFICATIONS.values()]


def test_tables_cover_every_meta_method() -> None:
    """REQUESTS and NOTIFICATIONS together name exactly the methods of meta.unstable.json."""
    assert set(REQUESTS) | set(NOTIFICATIONS) == methods_of(META_UNSTABLE)


def test_stable_meta_is_a_subset() -> None:
    """meta.json (stable) lists no method the unstable meta lacks."""
    assert methods_of(META) <= methods_of(META_UNSTABLE)


def test_keys_are_wire_names() -> None:
    """Each table entry is keyed by its own wire name and has the table's kind."""
    for name, info in REQUESTS.items():
        assert (info.name, info.kind) == (name, "request")
    for name, info in NOTIFICATIONS.items():
        assert (info.name, info.kind) == (name, "notification")


@pytest.mark.parametrize("info", ALL_INFOS, ids=lambda i: f"{i.kind}:{i.name}")
def test_side_matches_meta(info: MethodInfo) -> None:
    """The side is the meta table the method is listed in ("both" when in two)."""
    assert info.side == expected_side(info.name)


def test_sides_of_known_methods() -> None:
    """Spot checks: session/prompt is served by the agent, session/update by the client."""
    assert REQUESTS["session/prompt"].side == "agent"
    assert NOTIFICATIONS["session/cancel"].side == "agent"
    assert NOTIFICATIONS["session/update"].side == "client"
    assert REQUESTS["session/request_permission"].side == "client"
    assert NOTIFICATIONS["$/cancel_request"].side == "protocol"


@pytest.mark.parametrize("info", ALL_INFOS, ids=lambda i: f"{i.kind}:{i.name}")
def test_unstable_flag_matches_stable_meta(info: MethodInfo) -> None:
    """A method is unstable exactly when the stable meta.json does not list it."""
    assert info.unstable == (info.name not in methods_of(META))


def _is_params_type(tp: Any) -> bool:
    return attrs.has(tp) or tp in t.TAGGED_UNIONS or tp is Any


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
