"""Test helper: a process tree that outlives its leader unless the whole group is killed.

Usage: ``python spawn_tree.py [--leader eof|ignore-eof|ignore-term]``.

The leader forks three children; each child forks one grandchild. Child 0 ignores SIGTERM; the
grandchild of child 1 ignores SIGTERM; child 2 exits right after forking, so its grandchild is
orphaned (reparented to pid 1). Every descendant then sleeps forever. Once all of them are set up
the leader prints ``{"leader": pid, "descendants": [pids...]}`` as one JSON line on stdout, then:
``eof`` exits when stdin reaches EOF, ``ignore-eof`` sleeps forever, ``ignore-term`` ignores
SIGTERM and sleeps forever.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import NoReturn

_CHILDREN = 3


def _report(fd: int, pid: int) -> None:
    os.write(fd, f"{pid:>10}\n".encode())


def _sleep_forever() -> NoReturn:
    while True:
        signal.pause()


def _grandchild(report_fd: int, ignore_term: bool) -> NoReturn:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _report(report_fd, os.getpid())
    _sleep_forever()


def _child(index: int, report_fd: int) -> NoReturn:
    if index == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        _grandchild(report_fd, ignore_term=index == 1)
    _report(report_fd, os.getpid())
    if index == 2:
        os._exit(0)
    _sleep_forever()


def main() -> None:
    """Build the tree, report it, then behave as ``--leader`` says."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--leader", choices=["eof", "ignore-eof", "ignore-term"], default="eof")
    args = parser.parse_args()
    if args.leader == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    read_fd, write_fd = os.pipe()
    for index in range(_CHILDREN):
        if os.fork() == 0:
            os.close(read_fd)
            # Descendants must not run the leader's code on return.
            try:
                _child(index, write_fd)
            finally:
                os._exit(1)
    os.close(write_fd)
    pids: list[int] = []
    with os.fdopen(read_fd, "rb") as reports:
        while len(pids) < 2 * _CHILDREN:
            line = reports.readline()
            if not line:
                break
            pids.append(int(line))
    print(json.dumps({"leader": os.getpid(), "descendants": pids}), flush=True)
    if args.leader == "eof":
        sys.stdin.buffer.read()
        return
    _sleep_forever()


if __name__ == "__main__":
    main()
