"""Generate ``orchestrator/protocol/types.py`` and ``methods.py`` from the vendored ACP schema.

Usage::

    python tools/gen_protocol.py           # rewrite the generated modules
    python tools/gen_protocol.py --check   # exit 1 if they are stale (run by the tests and CI)

The schema is first loaded into a small model (:class:`Model`: classes, fields, unions, enums,
aliases, methods); the Python text is then emitted from that model, never while walking the raw
JSON. Types come from ``schema.unstable.json`` (a superset of ``schema.json``); those missing
from the stable schema are marked unstable. The classes get their ``__init__``, ``__repr__``,
``__eq__`` and ``__hash__`` as code in their bodies (see ``gen_dunders.py``), not from attrs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import keyword
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gen_dunders import DECORATOR_ARGS, PRELUDE, Attr, emit_dunders

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "orchestrator" / "protocol" / "schema"
TYPES_OUT = ROOT / "orchestrator" / "protocol" / "types.py"
METHODS_OUT = ROOT / "orchestrator" / "protocol" / "methods.py"
SCHEMA_RELEASE = "1.21.0"
PROTOCOL_VERSION = 1

# JSON-RPC envelopes: the jsonrpc layer owns these shapes, so no classes are made for them.
ENVELOPES = frozenset(
    {
        "AgentRequest",
        "AgentResponse",
        "AgentNotification",
        "ClientRequest",
        "ClientResponse",
        "ClientNotification",
    }
)
ANNOTATION_ONLY_KEYS = frozenset(
    {
        "description",
        "title",
        "x-deserialize-default-on-error",
        "x-method",
        "x-side",
        "x-docs-ignore",
    }
)
PRIMITIVES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
}


class SchemaShapeError(Exception):
    """The schema holds a shape this generator does not know how to map."""


# --------------------------------------------------------------------------- the model


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


# --------------------------------------------------------------------------- loading


def snake(name: str) -> str:
    """``sessionUpdate`` -> ``session_update``; ``_meta`` -> ``meta``; keywords get a ``_``."""
    text = name.lstrip("_")
    text = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", text)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text).lower()
    if keyword.iskeyword(text) or text in {"extra"}:
        text += "_"
    return text


def pascal(tag: str) -> str:
    parts = re.split(r"[_\-/ ]+", tag)
    return "".join(p[:1].upper() + p[1:] for p in parts if p)


def ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
        return ref_name(all_of[0])
    return None


def tag_of(variant: dict[str, Any]) -> tuple[str, str] | None:
    """(property, value) when the variant is tagged by a const string property."""
    for prop, sub in (variant.get("properties") or {}).items():
        if isinstance(sub, dict) and isinstance(sub.get("const"), str):
            return prop, sub["const"]
    return None


class Loader:
    def __init__(self, unstable: dict[str, Any], stable: dict[str, Any], meta: dict[str, Any]):
        self.defs: dict[str, Any] = unstable["$defs"]
        self.stable_names = set(stable["$defs"])
        self.meta = meta
        self.model = Model()
        self.ref_counts: Counter[str] = Counter()
        self._count_refs(unstable)
        # base def -> the single variant class folded into it (tag added to the def itself)
        self.folded: dict[str, tuple[str, str, str]] = {}
        # def name -> Python name of what a $ref to it means
        # folded base def -> properties common to all variants of its object union
        self.pending_common: dict[str, list[FieldSpec]] = {}

    def _count_refs(self, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str):
                    self.ref_counts[value.rsplit("/", 1)[-1]] += 1
                else:
                    self._count_refs(value)
        elif isinstance(node, list):
            for item in node:
                self._count_refs(item)

    def unstable(self, name: str) -> bool:
        return name not in self.stable_names

    # ---- annotations

    def annotation(self, schema: dict[str, Any]) -> str:
        name = ref_name(schema)
        if name is not None:
            return name
        if "anyOf" in schema or "oneOf" in schema:
            options = schema.get("anyOf") or schema.get("oneOf") or []
            parts = [self.annotation(o) for o in options]
            return join_union(parts)
        if "const" in schema:
            return f"Literal[{json.dumps(schema['const'])}]"
        kind = schema.get("type")
        if isinstance(kind, list):
            return join_union([self.annotation({**schema, "type": k}) for k in kind])
        if kind == "array":
            items = schema.get("items")
            inner = self.annotation(items) if isinstance(items, dict) else "Any"
            return f"list[{inner}]"
        if kind == "object":
            extra = schema.get("additionalProperties")
            inner = self.annotation(extra) if isinstance(extra, dict) else "Any"
            return f"dict[str, {inner}]"
        if isinstance(kind, str):
            if kind not in PRIMITIVES:
                raise SchemaShapeError(f"unknown type {kind!r}")
            return PRIMITIVES[kind]
        if not schema or set(schema) <= ANNOTATION_ONLY_KEYS:
            return "Any"
        raise SchemaShapeError(f"cannot map {json.dumps(schema)[:200]}")

    def fields_of(self, schema: dict[str, Any]) -> list[FieldSpec]:
        required = set(schema.get("required") or [])
        out = []
        for wire, sub in (schema.get("properties") or {}).items():
            if not isinstance(sub, dict):
                raise SchemaShapeError(f"property {wire} is not an object")
            annotation = self.annotation(sub)
            is_required = wire in required
            if not is_required and "None" not in split_union(annotation) and annotation != "Any":
                annotation = join_union([annotation, "None"])
            out.append(
                FieldSpec(
                    py_name=snake(wire),
                    wire=wire,
                    annotation=annotation,
                    required=is_required,
                    doc=sub.get("description", ""),
                    lenient=bool(sub.get("x-deserialize-default-on-error")),
                    skip_invalid_items=bool(sub.get("x-deserialize-skip-invalid-items")),
                )
            )
        names = [f.py_name for f in out]
        if len(names) != len(set(names)):
            raise SchemaShapeError(f"python field names collide: {names}")
        return out

    # ---- defs

    def load(self) -> Model:
        # First pass: find union variants whose base def can take the tag itself.
        for name, schema in self.defs.items():
            if name in ENVELOPES:
                continue
            variants = schema.get("oneOf") or schema.get("anyOf")
            if not isinstance(variants, list):
                continue
            for variant in variants:
                tagged = tag_of(variant) if isinstance(variant, dict) else None
                base = ref_name(variant) if isinstance(variant, dict) else None
                if tagged and base and self.ref_counts[base] == 1:
                    self.folded[base] = (name, tagged[0], tagged[1])
        for name, schema in self.defs.items():
            if name not in ENVELOPES:
                self.load_def(name, schema)
        self.load_methods()
        return self.model

    def load_def(self, name: str, schema: dict[str, Any]) -> None:
        doc = schema.get("description", "")
        variants = schema.get("oneOf") or schema.get("anyOf")
        if (
            isinstance(variants, list)
            and "properties" in schema
            and not any(isinstance(v, dict) and tag_of(v) for v in variants)
        ):
            # untagged alternatives flattened into an object (a scope mixin): the class has
            # its own fields plus every alternative's fields, those made optional
            fields = self.fields_of(schema)
            for variant in variants:
                base = ref_name(variant)
                if base is None:
                    raise SchemaShapeError(f"{name}: flattened variant without $ref")
                for f in self.fields_of({**self.defs[base], "required": []}):
                    if f.wire not in {g.wire for g in fields}:
                        fields.append(f)
            self.add_object(name, doc, fields)
            return
        if isinstance(variants, list) and all(
            isinstance(v, dict) and (isinstance(v.get("const"), int) or v.get("type") == "integer")
            for v in variants
        ):
            # integer codes with room for more (ErrorCode): a plain int
            self.model.aliases[name] = AliasSpec(name, doc, "int", self.unstable(name))
            return
        if isinstance(variants, list):
            if all(isinstance(v, dict) and "const" in v for v in variants) or (
                all(
                    isinstance(v, dict) and ("const" in v or v.get("type") == "string")
                    for v in variants
                )
                and any("const" in v for v in variants)
                and all(isinstance(v.get("const", ""), str) for v in variants)
            ):
                self.load_enum(name, doc, variants)
                return
            if any(
                isinstance(v, dict) and (tag_of(v) or ref_name(v) or v.get("type") == "object")
                for v in variants
            ) or ("properties" in schema):
                if any(isinstance(v, dict) and tag_of(v) for v in variants):
                    self.load_tagged_union(name, schema, doc, variants)
                else:
                    self.load_untagged_union(name, doc, variants)
                return
            # a union of primitives or of lists
            if any(
                isinstance(v, dict)
                and v.get("type") == "array"
                and isinstance(v.get("items"), dict)
                and ref_name(v["items"])
                for v in variants
            ):
                self.load_untagged_union(name, doc, variants)
                return
            self.model.aliases[name] = AliasSpec(
                name, doc, join_union([self.annotation(v) for v in variants]), self.unstable(name)
            )
            return
        if "properties" in schema or schema.get("type") == "object":
            self.add_object(name, doc, self.fields_of(schema))
            return
        self.model.aliases[name] = AliasSpec(
            name, doc, self.annotation(schema), self.unstable(name)
        )

    def add_object(self, name: str, doc: str, fields: list[FieldSpec]) -> None:
        if name in self.folded:
            _union, prop, value = self.folded[name]
            fields = [tag_field(prop, value), *[f for f in fields if f.wire != prop]]
        self.model.classes[name] = ClassSpec(name, doc, fields, self.unstable(name))

    def load_enum(self, name: str, doc: str, variants: list[dict[str, Any]]) -> None:
        consts = [v["const"] for v in variants if "const" in v]
        if all(isinstance(c, str) for c in consts):
            values = [str(c) for c in consts]
            annotation = "Literal[" + ", ".join(json.dumps(v) for v in values) + "]"
            self.model.aliases[name] = AliasSpec(name, doc, annotation, self.unstable(name), values)
        elif all(isinstance(c, int) for c in consts):
            self.model.aliases[name] = AliasSpec(name, doc, "int", self.unstable(name))
        else:
            raise SchemaShapeError(f"{name}: mixed enum")

    def load_tagged_union(
        self, name: str, schema: dict[str, Any], doc: str, variants: list[dict[str, Any]]
    ) -> None:
        common = self.fields_of(schema) if "properties" in schema else []
        union = UnionSpec(name, doc, [], self.unstable(name))
        for variant in variants:
            tagged = tag_of(variant)
            base = ref_name(variant)
            if tagged is None:
                if variant.get("title") == "other":
                    continue  # the schema's own catch-all: our Unknown class covers it
                if base is None:
                    # an inline default variant (used when the tag is absent)
                    title = variant.get("title")
                    if not title or "properties" not in variant:
                        raise SchemaShapeError(f"{name}: untagged variant without $ref")
                    base = f"{name}{pascal(title)}"
                    self.model.classes[base] = ClassSpec(
                        base,
                        variant.get("description", ""),
                        [*common, *self.fields_of(variant)],
                        self.unstable(name),
                    )
                union.default = base
                union.members.append(base)
                continue
            prop, value = tagged
            if union.tag_wire not in (None, prop):
                raise SchemaShapeError(f"{name}: two tag properties")
            union.tag_wire = prop
            vdoc = variant.get("description", "")
            if base is not None and base in self.folded and self.folded[base][0] == name:
                if common:
                    # the base def may load before or after this union: finish() adds them
                    self.pending_common[base] = common
                union.members.append(base)
                continue
            # a variant over a shared base reads well by its tag alone (``AgentMessageChunk``);
            # an inline one, or one whose tag names an existing type, gets the union's name too
            cls_name = pascal(value)
            if base is None or cls_name in self.defs or cls_name in self.model.classes:
                cls_name = f"{cls_name}{name}"
            fields = [tag_field(prop, value), *common]
            if base is None:
                fields += [f for f in self.fields_of(variant) if f.wire != prop]
            self.model.classes[cls_name] = ClassSpec(
                cls_name, vdoc, fields, self.unstable(name), base=base
            )
            union.members.append(cls_name)
        if union.tag_wire is None:
            raise SchemaShapeError(f"{name}: no tag")
        unknown = f"Unknown{name}"
        self.model.classes[unknown] = ClassSpec(
            unknown,
            f"A ``{name}`` whose ``{union.tag_wire}`` this schema release does not know.\n\n"
            "``raw`` keeps the whole object as received, so it can be stored or forwarded.",
            [],
            self.unstable(name),
            unknown_tag=FieldSpec(snake(union.tag_wire), union.tag_wire, "str", True),
        )
        union.unknown = unknown
        union.members.append(unknown)
        self.model.unions[name] = union

    def load_untagged_union(self, name: str, doc: str, variants: list[dict[str, Any]]) -> None:
        union = UnionSpec(name, doc, [], self.unstable(name))
        for variant in variants:
            base = ref_name(variant)
            if base is not None:
                union.members.append(base)
                union.required_keys[base] = list(self.defs[base].get("required") or [])
                continue
            if variant.get("type") == "array" and isinstance(variant.get("items"), dict):
                item = ref_name(variant["items"])
                if item is None:
                    raise SchemaShapeError(f"{name}: array variant of non-ref items")
                member = f"list[{item}]"
                union.members.append(member)
                union.required_keys[member] = list(self.defs[item].get("required") or [])
                continue
            raise SchemaShapeError(f"{name}: cannot map variant {json.dumps(variant)[:200]}")
        self.model.unions[name] = union

    def finish(self) -> None:
        # common properties of object unions go into folded base classes
        for base, common in self.pending_common.items():
            spec = self.model.classes[base]
            tag = spec.fields[0]
            rest = [f for f in spec.fields[1:] if f.wire not in {c.wire for c in common}]
            spec.fields = [tag, *common, *rest]

    def load_methods(self) -> None:
        by_method: dict[str, dict[str, tuple[str, str]]] = {}
        for name, schema in self.defs.items():
            method = schema.get("x-method")
            if not method:
                continue
            side = schema["x-side"]
            role = (
                "params"
                if name.endswith(("Request", "Notification"))
                else "result"
                if name.endswith("Response")
                else None
            )
            if role is None:
                raise SchemaShapeError(f"{name}: cannot tell params from result")
            kind = "notification" if name.endswith("Notification") else "request"
            by_method.setdefault(f"{kind}:{method}", {})[role] = (name, side)
        known = set()
        for table in ("agentMethods", "clientMethods", "protocolMethods"):
            known |= set(self.meta[table].values())
        for key, roles in sorted(by_method.items()):
            kind, method = key.split(":", 1)
            params = roles.get("params")
            result = roles.get("result")
            side = (params or result or ("", ""))[1]
            if method not in known:
                raise SchemaShapeError(f"{method} missing from meta.unstable.json")
            self.model.methods.append(
                MethodSpec(
                    method,
                    side,
                    kind,
                    params[0] if params else None,
                    result[0] if result else None,
                    self.unstable((params or result or ("", ""))[0]),
                )
            )
        found = {m.name for m in self.model.methods}
        missing = known - found
        if missing:
            raise SchemaShapeError(f"meta lists methods without types: {sorted(missing)}")


def tag_field(prop: str, value: str) -> FieldSpec:
    return FieldSpec(snake(prop), prop, f"Literal[{json.dumps(value)}]", True, tag_value=value)


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


# --------------------------------------------------------------------------- emitting


def docstring(text: str, indent: str) -> list[str]:
    text = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if not text:
        return []
    lines = text.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    out = [f'{indent}"""{lines[0]}']
    out += [f"{indent}{line}".rstrip() for line in lines[1:]]
    out.append(f'{indent}"""')
    return out


def comment(text: str, indent: str) -> list[str]:
    return [f"{indent}#: {line}".rstrip() for line in text.strip().splitlines()]


def header(source: str) -> list[str]:
    return [
        "# DO NOT EDIT: generated by tools/gen_protocol.py from",
        f"# orchestrator/protocol/schema/{source} (ACP protocol version {PROTOCOL_VERSION},",
        f"# schema release {SCHEMA_RELEASE}). Regenerate with: python tools/gen_protocol.py",
        "# ruff: noqa",
    ]


def field_default(f: FieldSpec) -> str | None:
    """The field's default as source text; None for a required field."""
    if f.tag_value is not None:
        return json.dumps(f.tag_value)
    return None if f.required else "None"


def emit_field(f: FieldSpec, indent: str) -> list[str]:
    meta = [f'"wire": {json.dumps(f.wire)}']
    if f.tag_value is not None:
        meta.append('"tag": True')
    if f.lenient:
        meta.append('"lenient": True')
    if f.skip_invalid_items:
        meta.append('"skip_invalid_items": True')
    args = []
    default = field_default(f)
    if default is not None:
        args.append(f"default={default}")
    args.append("metadata={" + ", ".join(meta) + "}")
    out = comment(f.doc, indent)
    out.append(f"{indent}{f.py_name}: {f.annotation} = field({', '.join(args)})")
    return out


TAGGED_UNION_ATTRS = [
    Attr("tag", "str"),
    Attr("members", "tuple[type, ...]"),
    Attr("default", "type | None"),
    Attr("unknown", "type"),
]
UNTAGGED_UNION_ATTRS = [Attr("members", "tuple[tuple[Any, frozenset[str]], ...]")]


def own_attrs(cls: ClassSpec) -> list[Attr]:
    """The fields ``emit_types`` writes into the class body, in order, for its methods."""
    if cls.unknown_tag is not None:
        return [Attr(cls.unknown_tag.py_name, "str"), Attr("raw", "dict[str, Any]", factory="dict")]
    out = [Attr(f.py_name, f.annotation, field_default(f)) for f in cls.fields]
    if not cls.base:
        out.append(Attr("extra", "dict[str, Any]", factory="dict"))
    return out


def emit_types(model: Model) -> str:
    out = header("schema.unstable.json")
    out += [
        '"""ACP v1 types as attrs classes (generated; see ``tools/gen_protocol.py``).',
        "",
        "Field names are snake_case; each field's wire name is in its metadata (``wire``).",
        "Every class keeps unknown wire fields in ``extra``; each tagged union has an",
        "``Unknown*`` class that keeps unknown variants whole. Unstable types are listed in",
        "``UNSTABLE``. Use :mod:`orchestrator.protocol.codec` to convert to and from JSON.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import threading",
        "from collections.abc import Callable",
        "from typing import Any, ClassVar, Literal, TypeAlias, Union",
        "",
        "from attrs import NOTHING, field, frozen",
        "",
        f"PROTOCOL_VERSION = {PROTOCOL_VERSION}",
        f'SCHEMA_RELEASE = "{SCHEMA_RELEASE}"',
        "",
        "# The classes carry their own __init__, __repr__, __eq__ and __hash__ (written by the",
        "# generator), so that attrs does not compile them anew at every import.",
        *PRELUDE,
        "",
        "",
        f"@frozen({DECORATOR_ARGS})",
        "class TaggedUnion:",
        '    """How a tagged union is told apart on the wire (read by the codec)."""',
        "",
        "    #: wire name of the tag property",
        "    tag: str",
        "    #: the member classes, each with a ``Literal`` tag field (the unknown class last)",
        "    members: tuple[type, ...]",
        "    #: the member used when the tag is absent, if the schema names one",
        "    default: type | None",
        "    #: the class that keeps variants with an unknown tag",
        "    unknown: type",
        "",
        *emit_dunders("TaggedUnion", TAGGED_UNION_ATTRS, kw_only=False),
        "",
        "",
        f"@frozen({DECORATOR_ARGS})",
        "class UntaggedUnion:",
        '    """A union told apart by which required wire keys an object has."""',
        "",
        "    #: (member type, required wire keys), most keys first",
        "    members: tuple[tuple[Any, frozenset[str]], ...]",
        "",
        *emit_dunders("UntaggedUnion", UNTAGGED_UNION_ATTRS, kw_only=False),
        "",
    ]
    # aliases that are enums or primitives first (classes refer to them only in annotations)
    for alias in sorted(model.aliases.values(), key=lambda a: a.name):
        out += [
            "",
            *comment(alias.doc, ""),
            f"{alias.name}: TypeAlias = {alias_runtime(alias.annotation)}",
        ]
    attrs_of: dict[str, list[Attr]] = {}
    for cls in base_first(model.classes):
        # attrs' field order: the base class's fields (those not redefined here) come first
        own = own_attrs(cls)
        inherited = attrs_of[cls.base] if cls.base else []
        taken = {a.name for a in own}
        attrs_of[cls.name] = [a for a in inherited if a.name not in taken] + own
        methods = emit_dunders(cls.name, attrs_of[cls.name], kw_only=True)
        out += ["", "", f"@frozen(kw_only=True, {DECORATOR_ARGS})"]
        base = cls.base if cls.base else ""
        out.append(f"class {cls.name}({base}):" if base else f"class {cls.name}:")
        doc = cls.doc or f"The ``{cls.name}`` type."
        if cls.unstable:
            doc = doc.rstrip() + "\n\nUnstable: not part of the stable v1 schema."
        out += docstring(doc, "    ")
        out.append("")
        if cls.unknown_tag is not None:
            t = cls.unknown_tag
            out += [
                "    __acp_unknown__: ClassVar[bool] = True",
                "",
                "    #: the unknown tag value",
                f"    {t.py_name}: str = field("
                f'metadata={{"wire": {json.dumps(t.wire)}, "tag": True}})',
                "    #: the whole object as received",
                "    raw: dict[str, Any] = field(factory=dict)",
                "",
                *methods,
            ]
            continue
        for f in cls.fields:
            out += emit_field(f, "    ")
        if not cls.base:
            out += [
                "    #: wire fields this schema release does not know, kept as received",
                '    extra: dict[str, Any] = field(factory=dict, metadata={"extra": True})',
            ]
        out += ["", *methods]
    out += [""]
    for union in model.unions.values():
        out += [
            "",
            *comment(union.doc, ""),
            f"{union.name}: TypeAlias = Union[{', '.join(union.members)}]",
        ]
    out += ["", "", "TAGGED_UNIONS: dict[Any, TaggedUnion] = {"]
    for union in model.unions.values():
        if union.tag_wire:
            joined = ", ".join(union.members)
            out.append(
                f"    {union.name}: TaggedUnion({json.dumps(union.tag_wire)}, ({joined},), "
                f"{union.default or 'None'}, {union.unknown}),"
            )
    out += ["}", "", "UNTAGGED_UNIONS: dict[Any, UntaggedUnion] = {"]
    for union in model.unions.values():
        if not union.tag_wire:
            ordered = sorted(union.members, key=lambda m: -len(union.required_keys[m]))
            parts = [
                f"({m}, frozenset({{{', '.join(json.dumps(k) for k in union.required_keys[m])}}}))"
                if union.required_keys[m]
                else f"({m}, frozenset())"
                for m in ordered
            ]
            out.append(f"    {union.name}: UntaggedUnion(({', '.join(parts)},)),")
    out += ["}", ""]
    unstable = sorted(
        [c.name for c in model.classes.values() if c.unstable]
        + [u.name for u in model.unions.values() if u.unstable]
        + [a.name for a in model.aliases.values() if a.unstable]
    )
    out += [
        "#: names of the types that are not part of the stable v1 schema",
        "UNSTABLE: frozenset[str] = frozenset({",
    ]
    out += [f"    {json.dumps(n)}," for n in unstable]
    out += ["})", ""]
    return "\n".join(out)


def base_first(classes: dict[str, ClassSpec]) -> list[ClassSpec]:
    """Classes in schema order, except that a base class comes before its subclasses."""
    done: dict[str, ClassSpec] = {}

    def visit(spec: ClassSpec) -> None:
        if spec.name in done:
            return
        if spec.base:
            visit(classes[spec.base])
        done[spec.name] = spec

    for spec in classes.values():
        visit(spec)
    return list(done.values())


def alias_runtime(annotation: str) -> str:
    parts = split_union(annotation)
    if len(parts) == 1:
        return parts[0]
    return "Union[" + ", ".join(parts) + "]"


def emit_methods(model: Model) -> str:
    out = header("schema.unstable.json and meta.unstable.json")
    out += [
        '"""The ACP v1 method table (generated; see ``tools/gen_protocol.py``).',
        "",
        "``side`` names who handles the method: ``agent`` (the client calls it), ``client``",
        "(the agent calls it), ``protocol`` (either), or ``both``.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any, Literal",
        "",
        "from attrs import frozen",
        "",
        "from . import types as t",
        "",
        "",
        "@frozen",
        "class MethodInfo:",
        '    """One ACP method: its wire name, who handles it and its param/result types."""',
        "",
        "    #: the wire method name",
        "    name: str",
        "    #: who handles it",
        '    side: Literal["agent", "client", "protocol", "both"]',
        "    #: a request expects a response; a notification does not",
        '    kind: Literal["request", "notification"]',
        "    #: the params type: a class, or a union alias of classes",
        "    params: Any",
        "    #: the result type (requests only): a class, a union alias, or None",
        "    result: Any",
        "    #: not part of the stable v1 schema",
        "    unstable: bool",
        "",
        "",
        "REQUESTS: dict[str, MethodInfo] = {",
    ]
    for m in model.methods:
        if m.kind == "request":
            out.append(method_line(m))
    out += ["}", "", "NOTIFICATIONS: dict[str, MethodInfo] = {"]
    for m in model.methods:
        if m.kind == "notification":
            out.append(method_line(m))
    out += ["}", ""]
    return "\n".join(out)


def method_line(m: MethodSpec) -> str:
    params = f"t.{m.params}" if m.params else "None"
    result = f"t.{m.result}" if m.result else "None"
    return (
        f"    {json.dumps(m.name)}: MethodInfo({json.dumps(m.name)}, {json.dumps(m.side)}, "
        f"{json.dumps(m.kind)}, {params}, {result}, {m.unstable}),"
    )


# --------------------------------------------------------------------------- main


def verify_checksums() -> None:
    for line in (SCHEMA_DIR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        actual = hashlib.sha256((SCHEMA_DIR / name).read_bytes()).hexdigest()
        if actual != digest:
            raise SystemExit(
                f"{name}: checksum mismatch (vendored schema files must not be edited)"
            )


def build() -> dict[Path, str]:
    verify_checksums()
    unstable = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())
    stable = json.loads((SCHEMA_DIR / "schema.json").read_text())
    meta = json.loads((SCHEMA_DIR / "meta.unstable.json").read_text())
    loader = Loader(unstable, stable, meta)
    model = loader.load()
    loader.finish()
    return {TYPES_OUT: emit_types(model), METHODS_OUT: emit_methods(model)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    outputs = build()
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: python tools/gen_protocol.py)")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
