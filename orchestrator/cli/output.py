"""What the command line prints for scripts: one JSON object, versioned.

Every ``--json`` object carries ``schemaVersion``; its shape is described by the JSON Schema
shipped in the package (``orchestrator/schemas/output.schema.json``, :func:`output_schema`).
The version changes when a field is removed or changes meaning; added fields keep it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["SCHEMA_VERSION", "emit_json", "output_schema"]

#: the version of the ``--json`` objects' shape
SCHEMA_VERSION = 1


def emit_json(obj: Any) -> None:
    """Print ``obj`` as the command's one JSON object on stdout, with ``schemaVersion`` first."""
    import orjson

    body = {"schemaVersion": SCHEMA_VERSION, **obj}
    sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def output_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every ``--json`` object."""
    from importlib import resources  # not at import: the commands that print JSON need none

    text = resources.files("orchestrator").joinpath("schemas/output.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema
