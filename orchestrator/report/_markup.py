"""A tiny HTML builder whose only way to emit text escapes it.

Everything in a report that comes from an agent (messages, diffs, file names, titles) is hostile
until escaped. Rather than remembering to call ``html.escape`` at each of hundreds of places, the
renderer builds pages from :func:`el` and :func:`join`: plain ``str`` values are always escaped, and
only :class:`Markup` (produced by these helpers) passes through as HTML.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

__all__ = ["Markup", "el", "escape", "join", "void"]


class Markup(str):
    """A string that already is safe HTML (built by :func:`el`, :func:`join` or :func:`escape`)."""

    __slots__ = ()

    def __add__(self, other: str) -> Markup:
        # like markupsafe: joining keeps the result HTML, escaping a plain-text operand
        return Markup(str.__add__(self, escape(other)))

    def __radd__(self, other: str) -> Markup:
        return Markup(str.__add__(escape(other), self))


def escape(value: object) -> Markup:
    """``value`` as HTML text: Markup passes through, anything else is ``str()``-ed and escaped."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def _children(items: Iterable[object]) -> Iterable[Markup]:
    for item in items:
        if item is None or item is False:
            continue
        if isinstance(item, str):  # Markup is a str too; escape() lets it through
            yield escape(item)
        elif isinstance(item, Iterable):
            yield from _children(item)
        else:
            yield escape(item)


def join(*items: object) -> Markup:
    """Concatenate children (strings escaped, Markup kept, iterables flattened, None dropped)."""
    return Markup("".join(_children(items)))


def _attributes(attrs: dict[str, object]) -> str:
    parts: list[str] = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        # class_ / for_ avoid Python keywords; data_step becomes data-step
        name = key.rstrip("_").replace("_", "-")
        if value is True:
            parts.append(f" {name}")
        else:
            parts.append(f' {name}="{escape(value)}"')
    return "".join(parts)


def el(tag: str, *children: object, **attrs: object) -> Markup:
    """An element ``<tag attrs>children</tag>``; attribute values and text children are escaped."""
    return Markup(f"<{tag}{_attributes(attrs)}>{join(*children)}</{tag}>")


def void(tag: str, **attrs: object) -> Markup:
    """An element without content or end tag (``<meta>``, ``<br>``)."""
    return Markup(f"<{tag}{_attributes(attrs)}>")
