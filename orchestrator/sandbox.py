"""Confining agent processes with Landlock: what may be written, read and connected to.

A :class:`Sandbox` is what a user configures; :func:`build_ruleset` turns it, with the paths of
one process, into a :class:`Ruleset` for the kernel's Landlock ABI version; the ruleset's
:meth:`~Ruleset.command` wraps a command line in the launcher (:mod:`orchestrator._landlock`),
which confines itself and then executes the command. This module is pure apart from
:func:`kernel_abi`, which asks the kernel.

What a confined process may do:

- **write** (create, change, delete, rename, execute) only beneath its working directory (an
  agent's branch directory), its home, its private temp directory and the paths of
  :attr:`Sandbox.write`; and to a few devices (``/dev/null``, ``/dev/zero``, ``/dev/full``,
  ``/dev/random``, ``/dev/urandom``, ``/dev/tty``, ``/dev/ptmx``, ``/dev/pts``);
- **read** and execute beneath the paths of :attr:`Sandbox.read` (default: the whole
  filesystem);
- **connect** over TCP only to the ports of :attr:`Sandbox.ports`, when given (Landlock ABI 4);
- **signal** and reach abstract unix sockets only inside its own sandbox (ABI 6, when the
  kernel has it).

Rights the kernel's ABI lacks are left out (best effort, as the kernel documentation advises):
before ABI 2 files cannot be moved or linked between directories at all; before ABI 3
truncating a file outside the writable paths is not prevented; before ABI 5 device ioctls are
not. Port rules are not best effort: asked for on a kernel without them, the sandbox is refused
(:class:`~orchestrator.errors.SandboxUnavailable`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs
from attrs import field, frozen

from ._landlock import (
    ACCESS_FS,
    ACCESS_NET_CONNECT_TCP,
    LAUNCHER,
    SCOPE_ABSTRACT_UNIX_SOCKET,
    SCOPE_SIGNAL,
    abi_version,
)
from .errors import SandboxUnavailable, UsageError

__all__ = [
    "DEVICES",
    "PathRule",
    "Ruleset",
    "Sandbox",
    "SandboxChoice",
    "build_ruleset",
    "choose_sandbox",
    "confined_environment",
    "kernel_abi",
    "rights_json",
    "sandbox_choice",
]


def _right(*names: str) -> int:
    value = 0
    for name in names:
        value |= ACCESS_FS[name][0]
    return value


#: what a readable path grants
READ_ACCESS = _right("execute", "read_file", "read_dir")
#: what a writable path grants: every filesystem right
WRITE_ACCESS = _right(*ACCESS_FS)
#: what the allowed devices grant
DEVICE_ACCESS = _right("read_file", "write_file", "truncate", "ioctl_dev")
#: devices every confined process may read and write
DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
)
#: the XDG base directories a confined process gets inside its home
XDG_DIRS: Mapping[str, str] = {
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}
_SCOPES = {"abstract_unix_socket": SCOPE_ABSTRACT_UNIX_SOCKET, "signal": SCOPE_SIGNAL}


def _paths(value: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise UsageError(f"sandbox paths are a list of paths, not the string {value!r}")
    out: list[str] = []
    for path in value:
        if not isinstance(path, str) or not path or "\0" in path:
            raise UsageError(f"sandbox path {path!r} is not a path")
        expanded = os.path.expanduser(path)
        if not os.path.isabs(expanded):
            raise UsageError(f"sandbox path {path!r} must be absolute (or start with ~)")
        out.append(os.path.normpath(expanded))
    return tuple(dict.fromkeys(out))


def _ports(value: Iterable[int] | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    ports: list[int] = []
    for port in value:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise UsageError(f"sandbox port {port!r} is not a TCP port (1-65535)")
        ports.append(port)
    return tuple(sorted(set(ports)))


def _home(value: str | None) -> str | None:
    return None if value is None else _paths((value,))[0]


@frozen
class Sandbox:
    """How a confined agent (and its terminal commands) may use the machine.

    Its working directory (the branch directory), its home and its private temp directory are
    always writable; these fields add to that. Paths may start with ``~``.
    """

    #: trees it may read and execute from (default: the whole filesystem)
    read: tuple[str, ...] = field(default=("/",), converter=_paths)
    #: more trees it may write to
    write: tuple[str, ...] = field(default=(), converter=_paths)
    #: the only TCP ports it may connect to (on any address); None: any port
    ports: tuple[int, ...] | None = field(default=None, converter=_ports)
    #: its home directory (writable; made when missing); None: a private one (for a run, one
    #: per agent under the state directory, kept between runs; else a fresh one per process)
    home: str | None = field(default=None, converter=_home)

    def with_home(self, home: str) -> Sandbox:
        """The same rules with ``home`` as the home directory."""
        return attrs.evolve(self, home=home)

    def to_json(self) -> dict[str, Any]:
        """The rules as JSON values (as recorded with a run)."""
        return {
            "read": list(self.read),
            "write": list(self.write),
            "ports": None if self.ports is None else list(self.ports),
            "home": self.home,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sandbox:
        """The rules from :meth:`to_json`'s form."""
        ports = data.get("ports")
        return cls(
            read=tuple(data.get("read") or ()),
            write=tuple(data.get("write") or ()),
            ports=None if ports is None else tuple(ports),
            home=data.get("home"),
        )


#: a layer's word on confinement: its rules, ``True`` (confine, with the rules of another layer),
#: or ``False``/``None`` (it does not ask)
SandboxChoice: TypeAlias = Sandbox | bool | None


def choose_sandbox(*layers: SandboxChoice, rules: Sandbox | None = None) -> Sandbox | None:
    """The sandbox a process runs in, from the layers that may ask for one, most specific first.

    Confined when any layer asks (``True`` or a :class:`Sandbox`): no layer turns off what
    another asked for. The rules are the most specific layer's own, else ``rules``, else the
    defaults. None: unconfined.
    """
    for layer in layers:  # anything else would read as "not asked": refused, not ignored
        sandbox_choice(layer)
    if not any(layer is True or isinstance(layer, Sandbox) for layer in layers):
        return None
    for layer in layers:
        if isinstance(layer, Sandbox):
            return layer
    return rules if rules is not None else Sandbox()


def sandbox_choice(value: Any, what: str = "") -> SandboxChoice:
    """``value`` checked as a :data:`SandboxChoice`; else a :class:`UsageError` (naming
    ``what``) that says what it may be."""
    if value is None or isinstance(value, bool | Sandbox):
        return value
    raise UsageError(
        f"{what + ': ' if what else ''}sandbox must be None, True, False or a Sandbox "
        f"(orchestrator.sandbox.Sandbox), not {value!r}"
    )


# --------------------------------------------------------------------------- the kernel


def kernel_abi() -> int:
    """The kernel's Landlock ABI version; :class:`SandboxUnavailable` when it has none."""
    abi, why = abi_version()
    if abi < 1:
        raise SandboxUnavailable(f"cannot confine agents: {why}")
    return abi


def _fs_rights(abi: int) -> int:
    return _right(*(name for name, (_, since) in ACCESS_FS.items() if since <= abi))


def _scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def rights_json(abi: int) -> dict[str, Any]:
    """What the kernel's ABI lets a sandbox enforce, by name (as recorded with a run)."""
    handled = [name for name, (_, since) in ACCESS_FS.items() if since <= abi]
    return {
        "landlockAbi": abi,
        "fs": handled,
        "fsMissing": [name for name in ACCESS_FS if name not in handled],
        "net": ["connect_tcp"] if abi >= 4 else [],
        "scoped": [name for name, bit in _SCOPES.items() if _scopes(abi) & bit],
    }


# --------------------------------------------------------------------------- rulesets


@frozen
class PathRule:
    """Rights beneath one path."""

    path: str
    #: Landlock filesystem access bits
    access: int


@frozen
class Ruleset:
    """The Landlock rules of one process, for one ABI version (see :func:`build_ruleset`)."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    paths: tuple[PathRule, ...]
    ports: tuple[int, ...]

    def launcher_args(self) -> list[str]:
        """The rules as the launcher's arguments (see :mod:`orchestrator._landlock`)."""
        args = ["-f", f"{self.handled_fs:x}"]
        if self.handled_net:
            args += ["-n", f"{self.handled_net:x}"]
        if self.scoped:
            args += ["-s", f"{self.scoped:x}"]
        for rule in self.paths:
            args += ["-p", f"{rule.access:x}", rule.path]
        for port in self.ports:
            args += ["-t", str(port)]
        return args

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run confined: the launcher applies the rules, then executes ``argv``.

        The interpreter runs isolated (``-I -S``): no ``PYTHON*`` variable, user site or
        ``sitecustomize`` of the command's environment is read before the rules hold.
        """
        if not sys.executable:
            raise SandboxUnavailable("cannot confine agents: no Python interpreter path")
        return [sys.executable, "-I", "-S", LAUNCHER, *self.launcher_args(), "--", *argv]

    @property
    def writable(self) -> tuple[str, ...]:
        """The paths whose rules allow writing."""
        write = _right("write_file")
        return tuple(r.path for r in self.paths if r.access & write and r.path not in DEVICES)

    @property
    def readable(self) -> tuple[str, ...]:
        """The paths whose rules allow reading only."""
        write = _right("write_file")
        return tuple(r.path for r in self.paths if not r.access & write)


def build_ruleset(sandbox: Sandbox, *, abi: int, writable: Sequence[str]) -> Ruleset:
    """The rules of one process confined by ``sandbox`` on a kernel of Landlock ABI ``abi``.

    ``writable`` are the process's own paths (working directory, home, temp directory). Rights
    the ABI lacks are left out; port rules on a kernel without them are refused, like a kernel
    without Landlock (:class:`SandboxUnavailable`).
    """
    if abi < 1:
        raise SandboxUnavailable("cannot confine agents: this kernel has no Landlock")
    if sandbox.ports is not None and abi < 4:
        raise SandboxUnavailable(
            f"cannot limit TCP ports: that needs Landlock ABI 4 (Linux 6.7); this kernel has "
            f"ABI {abi}"
        )
    handled = _fs_rights(abi)
    rules: dict[str, int] = {}

    def grant(paths: Iterable[str], access: int) -> None:
        for path in paths:
            key = os.path.normpath(path)
            rules[key] = rules.get(key, 0) | (access & handled)

    grant(sandbox.read, READ_ACCESS)
    grant(writable, WRITE_ACCESS)
    grant(sandbox.write, WRITE_ACCESS)
    grant(DEVICES, DEVICE_ACCESS)
    return Ruleset(
        abi=abi,
        handled_fs=handled,
        handled_net=ACCESS_NET_CONNECT_TCP if sandbox.ports is not None else 0,
        scoped=_scopes(abi),
        paths=tuple(PathRule(path, access) for path, access in rules.items()),
        ports=sandbox.ports or (),
    )


def confined_environment(
    environ: Mapping[str, str], *, home: str, tmp: str, keep: Iterable[str] = ()
) -> dict[str, str]:
    """``environ`` pointing a confined process at its own home and temp directory.

    Sets ``HOME``, ``TMPDIR``/``TMP``/``TEMP`` and the XDG base directories (inside the home),
    except the names in ``keep`` (variables the caller set on purpose).
    """
    kept = set(keep)
    env = dict(environ)
    values = {"HOME": home, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp}
    values.update({name: os.path.join(home, sub) for name, sub in XDG_DIRS.items()})
    for name, value in values.items():
        if name not in kept:
            env[name] = value
    return env
