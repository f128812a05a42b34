"""Tests for tools/gen_protocol.py: freshness, checksums, determinism and schema coverage."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Union, get_origin

import attrs
import pytest

from orchestrator.protocol import types as t

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "tools" / "gen_protocol.py"
#: modules next to the generator that it imports
GENERATOR_HELPERS = ("gen_dunders", "gen_model", "gen_schema")
SCHEMA_DIR = ROOT / "orchestrator" / "protocol" / "schema"
GENERATED = ("orchestrator/protocol/types.py", "orchestrator/protocol/methods.py")
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

UNSTABLE_DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())[
    "$defs"
]
STABLE_DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.json").read_text())["$defs"]
DEF_NAMES = sorted(set(UNSTABLE_DEFS) - ENVELOPES)


def load_generator(path: Path, name: str) -> ModuleType:
    """Import a copy of the generator from ``path`` under a private module name.

    Its helper modules are imported from the same directory, fresh, as a script run would.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = {h: sys.modules.pop(h) for h in GENERATOR_HELPERS if h in sys.modules}
    sys.path.insert(0, str(path.parent))
    # dataclasses look the module up in sys.modules while the class bodies run
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
        sys.path.remove(str(path.parent))
        for helper in GENERATOR_HELPERS:
            sys.modules.pop(helper, None)
        sys.modules.update(saved)
    return module


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A temporary copy of the generator, the vendored schema and the generated modules."""
    (tmp_path / "tools").mkdir()
    shutil.copy2(GENERATOR, tmp_path / "tools" / "gen_protocol.py")
    for helper in GENERATOR_HELPERS:
        shutil.copy2(GENERATOR.parent / f"{helper}.py", tmp_path / "tools" / f"{helper}.py")
    shutil.copytree(SCHEMA_DIR, tmp_path / "orchestrator" / "protocol" / "schema")
    for rel in GENERATED:
        shutil.copy2(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_check_mode_passes() -> None:
    """`python tools/gen_protocol.py --check` exits 0: the committed modules are fresh."""
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vendored_files_match_sha256sums() -> None:
    """Every vendored schema file is listed in SHA256SUMS with its actual digest."""
    listed: dict[str, str] = {}
    for line in (SCHEMA_DIR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        listed[name] = digest
    json_files = {p.name for p in SCHEMA_DIR.glob("*.json")}
    assert json_files <= set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((SCHEMA_DIR / name).read_bytes()).hexdigest() == digest, name


def test_generator_run_in_a_copy_is_deterministic(tree_copy: Path) -> None:
    """build() twice gives identical text, equal to the committed modules, and main() agrees."""
    gen = load_generator(tree_copy / "tools" / "gen_protocol.py", "_gen_protocol_copy")
    assert Path(gen.ROOT) == tree_copy
    first: dict[Path, str] = gen.build()
    second: dict[Path, str] = gen.build()
    assert first == second
    assert {p.relative_to(tree_copy).as_posix() for p in first} == set(GENERATED)
    for path, text in first.items():
        assert text == (ROOT / path.relative_to(tree_copy)).read_text(), path.name
    assert gen.main(["--check"]) == 0
    # a regeneration into the copy rewrites nothing and leaves the files byte-identical
    assert gen.main([]) == 0
    for rel in GENERATED:
        assert (tree_copy / rel).read_bytes() == (ROOT / rel).read_bytes()


def test_check_mode_reports_stale_output(tree_copy: Path) -> None:
    """--check exits 1 when a generated module was edited by hand, and a run repairs it."""
    gen = load_generator(tree_copy / "tools" / "gen_protocol.py", "_gen_protocol_stale")
    methods = tree_copy / GENERATED[1]
    methods.write_text(methods.read_text() + "# edited\n")
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    assert methods.read_bytes() == (ROOT / GENERATED[1]).read_bytes()


def test_edited_schema_is_refused(tree_copy: Path) -> None:
    """A vendored schema file that no longer matches SHA256SUMS stops the generator."""
    gen = load_generator(tree_copy / "tools" / "gen_protocol.py", "_gen_protocol_tampered")
    schema = tree_copy / "orchestrator" / "protocol" / "schema" / "schema.json"
    schema.write_text(schema.read_text() + "\n")
    with pytest.raises(SystemExit, match="checksum mismatch"):
        gen.build()


def test_emitted_methods_refuse_names_that_shadow_their_helpers() -> None:
    """A field named like something the emitted methods use (``self``, a factory) is refused."""
    gen = load_generator(GENERATOR, "_gen_protocol_dunders")
    with pytest.raises(ValueError, match="self"):
        gen.emit_dunders("C", [gen.Attr("self", "int")], kw_only=True)
    factory = gen.Attr("extra", "dict[str, Any]", factory="dict")
    with pytest.raises(ValueError, match="dict"):
        gen.emit_dunders("C", [gen.Attr("dict", "int"), factory], kw_only=True)
    assert any("def __init__" in line for line in gen.emit_dunders("C", [factory], kw_only=True))


def test_generated_classes_leave_only_attrs_init_to_attrs() -> None:
    """Every generated class (unions' tables too) brings its own methods; attrs adds none."""
    text = (ROOT / GENERATED[0]).read_text()
    decorators = [line for line in text.splitlines() if line.startswith("@frozen")]
    assert len(decorators) == text.count("\n    def __init__(") > 200
    assert all("init=False, repr=False, eq=False" in line for line in decorators)


def test_generated_header_says_do_not_edit() -> None:
    """Both generated modules start with the DO-NOT-EDIT header naming the generator."""
    for rel in GENERATED:
        head = (ROOT / rel).read_text().splitlines()[0]
        assert head.startswith("# DO NOT EDIT: generated by tools/gen_protocol.py"), rel


def _is_type_or_alias(obj: Any) -> bool:
    return isinstance(obj, type) or obj is Any or get_origin(obj) in (Union, Literal)


@pytest.mark.parametrize("name", DEF_NAMES)
def test_every_schema_def_is_generated(name: str) -> None:
    """Each $defs entry (envelopes aside) is a class or type alias of the same name."""
    assert hasattr(t, name), f"{name} missing from types.py"
    assert _is_type_or_alias(getattr(t, name))


def test_envelopes_are_not_generated() -> None:
    """The JSON-RPC envelopes belong to the jsonrpc layer and get no types."""
    assert not [name for name in ENVELOPES if hasattr(t, name)]


def test_unstable_set_matches_the_stable_schema() -> None:
    """A $defs name is in UNSTABLE exactly when schema.json lacks it."""
    wrong = [name for name in DEF_NAMES if (name in t.UNSTABLE) != (name not in STABLE_DEFS)]
    assert wrong == []


def test_unstable_names_exist() -> None:
    """UNSTABLE names only generated types; the extra ones stand for unstable unions."""
    assert all(hasattr(t, name) for name in t.UNSTABLE)
    members_of_unstable_unions = {
        member.__name__
        for union, spec in t.TAGGED_UNIONS.items()
        if spec.unknown.__name__ in t.UNSTABLE
        for member in spec.members
    } | {
        member.__name__
        for spec in t.UNTAGGED_UNIONS.values()
        for member, _keys in spec.members
        if isinstance(member, type) and member.__name__ in t.UNSTABLE
    }
    for name in t.UNSTABLE - set(UNSTABLE_DEFS):
        # classes made by the generator itself: the Unknown* (or Other*) class of an unstable
        # union, or an inline variant of one
        assert name in members_of_unstable_unions, name


def _generated_classes() -> list[type]:
    return [
        v
        for v in vars(t).values()
        if isinstance(v, type)
        and attrs.has(v)
        and v.__module__ == t.__name__
        and v not in (t.TaggedUnion, t.UntaggedUnion)
    ]


@pytest.mark.parametrize(
    "cls",
    [c for c in _generated_classes() if "properties" in UNSTABLE_DEFS.get(c.__name__, {})],
    ids=lambda c: c.__name__,
)
def test_class_fields_cover_schema_properties(cls: type) -> None:
    """A class made from a $defs object has a field per property, required ones required."""
    fields = {f.metadata["wire"]: f for f in attrs.fields(cls) if "wire" in f.metadata}
    schema = UNSTABLE_DEFS[cls.__name__]
    assert set(schema["properties"]) <= set(fields)
    for wire in schema.get("required", []):
        f = fields[wire]
        assert f.default is attrs.NOTHING or f.metadata.get("tag"), wire


@pytest.mark.parametrize("cls", _generated_classes(), ids=lambda c: c.__name__)
def test_every_field_has_a_wire_name(cls: type) -> None:
    """Every field carries its wire name in metadata, except ``extra`` and the Unknown ``raw``."""
    for f in attrs.fields(cls):
        if f.metadata.get("extra") or (getattr(cls, "__acp_unknown__", False) and f.name == "raw"):
            continue
        assert isinstance(f.metadata.get("wire"), str), f.name


def test_tagged_union_tables_are_consistent() -> None:
    """Each tagged union's members carry a Literal tag on its tag wire name, the Unknown last."""
    for union, spec in t.TAGGED_UNIONS.items():
        assert spec.members[-1] is spec.unknown
        assert spec.default is None or spec.default in spec.members
        tags: list[str] = []
        for member in spec.members[:-1]:
            tag_fields = [f for f in attrs.fields(member) if f.metadata.get("tag")]
            if member is spec.default and not tag_fields:
                continue
            (tag,) = tag_fields
            assert tag.metadata["wire"] == spec.tag
            tags.append(tag.default)
        assert len(tags) == len(set(tags)), union
