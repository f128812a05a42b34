"""Pieces of the runner: verify commands leave no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from orchestrator.pipeline._calls import run_verify


def sleeping(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


async def test_verify_reports_exit_code_and_output(tmp_path: Path) -> None:
    """The exit code and the tail of the output come back."""
    with trio.fail_after(20):
        result = await run_verify("echo checked; exit 3", tmp_path)
    assert (result.exit_code, result.output) == (3, "checked")


async def test_verify_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    """A command past its timeout is reported 124 and everything it started is killed."""
    with trio.fail_after(20):
        result = await run_verify("sleep 31.25 & sleep 31.25", tmp_path, timeout=0.5)
    assert result.exit_code == 124
    with trio.fail_after(10):
        while sleeping("31.25"):  # noqa: ASYNC110 - polling /proc, nothing to wait on
            await trio.sleep(0.05)


async def test_verify_cancelled_kills_the_whole_group(tmp_path: Path) -> None:
    """Cancelling the run while a verify command runs leaves none of its processes."""
    with trio.fail_after(20):
        with trio.move_on_after(0.5):
            await run_verify("sleep 32.25 & sleep 32.25", tmp_path)
        while sleeping("32.25"):  # noqa: ASYNC110 - polling /proc, nothing to wait on
            await trio.sleep(0.05)
