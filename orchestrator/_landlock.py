"""Landlock through direct system calls, and the launcher that confines a command before it runs.

Standard library only, and no import of the package: the launcher runs as a script
(``python -I -S .../_landlock.py RULES -- COMMAND...``) for every confined process, so its start-up
is the interpreter's and nothing more. It restricts itself (``PR_SET_NO_NEW_PRIVS``,
``landlock_create_ruleset``, ``landlock_add_rule``, ``landlock_restrict_self``) and then
``exec``-s the command, which inherits the restriction with all its descendants. When any step
fails it exits with :data:`EXIT_UNCONFINED` and one line on stderr: it never runs the command
unconfined.

Rules on its command line, numbers in hexadecimal::

    -f HANDLED_FS  -n HANDLED_NET  -s SCOPED     the ruleset's handled rights (0 when absent)
    -p ACCESS PATH                                a path-beneath rule (repeatable)
    -t PORT                                       a TCP port ``connect`` may reach (repeatable)
    -- COMMAND ARGS...

What a rule means is decided by :mod:`orchestrator.sandbox`; here the numbers are only carried
out. A path that does not exist is skipped (it grants nothing); on a path that is not a directory
only the rights that apply to files are kept, as the kernel requires.

The system call numbers (444, 445, 446) are the same on x86_64, aarch64 and every other Linux
architecture of the unified system call table.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
from collections.abc import Sequence

__all__ = [
    "ACCESS_FS",
    "ACCESS_NET_BIND_TCP",
    "ACCESS_NET_CONNECT_TCP",
    "EXIT_UNCONFINED",
    "FILE_ACCESS",
    "LAUNCHER",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
    "LaunchRules",
    "abi_version",
    "main",
    "parse_rules",
    "restrict_self",
    "rule_access",
]

# --------------------------------------------------------------------------- the kernel's ABI

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2
PR_SET_NO_NEW_PRIVS = 38

#: filesystem access rights, by name, with the ABI version that introduced each
ACCESS_FS: dict[str, tuple[int, int]] = {
    "execute": (1 << 0, 1),
    "write_file": (1 << 1, 1),
    "read_file": (1 << 2, 1),
    "read_dir": (1 << 3, 1),
    "remove_dir": (1 << 4, 1),
    "remove_file": (1 << 5, 1),
    "make_char": (1 << 6, 1),
    "make_dir": (1 << 7, 1),
    "make_reg": (1 << 8, 1),
    "make_sock": (1 << 9, 1),
    "make_fifo": (1 << 10, 1),
    "make_block": (1 << 11, 1),
    "make_sym": (1 << 12, 1),
    "refer": (1 << 13, 2),
    "truncate": (1 << 14, 3),
    "ioctl_dev": (1 << 15, 5),
}
#: the rights a rule on a file (not a directory) may grant
FILE_ACCESS = (
    ACCESS_FS["execute"][0]
    | ACCESS_FS["write_file"][0]
    | ACCESS_FS["read_file"][0]
    | ACCESS_FS["truncate"][0]
    | ACCESS_FS["ioctl_dev"][0]
)
#: network rights (ABI 4)
ACCESS_NET_BIND_TCP = 1 << 0
ACCESS_NET_CONNECT_TCP = 1 << 1
#: IPC scopes (ABI 6): no connecting to abstract unix sockets, no signals, outside the domain
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

#: the launcher's exit status when it could not confine the command (it did not run it)
EXIT_UNCONFINED = 125
#: this file, the launcher script
LAUNCHER = os.path.abspath(__file__)


class _Kernel:
    """The C side: ctypes, the kernel's structs and libc, made on first use (importing ctypes
    costs a few milliseconds that runs without a sandbox never pay)."""

    def __init__(self) -> None:
        import ctypes

        class RulesetAttr(ctypes.Structure):
            _fields_ = (
                ("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64),
            )

        class PathBeneathAttr(ctypes.Structure):
            _pack_ = 1  # packed in the kernel's header
            _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))

        class NetPortAttr(ctypes.Structure):
            _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))

        self.c = ctypes
        self.RulesetAttr = RulesetAttr
        self.PathBeneathAttr = PathBeneathAttr
        self.NetPortAttr = NetPortAttr
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.libc.prctl.restype = ctypes.c_int

    def call(self, number: int, *args: object) -> int:
        result = int(self.libc.syscall(self.c.c_long(number), *args))
        if result < 0:
            code = self.c.get_errno()
            raise OSError(code, os.strerror(code))
        return result


_KERNEL: _Kernel | None = None


def _kernel() -> _Kernel:
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _Kernel()
    return _KERNEL


def abi_version() -> tuple[int, str | None]:
    """The kernel's Landlock ABI version, or 0 and why Landlock cannot be used here."""
    if not sys.platform.startswith("linux"):
        return 0, f"Landlock is a Linux feature (this is {sys.platform})"
    try:
        k = _kernel()
        version = k.call(
            SYS_LANDLOCK_CREATE_RULESET,
            k.c.c_void_p(None),
            k.c.c_size_t(0),
            k.c.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return 0, "this kernel has no Landlock (landlock_create_ruleset: ENOSYS)"
        if e.errno == errno.EOPNOTSUPP:
            return 0, "Landlock is disabled in this kernel (EOPNOTSUPP; see the lsm= boot option)"
        return 0, f"cannot query Landlock: {e.strerror} ({errno.errorcode.get(e.errno or 0)})"
    return version, None


# --------------------------------------------------------------------------- the rules


class LaunchRules:
    """The launcher's parsed command line: the ruleset's numbers and the command."""

    __slots__ = ("command", "handled_fs", "handled_net", "paths", "ports", "scoped")

    def __init__(self) -> None:
        self.handled_fs = 0
        self.handled_net = 0
        self.scoped = 0
        self.paths: list[tuple[int, str]] = []
        self.ports: list[int] = []
        self.command: list[str] = []


def parse_rules(argv: Sequence[str]) -> LaunchRules:
    """The launcher's arguments (see the module doc); ValueError when they are malformed."""
    rules = LaunchRules()
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            rules.command = list(argv[i + 1 :])
            break
        if flag in ("-f", "-n", "-s", "-t") and i + 1 < len(argv):
            value = int(argv[i + 1], 16) if flag != "-t" else int(argv[i + 1])
            if flag == "-f":
                rules.handled_fs = value
            elif flag == "-n":
                rules.handled_net = value
            elif flag == "-s":
                rules.scoped = value
            else:
                rules.ports.append(value)
            i += 2
        elif flag == "-p" and i + 2 < len(argv):
            rules.paths.append((int(argv[i + 1], 16), argv[i + 2]))
            i += 3
        else:
            raise ValueError(f"unexpected argument {flag!r}")
    if not rules.command:
        raise ValueError("no command after --")
    return rules


def rule_access(access: int, handled: int, *, is_dir: bool) -> int:
    """The rights a path rule can grant: handled ones, and only file rights on a non-directory."""
    access &= handled
    return access if is_dir else access & FILE_ACCESS


def _attr_size(handled_net: int, scoped: int) -> int:
    # the smallest struct that holds what is used, so older kernels accept it
    if scoped:
        return 24  # the whole struct: three 64-bit fields
    if handled_net:
        return 16
    return 8


def restrict_self(rules: LaunchRules) -> None:
    """Confine this process (and what it will exec) to ``rules``; OSError when it cannot."""
    k = _kernel()
    c = k.c
    if k.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        code = c.get_errno()
        raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(code)}")
    attr = k.RulesetAttr(rules.handled_fs, rules.handled_net, rules.scoped)
    ruleset = k.call(
        SYS_LANDLOCK_CREATE_RULESET,
        c.byref(attr),
        c.c_size_t(_attr_size(rules.handled_net, rules.scoped)),
        c.c_uint32(0),
    )
    try:
        for access, path in rules.paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # nothing there: nothing to grant
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                allowed = rule_access(access, rules.handled_fs, is_dir=is_dir)
                if not allowed:
                    continue
                beneath = k.PathBeneathAttr(allowed, fd)
                try:
                    k.call(
                        SYS_LANDLOCK_ADD_RULE,
                        c.c_int(ruleset),
                        c.c_int(LANDLOCK_RULE_PATH_BENEATH),
                        c.byref(beneath),
                        c.c_uint32(0),
                    )
                except OSError as e:
                    raise OSError(e.errno, f"rule for {path}: {e.strerror}") from None
            finally:
                os.close(fd)
        for port in rules.ports:
            net = k.NetPortAttr(rules.handled_net & ACCESS_NET_CONNECT_TCP, port)
            k.call(
                SYS_LANDLOCK_ADD_RULE,
                c.c_int(ruleset),
                c.c_int(LANDLOCK_RULE_NET_PORT),
                c.byref(net),
                c.c_uint32(0),
            )
        k.call(SYS_LANDLOCK_RESTRICT_SELF, c.c_int(ruleset), c.c_uint32(0))
    finally:
        os.close(ruleset)


# --------------------------------------------------------------------------- the launcher


def main(argv: Sequence[str] | None = None) -> int:
    """Confine this process to the rules on the command line, then exec the command."""
    args = sys.argv[1:] if argv is None else argv
    try:
        rules = parse_rules(args)
    except ValueError as e:
        print(f"orchestrator sandbox: {e}", file=sys.stderr)
        return EXIT_UNCONFINED
    try:
        restrict_self(rules)
    except OSError as e:
        print(f"orchestrator sandbox: cannot confine the command: {e.strerror}", file=sys.stderr)
        return EXIT_UNCONFINED
    # the interpreter ignores these at start-up, and an ignored signal survives exec
    for name in ("SIGPIPE", "SIGXFSZ"):
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_DFL)
    try:
        sys.stderr.flush()
        os.execvp(rules.command[0], rules.command)
    except OSError as e:
        print(f"orchestrator sandbox: {rules.command[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    return EXIT_UNCONFINED  # not reached: exec replaced the process


if __name__ == "__main__":
    sys.exit(main())
