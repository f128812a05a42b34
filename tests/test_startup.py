"""Start-up cost control: structlog is imported without rich, and rich still imports."""

from __future__ import annotations

import subprocess
import sys


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
