"""The cluster options through the console script, without a cluster: a bad address, a rate
without a cluster, an address nobody answers, Ray missing, ``--cluster local`` over the
environment variable: each one line, exit 2, nothing recorded."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from run_helpers import CLI, as_json, one_line_error, run_console

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")

PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def fix() -> str:
    return 'replace "old" with "new" in app.txt\\n'
"""


def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    project = tmp_path / "p"
    project.mkdir()
    (project / "app.txt").write_text("old\n")
    path = tmp_path / "fix.py"
    path.write_text(PIPELINE)
    state = tmp_path / "state"
    return project, path, {"ORCHESTRATOR_STATE_DIR": str(state), "ORCHESTRATOR_CLUSTER": ""}


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def runs(tmp_path: Path, env: dict[str, str]) -> list[object]:
    done = await run_console("runs", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    return list(as_json(done)["runs"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cluster", "not an address"], "not a cluster address: 'not an address'"),
        (["--cluster", "ray:"], "nothing after ray:"),
        (["--cluster", "host:99999"], "not a cluster address"),
        (["--rate", "demo=2/s"], "--rate limits prompts across a cluster: it needs --cluster"),
        (["--cluster", "127.0.0.1:1", "--rate", "demo"], "--rate 'demo': expected AGENT=N/PERIOD"),
        (["--cluster", "127.0.0.1:1", "--rate", "demo=fast"], "demo=fast"),
    ],
)
async def test_bad_cluster_options_are_refused(tmp_path: Path, args: list[str], says: str) -> None:
    """A bad address or rate is one line on stderr, exit 2, before anything is recorded."""
    project, path, env = setup(tmp_path)
    done = await run_console(
        "run", str(path), "--cwd", str(project), "--policy", "edit", *args, cwd=tmp_path, env=env
    )
    line = one_line_error(done)
    assert says.split(":")[0] in line, line
    assert await runs(tmp_path, env) == []


async def test_an_address_nobody_answers_is_one_line(tmp_path: Path) -> None:
    """run, compare, batch and resume with --cluster at a closed port: 'cannot reach', exit 2,
    no traceback and nothing recorded; the environment variable does the same."""
    project, path, env = setup(tmp_path)
    address = f"127.0.0.1:{closed_port()}"
    for args in (
        ["run", str(path), "--cwd", str(project), "--cluster", f"ray:{address}"],
        ["compare", "--agent", "demo", "--cwd", str(project), "--cluster", address, "hello"],
        ["batch", str(path), "--repo", str(project), "--cluster", address],
    ):
        line = one_line_error(await run_console(*args, cwd=tmp_path, env=env))
        assert f"cannot reach the Ray cluster at {address}" in line, line
    from_env = {**env, "ORCHESTRATOR_CLUSTER": f"ray:{address}"}
    done = await run_console("run", str(path), "--cwd", str(project), cwd=tmp_path, env=from_env)
    assert "cannot reach the Ray cluster" in one_line_error(done)
    assert await runs(tmp_path, env) == []


async def test_cluster_local_overrides_the_environment(tmp_path: Path) -> None:
    """--cluster local runs on this machine whatever ORCHESTRATOR_CLUSTER says."""
    project, path, env = setup(tmp_path)
    env = {**env, "ORCHESTRATOR_CLUSTER": f"127.0.0.1:{closed_port()}"}
    done = await run_console(
        "run", str(path), "--cwd", str(project), "--policy", "edit", "--cluster", "local",
        "--json", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert as_json(done)["status"] == "succeeded"


async def test_without_ray_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    """With Ray not importable, --cluster says to install the [ray] extra (exit 2)."""
    project, path, env = setup(tmp_path)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = {**env, "PYTHONPATH": str(hide)}
    done = await run_console(
        "run", str(path), "--cwd", str(project), "--cluster", "127.0.0.1:6379",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    line = one_line_error(done)
    assert "Ray is not installed: pip install 'acp-orchestrator[ray]'" in line
