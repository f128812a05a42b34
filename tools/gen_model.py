"""The generator's model of the ACP schema, between loading and emitting.

``gen_schema.py`` fills a :class:`Model` from the schema's JSON; ``gen_protocol.py`` emits the
Python text from it. Annotations in the model are Python source text
(``list[ContentBlock] | None``); :func:`split_union` and :func:`join_union` take unions of them
apart and put them back together.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FieldSpec:
    py_name: str
    wire: str
    annotation: str
    required: bool
    doc: str = ""
    lenient: bool = False
    skip_invalid_items: bool = False
    tag_value: str | None = None


@dataclass
class ClassSpec:
    name: str
    doc: str
    fields: list[FieldSpec]
    unstable: bool
    base: str | None = None
    # set for a class standing for unknown variants of a tagged union
    unknown_tag: FieldSpec | None = None


@dataclass
class UnionSpec:
    name: str
    doc: str
    members: list[str]  # annotations of the members (class names, or list[...] forms)
    unstable: bool
    tag_wire: str | None = None  # tagged union: wire name of the tag property
    default: str | None = None  # tagged union: variant used when the tag is absent
    unknown: str | None = None  # tagged union: class holding unknown variants
    # untagged unions of objects (or lists of objects): member -> required wire keys
    required_keys: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class AliasSpec:
    name: str
    doc: str
    annotation: str
    unstable: bool
    literal_values: list[str] | None = None  # an enum: Literal values, unknown ones tolerated


@dataclass
class MethodSpec:
    name: str
    side: str
    kind: str
    params: str | None
    result: str | None
    unstable: bool


@dataclass
class Model:
    classes: dict[str, ClassSpec] = field(default_factory=dict)
    unions: dict[str, UnionSpec] = field(default_factory=dict)
    aliases: dict[str, AliasSpec] = field(default_factory=dict)
    methods: list[MethodSpec] = field(default_factory=list)


def split_union(annotation: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    parts.append(annotation[start:].strip())
    return parts


def join_union(parts: list[str]) -> str:
    seen: list[str] = []
    for part in parts:
        for p in split_union(part):
            if p not in seen:
                seen.append(p)
    if "None" in seen:  # None last reads best
        seen.remove("None")
        seen.append("None")
    return " | ".join(seen)
