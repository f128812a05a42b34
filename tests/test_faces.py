"""The asyncio and sync faces: explicit signatures, cancellation from asyncio and from threads,
and Ctrl-C stopping the runs of a thread pool.

The agents are scripted agents run as subprocesses; each records what it receives beside its
script, which is how a test knows that an agent got its prompt before it cancels.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import is_test_cluster, pid_gone
from run_helpers import CLI_LIMIT, agent_command, prompts, record_events, snapshot, timeline
from run_helpers import write_script as write_turn

import orchestrator
from orchestrator import aio
from orchestrator.agents import AgentSpec
from orchestrator.errors import RunCancelled
from orchestrator.runs import threaded
from orchestrator.store import RunRecord
from orchestrator.sync import CancelToken, list_runs_sync, prompt_sync
from orchestrator.testing import Say, Stall, Turn, WriteFile

ROOT = Path(__file__).resolve().parent.parent
POLL = 0.02  # seconds between two looks at an agent's record


# --------------------------------------------------------------------------- helpers


def alive(pids: set[int]) -> dict[int, str]:
    """Those of ``pids`` still running, with their command lines."""
    found = {}
    for pid in pids:
        if not pid_gone(pid):
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


def children() -> set[int]:
    """Every process below this one (from /proc/PID/task/*/children) but the orchestrator's
    watchdog (one per process, it outlives runs: see orchestrator.agent.reaper)."""
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for listing in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in listing.read_text().split()]
            except OSError:
                continue  # the thread or process ended meanwhile
            for kid in kids:
                if kid not in found and not is_test_cluster(kid):  # the session's, not a run's
                    found.add(kid)
                    todo.append(kid)
    return {pid for pid in found if "orchestrator-watchdog" not in alive({pid}).get(pid, "")}


def stalling(directory: Path, name: str, *, write: bool = False) -> tuple[AgentSpec, Path]:
    """An agent whose turn (after writing ``NAME.txt`` through the client, with ``write``)
    never ends until it is cancelled; its spec and its script file."""
    steps = (WriteFile(path=f"{name}.txt", content=f"from {name}\n"),) if write else ()
    script = write_turn(directory / f"{name}.json", Turn(steps=(*steps, Stall())))
    return AgentSpec(name, tuple(agent_command(script))), script


def answered_write(script: Path) -> bool:
    """Whether the agent of ``script`` got the answer to its ``fs/write_text_file``."""
    return any(
        e["event"] == "recv" and isinstance(e.get("message"), dict) and "result" in e["message"]
        for e in record_events(script.with_suffix(".jsonl"))
    )


def until(ready: Callable[[], bool]) -> None:
    """Wait (in this thread) until ``ready()``: an agent's record is read again and again."""
    deadline = time.monotonic() + CLI_LIMIT
    while not ready():
        assert time.monotonic() < deadline, "the agent never got there"
        time.sleep(POLL)


async def until_async(ready: Callable[[], bool]) -> None:
    """:func:`until` from asyncio."""
    deadline = time.monotonic() + CLI_LIMIT
    while not ready():
        assert time.monotonic() < deadline, "the agent never got there"
        await asyncio.sleep(POLL)


def runs(state: Path) -> list[RunRecord]:
    """Every recorded run, newest first."""
    return list_runs_sync(state_dir=state, limit=None)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The workspace: one file."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("# project\n")
    return root


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    """The directory of the agents' scripts and records (outside the workspace)."""
    path = tmp_path / "agents"
    path.mkdir()
    return path


# --------------------------------------------------------------------------- signatures

TRIO: dict[str, Callable[..., Any]] = {
    "prompt": orchestrator.runs.prompt,
    "run_pipeline": orchestrator.runs.run_pipeline,
    "compare": orchestrator.runs.compare,
    "resume_run": orchestrator.runs.resume_run,
    "apply_run": orchestrator.runs.apply_run,
    "list_runs": orchestrator.runs.list_runs,
    "get_run_json": orchestrator.runs.get_run_json,
    "diff_run": orchestrator.runs.diff_run,
}


def test_generated_faces_are_fresh() -> None:
    """`python tools/gen_faces.py --check` exits 0: the sync and asyncio faces are up to date."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_faces.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", sorted(TRIO))
def test_twins_have_the_trio_functions_parameters(name: str) -> None:
    """Each twin takes the trio function's own parameters (names, kinds, defaults, annotations),
    no ``**kwargs`` (so a type checker catches a misspelt one), and ``cancel`` in the sync face."""
    sync_twin = inspect.signature(getattr(orchestrator, f"{name}_sync"))
    aio_twin = inspect.signature(getattr(aio, name))
    assert inspect.iscoroutinefunction(getattr(aio, name))
    own = [
        p
        for p in inspect.signature(TRIO[name]).parameters.values()
        if not p.name.startswith("_") and p.kind is not p.VAR_KEYWORD
    ]
    for twin in (sync_twin, aio_twin):
        params = {p.name: p for p in twin.parameters.values()}
        assert all(p.kind is not p.VAR_KEYWORD for p in params.values())
        for p in own:
            if p.name in ("store", "pool"):  # bound to one trio run: not for other faces
                assert p.name not in params
                continue
            assert params[p.name] == p, name
    assert list(sync_twin.parameters)[-1] == "cancel"
    assert "cancel" not in aio_twin.parameters


# --------------------------------------------------------------------------- asyncio


def test_asyncio_run_prompt(project: Path, state_dir: Path) -> None:
    """`asyncio.run(aio.prompt(...))` runs the demo agent's turn; its events reach the loop."""
    (project / "notes.md").write_text("colour\n")
    seen: list[tuple[str, bool]] = []

    async def main() -> orchestrator.PromptRun:
        def on_event(event: orchestrator.RunEvent) -> None:
            # called on the loop's own thread
            seen.append((event.type, threading.get_ident() == loop_thread))

        loop_thread = threading.get_ident()
        return await aio.prompt(
            "demo",
            'replace "colour" with "color" in *.md',
            cwd=project,
            policy="edit",
            apply=True,
            on_event=on_event,
        )

    run = asyncio.run(main())
    assert run.status == "succeeded"
    assert (project / "notes.md").read_text() == "color\n"
    assert seen[0] == ("run_started", True) and seen[-1] == ("run_finished", True)
    assert all(on_loop for _, on_loop in seen)


def test_cancelled_task_stops_the_run_and_applies_nothing(
    project: Path, agents: Path, state_dir: Path
) -> None:
    """Cancelling the task of `aio.prompt(..., apply=True)` once its agent wrote a file: the
    agent gets session/cancel and is gone, nothing is applied, the run is recorded interrupted,
    and the task ends cancelled only after all that."""
    spec, script = stalling(agents, "a", write=True)
    before = snapshot(project)

    async def main() -> set[int]:
        task = asyncio.ensure_future(
            aio.prompt(spec, "work", cwd=project, policy="edit", apply=True)
        )
        await until_async(lambda: answered_write(script))
        pids = children()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pids

    pids = asyncio.run(main())
    assert pids and not alive(pids)
    assert snapshot(project) == before
    assert "recv session/cancel" in timeline(script.with_suffix(".jsonl"))
    assert [r.status for r in runs(state_dir)] == ["interrupted"]


def test_wait_for_timeout_interrupts_the_run(project: Path, agents: Path, state_dir: Path) -> None:
    """`asyncio.wait_for` running out on a turn that never ends raises TimeoutError once the
    run stopped: recorded interrupted, no agent left."""
    spec, script = stalling(agents, "slow")

    async def main() -> set[int]:
        task = asyncio.ensure_future(aio.prompt(spec, "work", cwd=project))
        await until_async(lambda: prompts(script) > 0)
        pids = children()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(task, timeout=0.1)
        assert task.cancelled()
        return pids

    pids = asyncio.run(main())
    assert pids and not alive(pids)
    assert [r.status for r in runs(state_dir)] == ["interrupted"]


def test_gather_runs_concurrently_and_a_cancelled_gather_stops_both(
    project: Path, agents: Path, state_dir: Path
) -> None:
    """Two `aio.prompt` in one `gather` have their agents in their turns at the same time;
    cancelling the gather interrupts both runs and leaves no agent."""
    (a, script_a), (b, script_b) = stalling(agents, "a"), stalling(agents, "b")

    async def main() -> set[int]:
        both = asyncio.gather(
            aio.prompt(a, "work", cwd=project), aio.prompt(b, "work", cwd=project)
        )
        # both turns are running at once: neither ends before it is cancelled
        await until_async(lambda: prompts(script_a) > 0 and prompts(script_b) > 0)
        pids = children()
        both.cancel()
        with pytest.raises(asyncio.CancelledError):
            await both
        return pids

    pids = asyncio.run(main())
    assert len(pids) >= 2 and not alive(pids)
    assert [r.status for r in runs(state_dir)] == ["interrupted", "interrupted"]


# --------------------------------------------------------------------------- threads


def test_cancel_token_from_another_thread(project: Path, agents: Path, state_dir: Path) -> None:
    """A `prompt_sync` in a worker thread is cancelled through its CancelToken from this one:
    it raises RunCancelled naming its run, recorded interrupted; nothing applied, no agent."""
    spec, script = stalling(agents, "a", write=True)
    before = snapshot(project)
    token = CancelToken()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            prompt_sync, spec, "work", cwd=project, policy="edit", apply=True, cancel=token
        )
        until(lambda: answered_write(script))
        pids = children()
        token.cancel()
        with pytest.raises(RunCancelled) as raised:
            future.result(timeout=CLI_LIMIT)
    assert token.cancelled
    assert pids and not alive(pids)
    assert snapshot(project) == before
    [run] = runs(state_dir)
    assert (run.run_id, run.status) == (raised.value.run_id, "interrupted")
    assert "recv session/cancel" in timeline(script.with_suffix(".jsonl"))


def test_a_cancelled_token_stops_a_call_at_once(project: Path, agents: Path) -> None:
    """A call given a token cancelled beforehand starts no agent and raises RunCancelled."""
    spec, script = stalling(agents, "a")
    token = CancelToken()
    token.cancel()
    with pytest.raises(RunCancelled):
        prompt_sync(spec, "work", cwd=project, cancel=token)
    assert prompts(script) == 0
    assert not threaded._LIVE


POOL = """
import sys
from concurrent.futures import ThreadPoolExecutor

from orchestrator.agents import AgentSpec
from orchestrator.sync import prompt_sync

project, *commands = sys.argv[1:]
agents = [
    AgentSpec(f"agent{i}", (sys.executable, "-m", "orchestrator.testing.scripted_agent", c))
    for i, c in enumerate(commands)
]
with ThreadPoolExecutor(len(agents)) as pool:
    futures = [pool.submit(prompt_sync, agent, "work", cwd=project) for agent in agents]
    for f in futures:
        f.result()
"""

MAIN = """
import sys

from orchestrator.agents import AgentSpec
from orchestrator.sync import prompt_sync

project, command = sys.argv[1:]
agent = AgentSpec("agent", (sys.executable, "-m", "orchestrator.testing.scripted_agent", command))
try:
    prompt_sync(agent, "work", cwd=project)
finally:
    from orchestrator.runs import threaded

    print("live calls:", len(threaded._LIVE), file=sys.stderr)
"""


@pytest.mark.parametrize(("program", "count"), [(POOL, 2), (MAIN, 1)], ids=["pool", "main"])
def test_ctrl_c_stops_the_sync_calls(
    tmp_path: Path, project: Path, agents: Path, state_dir: Path, program: str, count: int
) -> None:
    """SIGINT to a script running ``prompt_sync`` calls (two in a thread pool, or one in its
    main thread) on agents that ignore session/cancel: the runs stop, recorded interrupted,
    no agent is left, and the script ends with KeyboardInterrupt as Python's default does."""
    scripts = [
        write_turn(
            agents / f"{n}.json", Turn(steps=(Say(text="on it"), Stall()), ignore_cancel=True)
        )
        for n in "ab"[:count]
    ]
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(program))
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir), "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, str(path), str(project), *map(str, scripts)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            until(lambda: all(prompts(s) > 0 for s in scripts))
            pids = children()
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=CLI_LIMIT)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGINT, stderr
    assert "KeyboardInterrupt" in stderr
    assert len(pids) > count and not alive(pids)
    assert [r.status for r in runs(state_dir)] == ["interrupted"] * count
    if program is MAIN:  # the call let KeyboardInterrupt out once its run had stopped
        assert "live calls: 0" in stderr


def _default_handler_after(code: str) -> str:
    """What SIGINT's handler is after ``code`` ran in a fresh interpreter's main thread."""
    probe = (
        f"import signal\n{code}\n"
        "h = signal.getsignal(signal.SIGINT)\n"
        "print('default' if h is signal.default_int_handler else getattr(h, '__name__', h))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_sigint_handler_only_with_the_sync_face() -> None:
    """The command line, the trio API and the asyncio face leave SIGINT's default handler (trio
    and asyncio keep their own Ctrl-C); the sync face installs its own, but never over a
    program's handler."""
    trio_and_cli = "import orchestrator.cli, orchestrator.runs, orchestrator.aio\n"
    assert _default_handler_after(trio_and_cli) == "default"
    assert _default_handler_after("import orchestrator.sync") == "_on_sigint"
    mine = "def mine(*a): pass\nsignal.signal(signal.SIGINT, mine)\nimport orchestrator.sync"
    assert _default_handler_after(mine) == "mine"


def test_asyncio_example_runs(state_dir: Path) -> None:
    """examples/asyncio_prompt.py runs two prompts at once, then one cut short by its timeout,
    recorded interrupted."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "asyncio_prompt.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_LIMIT,
    )
    assert done.returncode == 0, done.stderr
    assert "succeeded succeeded" in done.stdout
    assert "+from .pricing import compute_total" in done.stdout
    assert "+- Totals are computed once." in done.stdout
    assert done.stdout.rstrip().endswith("interrupted")


# --------------------------------------------------------------------------- the point of no return


@pytest.fixture
def cancel_at_apply(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], Any]]:
    """Runs each callable appended to the list (in the run's trio thread) as the run's apply
    begins: past the point where a cancel can stop the run."""
    hooks: list[Callable[[], Any]] = []
    real = orchestrator.runs.apply.apply_recorded

    async def apply_recorded(*args: Any, **kwargs: Any) -> Any:
        for hook in hooks:
            result = hook()
            if inspect.isawaitable(result):
                await result
        return await real(*args, **kwargs)

    monkeypatch.setattr(orchestrator.runs.run, "apply_recorded", apply_recorded)
    return hooks


def test_a_cancel_once_the_apply_began_is_too_late_for_a_sync_call(
    project: Path, state_dir: Path, cancel_at_apply: list[Callable[[], Any]]
) -> None:
    """The token's cancel lands as the apply begins: the call returns the applied outcome."""
    (project / "notes.md").write_text("colour\n")
    token = CancelToken()
    cancel_at_apply.append(token.cancel)
    run = prompt_sync(
        "demo",
        'replace "colour" with "color" in *.md',
        cwd=project,
        policy="edit",
        apply=True,
        cancel=token,
    )
    assert token.cancelled
    assert (run.status, run.applied) == ("succeeded", True)
    assert (project / "notes.md").read_text() == "color\n"
    assert runs(state_dir)[0].status == "succeeded"


def test_a_cancel_once_the_apply_began_is_too_late_for_asyncio(
    project: Path, state_dir: Path, cancel_at_apply: list[Callable[[], Any]]
) -> None:
    """The task is cancelled as the apply begins: the coroutine returns the applied outcome
    and takes the cancel back (the task is not left cancelling)."""
    (project / "notes.md").write_text("colour\n")

    async def main() -> tuple[orchestrator.PromptRun, int]:
        loop = asyncio.get_running_loop()
        delivered = threading.Event()
        task: asyncio.Task[tuple[orchestrator.PromptRun, int]] | None = None

        def cancel_and_wait() -> None:
            # in the run's thread: the task's cancel is sent, and handled, before the apply
            assert task is not None
            loop.call_soon_threadsafe(task.cancel)
            loop.call_soon_threadsafe(lambda: loop.call_soon(delivered.set))
            assert delivered.wait(CLI_LIMIT)

        async def in_run_thread() -> None:
            import trio

            await trio.to_thread.run_sync(cancel_and_wait)

        cancel_at_apply.append(in_run_thread)

        async def call() -> tuple[orchestrator.PromptRun, int]:
            run = await aio.prompt(
                "demo",
                'replace "colour" with "color" in *.md',
                cwd=project,
                policy="edit",
                apply=True,
            )
            current = asyncio.current_task()
            assert current is not None
            return run, current.cancelling()

        task = asyncio.ensure_future(call())
        return await task

    run, cancelling = asyncio.run(main())
    assert (run.status, run.applied, cancelling) == ("succeeded", True, 0)
    assert (project / "notes.md").read_text() == "color\n"
    assert runs(state_dir)[0].status == "succeeded"


async def test_a_cancel_once_the_apply_began_is_too_late_for_trio(
    project: Path, state_dir: Path, cancel_at_apply: list[Callable[[], Any]]
) -> None:
    """The scope is cancelled as the apply begins: run_pipeline returns the applied outcome."""
    import trio

    (project / "notes.md").write_text("colour\n")
    with trio.CancelScope() as scope:
        cancel_at_apply.append(scope.cancel)
        run = await orchestrator.runs.prompt(
            "demo",
            'replace "colour" with "color" in *.md',
            cwd=project,
            policy="edit",
            apply=True,
        )
    assert scope.cancel_called
    assert (run.status, run.applied) == ("succeeded", True)
    assert (project / "notes.md").read_text() == "color\n"


def test_a_cancel_before_the_point_of_no_return_applies_nothing(
    project: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token's cancel lands as the run concludes, before its status is final: nothing is
    applied, the run is recorded interrupted, the call raises RunCancelled."""
    (project / "notes.md").write_text("colour\n")
    token = CancelToken()
    real = orchestrator.runs.run._conclude

    async def conclude(*args: Any, **kwargs: Any) -> Any:
        token.cancel()
        return await real(*args, **kwargs)

    monkeypatch.setattr(orchestrator.runs.run, "_conclude", conclude)
    with pytest.raises(RunCancelled) as stopped:
        prompt_sync(
            "demo",
            'replace "colour" with "color" in *.md',
            cwd=project,
            policy="edit",
            apply=True,
            cancel=token,
        )
    assert stopped.value.run_id == runs(state_dir)[0].run_id
    assert (project / "notes.md").read_text() == "colour\n"
    assert runs(state_dir)[0].status == "interrupted"


CTRL_C_AT_APPLY = """
import os, signal, sys
from pathlib import Path

import trio

import orchestrator.runs.run as run_module
from orchestrator.runs import threaded
from orchestrator.runs.apply import apply_recorded
from orchestrator.sync import prompt_sync


async def ctrl_c_then_apply(*args, **kwargs):
    # as a terminal's Ctrl-C: SIGINT to the process, as the apply begins; the apply waits
    # until the main thread's handler has asked every live call to stop
    os.kill(os.getpid(), signal.SIGINT)
    while not all(call._level for call in list(threaded._LIVE)):
        await trio.sleep(0.01)
    return await apply_recorded(*args, **kwargs)


run_module.apply_recorded = ctrl_c_then_apply
project = Path(sys.argv[1])
prompt_sync(
    "demo", 'replace "colour" with "color" in *.md', cwd=project, policy="edit", apply=True
)
print("returned")
"""


def test_ctrl_c_once_the_apply_began_stops_the_program_and_says_the_run_finished(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """SIGINT as the apply begins: the program still stops with KeyboardInterrupt, whose note
    says the run finished; the changes are written and the run recorded succeeded."""
    (project / "notes.md").write_text("colour\n")
    path = tmp_path / "script.py"
    path.write_text(CTRL_C_AT_APPLY)
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(path), str(project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_LIMIT,
    )
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "returned" not in done.stdout
    [run] = runs(state_dir)
    assert f"run {run.run_id} was past its point of no return" in done.stderr
    assert "it finished succeeded" in done.stderr
    assert run.status == "succeeded"
    assert (project / "notes.md").read_text() == "color\n"
