"""Loading a pipeline file: run it as a fresh module and collect its steps into a Pipeline.

The file runs once, as a module with a unique name (so two pipelines with the same file name
never share state), with its own directory on ``sys.path`` while it runs so that it can import
helper modules kept beside it. Every step the file creates is collected in definition order,
including one hidden by a later ``def`` of the same name (reported as a duplicate); steps
imported from elsewhere are found among the module's globals.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import sys
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

from .._log import get_logger
from ..errors import PipelineError, UsageError
from .spec import Pipeline, Step, collect_steps

__all__ = ["load_pipeline", "load_pipeline_from_module"]

log = get_logger(__name__)

_counter = itertools.count(1)


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """Run the pipeline file at ``path`` and return its validated :class:`Pipeline`.

    The pipeline is named by a module-level ``PIPELINE_NAME`` string, else by the file's stem.
    A missing file is a :class:`~orchestrator.errors.UsageError`. A file that fails to run
    (syntax error, failed import, a bad ``@step`` argument, ...) is a
    :class:`~orchestrator.errors.PipelineError` naming the file and line, with the original
    exception as its ``__cause__``; so is a pipeline that does not validate.
    """
    file = Path(path).resolve()
    if not file.exists():
        raise UsageError(f"pipeline file not found: {os.fspath(path)}")
    if not file.is_file():
        raise UsageError(f"pipeline path is not a file: {os.fspath(path)}")
    try:
        data = file.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read pipeline file {os.fspath(path)}: {e}") from e
    shown = os.fspath(path)
    module_name = f"_orchestrator_pipeline_{_safe(file.stem)}_{next(_counter)}"
    module = ModuleType(module_name)
    module.__file__ = str(file)
    module.__spec__ = importlib.util.spec_from_file_location(module_name, file)
    folder = str(file.parent)
    # Registered like an imported module: dataclasses, pickling and typing.get_type_hints
    # look classes' modules up in sys.modules.
    sys.modules[module_name] = module
    sys.path.insert(0, folder)
    try:
        with collect_steps() as collected:
            code = compile(importlib.util.decode_source(data), str(file), "exec", dont_inherit=True)
            exec(code, module.__dict__)
    except Exception as e:
        sys.modules.pop(module_name, None)
        line, message = _describe_failure(e, file)
        where = shown if line is None else f"{shown}:{line}"
        raise PipelineError(message, where) from e
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    finally:
        _remove_path_entry(folder)
    log.debug("pipeline file executed", path=shown, module=module_name, steps=len(collected))
    local = [s for s in collected if getattr(s.fn, "__module__", None) == module_name]
    return _build(module, local, default_name=file.stem, path=str(file), shown=shown, text=data)


def load_pipeline_from_module(module: ModuleType) -> Pipeline:
    """The :class:`Pipeline` of the steps among an already imported module's globals.

    Named by ``PIPELINE_NAME`` or the module's name. A name bound twice keeps only its last
    step here (the file loader, which sees every definition, reports such duplicates).
    """
    file = getattr(module, "__file__", None)
    text: bytes | None = None
    if isinstance(file, str):
        try:
            text = Path(file).read_bytes()
        except OSError:
            text = None  # a module without a readable source: digest the step names instead
    return _build(
        module,
        [],
        default_name=module.__name__.rpartition(".")[2],
        path=file if isinstance(file, str) else None,
        shown=file if isinstance(file, str) else module.__name__,
        text=text,
    )


def _build(
    module: ModuleType,
    local: Sequence[Step],
    *,
    default_name: str,
    path: str | None,
    shown: str,
    text: bytes | None,
) -> Pipeline:
    name = getattr(module, "PIPELINE_NAME", default_name)
    if not isinstance(name, str) or not name.strip():
        raise PipelineError(f"PIPELINE_NAME must be a non-empty string, not {name!r}", shown)
    steps = _steps_in_order(vars(module), local)
    try:
        return Pipeline.from_steps(steps, name=name, path=path, text=text)
    except PipelineError as e:
        # Name the file as the user typed it, not its resolved path.
        raise PipelineError(e.problems, shown) from None


def _steps_in_order(namespace: dict[str, object], local: Sequence[Step]) -> list[Step]:
    """The module's steps in definition order: those it made, then those it imported, merged
    by where their names were first bound in the module."""
    positions = {key: i for i, key in enumerate(namespace)}
    end = len(positions)
    seen = {id(s) for s in local}
    placed: list[tuple[int, int, Step]] = [
        (positions.get(s.name, end), i, s) for i, s in enumerate(local)
    ]
    for key, value in namespace.items():
        if isinstance(value, Step) and id(value) not in seen:
            seen.add(id(value))
            placed.append((positions[key], len(placed), value))
    return [s for _, _, s in sorted(placed, key=lambda p: (p[0], p[1]))]


def _describe_failure(error: BaseException, file: Path) -> tuple[int | None, str]:
    """The line of the pipeline file where ``error`` happened, and ``Type: message``."""
    if isinstance(error, SyntaxError) and error.filename == str(file):
        return error.lineno, f"{type(error).__name__}: {error.msg}"
    line = _last_line_in(traceback.extract_tb(error.__traceback__), str(file))
    return line, f"{type(error).__name__}: {error}"


def _last_line_in(frames: Iterable[traceback.FrameSummary], filename: str) -> int | None:
    line: int | None = None
    for frame in frames:
        if frame.filename == filename:
            line = frame.lineno
    return line


def _remove_path_entry(folder: str) -> None:
    # The file may have changed sys.path itself: remove our entry, wherever it is now.
    if sys.path and sys.path[0] == folder:
        del sys.path[0]
    elif folder in sys.path:
        sys.path.remove(folder)


def _safe(stem: str) -> str:
    return re.sub(r"\W", "_", stem) or "pipeline"
