"""The services of one branch's session: its fs, terminals, permissions and elicitation.

Every way of running an agent (a prompt, a comparison, a pipeline step) gives its session the
services from :func:`open_branch_services`, so a policy decides the same way, terminals run
and are harvested the same way, and the fs requests reach the same branch, whatever command
started the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from attrs import frozen

from ..policy import PolicySet
from ..sandbox import Sandbox
from ..vfs import Workdir
from .branchfs import BranchFileSystem
from .elicitation import PolicyElicitationService
from .permissions import Escalate, PolicyPermissionService
from .services import ClientServices
from .terminals import open_terminal_service

__all__ = ["BranchServices", "open_branch_services"]


@frozen
class BranchServices:
    """What :func:`open_branch_services` made for one branch."""

    #: the services to install for the session (the branch's fs always among them)
    services: ClientServices
    #: the branch's fs service (its workdir is harvested after the turn)
    fs: BranchFileSystem
    #: the policy's permission service (its records are the turn's audit), or None when the
    #: caller replaced the permission service
    permission: PolicyPermissionService | None


@asynccontextmanager
async def open_branch_services(
    workdir: Workdir,
    policy: PolicySet,
    *,
    escalate: Escalate | None = None,
    replace: ClientServices | None = None,
    env_passthrough: Iterable[str] = (),
    sandbox: Sandbox | None = None,
) -> AsyncIterator[BranchServices]:
    """The services of a session on ``workdir``'s branch, under ``policy``.

    Terminals run in the branch directory, their commands (and the variables a request sets
    for them) vetted by the same permission service, with the basic environment plus the
    variables named by ``env_passthrough``; what a command changed on disk is harvested into
    the branch when it exits. ``replace`` swaps in the caller's permission, terminal and
    elicitation services (the branch's fs service is always installed). The terminals are
    killed on the way out. With ``sandbox``, terminal commands run confined by Landlock to the
    branch directory.
    """
    fs = BranchFileSystem(workdir)
    permission = PolicyPermissionService(policy, escalate=escalate)
    async with open_terminal_service(
        command_check=permission.check_command,
        on_exit=fs.on_terminal_exit,
        env_passthrough=env_passthrough,
        sandbox=sandbox,
    ) as terminals:
        base = replace or ClientServices(
            terminal=terminals,
            permission=permission,
            elicitation=PolicyElicitationService.from_policy(policy),
        )
        services = ClientServices(
            fs=fs,
            terminal=base.terminal,
            permission=base.permission,
            elicitation=base.elicitation,
        )
        yield BranchServices(services, fs, None if replace is not None else permission)
