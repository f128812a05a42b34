"""Starting a process confined by a :class:`~orchestrator.sandbox.Sandbox`.

:func:`confine` prepares one process: it asks the kernel for its Landlock version (refusing,
with :class:`~orchestrator.errors.SandboxUnavailable`, where there is none), makes the process's
private temp directory (and its home when the sandbox names none), points the environment at
them, and wraps the command in the launcher that applies the rules before it executes the
command. Agent processes, terminal commands and verify commands start this way; the caller
removes the temp directory with :meth:`Confined.release` once the process is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

from ..sandbox import XDG_DIRS, Ruleset, Sandbox, build_ruleset, confined_environment, kernel_abi

__all__ = ["Confined", "confine", "which"]


@frozen
class Confined:
    """One process's confinement: what to execute, with which environment, under which rules."""

    #: the launcher's command line, ending with the command
    argv: tuple[str, ...]
    #: the process's whole environment
    env: Mapping[str, str]
    #: the rules the launcher applies
    ruleset: Ruleset
    #: the private temp directory (``TMPDIR``), removed by :meth:`release`
    tmp: str
    #: the home directory (``HOME``)
    home: str

    def release(self) -> None:
        """Remove the private temp directory (blocking; call it once the process is gone)."""
        shutil.rmtree(self.tmp, ignore_errors=True)


def confine(
    command: Sequence[str],
    sandbox: Sandbox,
    *,
    cwd: str,
    environ: Mapping[str, str],
    keep: Iterable[str] = (),
    writable: Iterable[str] = (),
) -> Confined:
    """Prepare ``command`` to run in ``cwd`` confined by ``sandbox`` (blocking: makes dirs).

    ``environ`` is the process's environment before confinement; the names in ``keep`` are
    left as they are (the caller's deliberate values), the other home and temp variables point
    at the process's own directories. ``cwd``, the home, the temp directory and ``writable``
    (paths the caller trusts, never the agent's words) are writable.
    """
    abi = kernel_abi()
    tmp = tempfile.mkdtemp(prefix="orchestrator-sandbox-")
    try:
        home = sandbox.home or os.path.join(tmp, "home")
        os.makedirs(home, exist_ok=True)
        kept = set(keep)
        env = confined_environment(environ, home=home, tmp=tmp, keep=kept)
        for name in XDG_DIRS:  # the XDG directories the home's subdirectories stand for
            if name not in kept:
                os.makedirs(env[name], exist_ok=True)
        own = [os.path.abspath(cwd), home, tmp, *writable]
        ruleset = build_ruleset(sandbox, abi=abi, writable=own)
        return Confined(tuple(ruleset.command(command)), env, ruleset, tmp, home)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def which(program: str, env: Mapping[str, str], cwd: str) -> str | None:
    """Where ``program`` is found with ``env``'s PATH (relative paths from ``cwd``), or None."""
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))
