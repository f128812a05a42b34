"""Emit, as Python source, the dunder methods attrs would build for a frozen class.

attrs compiles a script with ``__init__``, ``__repr__``, ``__eq__`` and ``__hash__`` for every
class it decorates, each time the module is imported: a ``.pyc`` cannot cache that work, and
for the ~230 generated protocol classes it was most of the cost of importing them.
``gen_protocol.py`` therefore writes these methods into the class bodies (compiled once, into
the ``.pyc``) and decorates the classes with :data:`DECORATOR_ARGS`, so attrs keeps making
only what needs no compiling (the frozen ``__setattr__``/``__delattr__``, pickling,
``__match_args__``, ``attrs.fields`` metadata) plus one small ``__attrs_init__``, which attrs
always adds when ``init=False``.

The emitted methods behave as attrs' own (attrs 23.2 and later):

* ``__init__`` takes the fields in attrs' order (a base class's fields first) under their
  names, keyword-only for ``kw_only`` classes; a ``factory`` field defaults to ``NOTHING`` and
  gets a fresh value per instance; slots are set with ``object.__setattr__`` (frozen).
* ``__eq__`` compares field by field, and only with an instance of the very same class
  (``NotImplemented`` otherwise); ``object.__ne__`` inverts it exactly as attrs' ``__ne__``.
* ``__hash__`` hashes a per-class salt and the field values (so a field holding a list or a
  dict makes it raise ``TypeError``, as with attrs).
* ``__repr__`` is ``Class(field=value, ...)``, with ``...`` for an object met again while it is
  being shown.
"""

from __future__ import annotations

from dataclasses import dataclass

#: arguments of ``attrs.frozen`` for a class whose methods come from :func:`emit_dunders`
#: (``kw_only=True`` is added for keyword-only classes: it also marks the fields)
DECORATOR_ARGS = "init=False, repr=False, eq=False"

LINE_LENGTH = 100

#: module-level names the emitted methods use; a field may not take one of them as its name
HELPER_NAMES = frozenset({"self", "other", "_setattr", "_NOTHING", "_repr"})

#: helpers emitted once into the generated module, after ``import threading``,
#: ``from collections.abc import Callable`` and ``from attrs import NOTHING, ...``
PRELUDE = [
    "#: sets a slot of a frozen instance (what attrs' ``__init__`` uses)",
    "_setattr = object.__setattr__",
    "#: the default of a ``factory`` field's ``__init__`` parameter, as in attrs' signatures;",
    "#: typed Any so the parameter keeps the field's type",
    "_NOTHING: Any = NOTHING",
    "#: ids of the objects whose repr is being built, per thread (cycles print as ``...``)",
    "_repr_context = threading.local()",
    "",
    "",
    "def _repr(self: Any, fields: Callable[[], str]) -> str:",
    '    """attrs\' repr: ``Class(field=value, ...)``, ``...`` for an object met again."""',
    "    try:",
    "        active: set[int] = _repr_context.active",
    "    except AttributeError:",
    "        active = set()",
    "        _repr_context.active = active",
    "    if id(self) in active:",
    '        return "..."',
    "    active.add(id(self))",
    "    try:",
    "        return f\"{self.__class__.__qualname__.rsplit('>.', 1)[-1]}({fields()})\"",
    "    finally:",
    "        active.remove(id(self))",
]


@dataclass(frozen=True)
class Attr:
    """One attrs field as the emitted methods see it."""

    name: str
    #: the annotation, as source text
    annotation: str
    #: the default value as source text (``"None"`` for None); None when there is none
    default: str | None = None
    #: source text of a callable making each instance's default (``"dict"``)
    factory: str | None = None


def emit_dunders(cls_name: str, attrs: list[Attr], *, kw_only: bool) -> list[str]:
    """``__init__``, ``__repr__``, ``__eq__`` and ``__hash__`` lines for a class body.

    ``attrs`` lists every field of the class, inherited ones included, in attrs' order.
    """
    names = [a.name for a in attrs]
    clash = (HELPER_NAMES | {a.factory for a in attrs if a.factory}) & set(names)
    if clash or len(set(names)) != len(names):
        raise ValueError(f"{cls_name}: field names {sorted(clash) or names} cannot be emitted")
    shown = [f"{n}={{self.{n}!r}}" for n in names]
    compared = [f"self.{n} == other.{n}" for n in names] or ["True"]
    return [
        *_init(attrs, kw_only),
        "",
        "    def __repr__(self) -> str:",
        *_repr(shown),
        "",
        "    def __eq__(self, other: Any) -> bool:",
        "        if other.__class__ is not self.__class__:",
        "            return NotImplemented",
        *_wrap("        return ", compared, "", sep=" and "),
        "",
        "    def __hash__(self) -> int:",
        *_wrap("        return hash((", [f'"{cls_name}"', *(f"self.{n}" for n in names)], "))"),
    ]


def _init(attrs: list[Attr], kw_only: bool) -> list[str]:
    params = ["self", *(["*"] if kw_only and attrs else [])]
    body = []
    for a in attrs:
        if a.factory is not None:
            params.append(f"{a.name}: {a.annotation} = _NOTHING")
            value = f"{a.factory}() if {a.name} is _NOTHING else {a.name}"
        else:
            default = "" if a.default is None else f" = {a.default}"
            params.append(f"{a.name}: {a.annotation}{default}")
            value = a.name
        body.append(f'        _setattr(self, "{a.name}", {value})')
    return [
        *_wrap("    def __init__(", params, ") -> None:"),
        *(body or ["        pass"]),
    ]


def _repr(shown: list[str]) -> list[str]:
    # the fields formatted by an f-string, as attrs does: much faster than getattr() in a loop
    line = f'        return _repr(self, lambda: f"{", ".join(shown)}")'
    if len(line) <= LINE_LENGTH:
        return [line]
    parts = [f'            f"{part}, "' for part in shown[:-1]] + [f'            f"{shown[-1]}"']
    return ["        return _repr(self, lambda: (", *parts, "        ))"]


def _wrap(head: str, items: list[str], tail: str, *, sep: str = ", ") -> list[str]:
    """``head item, item tail`` on one line if it fits, else one item per line."""
    joined = sep.join(items)
    if len(head) + len(joined) + len(tail) <= LINE_LENGTH:
        return [head + joined + tail]
    indent = " " * (len(head) - len(head.lstrip()) + 4)
    if sep == ", ":
        lines = [f"{indent}{item}," for item in items]
    else:  # an operator chain: parenthesized, the operator leading each continuation
        head, tail = head + "(", ")" + tail
        lines = [indent + items[0], *(f"{indent}{sep.strip()} {item}" for item in items[1:])]
    return [head.rstrip(), *lines, " " * (len(indent) - 4) + tail.lstrip()]
