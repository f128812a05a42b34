"""Generate the sync and asyncio faces of the library from its trio functions.

Usage::

    python tools/gen_faces.py           # rewrite orchestrator/sync.py and orchestrator/aio.py
    python tools/gen_faces.py --check   # exit 1 if they are stale (run by the tests and ./dev lint)

Each function of :data:`FUNCTIONS` gets a twin in each face with the same parameters (names,
kinds, defaults and annotations, read with :func:`inspect.signature`); the twins of the sync
face also take ``cancel``. A trio function with ``*args`` or ``**kwargs`` is refused: every
parameter is named, so that mypy checks every call of every face. Private parameters
(``_kind``) and those that only make sense inside one trio run (an open run store, an agent
pool) are left out. The types the annotations name are imported where the trio function's
module imports them.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SYNC_OUT = ROOT / "orchestrator" / "sync.py"
AIO_OUT = ROOT / "orchestrator" / "aio.py"

#: (module, function): the trio functions that get twins, in this order
FUNCTIONS = [
    ("orchestrator.runs.prompt", "prompt"),
    ("orchestrator.runs.run", "run_pipeline"),
    ("orchestrator.runs.compare", "compare"),
    ("orchestrator.runs.resume", "resume_run"),
    ("orchestrator.runs.replay", "replay_run"),
    ("orchestrator.runs.apply", "apply_run"),
    ("orchestrator.runs.recorded", "list_runs"),
    ("orchestrator.runs.recorded", "get_run_json"),
    ("orchestrator.runs.recorded", "diff_run"),
    ("orchestrator.runs.prune", "prune"),
    ("orchestrator.runs.batch", "batch"),
    ("orchestrator.runs.batch", "resume_batch"),
]
#: parameters bound to one trio run: a run store opened in it, an agent pool serving in it
LEFT_OUT = {"store", "pool"}

BUILTINS = set(dir(builtins))

SYNC_HEAD = '''"""The sync face: the functions of :mod:`orchestrator.runs` for scripts.

Each call runs the trio function in a thread of its own (see :mod:`orchestrator.runs.threaded`),
so the calling thread stays interruptible. ``cancel`` takes a
:class:`~orchestrator.runs.threaded.CancelToken`: cancelling it from any thread stops the call
as Ctrl-C stops the command line (the turns get ``session/cancel``, the agents are stopped,
nothing is applied after it, the run is recorded ``interrupted``), and the call raises
:class:`~orchestrator.errors.RunCancelled`. The callbacks (``on_event``, ``on_update``,
``escalate``) run in the call's thread.

Imported in the main thread while SIGINT has Python's default handler, this module installs a
handler that first cancels every run of the sync and asyncio faces, then raises
``KeyboardInterrupt`` as the default one does; a call waiting in the main thread waits for its
run to stop before letting ``KeyboardInterrupt`` out.
"""
'''

AIO_HEAD = '''"""The asyncio face: the functions of :mod:`orchestrator.runs` for asyncio.

Each call runs the trio function in a thread of its own (see :mod:`orchestrator.runs.threaded`),
so several calls (``asyncio.gather``) run at once. Cancelling the awaiting task (``task.cancel()``,
an ``asyncio.wait_for`` or ``asyncio.timeout`` running out) cancels the run as Ctrl-C cancels
the command line: the turns get ``session/cancel``, the agents are stopped, nothing is applied
after it, and the run is recorded ``interrupted``. The coroutine returns only once the run
stopped, then raises ``CancelledError``.

``on_event`` and ``on_update`` are called on the event loop (``call_soon_threadsafe``, in order),
and ``escalate`` is awaited there: they may use asyncio freely. Objects of trio code (a
``connector``, ``services``) run in the call's thread, in its trio run.
"""
'''


def _source_imports(module: Any) -> dict[str, str]:
    """The import line that binds each name at the top level of ``module``'s source."""
    tree = ast.parse(inspect.getsource(module))
    package = module.__name__.rsplit(".", 1)[0]
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If):  # if TYPE_CHECKING: ...
            nodes: list[ast.stmt] = node.body
        else:
            nodes = [node]
        for n in nodes:
            if isinstance(n, ast.Import):
                for alias in n.names:
                    found[alias.asname or alias.name] = f"import {alias.name}" + (
                        f" as {alias.asname}" if alias.asname else ""
                    )
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (n.level - 1)]
                    base = ".".join(parts) + (f".{n.module}" if n.module else "")
                for alias in n.names:
                    bound = alias.asname or alias.name
                    found[bound] = f"from {base} import {alias.name}" + (
                        f" as {alias.asname}" if alias.asname else ""
                    )
            elif isinstance(n, ast.ClassDef | ast.FunctionDef):
                found[n.name] = f"from {module.__name__} import {n.name}"
            elif isinstance(n, ast.Assign | ast.AnnAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = f"from {module.__name__} import {target.id}"
    return found


def _names(annotation: str) -> set[str]:
    """The names an annotation uses, builtins aside."""
    tree = ast.parse(annotation, mode="eval")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in BUILTINS}


def parameters(module_name: str, name: str) -> tuple[list[inspect.Parameter], str, set[str]]:
    """The twins' parameters of ``module_name.name``, its return annotation, and the import
    lines of the names the annotations use."""
    module = importlib.import_module(module_name)
    signature = inspect.signature(getattr(module, name))
    imports = _source_imports(module)
    params: list[inspect.Parameter] = []
    used: set[str] = set()
    for p in signature.parameters.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            # a twin's parameters are the trio function's, checked by mypy: none may hide
            raise ValueError(f"{module_name}.{name}: *{p.name} hides parameters; name them")
        if p.name.startswith("_") or p.name in LEFT_OUT:
            continue
        params.append(p)
        used |= {imports[n] for n in _names(str(p.annotation))}
    returns = str(signature.return_annotation)
    used |= {imports[n] for n in _names(returns)}
    used.add(f"from {module_name} import {name} as _{name}")
    return params, returns, used


def _default(p: inspect.Parameter) -> str:
    text = repr(p.default)
    if ast.literal_eval(text) != p.default:  # only literals: they read the same in the twin
        raise ValueError(f"{p.name}: default {text} is not a literal")
    return text


def _signature(params: list[inspect.Parameter], extra: list[str]) -> list[str]:
    lines: list[str] = []
    star = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            lines.append("    *,")
            star = True
        default = "" if p.default is p.empty else f" = {_default(p)}"
        lines.append(f"    {p.name}: {p.annotation}{default},")
    if extra and not star:
        lines.append("    *,")
    lines.extend(f"    {e}," for e in extra)
    return lines


def _call(name: str, params: list[inspect.Parameter]) -> str:
    args = [p.name if p.kind is not p.KEYWORD_ONLY else f"{p.name}={p.name}" for p in params]
    return f"functools.partial(_{name}, {', '.join(args)})"


def emit(face: str) -> str:
    """The text of one face: ``sync`` or ``aio``."""
    head = SYNC_HEAD if face == "sync" else AIO_HEAD
    imports = {"import functools", "from orchestrator.runs import threaded as _threaded"}
    if face == "sync":
        imports.add("from orchestrator.runs.threaded import CancelToken")
    bodies: list[str] = []
    names: list[str] = []
    for module_name, name in FUNCTIONS:
        params, returns, used = parameters(module_name, name)
        imports |= used
        twin = f"{name}_sync" if face == "sync" else name
        names.append(twin)
        lines = [f"def {twin}(" if face == "sync" else f"async def {twin}("]
        lines += _signature(params, ["cancel: CancelToken | None = None"] if face == "sync" else [])
        lines.append(f") -> {returns}:")
        if face == "sync":
            lines.append(
                f'    """:func:`~{module_name}.{name}` in a thread of its own (see the module)."""'
            )
            lines.append(f"    return _threaded.call_sync({_call(name, params)}, cancel)")
        else:
            lines.append(
                f'    """:func:`~{module_name}.{name}` awaited from asyncio (see the module)."""'
            )
            lines.append(f"    return await _threaded.call_async({_call(name, params)})")
        bodies.append("\n".join(lines))
    if face == "sync":
        names.append("CancelToken")
    plain = sorted(i for i in imports if i.startswith("import "))
    froms = sorted(i for i in imports if i.startswith("from "))
    text = "\n".join(
        [
            "# DO NOT EDIT: generated by tools/gen_faces.py from the trio functions of",
            "# orchestrator/runs; run `python tools/gen_faces.py` after changing their parameters.",
            head,
            "from __future__ import annotations",
            "",
            *plain,
            *froms,
            "",
            f"__all__ = {sorted(names)!r}",
            "",
            "",
            "\n\n\n".join(bodies),
        ]
    )
    if face == "sync":
        text += "\n\n\n_threaded.install_interrupt_handler()\n"
    return _formatted(text)


def _formatted(text: str) -> str:
    """``text`` through ``ruff check --fix`` (import order) and ``ruff format``."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        raise SystemExit("ruff not found (it formats the generated modules)")
    name = str(SYNC_OUT)

    def run(*args: str, source: str) -> str:
        done = subprocess.run(
            [ruff, *args, "--stdin-filename", name, "-"],
            input=source,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if done.returncode not in (0, 1):
            raise SystemExit(done.stderr)
        return done.stdout

    fixed = run("check", "--fix-only", "--select", "I", "--exit-zero", source=text)
    return run("format", source=fixed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    stale = []
    outputs: dict[Path, Callable[[], str]] = {
        SYNC_OUT: lambda: emit("sync"),
        AIO_OUT: lambda: emit("aio"),
    }
    for path, make in outputs.items():
        text = make()
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text)
    if stale:
        print(
            f"stale: {', '.join(map(str, stale))}; run python tools/gen_faces.py", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
