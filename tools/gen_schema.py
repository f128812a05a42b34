"""Load the vendored ACP schema into the generator's model (see ``gen_model.py``).

:class:`Loader` walks ``schema.unstable.json`` once and maps each ``$defs`` entry to a class,
a union or an alias, and the ``x-method`` defs to the method table; a shape it does not know
raises :class:`SchemaShapeError` rather than guessing.
"""

from __future__ import annotations

import json
import keyword
import re
from collections import Counter
from typing import Any

from gen_model import (
    AliasSpec,
    ClassSpec,
    FieldSpec,
    MethodSpec,
    Model,
    UnionSpec,
    join_union,
    split_union,
)

# JSON-RPC envelopes: the jsonrpc layer owns these shapes, so no classes are made for them.
ENVELOPES = frozenset(
    {
        "AgentRequest",
        "AgentResponse",
        "AgentNotification",
        "ClientRequest",
        "ClientResponse",
        "ClientNotification",
        "ProxyRequest",
        "ProxyResponse",
        "ProxyNotification",
    }
)
ANNOTATION_ONLY_KEYS = frozenset(
    {
        "description",
        "title",
        "x-deserialize-default-on-error",
        "x-deserialize-default-on-null",
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
    def __init__(self, unstable: dict[str, Any], stable: dict[str, Any]):
        self.defs: dict[str, Any] = unstable["$defs"]
        self.stable_names = set(stable["$defs"])
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
            if sub.get("type") == "null" and set(sub) - {"type"} <= ANNOTATION_ONLY_KEYS:
                # only ever null (IdleStateUpdate's "no stop reason" variant): the same as
                # absent, so no field; a null on the wire is kept in ``extra``
                continue
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
                if tagged and base and self.ref_counts[base] == 1 and not self.is_union(base):
                    self.folded[base] = (name, tagged[0], tagged[1])
        for name, schema in self.defs.items():
            if name not in ENVELOPES:
                self.load_def(name, schema)
        self.load_methods()
        return self.model

    def is_union(self, name: str) -> bool:
        """Whether a def is itself a tagged union (so it cannot take another union's tag)."""
        variants = self.defs[name].get("oneOf") or self.defs[name].get("anyOf")
        return isinstance(variants, list) and any(
            isinstance(v, dict) and tag_of(v) for v in variants
        )

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
            # the object may also declare the tag property itself (IdleStateUpdate's
            # stopReason): each variant has it as its tag field, not twice
            common = [f for f in common if f.wire != prop]
            vdoc = variant.get("description", "")
            if base is not None and base in self.folded and self.folded[base][0] == name:
                if common:
                    # the base def may load before or after this union: finish() adds them
                    self.pending_common[base] = common
                union.members.append(base)
                continue
            # a variant over a shared base reads well by its tag alone (``AgentMessageChunk``);
            # an inline one, or one whose tag names an existing type, gets the union's name too
            inline = variant
            if base is not None and self.is_union(base):
                # a variant that is itself a union (StateUpdate's idle: IdleStateUpdate, told
                # apart by stopReason): one class with the inner union's own fields
                inline, base = self.defs[base], None
            cls_name = pascal(value)
            if base is None or cls_name in self.defs or cls_name in self.model.classes:
                cls_name = f"{cls_name}{name}"
            if cls_name in self.defs:
                cls_name = f"{name}{pascal(value)}"
            fields = [tag_field(prop, value), *common]
            if base is None:
                fields += [f for f in self.fields_of(inline) if f.wire != prop]
            self.model.classes[cls_name] = ClassSpec(
                cls_name, vdoc, fields, self.unstable(name), base=base
            )
            union.members.append(cls_name)
        if union.tag_wire is None:
            raise SchemaShapeError(f"{name}: no tag")
        unknown = f"Unknown{name}"
        if unknown in self.defs:
            # the schema has a variant of that name (StateUpdate's state "unknown")
            unknown = f"Other{name}"
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
            title = variant.get("title")
            if title and "properties" in variant:
                # an inline object alternative (MessageMcpResponse's Result / Error), told
                # apart by its required keys like the $ref members
                member = f"{name}{pascal(title)}"
                self.model.classes[member] = ClassSpec(
                    member,
                    variant.get("description", ""),
                    self.fields_of(variant),
                    self.unstable(name),
                )
                union.members.append(member)
                union.required_keys[member] = list(variant.get("required") or [])
                continue
            raise SchemaShapeError(f"{name}: cannot map variant {json.dumps(variant)[:200]}")
        self.model.unions[name] = union

    def finish(self) -> None:
        # common properties of object unions go into folded base classes
        for base, common in self.pending_common.items():
            spec = self.model.classes[base]
            tag = spec.fields[0]
            common = [c for c in common if c.wire != tag.wire]
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
        for key, roles in sorted(by_method.items()):
            kind, method = key.split(":", 1)
            params = roles.get("params")
            result = roles.get("result")
            side = (params or result or ("", ""))[1]
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


def tag_field(prop: str, value: str) -> FieldSpec:
    return FieldSpec(snake(prop), prop, f"Literal[{json.dumps(value)}]", True, tag_value=value)
