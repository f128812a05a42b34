"""Shared fixtures: every frame our ACP client sends is validated against the official schema."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from schema_check import FrameValidator

import orchestrator.agent.launch as client_module
from orchestrator.jsonrpc.connection import JsonRpcConnection
from orchestrator.vfs import _statwalk
from orchestrator.vfs._mounts import MOUNTINFO, mount_id, mount_points

# the fixtures acp-orchestrator's users get (a pytest11 entry point in an installed package):
# the suite runs with them loaded, as theirs do
pytest_plugins = ["orchestrator.testing.pytest_plugin"]

#: every validator created during the session, for the summary line
VALIDATORS: list[FrameValidator] = []


@pytest.fixture(autouse=True)
def validate_client_frames(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wrap every client-side JSON-RPC connection so each frame it sends is schema-checked.

    The connection swallows exceptions from frame observers (a broken observer must not end a
    connection), so violations are collected here and fail the test at teardown.
    """
    original = JsonRpcConnection
    violations: list[str] = []

    def factory(stream: Any, **kwargs: Any) -> JsonRpcConnection:
        validator = FrameValidator()
        VALIDATORS.append(validator)
        chained: Callable[[str, bytes, bool], None] | None = kwargs.pop("frame_observer", None)

        def observe(direction: Any, frame: bytes, valid: bool) -> None:
            try:
                validator.feed(direction, frame)
            except AssertionError as e:
                violations.append(str(e))
            if chained is not None:
                chained(direction, frame, valid)

        return original(stream, frame_observer=observe, **kwargs)

    monkeypatch.setattr(client_module, "JsonRpcConnection", factory)
    yield
    if violations:
        pytest.fail("frames violating the ACP schema were sent:\n" + "\n".join(violations))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many frames were validated against the schema."""
    total = sum(v.validated for v in VALIDATORS)
    terminalreporter.write_line(
        f"schema: {total} client frames validated against the ACP v1 schema "
        f"({len(VALIDATORS)} connections)"
    )
    real = sys.modules.get("test_real_agents")
    if real is not None:
        exercised = sorted(getattr(real, "EXERCISED", ()))
        names = ", ".join(exercised) or "none (see the skip reasons)"
        terminalreporter.write_line(f"real agents: {len(exercised)} exercised end to end: {names}")
    readme = sys.modules.get("test_readme_examples")
    if readme is not None:
        skipped = len(readme.BLOCKS) - len(readme.RUNNABLE)
        terminalreporter.write_line(
            f"README examples: {len(readme.RUNNABLE)} run as written, {skipped} marked skip"
        )


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs and branches go to a temporary state directory, never the user's."""
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(path))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A workspace holding README.md."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("# project\n")
    return root


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A project directory for a session."""
    root = tmp_path / "project"
    root.mkdir()
    return root


def pid_gone(pid: int) -> bool:
    """Whether a process is gone (a zombie nobody reaps counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    except ProcessLookupError:
        return True
    return state in ("Z", "X")


def make_chain(root: Path, depth: int, name: str = "d") -> str:
    """``depth`` directories one in another under ``root`` with ``f.txt`` at the bottom (made
    through directory fds: the whole path may be too long to name at once); its branch path."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        with open(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep\n")
    finally:
        os.close(fd)
    return "/".join([name] * depth + ["f.txt"])


@contextmanager
def bind_mount(source: Path, mount_point: Path) -> Iterator[None]:
    """``source`` bind-mounted on ``mount_point`` while the block runs, as an agent running as
    root can do in its branch directory; unmounted (``umount -l``) after it in any case, where
    the mount point is then (a directory holding it may have been renamed). Skips the test
    where this process may not mount: not root, or a container that forbids it."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    try:
        done = subprocess.run(
            ["mount", "--bind", str(source), str(mount_point)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip(f"mount --bind refused here: {done.stderr.strip()}")
    mount: int | None = None
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            mount = mount_id(fd)
        finally:
            os.close(fd)
        yield
    finally:
        where = str(mount_point)
        with open(MOUNTINFO, "rb") as f:
            for line in f.read().splitlines():
                if mount is not None and line.split(b" ", 1)[0] == b"%d" % mount:
                    where = mount_points(line)[0]
        subprocess.run(["umount", "-l", where], capture_output=True)


@pytest.fixture
def mounts_allowed(tmp_path: Path) -> None:
    """Skip the test unless :func:`bind_mount` can mount here: tried once, outside the test
    (a skip raised in an async test through trio loses its reason)."""
    (tmp_path / "mount-source").mkdir()
    (tmp_path / "mount-point").mkdir()
    with bind_mount(tmp_path / "mount-source", tmp_path / "mount-point"):
        pass


def is_test_cluster(pid: int) -> bool:
    """Whether ``pid`` is a process of a loopback Ray cluster of this test session (see
    tests/raycluster.py): it and what runs below it are the cluster's, not a test's leftovers."""
    cluster = sys.modules.get("raycluster")
    return cluster is not None and bool(cluster.is_cluster_process(pid))


def is_process_watchdog(pid: int) -> bool:
    """Whether ``pid`` is an orchestrator's process watchdog (it lives as long as its process).

    The first process tree a process opens starts it, so whether a test finds it among the
    children depends on which tests ran before: tests that count children leave it out.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"_sweep.py" in f.read()
    except OSError:
        return False


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A loopback Ray cluster for the session: two nodes on this machine, 2 agent slots each
    (see tests/raycluster.py: ``.address``, ``.nodes``, ``add_node(slots)``,
    ``remove_node(node)``). Skipped when Ray is not installed.

    The fixture does not connect this process to it: a test connects (``ray.init(address=
    ray_cluster.address)`` or ``connect()``) and disconnects when done, so each test starts
    from a driver that is not connected, and a test's CLI subprocess is a driver of its own."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    from raycluster import start_cluster

    with start_cluster() as cluster:
        yield cluster


os.environ.setdefault("PYTHONUNBUFFERED", "1")


@contextmanager
def stat_walk(kind: str) -> Iterator[None]:
    """Directories walked with GNU ``find`` (``"find"``, trees of any size; the test is
    skipped where there is none) or by this process (``"walk"``), whatever the machine has."""
    if kind == "find":
        if _statwalk.find_command() is None:
            pytest.skip("no GNU find here: directories are walked by this process only")
        least = _statwalk.FIND_MIN_ENTRIES
        _statwalk.FIND_MIN_ENTRIES = 0  # small trees too
        try:
            yield
        finally:
            _statwalk.FIND_MIN_ENTRIES = least
        return
    saved = _statwalk._checked[:]
    _statwalk._checked[:] = [None]
    try:
        yield
    finally:
        _statwalk._checked[:] = saved
