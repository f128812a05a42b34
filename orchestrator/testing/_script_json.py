"""The JSON form of agent scripts: one strict cattrs converter and the ``to_json`` mixin.

The format itself is documented in :mod:`orchestrator.testing.script`. Classes whose JSON
names differ from their field names declare them with ``metadata={WIRE: "jsonName"}`` and
the :func:`wire_names` decorator; the script module registers the ``Step`` union hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self, TypeAlias, TypeVar

import attrs
import cattrs
from attrs import AttrsInstance
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.v import format_exception

from orchestrator.errors import UsageError

__all__ = ["WIRE", "JsonMixin", "JsonObject", "converter", "wire_names"]

JsonObject: TypeAlias = dict[str, Any]

WIRE = "wire"  # attrs metadata key: the field's JSON name when it differs

_T = TypeVar("_T", bound=AttrsInstance)


class JsonMixin:
    """Mixin: ``to_json()`` / ``from_json()`` through the module's converter."""

    __slots__ = ()

    @classmethod
    def _json_type(cls) -> Any:
        """The type the converter handles this class as (a step: the whole ``Step`` union)."""
        return cls

    def to_json(self) -> JsonObject:
        """The JSON form (fields at their default are left out)."""
        data: JsonObject = converter.unstructure(self, self._json_type())
        return data

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Parse the JSON form; raises :class:`UsageError` naming every bad field."""
        if not isinstance(data, dict):
            raise UsageError(f"invalid agent script: {cls.__name__} must be a JSON object")
        try:
            result: Self = converter.structure(data, cls._json_type())
            return result
        except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
            problems = (
                cattrs.transform_error(exc, path=cls.__name__, format_exception=_format_error)
                if isinstance(exc, cattrs.BaseValidationError)
                else [f"{exc} @ {cls.__name__}"]
            )
            raise UsageError("invalid agent script: " + "; ".join(problems)) from exc


def _format_error(exc: BaseException, type_: Any) -> str:
    # Our hooks, attrs validators and Literal checks say exactly what is wrong: keep their words.
    plain = isinstance(exc, TypeError | ValueError) or type(exc) is cattrs.errors.CattrsError
    if plain and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return format_exception(exc, type_)


def _strict(kind: type[Any]) -> Callable[[Any, Any], Any]:
    # cattrs would coerce ("5" -> 5, "false" -> True); a script with a wrong type is a bug.
    def check(value: Any, _: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got a boolean")
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


def _strict_str_or_bool(value: Any, _: Any) -> str | bool:
    if not isinstance(value, str | bool):
        raise TypeError(f"expected a string or a boolean, got {type(value).__name__}")
    return value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(
        forbid_extra_keys=True,
        omit_if_default=True,
        unstruct_collection_overrides={Sequence: list},
    )
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_structure_hook(str | bool, _strict_str_or_bool)
    return conv


converter = _make_converter()
"""The converter of every script class (strict types, no extra keys, defaults omitted)."""


def wire_names(cls: type[_T]) -> type[_T]:
    """Class decorator: (un)structure ``cls`` with the JSON names in its fields' WIRE metadata."""
    renames: dict[str, Any] = {
        a.name: override(rename=a.metadata[WIRE]) for a in attrs.fields(cls) if WIRE in a.metadata
    }
    converter.register_unstructure_hook(
        cls, make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **renames)
    )
    converter.register_structure_hook(
        cls, make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True, **renames)
    )
    return cls
