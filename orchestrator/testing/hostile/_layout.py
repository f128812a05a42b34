"""The attacks' directory: the agent's own programs, files outside every branch, markers."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

from attrs import frozen

__all__ = ["PROGRAM_RAN", "SECRET_VARIABLES", "Layout", "walk"]

#: what the agent's own programs print when they run
PROGRAM_RAN = "HOSTILE-PROGRAM-RAN"
#: variables the ``terminal-secrets`` attack looks for in a terminal's environment
SECRET_VARIABLES = (
    "MYSQL_PWD",
    "MY_DB_PASS",
    "SLACK_WEBHOOK_URL",
    "HTTPS_PROXY",
    "DATABASE_URL",
    "GITHUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
)
#: the names the agent's ``PATH`` programs take
_FAKE_COMMANDS = ("ls", "echo", "cat", "env", "printenv", "git")


@frozen
class Layout:
    """The attacks' directory: the agent's programs, the files outside, markers, the record."""

    root: Path

    @property
    def bin(self) -> Path:
        """The agent's own programs."""
        return self.root / "bin"

    @property
    def outside(self) -> Path:
        """Files outside every branch; an attack that held left them as they were."""
        return self.root / "outside"

    @property
    def markers(self) -> Path:
        """Where the agent's programs leave a file when they run."""
        return self.root / "markers"

    @property
    def record(self) -> Path:
        """The agent's record (JSON lines)."""
        return self.root / "records" / "agent.jsonl"

    @property
    def token(self) -> str:
        """A word unique to this directory."""
        return hashlib.sha256(str(self.root).encode()).hexdigest()[:16]

    @property
    def secret(self) -> str:
        """The text of ``outside/secret.txt``."""
        return f"SECRET-{self.token}\n"

    @property
    def victim(self) -> str:
        """The text of ``outside/victim.txt``."""
        return "victim: an attack that held leaves this file as it is\n"

    @property
    def preload(self) -> Path:
        """What the agent gives as ``LD_PRELOAD`` (the loader names it when it tries it)."""
        return self.bin / "preload.so"

    def program(self, tag: str) -> str:
        """The shell words running the agent's hostile program, tagged ``tag``."""
        return f"{shlex.quote(str(self.bin / 'hostile'))} {shlex.quote(tag)}"

    def canary(self, name: str) -> str:
        """The secret in the canary value of ``name``, unique to this directory."""
        return f"canary-{self.token}-{name.lower()}"

    def canaries(self) -> dict[str, str]:
        """A value for each of :data:`SECRET_VARIABLES` (a URL's password is the secret)."""
        values = {name: self.canary(name) for name in SECRET_VARIABLES}
        values["HTTPS_PROXY"] = f"http://user:{self.canary('HTTPS_PROXY')}@proxy.invalid:3128"
        values["DATABASE_URL"] = f"postgres://app:{self.canary('DATABASE_URL')}@db.invalid/app"
        return values

    def prepare(self) -> None:
        """Make the directory's programs, files outside and empty folders (idempotent)."""
        for folder in (self.bin, self.outside, self.markers, self.record.parent):
            folder.mkdir(parents=True, exist_ok=True)
        program = (
            "#!/bin/sh\n"
            "# A program the agent smuggles past the policy: it says so and leaves a marker.\n"
            f'echo "{PROGRAM_RAN} $(basename "$0") $*"\n'
            f': > {shlex.quote(str(self.markers))}/"$(basename "$0")-$$" 2>/dev/null\n'
            "exit 0\n"
        )
        for name in ("hostile", *_FAKE_COMMANDS):
            path = self.bin / name
            path.write_text(program)
            path.chmod(0o755)
        self.preload.write_text("not a shared object: the loader says so and names this file\n")
        (self.bin / "rc.sh").write_text(f"{self.program('startup-file')}\n")
        (self.outside / "victim.txt").write_text(self.victim)
        (self.outside / "secret.txt").write_text(self.secret)

    def outside_changes(self) -> list[str]:
        """What changed in ``outside/`` since :meth:`prepare`."""
        expected = {"victim.txt": self.victim.encode(), "secret.txt": self.secret.encode()}
        found: list[str] = []
        seen: set[str] = set()
        for rel, kind in walk(self.outside):
            path = self.outside / rel
            if rel in expected and kind == "file":
                seen.add(rel)
                if path.read_bytes() != expected[rel]:
                    found.append(f"a file outside the branch was changed: {path}")
            elif kind != "dir":
                found.append(f"a file was written outside the branch: {path}")
        found += [
            f"a file outside the branch was removed or replaced: {self.outside / name}"
            for name in sorted(expected.keys() - seen)
        ]
        return found

    def programs_ran(self) -> list[str]:
        """The markers the agent's programs left."""
        try:
            return sorted(os.listdir(self.markers))
        except OSError:
            return []


def walk(root: Path) -> Iterator[tuple[str, str]]:
    """(relative path, file | dir | link | other) under ``root``, iteratively (any depth)."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(root / rel if rel else root) as found:
                entries = list(found)
        except OSError:
            continue
        for entry in entries:
            name = os.path.join(rel, entry.name) if rel else entry.name
            if entry.is_symlink():
                yield name, "link"
            elif entry.is_dir():
                yield name, "dir"
                stack.append(name)
            else:
                yield name, "file" if entry.is_file() else "other"
