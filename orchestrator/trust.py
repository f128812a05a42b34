"""Which project config files the user trusted to start programs, by path and digest.

A project's ``.orchestrator.toml`` arrives with the project: a cloned repository can carry one
that names any program as an agent's ``command``. So the parts of a project file that start
programs or widen what an agent may do (:data:`NEEDS_TRUST`) are used only once the user has
trusted that file, as direnv and mise do: the trust is recorded by the file's real path and the
SHA-256 of its bytes, so an edited file (a ``git pull``) must be trusted again. The path is the
file's name in the real path of its project directory: the file is not followed if it is a
symlink, since its relative paths resolve against the directory it is used from. The record lives
in the state directory (``trusted.json``); the user's own config file is always trusted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from .errors import UsageError
from .state import state_directory, state_path
from .vfs._fileio import write_entry_atomic

__all__ = ["NEEDS_TRUST", "TRUST_FILE", "TrustEntry", "TrustStatus", "TrustStore", "file_digest"]

#: The keys of an agent table that start programs, widen what the agent may do, or pass
#: the user's secrets on (``terminal_env``), or open paths and ports (``sandbox`` rules), or
#: give it tools (``mcp_servers``). A project file's stdio ``[mcp_servers.NAME]`` is a program
#: too: it is used only once the file is trusted, as an agent's ``command`` is.
NEEDS_TRUST = ("command", "env", "cwd", "policy", "terminal_env", "sandbox", "mcp_servers")
#: The file, in the state directory, that records the trusted project files.
TRUST_FILE = "trusted.json"

#: ``trusted``: recorded with this digest; ``changed``: recorded with another digest;
#: ``untrusted``: never recorded (or revoked).
TrustStatus = Literal["trusted", "changed", "untrusted"]


def file_digest(data: bytes) -> str:
    """The digest a trust is recorded with: ``sha256:`` and the hex of the file's bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@frozen
class TrustEntry:
    """One trusted file: its real path, the digest it was trusted with, and when."""

    path: str
    digest: str
    trusted_at: str

    def to_json(self) -> dict[str, str]:
        """The camelCase JSON form."""
        return {"path": self.path, "digest": self.digest, "trustedAt": self.trusted_at}


@frozen
class TrustStore:
    """The record of trusted project files (one JSON file, replaced atomically under a lock)."""

    path: Path

    @classmethod
    def at(cls, state_dir: str | os.PathLike[str] | None = None) -> TrustStore:
        """The record in ``state_dir`` (default: the state directory, see :mod:`.state`).

        Reading it makes nothing: a command refused for its state directory leaves none.
        """
        return cls(state_path(state_dir) / TRUST_FILE)

    def status(self, file: str | os.PathLike[str], data: bytes) -> TrustStatus:
        """Whether ``file``, holding ``data`` (the bytes about to be used), is trusted."""
        entry = self._read().get(_key(file))
        if entry is None:
            return "untrusted"
        return "trusted" if entry.get("digest") == file_digest(data) else "changed"

    def trust(self, file: str | os.PathLike[str]) -> TrustEntry:
        """Record ``file`` as trusted with the digest of what it holds now."""
        key = _key(file)
        try:
            data = Path(key).read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read {key}: {e.strerror or e}") from e
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        entry = TrustEntry(key, file_digest(data), now)
        with self._locked() as entries:
            entries[key] = {"digest": entry.digest, "trustedAt": entry.trusted_at}
        return entry

    def revoke(self, file: str | os.PathLike[str]) -> bool:
        """Forget ``file``; whether it was recorded."""
        with self._locked() as entries:
            return entries.pop(_key(file), None) is not None

    def entries(self) -> list[TrustEntry]:
        """Every trusted file, by path."""
        return [
            TrustEntry(path, str(item.get("digest", "")), str(item.get("trustedAt", "")))
            for path, item in sorted(self._read().items())
        ]

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise UsageError(f"cannot read {self.path}: {e.strerror or e}") from e
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict):
            # a damaged record trusts nothing; it is never guessed at
            raise UsageError(f"{self.path} is damaged; remove it and trust again")
        return {str(k): v for k, v in files.items() if isinstance(v, dict)}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The entries, written back (atomically) when the block ends without error."""
        state_directory(self.path.parent)  # made, and checked usable, only to write
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            yield entries
            text = json.dumps({"version": 1, "files": entries}, indent=2) + "\n"
            write_entry_atomic(str(self.path), text.encode(), 0o100644, fsync=True)
        finally:
            os.close(fd)


def _key(file: str | os.PathLike[str]) -> str:
    # the file in the real path of its directory: the directory is where its relative paths
    # (a command's `tools/agent.py`) resolve, so a link in another project to a trusted file
    # names another trust; a directory reached through a symlink names the same one
    path = os.path.abspath(os.fspath(file))
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
