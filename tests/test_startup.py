"""Start-up cost control: structlog is imported without rich, and rich still imports."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from run_helpers import CLI


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_structlog_import_skips_rich() -> None:
    """After importing orchestrator, importing structlog does not import rich."""
    assert run("import orchestrator, structlog, sys; print('rich' in sys.modules)") == "False"


def test_rich_still_imports_for_the_live_view() -> None:
    """rich itself imports normally, after structlog and on its own."""
    code = "import orchestrator, structlog, rich.live, sys; print('rich.live' in sys.modules)"
    assert run(code) == "True"


def test_console_logging_still_renders_exceptions() -> None:
    """structlog's console renderer formats an exception without rich."""
    code = (
        "import orchestrator, structlog, io\n"
        "out = io.StringIO()\n"
        "structlog.configure(processors=[structlog.dev.ConsoleRenderer(colors=False)],"
        " logger_factory=structlog.PrintLoggerFactory(out))\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n"
        "    structlog.get_logger().exception('failed')\n"
        "print('ZeroDivisionError' in out.getvalue())"
    )
    assert run(code) == "True"


HEAVY = ("trio", "structlog", "rich", "attrs", "orchestrator.protocol", "orchestrator.runs")


def imported(argv: list[str]) -> tuple[int, set[str]]:
    """The exit code of ``python -X importtime ARGV`` and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, check=False
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done.returncode, modules


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["prompt"], ["no-such-command"]])
def test_console_script_takes_the_same_fast_exit_as_python_m(args: list[str]) -> None:
    """``orchestrator ARGS`` and ``python -m orchestrator ARGS`` exit alike, importing the same
    modules of the package and nothing heavy, for help, the version and usage errors."""
    assert CLI.exists(), CLI
    script_code, script = imported([str(CLI), *args])
    module_code, module = imported(["-m", "orchestrator", *args])
    assert script_code == module_code == (0 if args in (["--help"], ["--version"]) else 2)
    ours = {m for m in script | module if m.startswith("orchestrator")}
    assert {m for m in script if m.startswith("orchestrator")} == ours - {"orchestrator.__main__"}
    assert not {m for m in script | module if m.split(".")[0] in HEAVY or m.startswith(HEAVY)}


def test_console_script_and_python_m_run_the_same_entry() -> None:
    """The console script is ``entry`` (no interpreter teardown), as ``python -m`` is."""
    root = Path(__file__).resolve().parent.parent
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"orchestrator": "orchestrator.cli:entry"}
    assert (
        "from orchestrator.cli import entry" in (root / "orchestrator" / "__main__.py").read_text()
    )
    assert "from orchestrator.cli import entry" in CLI.read_text()
