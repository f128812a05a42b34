"""File sizes: the limit on a changed file, reading sizes as people write them, and showing them.

A size is a whole number of bytes, or a string of a number and a unit: ``"100M"``, ``"512K"``,
``"1.5G"``; ``K``, ``M`` and ``G`` (also spelled ``KB``/``KiB`` and so on) are powers of 1024.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_MAX_TURN_RECORD_BYTES",
    "MAX_FILE_SIZE_CEILING",
    "first_within",
    "format_size",
    "parse_size",
]

#: the largest changed file a run records unless told otherwise (100 MiB)
DEFAULT_MAX_FILE_SIZE = 100 * 2**20
#: what a run keeps of one turn by default (8 MiB): of its text, of its tool calls' summaries
#: and of its wire transcript, each. A real turn stays far below; the turn itself is never cut,
#: only what is recorded of it
DEFAULT_MAX_TURN_RECORD_BYTES = 8 * 2**20
#: the largest content the run store can keep: SQLite's limit on one value
MAX_FILE_SIZE_CEILING = 1_000_000_000

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
# ASCII digits only: \d would take any script's digits (Arabic-Indic "١٢٣" as 123)
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG]?)(?:I?B)?\s*", re.IGNORECASE | re.ASCII)


#: a failed tool call's error text is kept (and shown) up to this many characters
MAX_TOOL_ERROR_CHARS = 2000


def bounded_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\u2026 ({len(text) - limit:,} more characters)"


def first_within(items: Iterable[Mapping[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The first JSON objects of ``items`` whose JSON fits in ``limit`` bytes together (None:
    all): what a record keeps of a list an agent can make as long as it likes."""
    kept: list[dict[str, Any]] = []
    used = 0
    for item in items:
        used += len(orjson.dumps(dict(item)))
        if limit is not None and used > limit:
            break
        kept.append(dict(item))
    return kept


def parse_size(value: object) -> int:
    """A size in bytes from an int or a string such as ``"100M"`` (see the module doc).

    Raises :class:`TypeError` for another type and :class:`ValueError` (saying what is expected)
    for a string that is not a size or a size below 1 byte or above
    :data:`MAX_FILE_SIZE_CEILING`.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a size is a number of bytes or a string such as '100M', not {value!r}")
    if isinstance(value, int):
        size = value
    else:
        found = _SIZE.fullmatch(value)
        if found is None:
            raise ValueError(f"{value!r} is not a size (bytes, or a number with K, M or G)")
        number = float(found.group(1)) * _UNITS[found.group(2).upper()]
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not a size (bytes, or a number with K, M or G)")
        size = int(number)
    if size < 1:
        raise ValueError(f"a size must be at least 1 byte, got {value!r}")
    if size > MAX_FILE_SIZE_CEILING:
        raise ValueError(
            f"{value!r} is more than {MAX_FILE_SIZE_CEILING} bytes "
            f"({format_size(MAX_FILE_SIZE_CEILING)}), the largest file the run store keeps"
        )
    return size


def format_size(size: int) -> str:
    """``size`` bytes for people: ``"512 bytes"``, ``"2.0 MiB"``, ``"1.5 GiB"``."""
    if size < 1024:
        return f"{size} bytes"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"
