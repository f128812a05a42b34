"""The dunder methods written into orchestrator/protocol/types.py behave as attrs' own.

Each generated class is compared with the class plain attrs makes, at test time, from the same
fields; and importing the module must not make attrs compile those methods again.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from orchestrator.protocol import types as t
from orchestrator.protocol.codec import structure, unstructure

ROOT = Path(__file__).resolve().parent.parent

CLASSES: list[type] = sorted(
    (
        v
        for v in vars(t).values()
        if isinstance(v, type) and attrs.has(v) and v.__module__ == t.__name__
    ),
    key=lambda c: c.__name__,
)


def _name(cls: type) -> str:
    return cls.__name__


def reference(cls: type) -> type:
    """The class ``attrs.frozen`` makes from ``cls``'s fields, with attrs' own methods."""
    annotations: dict[str, Any] = {}
    ns: dict[str, Any] = {
        "__annotations__": annotations,
        "__module__": __name__,
        # the same qualified name, so that both reprs start alike
        "__qualname__": cls.__qualname__,
    }
    for f in attrs.fields(cls):
        annotations[f.name] = f.type
        ns[f.name] = attrs.field(
            default=f.default, metadata=dict(f.metadata), kw_only=f.kw_only, alias=f.alias
        )
    made: type = attrs.frozen(type(cls.__name__, (), ns))
    return made


def values(cls: type, mark: str) -> dict[str, Any]:
    """A hashable, picklable value for every ``__init__`` parameter (there are no validators)."""
    return {f.alias: f"{f.name}:{mark}" for f in attrs.fields(cls) if f.init}


def required(cls: type) -> dict[str, Any]:
    """Values for the parameters without a default only."""
    return {a: v for a, v in values(cls, "r").items() if _field(cls, a).default is attrs.NOTHING}


def _field(cls: type, alias: str) -> Any:
    return next(f for f in attrs.fields(cls) if f.alias == alias)


def _factory_fields(cls: type) -> list[str]:
    return [f.name for f in attrs.fields(cls) if isinstance(f.default, attrs.Factory)]  # type: ignore[arg-type]


def test_the_sample_covers_every_kind_of_field() -> None:
    """The classes compared include defaults, factories, kw_only and positional fields, tags,
    ``extra`` and subclasses, so each branch of the emitted methods is exercised."""
    fields = [f for c in CLASSES for f in attrs.fields(c)]
    assert len(CLASSES) > 200
    assert any(f.default is attrs.NOTHING for f in fields)
    assert any(f.default is None for f in fields)
    assert any(isinstance(f.default, attrs.Factory) for f in fields)  # type: ignore[arg-type]
    assert any(f.metadata.get("tag") for f in fields)
    assert any(f.metadata.get("extra") for f in fields)
    assert any(f.kw_only for f in fields)
    assert any(not f.kw_only for f in fields)
    assert any(c.__bases__ != (object,) for c in CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_init_signature_matches_attrs(cls: type) -> None:
    """``__init__`` takes the same parameters as attrs': names, kinds, order and defaults."""
    ours = inspect.signature(cls).parameters
    theirs = inspect.signature(reference(cls)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_init_sets_the_same_values(cls: type) -> None:
    """Given every argument, or only the required ones, both classes hold the same values, and a
    factory default is a fresh object for each instance."""
    ref = reference(cls)
    for kwargs in (values(cls, "a"), required(cls)):
        assert attrs.asdict(cls(**kwargs), recurse=False) == attrs.asdict(
            ref(**kwargs), recurse=False
        )
    first, second = cls(**required(cls)), cls(**required(cls))
    for name in _factory_fields(cls):
        assert getattr(first, name) == {}
        assert getattr(first, name) is not getattr(second, name)
    if not any(f.kw_only for f in attrs.fields(cls)):
        assert cls(*values(cls, "a").values()) == cls(**values(cls, "a"))


def _subclass(cls: type, qualname: str = "build.<locals>.Sub") -> type:
    """A plain subclass of ``cls`` (as a user of the library might write)."""
    return type("Sub", (cls,), {"__slots__": (), "__qualname__": qualname})


def _compare(x: Any, y: Any) -> tuple[Any, ...]:
    return (x == y, x != y, x.__eq__(y), x.__ne__(y))


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_eq_and_ne_match_attrs(cls: type) -> None:
    """``==``/``!=`` give what attrs' give: equal when every field is (compared with ``==``,
    so a NaN is not equal to itself), NotImplemented for any other class, a subclass included."""
    ref = reference(cls)
    nan = float("nan")
    first = next(iter(values(cls, "a")))
    cases = [
        (values(cls, "a"), values(cls, "a")),
        (values(cls, "a"), values(cls, "b")),
        (required(cls), required(cls)),
        ({**values(cls, "a"), first: nan}, {**values(cls, "a"), first: nan}),
        *(
            (values(cls, "a"), {**values(cls, "a"), name: value + "!"})
            for name, value in values(cls, "a").items()
        ),
    ]
    for left, right in cases:
        assert _compare(cls(**left), cls(**right)) == _compare(ref(**left), ref(**right))
        sub, ref_sub = _subclass(cls)(**right), _subclass(ref)(**right)
        assert _compare(cls(**left), sub) == _compare(ref(**left), ref_sub)
    assert _compare(cls(**values(cls, "a")), cls(**values(cls, "a"))) == (True, False, True, False)
    a, ra = cls(**values(cls, "a")), ref(**values(cls, "a"))
    assert _compare(a, ra) == (False, True, NotImplemented, NotImplemented)


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_hash_matches_attrs(cls: type) -> None:
    """Equal instances hash alike, and every field takes part: a list or dict in any field
    makes hash() raise TypeError, as with attrs' frozen hashing."""
    ref = reference(cls)
    assert hash(cls(**values(cls, "a"))) == hash(cls(**values(cls, "a")))
    assert isinstance(hash(ref(**values(cls, "a"))), int)
    for name in values(cls, "a"):
        unhashable = {**values(cls, "a"), name: ["a list"]}
        with pytest.raises(TypeError, match="unhashable"):
            hash(cls(**unhashable))
        with pytest.raises(TypeError, match="unhashable"):
            hash(ref(**unhashable))
    if _factory_fields(cls):
        with pytest.raises(TypeError, match="unhashable"):
            hash(cls(**required(cls)))


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_repr_matches_attrs(cls: type) -> None:
    """repr() is attrs' ``Class(field=value, ...)``, also for defaults, a subclass of the
    class, and an instance that contains itself (shown as ``...``)."""
    ref = reference(cls)
    for kwargs in (values(cls, "a"), required(cls)):
        assert repr(cls(**kwargs)) == repr(ref(**kwargs))
    # attrs shows the qualified name, less the ``<locals>`` part of a local class
    for qualname, shown in (("build.<locals>.Sub", "Sub("), ("Outer.Sub", "Outer.Sub(")):
        ours = _subclass(cls, qualname)(**values(cls, "a"))
        assert repr(ours) == repr(_subclass(ref, qualname)(**values(cls, "a")))
        assert repr(ours).startswith(shown)
    for name in _factory_fields(cls):
        ours, theirs = cls(**required(cls)), ref(**required(cls))
        getattr(ours, name)["self"] = ours
        getattr(theirs, name)["self"] = theirs
        assert repr(ours) == repr(theirs)
        assert "'self': ...}" in repr(ours)


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_evolve_pickle_and_frozenness(cls: type) -> None:
    """attrs.evolve and pickling round-trip; assigning or deleting a field raises
    FrozenInstanceError; ``__match_args__`` is attrs'."""
    a = cls(**values(cls, "a"))
    name, value = next(iter(values(cls, "b").items()))
    evolved = attrs.evolve(a, **{name: value})
    assert evolved == cls(**{**values(cls, "a"), name: value})
    assert attrs.evolve(a) == a
    assert attrs.evolve(a) is not a
    assert pickle.loads(pickle.dumps(a)) == a
    assert pickle.loads(pickle.dumps(evolved)) == evolved
    field_name = attrs.fields(cls)[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(a, field_name, "changed")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        delattr(a, field_name)
    assert getattr(a, field_name) == values(cls, "a")[attrs.fields(cls)[0].alias]
    assert cls.__match_args__ == reference(cls).__match_args__  # type: ignore[attr-defined]


def test_codec_round_trip_uses_the_emitted_methods() -> None:
    """A value read by the codec equals one built with ``__init__``, and reads the same."""
    built = t.AgentMessageChunk(content=t.TextContent(text="hi"), message_id="m1")
    wire = unstructure(built)
    read = structure(wire, t.AgentMessageChunk)
    assert read == built
    assert repr(read) == repr(built)
    assert "AgentMessageChunk(content=TextContent(" in repr(read)


COUNT_COMPILES = r"""
import json, sys
import attrs, orchestrator  # already imported by anything that imports the types
events = []
def hook(event, args):
    if event == "compile":
        source, filename = args
        if isinstance(source, bytes):
            source = source.decode("utf-8", "replace")
        events.append([str(filename), source if isinstance(source, str) else ""])
sys.addaudithook(hook)
import orchestrator.protocol.types
print(json.dumps(events))
"""


def test_import_does_not_compile_the_methods(tmp_path: Path) -> None:
    """Importing the module (its .pyc warm) compiles no attrs ``__init__``, ``__repr__``,
    ``__eq__`` or ``__hash__``: at most attrs' one-line-per-field ``__attrs_init__`` per class,
    which attrs always adds, and a handful of other compiles."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path)
    runs = [
        subprocess.run(
            [sys.executable, "-c", COUNT_COMPILES],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for _ in range(2)  # the first run writes the .pyc files
    ]
    events: list[list[str]] = json.loads(runs[1].stdout)
    assert not [f for f, _ in events if f == t.__file__], "types.py compiled: no .pyc was used"
    prefix = f"<attrs generated methods {t.__name__}."
    per_class = [source for filename, source in events if filename.startswith(prefix)]
    others = [filename for filename, _ in events if not filename.startswith(prefix)]
    defined = {name for source in per_class for name in re.findall(r"^def (\w+)", source, re.M)}
    assert defined <= {"__attrs_init__"}
    assert len(per_class) <= len(CLASSES)
    assert len(others) <= 5, others
