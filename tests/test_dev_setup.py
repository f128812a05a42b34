"""``./dev`` sets up only what a command needs, and the real-agent install's rule for the tests.

``./dev`` runs here in a temporary copy (the script, ``pyproject.toml`` and the installer) whose
``.venv/bin/python`` is a stand-in that logs its arguments: pip, compileall, pytest and the demo
are only logged, the node installer runs for real (with this interpreter) against a PATH whose
``npm`` is a script that fails as an unreachable registry does.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import install_node_agents as installer  # noqa: E402

FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$DEV_LOG"
case "$1" in
    tools/*) exec "$REAL_PYTHON" "$@" ;;
esac
exit 0
"""
FAILING_NPM = """#!/bin/sh
echo "npm $*" >> "$DEV_LOG"
echo "npm error network request to https://registry.npmjs.org failed" >&2
exit 1
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of what ``./dev`` reads, with a logging stand-in for ``.venv/bin/python``."""
    root = tmp_path / "repo"
    (root / "tools").mkdir(parents=True)
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(ROOT / "dev", root / "dev")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy2(ROOT / "tools" / "install_node_agents.py", root / "tools")
    _executable(root / ".venv" / "bin" / "python", FAKE_PYTHON)
    tools = tmp_path / "bin"
    tools.mkdir()
    _executable(tools / "npm", FAILING_NPM)
    _executable(tools / "node", "#!/bin/sh\nexit 0\n")
    return root


def dev(repo: Path, *args: str, ci: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the copy's ``./dev`` with the failing npm first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "ORCHESTRATOR_NODE_CACHE")}
    env.update(
        PATH=f"{repo.parent / 'bin'}:/usr/bin:/bin",
        DEV_LOG=str(repo / "log"),
        REAL_PYTHON=sys.executable,
        PYTHONPATH="",
    )
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [str(repo / "dev"), *args], env=env, capture_output=True, text=True, timeout=60
    )


def log(repo: Path) -> list[str]:
    """The commands the stand-ins ran, and empties the log."""
    path = repo / "log"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def test_demo_installs_the_package_alone_and_never_the_node_agents(repo: Path) -> None:
    """``./dev demo`` pip-installs the package without extras, then runs the demo; no npm."""
    done = dev(repo, "demo", "--apply")
    assert done.returncode == 0, done.stderr
    ran = log(repo)
    assert "python -m pip install --quiet --disable-pip-version-check -e ." in ran
    assert ran[-1] == "python examples/demo.py --apply"
    assert not any("install_node_agents" in line or line.startswith("npm") for line in ran)


def test_a_fresh_stamp_skips_pip(repo: Path) -> None:
    """The second ``./dev demo`` installs nothing; a development install serves it too."""
    assert dev(repo, "demo").returncode == 0
    log(repo)
    assert dev(repo, "demo").returncode == 0
    assert not any("pip" in line for line in log(repo))
    (repo / ".venv" / ".installed-package").unlink()
    (repo / ".venv" / ".installed").touch()
    assert dev(repo, "demo").returncode == 0
    assert not any("pip" in line for line in log(repo))


def test_test_with_npm_unreachable_warns_and_runs_the_tests(repo: Path) -> None:
    """Outside CI a failed npm install is a warning: pytest runs, and npm is not retried."""
    done = dev(repo, "test", "-q")
    assert done.returncode == 0, done.stderr
    ran = log(repo)
    assert "python -m pip install --quiet --disable-pip-version-check -e .[dev]" in ran
    assert any(line.startswith("npm install") for line in ran)
    assert ran[-1] == "python -m pytest -q"
    assert "warning: npm install failed with exit status 1" in done.stderr
    assert "skip" in done.stderr
    again = dev(repo, "test")
    assert again.returncode == 0, again.stderr
    ran = log(repo)
    assert not any(line.startswith("npm") for line in ran)
    assert ran[-1] == "python -m pytest"
    assert "the last install of the node agents failed" in again.stderr


def test_test_in_ci_stops_when_the_install_fails(repo: Path) -> None:
    """In CI with npm present a failed install is an error: exit 1 and no pytest."""
    done = dev(repo, "test", ci=True)
    assert done.returncode == 1
    assert "required in CI" in done.stderr
    assert not any(line.startswith("python -m pytest") for line in log(repo))


def test_unknown_command_is_a_usage_error_and_help_is_not(repo: Path) -> None:
    """An unknown command exits 2 with the usage on stderr; no argument prints it, exit 0."""
    bad = dev(repo, "demoo")
    assert bad.returncode == 2
    assert "unknown command: demoo" in bad.stderr
    assert "./dev demo" in bad.stderr
    plain = dev(repo)
    assert plain.returncode == 0
    assert "./dev test" in plain.stdout
    assert log(repo) == []


def _failing(_: Path) -> None:
    raise subprocess.CalledProcessError(1, ["npm", "install"])


def _present(tool: str) -> str:
    return f"/usr/bin/{tool}"


def test_for_tests_without_npm_is_a_skip_even_in_ci(tmp_path: Path) -> None:
    """No npm on PATH: exit 0 and a line saying the node tests skip."""
    code, message = installer.for_tests(tmp_path, ci=True, which=lambda _: None)
    assert code == 0
    assert "npm not found on PATH" in message


def test_for_tests_retries_once_the_pins_change(tmp_path: Path) -> None:
    """A recorded failure is skipped while the pins match, and retried once they differ."""
    calls: list[Path] = []

    def failing(cache: Path) -> None:
        calls.append(cache)
        _failing(cache)

    first = installer.for_tests(tmp_path, ci=False, which=_present, installer=failing)
    second = installer.for_tests(tmp_path, ci=False, which=_present, installer=failing)
    assert (first[0], second[0], len(calls)) == (0, 0, 1)
    record = tmp_path / installer.FAILED
    record.write_text("@old/package@0.0.1\n\nnpm install failed with exit status 1\n")
    installer.for_tests(tmp_path, ci=False, which=_present, installer=failing)
    assert len(calls) == 2


def test_for_tests_in_ci_ignores_a_recorded_failure(tmp_path: Path) -> None:
    """In CI every run tries the install, and a failure is exit 1."""
    calls: list[Path] = []

    def failing(cache: Path) -> None:
        calls.append(cache)
        _failing(cache)

    installer.for_tests(tmp_path, ci=False, which=_present, installer=failing)
    code, message = installer.for_tests(tmp_path, ci=True, which=_present, installer=failing)
    assert (code, len(calls)) == (1, 2)
    assert message.startswith("npm install failed with exit status 1")


def test_for_tests_success_clears_the_record(tmp_path: Path) -> None:
    """An install that works removes the recorded failure."""
    installer.for_tests(tmp_path, ci=False, which=_present, installer=_failing)
    (tmp_path / installer.FAILED).write_text("changed pins\n\nold failure\n")
    done = installer.for_tests(tmp_path, ci=False, which=_present, installer=lambda _: None)
    assert done == (0, "")
    assert not (tmp_path / installer.FAILED).exists()
