"""Test helper: run a command on what looks like a kernel without Landlock.

Usage: ``python no_landlock.py ERRNO -- COMMAND ARGS...``.

A seccomp filter makes the three Landlock system calls (444, 445, 446) fail with ``ERRNO``
(``ENOSYS``: a kernel built without Landlock; ``EOPNOTSUPP``: Landlock disabled at boot), for
this process and everything it executes, then the command runs. Nothing else is changed: the
orchestrator's own probe meets the kernel's answer as it would on such a machine.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

# linux/filter.h and linux/seccomp.h
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
# offsetof(struct seccomp_data, nr) and (..., arch)
_NR, _ARCH = 0, 4
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def install(error: int) -> None:
    """Make landlock_create_ruleset, _add_rule and _restrict_self fail with ``error``."""
    arch = _AUDIT_ARCH[platform.machine()]
    program = b"".join(
        (
            _insn(_BPF_LD_W_ABS, 0, 0, _ARCH),
            _insn(_BPF_JEQ_K, 1, 0, arch),  # another ABI: leave it alone
            _insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
            _insn(_BPF_LD_W_ABS, 0, 0, _NR),
            _insn(_BPF_JGE_K, 0, 2, 444),  # below 444: allow
            _insn(_BPF_JGE_K, 1, 0, 447),  # 447 and above: allow
            _insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | error),
            _insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
        )
    )
    filters = ctypes.create_string_buffer(program, len(program))

    class _Prog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    prog = _Prog(len(program) // 8, ctypes.addressof(filters))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main() -> None:
    """Install the filter for the error named on the command line, then exec the command."""
    name, sep, *command = sys.argv[1:]
    if sep != "--" or not command:
        raise SystemExit("usage: no_landlock.py ERRNO -- COMMAND ARGS...")
    install(getattr(errno, name))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
