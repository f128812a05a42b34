"""``orchestrator agents --registry [FILE|URL]``: the agents of an ACP registry.

Without a value it lists the registry ``--agent registry:ID`` reads: the file
``$ORCHESTRATOR_REGISTRY`` names, else the snapshot bundled with the orchestrator (also named
``builtin``), saying where that was built from. A file (or ``file://`` URL) is read, an
``https://`` URL fetched (:func:`orchestrator.registry.fetch_registry`: redirects checked, a
total deadline, a size cap) in a thread that Ctrl-C abandons at once. Each agent shows its id,
name, version, distribution kinds and whether it can start here (the check launch makes), and
``--agent registry:ID`` runs it. A registry that cannot be read is a one-line error (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .output import emit_json, say

EXIT_OK = 0


async def list_registry(source: str, *, as_json: bool) -> int:
    """List the registry at ``source`` (``builtin``, a file or a URL; empty: the one
    ``registry:ID`` reads); return the exit code."""
    import trio

    from ..registry import fetch_registry, is_url, load_registry, platform_key, registry_from_env

    if not source:  # what registry:ID reads, refused alike when it cannot
        found = registry_from_env()
    elif is_url(source):
        # the fetch blocks in its thread: abandoned on Ctrl-C/SIGTERM, so they end it at once
        found = await trio.to_thread.run_sync(fetch_registry, source, abandon_on_cancel=True)
    else:
        found = load_registry(source)
    rows = [agent.to_json() for agent in found.agents]
    head = {
        "source": found.source,
        "version": found.version,
        "provenance": dict(found.provenance) if found.provenance is not None else None,
        "platform": platform_key(),
    }
    if as_json:
        emit_json({"registry": head, "agents": rows})
        return EXIT_OK
    say(_one_line(_heading(head, len(rows))))
    _print_rows(rows)
    return EXIT_OK


def _one_line(text: str) -> str:
    """``text`` with every control character escaped, newlines and tabs included: a
    registry's text must not start lines of its own in the listing."""
    return "".join(
        c
        if c.isprintable() or c == " "
        else (repr(c)[1:-1] if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )


def _heading(head: Mapping[str, Any], count: int) -> str:
    where = head["source"]
    provenance = head["provenance"]
    if provenance:
        where = (
            f"the bundled snapshot of {provenance.get('repository')} at"
            f" {str(provenance.get('commit'))[:12]} ({provenance.get('date')},"
            f" {provenance.get('license')})"
        )
    return f"ACP registry {head['version'] or '(no version)'}: {count} agents from {where}"


def _print_rows(rows: list[dict[str, Any]]) -> None:
    width = max((len(row["agent"]) for row in rows), default=0)
    for row in rows:
        state = (
            f"runs here via {row['runWith']}" if row["runnable"] else f"cannot run: {row['whyNot']}"
        )
        kinds = ", ".join(row["distributions"])
        say(
            _one_line(f"{row['agent']:<{width}}  {row['name']} {row['version']} [{kinds}]: {state}")
        )
        say(f"{'':<{width}}  {_one_line(row['description'])}")
