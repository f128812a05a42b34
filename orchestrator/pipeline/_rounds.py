"""Rounds of an agent step with a check: running the check, and the prompt of the next round.

A step declared with ``check=`` (see :func:`~orchestrator.pipeline.step`) runs its check on
the branch directory after each turn; while it fails and rounds are left, the same session
gets a follow-up prompt made from the check's output. The loop itself is the agent step's
(``_agent_step``); this module holds what it calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..agent.content import check_prompt
from ..errors import UsageError
from ..protocol import types as t
from ..sandbox import Sandbox
from ._calls import call, prompt_input, run_verify
from .results import CheckResult, StepResult

__all__ = ["default_feedback", "feedback_prompt", "run_check", "with_feedback"]

#: how long a shell check may run (seconds) when the step's time allows it
CHECK_TIMEOUT = 600.0


def default_feedback(check: CheckResult, round: int) -> str:
    """The prompt of round ``round`` after ``check`` failed: what it said, and to fix it."""
    if check.timed_out:
        how = "timed out"
    elif check.exit_code is not None:
        how = f"failed (exit status {check.exit_code})"
    else:
        how = "failed"
    output = check.output.strip() or "(no output)"
    return (
        f"The check of your work {how}. Its output:\n\n{output}\n\n"
        "Please fix the problem; the check runs again when you end your turn."
    )


async def feedback_prompt(
    feedback: Callable[..., Any] | None, check: CheckResult, round: int
) -> Any:
    """The next round's prompt: ``feedback(check, round)`` (sync or async), or the default;
    a :class:`~orchestrator.errors.UsageError` when it returns no prompt."""
    if feedback is None:
        return default_feedback(check, round)
    if inspect.iscoroutinefunction(feedback):

        async def build() -> Any:
            return await feedback(check, round)

        prompt = await call(build, {})
    else:
        # in a thread the run abandons when cancelled: it may block (read a file, ask a
        # service), and the loop must stay free for Ctrl-C and the step's timeout
        prompt = await call(lambda: feedback(check, round), {}, abandon=True)
    try:
        return check_prompt(prompt)
    except UsageError as e:
        raise UsageError(f"a step's feedback must return a prompt: {e}") from None


def with_feedback(prompt: Any, feedback: Any) -> Any:
    """The step's prompt followed by a feedback prompt: what a new session that goes on with
    an earlier loop's work is told (the task, then what the last check said)."""
    task = prompt_input(prompt)
    more = prompt_input(feedback)
    if isinstance(task, str) and isinstance(more, str):
        return f"{task}\n\n{more}"
    parts: list[str | t.ContentBlock] = []
    for one in (task, more):
        if isinstance(one, str | Sequence):
            parts.extend([one] if isinstance(one, str) else one)
        else:
            parts.append(one)
    return parts


async def run_check(
    check: str | Callable[..., Any],
    directory: Path,
    result: StepResult,
    *,
    timeout: float | None,
    sandbox: Sandbox | None,
) -> CheckResult:
    """Run ``check`` on the branch directory: a shell command (reaped like every process,
    confined with ``sandbox``), or the pipeline's function of (directory, result).

    A Python check runs in a worker thread (an ``async`` one on the loop); what it raises fails
    the instance like an exception in a step. ``timeout`` bounds a shell command (None:
    :data:`CHECK_TIMEOUT`); a Python check is bounded by its caller's cancel scope: a sync one's
    thread is then abandoned (Python cannot stop it), left to finish in the background with
    its result ignored.
    """
    if isinstance(check, str):
        limit = CHECK_TIMEOUT if timeout is None else max(min(timeout, CHECK_TIMEOUT), 0.001)
        verify = await run_verify(check, directory, timeout=limit, sandbox=sandbox)
        return CheckResult.from_value(CheckResult.from_verify(verify))
    fn = check
    if inspect.iscoroutinefunction(fn):

        async def run() -> Any:
            return await fn(directory, result)

        value = await call(run, {})
    else:
        value = await call(lambda: fn(directory, result), {}, abandon=True)
    try:
        return CheckResult.from_value(value)
    except TypeError as e:
        raise UsageError(str(e)) from None
