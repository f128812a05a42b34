"""The README's example of testing a pipeline offline (examples/testing/) runs as a user's
test suite would, with the plugin loaded through its entry point, and writes nothing to the
user's state directory, home or config."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from test_readme_examples import BLOCKS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "testing"
FILES = ("fix_typos.py", "test_fix_typos.py")
#: the environment variables that lead to the user's state directory and config
SENTINELS = ("HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "ORCHESTRATOR_STATE_DIR")

UNPROTECTED = """
from pathlib import Path

from orchestrator import prompt_sync
from orchestrator.testing import InProcessAgents


def test_without_the_state_fixture(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("x\\n")
    run = prompt_sync("demo", 'append "y" to a.md', cwd=tmp_path, connector=InProcessAgents())
    assert run.status == "succeeded"
"""


def installed_plugin(site: Path) -> None:
    """Make ``site`` hold what installing the package registers for pytest: a distribution
    whose entry points are the ``pytest11`` ones pyproject.toml declares."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    info = site / "acp_orchestrator_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acp-orchestrator-plugin\nVersion: 0\n"
    )
    lines = [f"{name} = {target}" for name, target in declared["entry-points"]["pytest11"].items()]
    (info / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")


def run_user_suite(tmp_path: Path, files: dict[str, str]) -> tuple[str, int, Path]:
    """Run pytest on ``files`` in a directory of their own, as a user's suite: the plugin
    installed, every way to the user's state directory and config pointing into sentinel
    directories. Its output, exit code and the sentinels' parent."""
    suite, sentinels, site = tmp_path / "suite", tmp_path / "sentinels", tmp_path / "site"
    suite.mkdir()
    for name, text in files.items():
        (suite / name).write_text(text)
    installed_plugin(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "XDG_"))}
    for name in SENTINELS:
        (sentinels / name).mkdir(parents=True)
        env[name] = str(sentinels / name)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr, done.returncode, sentinels


def test_the_readme_shows_the_example_files_as_they_are() -> None:
    """Each file of examples/testing/ is a python block of the README, word for word."""
    shown = {b.text for b in BLOCKS if b.language == "python"}
    for name in FILES:
        assert (EXAMPLE / name).read_text() in shown, f"the README does not show {name} as it is"


def test_the_example_passes_and_writes_nothing_to_the_users_state(tmp_path: Path) -> None:
    """The example's tests pass with the plugin found through its entry point; nothing
    appears in HOME, XDG_STATE_HOME, XDG_CONFIG_HOME or ORCHESTRATOR_STATE_DIR."""
    files = {name: (EXAMPLE / name).read_text() for name in FILES}
    output, code, sentinels = run_user_suite(tmp_path, files)
    assert code == 0, output
    assert "2 passed" in output, output
    # the sentinel directories themselves, empty
    assert sorted(sentinels.rglob("*")) == sorted(sentinels / n for n in SENTINELS)


def test_without_the_fixture_the_same_suite_writes_to_the_sentinel(tmp_path: Path) -> None:
    """The check above can fail: a test that runs the library without the state fixture, in
    the same environment, leaves its run in the sentinel state directory."""
    output, code, sentinels = run_user_suite(tmp_path, {"test_unprotected.py": UNPROTECTED})
    assert code == 0, output
    assert (sentinels / "ORCHESTRATOR_STATE_DIR" / "runs").is_dir()
