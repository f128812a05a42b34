"""Judging what got through: from the agent's record, and from its branch while it exists."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchestrator.testing.hostile._layout import PROGRAM_RAN, SECRET_VARIABLES, Layout
from orchestrator.testing.script import JsonObject

__all__ = ["judge_escapes", "judge_record", "unique"]


def _secret_values(layout: Layout, environ: Mapping[str, str]) -> dict[str, str]:
    """Values that must not reach a terminal: the canaries, and the values the agent's own
    environment gives :data:`SECRET_VARIABLES` (the user's, when run from the command line)."""
    values = {f"{name} (canary)": layout.canary(name) for name in SECRET_VARIABLES}
    for name in SECRET_VARIABLES:
        value = environ.get(name, "")
        if "://" in value:  # a URL: its password is the secret (a proxy may pass without it)
            with contextlib.suppress(ValueError):
                value = urlsplit(value).password or ""
        if len(value) >= 6:  # shorter ones are found in any output
            values[name] = value
    return values


def _error_code(event: JsonObject) -> Any:
    error = event.get("error")
    return error.get("code") if isinstance(error, dict) else None


def judge_record(
    events: Sequence[JsonObject], layout: Layout, environ: Mapping[str, str] | None = None
) -> list[str]:
    """What the agent's record shows got through: programs that ran, secrets, grants, -32603."""
    secrets = _secret_values(layout, os.environ if environ is None else environ)
    found: list[str] = []
    for e in events:
        kind = e.get("event")
        if kind == "terminal":
            output = e.get("output")
            command = e.get("command")
            if not isinstance(output, str):
                continue
            if PROGRAM_RAN in output:
                found.append(f"a program the policy should have refused ran: {command!r}")
            if layout.preload.name in output:
                found.append(f"the loader saw the agent's LD_PRELOAD: {command!r}")
            found += [
                f"{name} reached a terminal's output: {command!r}"
                for name, value in secrets.items()
                if value in output
            ]
        elif kind == "permission" and e.get("decision") == "allow":
            found.append(f"a hostile permission request was granted: {e.get('toolCallId')}")
        elif kind == "response" and _error_code(e) == -32603:
            found.append(f"{e.get('method')} was answered with an internal error (-32603)")
        elif kind == "unexpected_response" and _error_code(e.get("message") or {}) == -32603:
            found.append(f"a malformed frame was answered with an internal error: {e['message']}")
        elif kind == "fs_read" and layout.secret.strip() in str(e.get("content", "")):
            found.append(f"fs/read_text_file read outside the branch: {e.get('path')}")
    found += [f"the agent's program ran (marker {m})" for m in layout.programs_ran()]
    return unique(found)


def _outside(path: str, cwd: str) -> str | None:
    """``path``'s real location, when it is outside ``cwd``."""
    real = os.path.realpath(path)
    base = os.path.realpath(cwd)
    return None if real == base or real.startswith(base.rstrip("/") + "/") else real


def judge_escapes(events: Sequence[JsonObject], layout: Layout, cwd: str) -> list[str]:
    """Writes that landed outside the branch ``cwd``; run while the branch still exists."""
    found: list[str] = []
    for e in events:
        path = e.get("path")
        if not isinstance(path, str) or "\0" in path:
            continue
        try:
            real = _outside(path, cwd)
        except (OSError, ValueError):
            continue
        if real is None:
            continue
        if e.get("event") == "fs_write":
            content = e.get("content")
            try:
                landed = Path(real).read_text() == content
            except (OSError, UnicodeDecodeError):
                landed = False
            if landed:
                found.append(f"fs/write_text_file wrote outside the branch: {real}")
        elif e.get("event") == "disk_write" and "error" not in e:
            found.append(f"the agent process wrote outside its branch: {real}")
    return unique(found + layout.outside_changes())


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
