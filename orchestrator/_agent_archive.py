"""Start a binary agent of the ACP registry: download its archive once, unpack it, exec it.

Run as ``python -m orchestrator._agent_archive --cache DIR --key KEY --archive URL --cmd CMD
[--sha256 HEX] -- ARGS...`` (the command :func:`orchestrator.registry.registry_spec` builds).
The archive is fetched into ``DIR/KEY`` on first use (``https://``; ``http://`` only from this
machine; ``file://``), checked against ``--sha256`` when the registry entry carries one (the
official format has no checksum today), unpacked (``.tar.gz``, ``.tgz``, ``.tar.bz2``,
``.tar.xz``, ``.zip``; anything else is the program itself), and the digest it had is kept in
``DIR/KEY/.sha256``. Later starts find it there and touch no network. The process then
becomes the agent (``exec``), so its pid, stdin and stdout are the agent's.

Failures print one line on stderr and exit 127, which the orchestrator reports with the
agent's stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from .errors import AgentArchiveError

#: an archive larger than this is refused (the largest agents ship ~150 MB)
MAX_BYTES = 1024 * 1024 * 1024
#: seconds each read of the download may wait
TIMEOUT = 60.0
_CHUNK = 1024 * 1024
_DIGEST_FILE = ".sha256"


def _open(url: str) -> object:
    parts = urllib.parse.urlsplit(url)
    local = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme not in ("https", "file") and not (parts.scheme == "http" and local):
        raise AgentArchiveError(f"{url}: an archive URL must be https:// (http only to localhost)")
    request = urllib.request.Request(url, headers={"User-Agent": "acp-orchestrator"})
    return urllib.request.urlopen(request, timeout=TIMEOUT)


def download(url: str, into: Path, *, max_bytes: int = MAX_BYTES) -> str:
    """Fetch ``url`` into the file ``into``; return its SHA-256 (hex)."""
    digest = hashlib.sha256()
    size = 0
    try:
        with _open(url) as response, open(into, "wb") as out:  # type: ignore[attr-defined]
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise AgentArchiveError(f"{url} is larger than {max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
    except (OSError, ValueError) as e:
        raise AgentArchiveError(f"cannot download {url}: {getattr(e, 'reason', e)}") from e
    return digest.hexdigest()


def unpack(archive: Path, url: str, cmd: str, into: Path) -> None:
    """Unpack ``archive`` (named by ``url``) into the directory ``into``; a file that is no
    archive is the program itself, saved as ``cmd``."""
    name = urllib.parse.urlsplit(url).path.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(into, filter="data")  # no absolute paths, links out, devices
        except (tarfile.TarError, OSError) as e:
            raise AgentArchiveError(f"cannot unpack {url}: {e}") from e
    elif name.endswith(".zip"):
        try:
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    target = (into / member).resolve()
                    if not target.is_relative_to(into.resolve()):
                        raise AgentArchiveError(f"{url}: member {member!r} leaves the archive")
                zf.extractall(into)
        except (zipfile.BadZipFile, OSError) as e:
            raise AgentArchiveError(f"cannot unpack {url}: {e}") from e
    else:
        shutil.copyfile(archive, into / cmd)
    program = into / cmd
    if not program.is_file():
        raise AgentArchiveError(f"{url} holds no {cmd}")
    # zip members lose their mode; the program must be executable
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def ensure(cache: Path, key: str, url: str, cmd: str, sha256: str | None) -> Path:
    """The program ``cmd`` of ``url``'s archive, unpacked under ``cache/key`` (fetched,
    verified and unpacked the first time)."""
    if "/" in key or key in ("", ".", ".."):
        raise AgentArchiveError(f"bad cache key {key!r}")
    if os.path.isabs(cmd) or os.path.normpath(cmd).split(os.sep)[0] == "..":
        raise AgentArchiveError(f"cmd {cmd!r} is not a path inside the archive")
    home = cache / key
    program = home / cmd
    if program.is_file():
        kept = (home / _DIGEST_FILE).read_text("ascii").strip()
        if sha256 is not None and kept != sha256.lower():
            raise AgentArchiveError(
                f"the cached {url} has SHA-256 {kept}, the registry says {sha256}:"
                f" remove {home} to fetch it again"
            )
        return program
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{key}.") as tmp:
        archive = Path(tmp) / "archive"
        digest = download(url, archive)
        if sha256 is not None and digest != sha256.lower():
            raise AgentArchiveError(
                f"{url} has SHA-256 {digest}, the registry says {sha256}: refused"
            )
        unpacked = Path(tmp) / "unpacked"
        unpacked.mkdir()
        unpack(archive, url, cmd, unpacked)
        (unpacked / _DIGEST_FILE).write_text(digest + "\n", "ascii")
        try:
            unpacked.rename(home)
        except OSError:
            if not program.is_file():  # not another start that unpacked it meanwhile
                raise
    return program


def main(argv: list[str] | None = None) -> int:
    """Ensure the program is unpacked, then exec it with the arguments after ``--``."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator._agent_archive")
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--key", required=True)
    parser.add_argument("--archive", required=True)
    parser.add_argument("--cmd", required=True)
    parser.add_argument("--sha256")
    parser.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    try:
        program = ensure(args.cache, args.key, args.archive, args.cmd, args.sha256)
    except (AgentArchiveError, OSError) as e:
        print(f"orchestrator: registry agent {args.key}: {e}", file=sys.stderr)
        return 127
    os.execv(program, [str(program), *args.args])
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
