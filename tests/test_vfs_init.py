"""Tests for the orchestrator.vfs package surface: exports and layering."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import orchestrator.vfs as vfs

VFS_DIR = Path(vfs.__file__).parent


def test_all_names_are_exported() -> None:
    """Every name in __all__ exists, and __all__ is sorted and unique."""
    for name in vfs.__all__:
        assert hasattr(vfs, name), name
    assert len(set(vfs.__all__)) == len(vfs.__all__)
    assert vfs.__all__ == sorted(vfs.__all__, key=lambda n: (not n.isupper(), n))


def test_public_names_have_docstrings() -> None:
    """Every exported class and function documents itself (the README is built from them)."""
    for name in vfs.__all__:
        obj = getattr(vfs, name)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), name


def test_vfs_is_a_leaf_package() -> None:
    """No vfs module imports the agent, jsonrpc or cli layers at run time."""
    forbidden = ("orchestrator.agent", "orchestrator.jsonrpc", "orchestrator.cli")
    code = (
        "import sys, orchestrator.vfs; "
        f"print([m for m in sys.modules if m.startswith({forbidden!r})])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for module in VFS_DIR.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 2:
                # layer 0: they import nothing of ours
                allowed = {"errors", "_names", "_sizes", "_log"}
                if module.name == "service.py":
                    allowed |= {"protocol", "protocol.types", "agent.services"}
                assert node.module in allowed, f"{module.name} imports ..{node.module}"
