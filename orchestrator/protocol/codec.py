"""The one converter between JSON values and the generated ACP types.

:func:`make_converter` builds a :class:`cattrs.Converter` whose hooks are generated per class
from the attrs field metadata the generator wrote (``wire`` names, ``tag``, ``lenient``,
``skip_invalid_items``):

- wire names come from metadata, never derived (``_meta`` and friends);
- ``None`` is omitted on the wire for optional fields; tags are always written;
- tagged unions are told apart by the ``Literal`` type of each member's tag field; an unknown
  tag becomes the union's ``Unknown*`` value carrying the raw object;
- unknown fields are kept in ``extra`` and written back out;
- fields the schema marks ``x-deserialize-default-on-error`` fall back to ``None`` when they do
  not fit, and lists marked ``x-deserialize-skip-invalid-items`` drop the items that do not fit;
- anything else that does not fit raises :class:`~orchestrator.errors.InvalidParams` whose
  message names the path (``update.content.text: expected a string, got number``).

Hooks are built lazily on first use, so importing this module is cheap. The union of session
updates has a fast path for the bulk of a turn, message and thought chunks holding just a text
block: it builds the same values as the general path, which takes anything else.
"""

from __future__ import annotations

import sys
import types as pytypes
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import attrs
import cattrs

from ..errors import InvalidParams
from . import types as acp

__all__ = [
    "StructureError",
    "converter",
    "make_converter",
    "structure",
    "unstructure",
]

T = TypeVar("T")
_NoneType = type(None)
_JSON_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
    _NoneType: "null",
}


def json_type(value: Any) -> str:
    """The JSON type name of ``value``, for messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", dict: "object", list: "array", _NoneType: "null"}.get(
        type(value), type(value).__name__
    )


class StructureError(Exception):
    """A value does not fit its type; ``path`` locates it from the root (wire names)."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()):
        self.message = message
        self.path = path
        super().__init__(message)

    def at(self, key: str | int) -> StructureError:
        """The same error one level further out."""
        return StructureError(self.message, (key, *self.path))

    def __str__(self) -> str:
        where = ""
        for key in self.path:
            where += f"[{key}]" if isinstance(key, int) else (f".{key}" if where else key)
        return f"{where}: {self.message}" if where else self.message


def _expected(what: str, value: Any) -> StructureError:
    return StructureError(f"expected {what}, got {json_type(value)}")


# Kinds of field that the generated code converts inline, without a hook call.
_INLINE = {Any: "any", str: "str", int: "int", float: "float", bool: "bool"}
_CHECKS = {
    "str": "v.__class__ is not str",
    "int": "v.__class__ is not int",
    "float": "v.__class__ is not float and v.__class__ is not int",
    "bool": "v.__class__ is not bool",
    "dict": "v.__class__ is not dict",
}


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` was allowed)."""
    if get_origin(tp) in (Union, pytypes.UnionType):
        args = get_args(tp)
        if _NoneType in args:
            rest = tuple(a for a in args if a is not _NoneType)
            return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007
    return tp, tp is _NoneType


def _inline_kind(tp: Any) -> str | None:
    kind = _INLINE.get(tp)
    if kind is not None:
        return kind
    if get_origin(tp) is dict and get_args(tp)[1:] == (Any,):
        return "dict"
    if get_origin(tp) is Literal and len(get_args(tp)) > 1:
        return "str"  # an enum: unknown values pass through
    return None


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, pytypes.UnionType)


def _is_enum_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal


def _is_list(tp: Any) -> bool:
    return get_origin(tp) is list or tp is list


def _is_dict(tp: Any) -> bool:
    return get_origin(tp) is dict or tp is dict


class _HookFactory:
    """Builds and caches the structure/unstructure functions for one converter."""

    def __init__(self, conv: cattrs.Converter, fast_paths: bool = True):
        self.conv = conv
        self.fast_paths = fast_paths
        self._tagged: dict[frozenset[type], acp.TaggedUnion] = {
            frozenset(spec.members): spec for spec in acp.TAGGED_UNIONS.values()
        }
        self._untagged: dict[frozenset[Any], acp.UntaggedUnion] = {
            frozenset(m for m, _ in spec.members): spec for spec in acp.UNTAGGED_UNIONS.values()
        }

    # ---------------------------------------------------------------- attrs classes

    def structure_attrs(self, cls: type) -> Callable[[Any, Any], Any]:
        if getattr(cls, "__acp_unknown__", False):
            return self._structure_unknown(cls)
        _resolve(cls)
        fields = attrs.fields(cls)
        ns: dict[str, Any] = {
            "cls": cls,
            "StructureError": StructureError,
            "_expected": _expected,
            "_skip_invalid": _skip_invalid,
        }
        known: list[str] = []
        body: list[str] = []
        kwargs: list[tuple[str, str]] = []  # (slot name, local variable)
        extra_field: str | None = None
        for i, f in enumerate(fields):
            if f.metadata.get("extra"):
                extra_field = f.name
                continue
            wire = f.metadata.get("wire", f.name)
            known.append(wire)
            if f.metadata.get("tag"):
                continue  # the union chose the class by its tag; the default is that tag
            inner, nullable = _strip_none(f.type)
            required = f.default is attrs.NOTHING
            lenient = bool(f.metadata.get("lenient")) and (nullable or not required)
            conv_lines = self._convert_lines(i, inner, ns, f.metadata.get("skip_invalid_items"))
            w = repr(wire)
            if required:
                body += [
                    "    try:",
                    f"        v = d[{w}]",
                    "    except KeyError:",
                    f"        raise StructureError('missing required field', ({w},)) from None",
                ]
            else:
                body.append(f"    v = d.get({w})")
            guard = "    if v is None:\n"
            if nullable or not required:
                body.append(f"{guard}        a{i} = None\n    else:")
                indent = "        "
            else:
                indent = "    "
            body.append(f"{indent}try:")
            body += [f"{indent}    {line}" for line in conv_lines]
            body.append(f"{indent}except StructureError as e:")
            if lenient:
                body.append(f"{indent}    a{i} = None")
            else:
                body.append(f"{indent}    raise e.at({w}) from None")
            kwargs.append((f.name, f"a{i}"))
        ns["KNOWN"] = frozenset(known)
        if extra_field is not None:
            body += [
                "    if d.keys() <= KNOWN:",
                "        ex = {}",
                "    else:",
                "        ex = {k: x for k, x in d.items() if k not in KNOWN}",
            ]
            kwargs.append((extra_field, "ex"))
        # Build the instance without calling __init__: the generated classes have no
        # validators or converters, so setting each slot directly is equivalent and about
        # twice as fast, which matters for floods of session/update notifications.
        ns["new"] = object.__new__
        make = ["    o = new(cls)"]
        for j, (name, value) in enumerate(kwargs):
            ns[f"s{j}"] = _slot_setter(cls, name)
            make.append(f"    s{j}(o, {value})")
        for f in fields:
            if f.metadata.get("tag"):
                ns[f"tag_{f.name}"] = _slot_setter(cls, f.name)
                make.append(f"    tag_{f.name}(o, {f.default!r})")
        src = [
            "def structure(d, _):",
            "    if d.__class__ is not dict:",
            "        raise _expected('an object', d)",
            *body,
            *make,
            "    return o",
        ]
        return _compile(src, ns, f"structure_{cls.__name__}")

    def _convert_lines(self, i: int, tp: Any, ns: dict[str, Any], skip_invalid: Any) -> list[str]:
        kind = _inline_kind(tp)
        if kind == "any":
            return [f"a{i} = v"]
        if kind is not None:
            what = {"str": "a string", "int": "an integer", "float": "a number"}.get(kind)
            what = what or {"bool": "a boolean", "dict": "an object"}[kind]
            return [f"if {_CHECKS[kind]}:", f"    raise _expected({what!r}, v)", f"a{i} = v"]
        if skip_invalid and _is_list(tp):
            item = get_args(tp)[0] if get_args(tp) else Any
            ns[f"h{i}"] = self.conv.get_structure_hook(item)
            ns[f"t{i}"] = item
            return [f"a{i} = _skip_invalid(v, h{i}, t{i})"]
        ns[f"h{i}"] = self.conv.get_structure_hook(tp)
        ns[f"t{i}"] = tp
        return [f"a{i} = h{i}(v, t{i})"]

    def _structure_unknown(self, cls: type) -> Callable[[Any, Any], Any]:
        _resolve(cls)
        tag = next(f for f in attrs.fields(cls) if f.metadata.get("tag"))
        wire, name = tag.metadata["wire"], tag.alias

        def structure(d: Any, _: Any) -> Any:
            if d.__class__ is not dict:
                raise _expected("an object", d)
            return cls(**{name: d.get(wire), "raw": d})

        return structure

    def unstructure_attrs(self, cls: type) -> Callable[[Any], Any]:
        if getattr(cls, "__acp_unknown__", False):
            return lambda o: dict(o.raw)
        _resolve(cls)
        ns: dict[str, Any] = {"u": self.conv.unstructure}
        body: list[str] = []
        extra_field: str | None = None
        # the tag first: a reader of the wire sees what the object is before its fields
        ordered = sorted(attrs.fields(cls), key=lambda f: not f.metadata.get("tag"))
        for f in ordered:
            if f.metadata.get("extra"):
                extra_field = f.name
                continue
            wire = repr(f.metadata.get("wire", f.name))
            inner, _ = _strip_none(f.type)
            value = "v" if _inline_kind(inner) is not None else "u(v)"
            if f.default is attrs.NOTHING or f.metadata.get("tag"):
                body.append(f"    v = o.{f.name}")
                if value == "v":
                    body.append(f"    d[{wire}] = v")
                else:
                    body.append(f"    d[{wire}] = None if v is None else u(v)")
            else:
                body += [
                    f"    v = o.{f.name}",
                    "    if v is not None:",
                    f"        d[{wire}] = {value}",
                ]
        if extra_field is not None:
            body += [
                f"    if o.{extra_field}:",
                f"        for k, x in o.{extra_field}.items():",
                "            d.setdefault(k, x)",
            ]
        src = ["def unstructure(o):", "    d = {}", *body, "    return d"]
        return _compile(src, ns, f"unstructure_{cls.__name__}")

    # ---------------------------------------------------------------- unions and the rest

    def structure_union(self, tp: Any) -> Callable[[Any, Any], Any]:
        args = get_args(tp)
        nullable = _NoneType in args
        members = tuple(a for a in args if a is not _NoneType)
        inner = self._union_members(members)

        if not nullable:
            return inner

        def optional(v: Any, _: Any) -> Any:
            return None if v is None else inner(v, None)

        return optional

    def _union_members(self, members: tuple[Any, ...]) -> Callable[[Any, Any], Any]:
        if len(members) == 1:
            hook = self.conv.get_structure_hook(members[0])
            only = members[0]
            return lambda v, _: hook(v, only)
        tagged = self._tagged.get(frozenset(members))
        if tagged is not None:
            return self._tagged_union(tagged)
        untagged = self._untagged.get(frozenset(members))
        if untagged is not None:
            return self._untagged_union(untagged)
        if all(
            _inline_kind(m) in ("str", "int", "float", "bool") or m in (list[str],) for m in members
        ):
            return self._primitive_union(members)
        raise TypeError(f"no structure rule for the union of {members}")

    def _tagged_union(self, spec: acp.TaggedUnion) -> Callable[[Any, Any], Any]:
        members: dict[str, type] = {}
        for member in spec.members:
            if member is spec.unknown:
                continue
            _resolve(member)
            tag_field = next((f for f in attrs.fields(member) if f.metadata.get("tag")), None)
            if tag_field is None:
                continue  # the default member, used when the tag is absent
            (value,) = get_args(tag_field.type)  # the Literal tag
            members[value] = member
        # each member's hook is built when its tag first arrives: a process that only ever
        # sees a few kinds of update does not compile the structure functions of the rest
        table: dict[str, Callable[[Any, Any], Any]] = {}
        get_hook = self.conv.get_structure_hook
        wire = spec.tag
        unknown = get_hook(spec.unknown)
        default = get_hook(spec.default) if spec.default else None

        def structure(v: Any, _: Any) -> Any:
            if v.__class__ is not dict:
                raise _expected("an object", v)
            tag = v.get(wire)
            if tag.__class__ is str:
                hook = table.get(tag)
                if hook is None:
                    member = members.get(tag)
                    if member is None:
                        return unknown(v, None)
                    hook = table[tag] = get_hook(member)
                return hook(v, None)
            if tag is None:
                if default is not None:
                    return default(v, None)
                raise StructureError("missing required field", (wire,))
            raise _expected("a string", tag).at(wire)

        chunks = self._text_chunk_builders(spec) if self.fast_paths else {}
        if not chunks:
            return structure

        def structure_text_chunks_first(v: Any, _: Any) -> Any:
            # exactly {tag: <a chunk kind>, "content": {"type": "text", "text": <a string>}}:
            # counting the keys sends anything with another field to the general path
            if v.__class__ is dict and len(v) == 2:
                tag = v.get(wire)
                if tag.__class__ is str:
                    build = chunks.get(tag)
                    if build is not None:
                        c = v.get("content")
                        if c.__class__ is dict and len(c) == 2 and c.get("type") == "text":
                            text = c.get("text")
                            if text.__class__ is str:
                                return build(text)
            return structure(v, _)

        return structure_text_chunks_first

    def _text_chunk_builders(self, spec: acp.TaggedUnion) -> dict[str, Callable[[str], Any]]:
        """Per tag, a function of a text building what the member's hook builds from
        ``{tag: ..., "content": {"type": "text", "text": text}}``.

        Only for the content chunk members of a union, and only while the generated classes
        keep the shape this relies on (one required field ``content``, a :class:`TextContent`
        whose one required field is the string ``text``); otherwise empty.
        """
        text_cls = acp.TextContent
        _resolve(text_cls)
        text_fields = {f.name: f for f in attrs.fields(text_cls)}
        text_tag = next((f for f in text_fields.values() if f.metadata.get("tag")), None)
        text_field = text_fields.get("text")
        if (
            text_tag is None
            or text_tag.metadata.get("wire") != "type"
            or text_tag.default != "text"
            or text_field is None
            or text_field.metadata.get("wire") != "text"
            or text_field.type is not str
        ):
            return {}
        block = _construct_lines(text_cls, "b", {"text": "text"}, "t_")
        if block is None:
            return {}
        builders: dict[str, Callable[[str], Any]] = {}
        for member in spec.members:
            if not (isinstance(member, type) and issubclass(member, acp.ContentChunk)):
                continue
            _resolve(member)
            fields = {f.name: f for f in attrs.fields(member)}
            content = fields.get("content")
            tag = next((f for f in fields.values() if f.metadata.get("tag")), None)
            if (
                tag is None
                or spec.tag != tag.metadata.get("wire")
                or content is None
                or content.metadata.get("wire") != "content"
                or text_cls not in get_args(_strip_none(content.type)[0])
            ):
                continue
            chunk = _construct_lines(member, "o", {"content": "b"}, "c_")
            if chunk is None:
                continue
            ns: dict[str, Any] = {**block[1], **chunk[1]}
            src = ["def build(text):", *block[0], *chunk[0], "    return o"]
            builders[tag.default] = _compile(src, ns, f"build_text_{member.__name__}")
        return builders

    def _untagged_union(self, spec: acp.UntaggedUnion) -> Callable[[Any, Any], Any]:
        options = [(m, keys, self.conv.get_structure_hook(m)) for m, keys in spec.members]

        def structure(v: Any, _: Any) -> Any:
            probe = v
            if v.__class__ is list:
                if not v:
                    return []
                probe = v[0]
            if probe.__class__ is not dict:
                raise _expected("an object", probe)
            for member, keys, hook in options:
                if keys <= probe.keys() and (v.__class__ is list) == _is_list(member):
                    return hook(v, member)
            raise StructureError("matches none of the alternatives")

        return structure

    def _primitive_union(self, members: tuple[Any, ...]) -> Callable[[Any, Any], Any]:
        allowed: set[type] = set()
        for m in members:
            allowed |= {float, int} if m is float else {list} if _is_list(m) else {m}

        def structure(v: Any, _: Any) -> Any:
            if v.__class__ not in allowed:
                raise StructureError(f"unexpected {json_type(v)}")
            if v.__class__ is list:  # the only list member is list[str]
                for i, item in enumerate(v):
                    if item.__class__ is not str:
                        raise _expected("a string", item).at(i)
            return v

        return structure

    def structure_literal(self, tp: Any) -> Callable[[Any, Any], Any]:
        values = get_args(tp)
        if len(values) > 1 and all(isinstance(x, str) for x in values):
            # an enum: values a newer schema adds pass through as strings
            def enum(v: Any, _: Any) -> Any:
                if v.__class__ is not str:
                    raise _expected("a string", v)
                return v

            return enum

        def exact(v: Any, _: Any) -> Any:
            if v not in values:
                raise StructureError(f"expected one of {list(values)!r}, got {v!r}")
            return v

        return exact

    def structure_list(self, tp: Any) -> Callable[[Any, Any], Any]:
        args = get_args(tp)
        item = args[0] if args else Any
        hook = self.conv.get_structure_hook(item)

        def structure(v: Any, _: Any) -> Any:
            if v.__class__ is not list:
                raise _expected("an array", v)
            out = []
            for i, x in enumerate(v):
                try:
                    out.append(hook(x, item))
                except StructureError as e:
                    raise e.at(i) from None
            return out

        return structure

    def structure_dict(self, tp: Any) -> Callable[[Any, Any], Any]:
        args = get_args(tp)
        value_type = args[1] if len(args) == 2 else Any
        if value_type is Any:
            return _structure_plain_dict
        hook = self.conv.get_structure_hook(value_type)

        def structure(v: Any, _: Any) -> Any:
            if v.__class__ is not dict:
                raise _expected("an object", v)
            out = {}
            for k, x in v.items():
                try:
                    out[k] = hook(x, value_type)
                except StructureError as e:
                    raise e.at(k) from None
            return out

        return structure


def _construct_lines(
    cls: type, var: str, given: dict[str, str], prefix: str
) -> tuple[list[str], dict[str, Any]] | None:
    """Source lines building ``cls`` into ``var`` the way its structure hook does for an object
    holding only the tag and the fields in ``given`` (field name -> expression): other fields
    None, ``extra`` empty, the tag its default. None if a required field is not given.
    """
    ns: dict[str, Any] = {f"{prefix}cls": cls, "new": object.__new__}
    lines = [f"    {var} = new({prefix}cls)"]
    for j, f in enumerate(attrs.fields(cls)):
        if f.metadata.get("extra"):
            value = "{}"
        elif f.metadata.get("tag"):
            value = repr(f.default)
        elif f.name in given:
            value = given[f.name]
        elif f.default is attrs.NOTHING:
            return None
        else:
            value = "None"  # as the general path reads an absent optional field
        ns[f"{prefix}s{j}"] = _slot_setter(cls, f.name)
        lines.append(f"    {prefix}s{j}({var}, {value})")
    return lines, ns


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    for klass in cls.__mro__:
        slot = klass.__dict__.get(name)
        if slot is not None and hasattr(slot, "__set__"):
            setter: Callable[[Any, Any], None] = slot.__set__
            return setter
    raise TypeError(f"{cls.__name__}.{name} is not a slot")


def _structure_plain_dict(v: Any, _: Any) -> Any:
    if v.__class__ is not dict:
        raise _expected("an object", v)
    return v


def _skip_invalid(v: Any, hook: Callable[[Any, Any], Any], item: Any) -> list[Any]:
    if v.__class__ is not list:
        raise _expected("an array", v)
    out = []
    for x in v:
        try:
            out.append(hook(x, item))
        except StructureError:
            continue  # the schema says: skip items that do not fit
    return out


def _primitive(kind: type) -> Callable[[Any, Any], Any]:
    check: tuple[type, ...] = (float, int) if kind is float else (kind,)

    def structure(v: Any, _: Any) -> Any:
        if v.__class__ not in check:
            raise _expected(_JSON_NAMES[kind], v)
        return v

    return structure


def _resolve(cls: type) -> None:
    # attrs caches the resolution on the class, so this is cheap after the first call
    attrs.resolve_types(cls, globalns=vars(sys.modules[cls.__module__]))


def _compile(src: list[str], ns: dict[str, Any], name: str) -> Callable[..., Any]:
    code = compile("\n".join(src), f"<codec {name}>", "exec")
    exec(code, ns)  # generated from our own field metadata, never from input
    fn: Callable[..., Any] = ns[src[0].split("(")[0].removeprefix("def ")]
    fn.__name__ = name
    return fn


def make_converter(*, fast_paths: bool = True) -> cattrs.Converter:
    """A converter for the generated ACP types (and any attrs class using the same metadata).

    ``fast_paths=False`` leaves out the shortcut for text chunks, so that only the general
    path runs (the shortcut is checked against it).
    """
    conv = cattrs.Converter()
    hooks = _HookFactory(conv, fast_paths)
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _primitive(kind))
    conv.register_structure_hook(typing.Any, lambda v, _: v)
    conv.register_structure_hook_factory(_is_list, hooks.structure_list)
    conv.register_structure_hook_factory(_is_dict, hooks.structure_dict)
    conv.register_structure_hook_factory(_is_enum_literal, hooks.structure_literal)
    conv.register_structure_hook_factory(_is_union, hooks.structure_union)
    conv.register_structure_hook_factory(attrs.has, hooks.structure_attrs)
    conv.register_unstructure_hook_factory(attrs.has, hooks.unstructure_attrs)
    return conv


#: The converter the whole library uses.
converter = make_converter()


@typing.overload
def structure(value: Any, tp: type[T]) -> T: ...
@typing.overload
def structure(value: Any, tp: object) -> Any: ...
def structure(value: Any, tp: Any) -> Any:
    """Turn a JSON value into ``tp``; raise :class:`InvalidParams` naming the path on misfit."""
    try:
        result = converter.structure(value, tp)
    except StructureError as e:
        path = _path(e)  # none when the whole value misfits: the message says it all
        raise InvalidParams(
            f"invalid {_type_name(tp)}: {e}", data={"path": path} if path else None
        ) from e
    return result


def unstructure(obj: Any) -> Any:
    """Turn a value of the generated types (or lists/dicts of them) into JSON values."""
    return converter.unstructure(obj)


def _type_name(tp: Any) -> str:
    if _is_union(tp):
        name = _union_names().get(tp)
        if name is not None:
            return name
    return getattr(tp, "__name__", None) or str(tp).replace("orchestrator.protocol.types.", "")


_UNION_NAMES: dict[Any, str] = {}


def _union_names() -> dict[Any, str]:
    """Union aliases of the generated module by their value (``Union[...]`` has no name)."""
    if not _UNION_NAMES:
        for name, value in vars(acp).items():
            if _is_union(value):
                _UNION_NAMES.setdefault(value, name)
    return _UNION_NAMES


def _path(e: StructureError) -> str:
    return str(StructureError("", e.path)).removesuffix(": ")
