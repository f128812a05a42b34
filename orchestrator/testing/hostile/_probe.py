"""Probing a policy: each attack through the real run path, and what it left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio
from attrs import define, field, frozen

from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.testing.hostile._agent import script_for
from orchestrator.testing.hostile._catalogue import ATTACKS, Attack
from orchestrator.testing.hostile._judge import judge_record, unique
from orchestrator.testing.hostile._layout import Layout, walk
from orchestrator.testing.script import JsonObject

if TYPE_CHECKING:
    from orchestrator.config import Config
    from orchestrator.policy import PolicySet
    from orchestrator.runs import PromptRun
    from orchestrator.sandbox import Sandbox

__all__ = ["AttackResult", "probe_policy", "probe_policy_sync"]

#: seconds a run may take beyond its turn timeout before the orchestrator counts as hung
_HANG_GRACE = 20.0


@frozen
class AttackResult:
    """What one attack did to a client, and whether the client held."""

    #: the attack's name
    attack: str
    #: what it probes
    probes: str
    #: nothing got through
    held: bool
    #: what got through, one line each (empty when it held)
    failures: tuple[str, ...]
    #: the run's status (succeeded, failed, ...); None when the run raised
    status: str | None
    #: the command line's exit code for the run; None when the run raised
    exit_code: int | None
    #: the error the run raised, as ``Type: message``; None when it returned
    error: str | None
    #: processes of the attack left after the run (``pid command line``; the probe killed them)
    left: tuple[str, ...]
    #: permission requests of the agent that were granted (tool call ids)
    granted: tuple[str, ...]
    #: how far this process's peak memory rose during the run, in bytes (0 where unknown)
    memory_growth: int
    #: how far the state directory grew during the run, in bytes
    store_growth: int
    #: the run's wall-clock seconds
    seconds: float

    def summary(self) -> str:
        """One line: the attack, held or not, and why."""
        verdict = "held" if self.held else "NOT HELD: " + "; ".join(self.failures)
        return f"{self.attack} [{self.probes}]: {verdict}"


def _status_kb(name: str) -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(name.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_memory() -> int | None:
    """Reset this process's peak resident size (Linux); its resident size now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_kb("VmRSS")


def _size(root: Path) -> int:
    total = 0
    for rel, kind in walk(root):
        if kind == "file":
            with contextlib.suppress(OSError):
                total += (root / rel).stat().st_size
    return total


def _leftovers(places: Sequence[Path]) -> list[tuple[int, str]]:
    """Live processes whose command line names one of ``places`` or that work under one."""
    names = [os.fsencode(p) for p in places]
    me = os.getpid()
    found: list[tuple[int, str]] = []
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        try:
            if _dead_or_dying(pid):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd"))
        except (OSError, ValueError):
            continue
        hit = any(
            arg == n or arg.startswith(n + b"/") or cwd == n or cwd.startswith(n + b"/")
            for n in names
            for arg in argv
        )
        if hit:
            found.append((pid, b" ".join(argv).decode(errors="replace").strip()))
    return found


_PF_EXITING = 0x4  # the kernel's flag of a task in its exit path


def _dead_or_dying(pid: int) -> bool:
    """Whether ``pid`` is a zombie, is exiting, or has a SIGKILL on its way: it cannot outlive
    that, and a kill returns before the process is gone."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        state, *rest = f.read().rsplit(b")", 1)[1].split()
    if state in (b"Z", b"X", b"x") or int(rest[5]) & _PF_EXITING:
        return True
    with open(f"/proc/{pid}/status", "rb") as f:
        fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    kill = 1 << (signal.SIGKILL - 1)
    return any(int(fields.get(m, b"0").strip(), 16) & kill for m in (b"SigPnd", b"ShdPnd"))


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _runs(state: Path) -> set[Path]:
    """The run directories in the state directory ``state``."""
    try:
        return {p for p in (state / "runs").iterdir() if p.is_dir()}
    except OSError:
        return set()


#: errors that say the orchestrator has a bug, not that the input was refused
_PROGRAMMING_ERRORS = (
    RecursionError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    AssertionError,
    UnicodeError,
    NameError,
)


def _programming_error(exc: BaseException) -> BaseException | None:
    """A bug under a clear error: the first programming error in ``exc``'s causes."""
    seen: set[int] = set()
    cause: BaseException | None = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, _PROGRAMMING_ERRORS):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _load_record(path: Path) -> list[JsonObject]:
    try:
        data = path.read_bytes()
    except OSError:
        return []
    events: list[JsonObject] = []
    for line in data.split(b"\n"):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # the last line of an agent killed while writing it
        if isinstance(event, dict):
            events.append(event)
    return events


def _relative(path: str, cwd: str) -> str | None:
    """``path`` relative to the branch ``cwd`` (lexically), or None when outside it."""
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(cwd))
    return None if rel == os.curdir or rel.startswith(os.pardir) else rel


def _with_sandbox(sandbox: Sandbox | bool, layout: Layout) -> Sandbox:
    """The sandbox rules, with the agent's record directory writable."""
    from orchestrator.sandbox import Sandbox

    base = sandbox if isinstance(sandbox, Sandbox) else Sandbox()
    return attrs.evolve(base, write=(*base.write, str(layout.record.parent)))


@define
class _Probe:
    """One attack run through the real run path, and what it left."""

    attack: Attack
    policy: Any
    workspace: Path | None
    state_dir: Path | None
    sandbox: Sandbox | bool
    config: Config | None
    failures: list[str] = field(factory=list)

    async def run(self) -> AttackResult:
        root = Path(await trio.to_thread.run_sync(tempfile.mkdtemp, None, "hostile-")).resolve()
        try:
            return await self._run(Layout(root))
        finally:
            # rm copes with any depth (shutil.rmtree recurses once per directory level)
            with trio.CancelScope(shield=True), trio.move_on_after(_HANG_GRACE):
                await trio.run_process(["rm", "-rf", "--", str(root)], check=False)

    async def _run(self, layout: Layout) -> AttackResult:
        from orchestrator.agents import AgentSpec
        from orchestrator.runs import prompt

        attack = self.attack
        workspace = layout.root / "workspace"
        state = self.state_dir or layout.root / "state"
        await trio.to_thread.run_sync(self._prepare, layout, workspace)
        script = layout.root / "attack.json"
        await trio.Path(script).write_bytes(orjson.dumps(script_for(attack, layout).to_json()))
        command = (
            sys.executable,
            "-m",
            "orchestrator.testing.hostile",
            "--script",
            str(script),
            "--root",
            str(layout.root),
        )
        spec = AgentSpec(f"hostile-{attack.name}", command, max_restarts=0)
        options: dict[str, Any] = {}
        if self.sandbox:
            options["sandbox"] = _with_sandbox(self.sandbox, layout)
        store_before = _size(state) if state.exists() else 0
        canaries = layout.canaries()
        saved = {name: os.environ.get(name) for name in canaries}
        runs_before = _runs(state)

        def places() -> list[Path]:
            # the runs this attack made, not the state directory: it may hold others' runs
            return [layout.root, workspace, *(_runs(state) - runs_before)]

        run: PromptRun | None = None
        error: str | None = None
        rss = _reset_peak_memory()
        started = time.monotonic()
        os.environ.update(canaries)
        try:
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()
                nursery.start_soon(self._watchdog, attack.timeout + _HANG_GRACE, places, scope)
                try:
                    with scope:
                        run = await prompt(
                            spec,
                            f"hostile attack {attack.name}",
                            cwd=workspace,
                            policy=self.policy,
                            apply=True,
                            state_dir=state,
                            timeout=attack.timeout,
                            config=self.config,
                            **options,
                        )
                except OrchestratorError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if (cause := _programming_error(exc)) is not None:
                        self.failures.append(f"the orchestrator crashed: {_describe(cause)}")
                except Exception as exc:  # what the probe looks for: anything but a clear error
                    error = f"{type(exc).__name__}: {exc}"
                    self.failures.append(f"the orchestrator crashed: {_describe(exc)}")
                nursery.cancel_scope.cancel()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        seconds = time.monotonic() - started
        peak = _status_kb("VmHWM")
        left = await trio.to_thread.run_sync(_leftovers, places())
        _kill(pid for pid, _ in left)
        self.failures += [f"a process was left behind: {pid} {argv}" for pid, argv in left]
        self.failures += [
            f"the run left its branch directories behind: {path}"
            for path in _runs(state) - runs_before
            if (path / "branches").exists() and any((path / "branches").iterdir())
        ]
        events = await trio.to_thread.run_sync(_load_record, layout.record)
        self._judge(layout, events, run, workspace)
        memory = max(0, peak - rss) if peak is not None and rss is not None else 0
        if attack.memory_limit is not None and memory > attack.memory_limit:
            self.failures.append(
                f"peak memory rose by {memory >> 20} MiB (limit {attack.memory_limit >> 20} MiB)"
            )
        store = max(0, (_size(state) if state.exists() else 0) - store_before)
        if attack.store_limit is not None and store > attack.store_limit:
            self.failures.append(
                f"the state directory grew by {store >> 20} MiB "
                f"(limit {attack.store_limit >> 20} MiB)"
            )
        granted = tuple(
            str(e.get("toolCallId"))
            for e in events
            if e.get("event") == "permission" and e.get("decision") == "allow"
        )
        failures = tuple(unique(self.failures))
        return AttackResult(
            attack=attack.name,
            probes=attack.probes,
            held=not failures,
            failures=failures,
            status=run.status if run is not None else None,
            exit_code=run.exit_code if run is not None else None,
            error=error,
            left=tuple(f"{pid} {argv}" for pid, argv in left),
            granted=granted,
            memory_growth=memory,
            store_growth=store,
            seconds=seconds,
        )

    async def _watchdog(
        self, deadline: float, places: Callable[[], Sequence[Path]], run: trio.CancelScope
    ) -> None:
        """Past the deadline the run hung: kill the attack's processes so that it can end,
        and cancel it if even that did not end it."""
        await trio.sleep(deadline)
        stuck = await trio.to_thread.run_sync(_leftovers, places())
        self.failures.append(
            f"the run did not end within {deadline:g} s; the probe killed the attack's "
            f"processes ({len(stuck)}) to end it"
        )
        _kill(pid for pid, _ in stuck)
        await trio.sleep(_HANG_GRACE)
        run.cancel()

    def _prepare(self, layout: Layout, workspace: Path) -> None:
        layout.prepare()
        if self.workspace is not None:
            shutil.copytree(self.workspace, workspace, symlinks=True)
        else:
            workspace.mkdir()
            (workspace / "README.md").write_text("A workspace under attack.\n")
        if self.attack.setup is not None:
            self.attack.setup(workspace)

    def _judge(
        self, layout: Layout, events: list[JsonObject], run: PromptRun | None, workspace: Path
    ) -> None:
        attack = self.attack
        self.failures += judge_record(events, layout, {})
        for e in events:
            if e.get("event") == "verdict":
                self.failures += [str(f) for f in e.get("failures") or ()]
        self.failures += layout.outside_changes()
        if run is None or run.status != "succeeded":
            return
        if attack.expect_failure:
            self.failures.append("the run was recorded as succeeded though the turn never ended")
            return
        changed = {c.name for c in run.changes}
        cwd = next((str(e["cwd"]) for e in events if e.get("event") == "session_new"), None)
        made = [
            _relative(str(e["path"]), cwd)
            for e in events
            if cwd is not None and e.get("event") == "fs_write" and "result" in e
        ]
        missing = [p for p in (*made, *attack.must_record) if p is not None and p not in changed]
        self.failures += [
            f"succeeded without recording a change the agent made: {p}" for p in missing
        ]
        if run.applied and attack.check_applied is not None:
            self.failures += attack.check_applied(workspace)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _chosen(attacks: Iterable[str | Attack] | None) -> list[Attack]:
    if attacks is None:
        return list(ATTACKS.values())
    chosen: list[Attack] = []
    for item in attacks:
        if isinstance(item, Attack):
            chosen.append(item)
        elif item in ATTACKS:
            chosen.append(ATTACKS[item])
        else:
            raise UsageError(f"unknown attack {item!r}; known: {', '.join(ATTACKS)}")
    return chosen


async def probe_policy(
    policy: str | os.PathLike[str] | PolicySet | None = None,
    attacks: Iterable[str | Attack] | None = None,
    *,
    workspace: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    sandbox: Sandbox | bool = False,
    config: Config | None = None,
) -> tuple[AttackResult, ...]:
    """Run each attack against ``policy`` through the real run path; one result per attack.

    Each attack runs as a real subprocess agent through :func:`orchestrator.runs.prompt`
    (with ``apply``) on a fresh temporary copy of ``workspace`` (default: a one-file
    workspace), one after the other; its runs are recorded in ``state_dir`` (default: a
    temporary one per attack). ``sandbox`` (``True`` or
    :class:`~orchestrator.sandbox.Sandbox` rules) confines the agent and its terminals, its
    record directory made writable. While an attack runs, canary values of
    :data:`SECRET_VARIABLES` are set in this process's environment (terminals must not see
    them), and memory is measured on this whole process: run nothing else meanwhile. A run
    that outlives its timeout by 20 s counts as hung: the probe kills the attack's processes
    to end it. Processes an attack left behind are reported and killed.
    """
    chosen = _chosen(attacks)
    base = None if workspace is None else Path(workspace).resolve()
    state = None if state_dir is None else Path(state_dir).resolve()
    results: list[AttackResult] = []
    for attack in chosen:
        probe = _Probe(attack, policy, base, state, sandbox, config)
        results.append(await probe.run())
    return tuple(results)


def probe_policy_sync(
    policy: str | os.PathLike[str] | PolicySet | None = None,
    attacks: Iterable[str | Attack] | None = None,
    **kwargs: Any,
) -> tuple[AttackResult, ...]:
    """:func:`probe_policy` for scripts and pytest: runs its own trio loop."""

    async def run() -> tuple[AttackResult, ...]:
        return await probe_policy(policy, attacks, **kwargs)

    return trio.run(run)
