"""``orchestrator agents --registry [FILE|URL]``: the agents of an ACP registry.

Without a value (or with ``builtin``) it lists the snapshot bundled with the orchestrator and
says where it was built from; a file is read, a URL fetched (:func:`orchestrator.registry.
fetch_registry`: HTTPS, a timeout, a size cap). Each agent shows its id, name, version,
distribution kinds and whether it can start here, and ``--agent registry:ID`` runs it. A
registry that cannot be read is a one-line error (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .output import emit_json, say, terminal_text

EXIT_OK = 0


async def list_registry(source: str, *, as_json: bool) -> int:
    """List the registry at ``source`` (``builtin``, a file or a URL); return the exit code."""
    import trio

    from ..registry import fetch_registry, is_url, load_registry, platform_key

    if is_url(source):
        found = await trio.to_thread.run_sync(fetch_registry, source)
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
    say(terminal_text(_heading(head, len(rows))))
    _print_rows(rows)
    return EXIT_OK


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
        state = f"runs here via {row['runWith']}" if row["runnable"] else row["whyNot"]
        kinds = ", ".join(row["distributions"])
        say(
            terminal_text(
                f"{row['agent']:<{width}}  {row['name']} {row['version']} [{kinds}]: {state}"
            )
        )
        say(terminal_text(f"{'':<{width}}  {row['description']}"))
