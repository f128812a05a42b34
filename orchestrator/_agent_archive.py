"""Start a binary agent of the ACP registry: download its archive once, unpack it, exec it.

Run as ``python -m orchestrator._agent_archive --cache=DIR --key=KEY --archive=URL --cmd=CMD
[--sha256=HEX] -- ARGS...`` (the command :func:`orchestrator.registry.registry_spec` builds).
The archive is fetched into ``DIR/KEY`` on first use by :func:`orchestrator._fetch.fetch`
(``https://``; ``http://`` only from this machine; ``file://``; every redirect checked alike;
within :data:`DOWNLOAD_DEADLINE` seconds in all and :data:`MAX_DOWNLOAD` bytes), checked
against ``--sha256`` when the registry entry carries one (the official format has no checksum
today), unpacked (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``, ``.zip``, at most
:data:`MAX_MEMBERS` members and :data:`MAX_UNPACKED` bytes; anything else is the program
itself), and the digest it had is kept in ``DIR/KEY/.sha256``. Later starts find it there and
touch no network. The process then becomes the agent (``exec``), so its pid, stdin and stdout
are the agent's.

The work happens in ``DIR/.KEY.*`` while holding a lock on ``DIR`` (one download at a time):
removed when the launcher ends, SIGTERM and Ctrl-C included, and what a launcher killed
outright left is swept by the next download of that agent.

A failure is said in one line: on stderr, and as the JSON-RPC error answering the client's
``initialize`` (the launcher stands where the agent would), so the orchestrator reports the
reason itself rather than an exit status; then it exits 127.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import stat
import sys
import tarfile
import tempfile
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from ._fetch import fetch, redact
from .errors import AgentArchiveError

#: an archive larger than this is refused (the largest agents ship ~150 MB)
MAX_DOWNLOAD = 256 * 1024 * 1024
#: an archive whose members add up to more than this many bytes is refused
MAX_UNPACKED = 1024 * 1024 * 1024
#: an archive with more members than this is refused
MAX_MEMBERS = 10_000
#: seconds the whole download may take
DOWNLOAD_DEADLINE = 600.0
#: seconds the launcher waits for ``initialize`` to answer it with its failure
_ANSWER_WAIT = 10.0
_DIGEST_FILE = ".sha256"


def download(url: str, into: Path) -> str:
    """Fetch ``url`` into the file ``into`` (within :data:`DOWNLOAD_DEADLINE` and
    :data:`MAX_DOWNLOAD`); return its SHA-256 (hex)."""
    digest = hashlib.sha256()
    with open(into, "wb") as out:

        def sink(chunk: bytes) -> None:
            digest.update(chunk)
            out.write(chunk)

        fetch(
            url,
            sink,
            error=AgentArchiveError,
            what="archive",
            deadline=DOWNLOAD_DEADLINE,
            max_bytes=MAX_DOWNLOAD,
            allow_file=True,
        )
    return digest.hexdigest()


def _check_sizes(url: str, sizes: list[int]) -> None:
    """Refuse an archive of more than :data:`MAX_MEMBERS` members or :data:`MAX_UNPACKED`
    bytes (the sizes its headers give, which bound what extraction writes)."""
    shown = redact(url)
    max_members, max_unpacked = MAX_MEMBERS, MAX_UNPACKED
    if len(sizes) > max_members:
        raise AgentArchiveError(f"the archive {shown} has more than {max_members} members: refused")
    if sum(sizes) > max_unpacked:
        raise AgentArchiveError(
            f"the archive {shown} unpacks to {sum(sizes)} bytes, more than {max_unpacked}: refused"
        )


def unpack(archive: Path, url: str, cmd: str, into: Path) -> None:
    """Unpack ``archive`` (named by ``url``) into the directory ``into``; a file that is no
    archive is the program itself, saved as ``cmd``."""
    name = urllib.parse.urlsplit(url).path.lower()
    shown = redact(url)
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
        try:
            with tarfile.open(archive) as tar:
                sizes = []
                for info in tar:  # headers only; stops reading past the member cap
                    sizes.append(info.size)
                    if len(sizes) > MAX_MEMBERS:
                        break
                _check_sizes(url, sizes)
                tar.extractall(into, filter="data")  # no absolute paths, links out, devices
        except (tarfile.TarError, OSError, EOFError) as e:
            raise AgentArchiveError(f"cannot unpack {shown}: {e}") from e
    elif name.endswith(".zip"):
        try:
            with zipfile.ZipFile(archive) as zf:
                # zipfile reads no more of a member than the size its header gives
                _check_sizes(url, [i.file_size for i in zf.infolist()])
                for member in zf.namelist():
                    target = (into / member).resolve()
                    if not target.is_relative_to(into.resolve()):
                        raise AgentArchiveError(f"{shown}: member {member!r} leaves the archive")
                zf.extractall(into)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise AgentArchiveError(f"cannot unpack {shown}: {e}") from e
    else:
        (into / cmd).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(archive, into / cmd)
    program = into / cmd
    if not program.is_file():
        raise AgentArchiveError(
            f"the archive {shown} has no {cmd!r} in it (the program the registry entry names)"
        )
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
    with _locked(cache, key), tempfile.TemporaryDirectory(dir=cache, prefix=f".{key}.") as tmp:
        if program.is_file():  # another start unpacked it while this one waited for the lock
            return program
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
        unpacked.rename(home)
    return program


@contextlib.contextmanager
def _locked(cache: Path, key: str) -> Iterator[None]:
    """Hold a lock on the ``cache`` directory (one download at a time) and, holding it,
    remove the work directories of ``key`` that launchers killed outright (SIGKILL) left."""
    fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for stale in cache.glob(f".{key}.*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def cached_program(argv: tuple[str, ...] | list[str]) -> Path | None:
    """The program the launcher command ``argv`` runs, where it is (or will be) unpacked;
    None when ``argv`` is no command of this launcher."""
    if len(argv) < 3 or tuple(argv[1:3]) != ("-m", __name__):
        return None
    values = dict(
        word[2:].split("=", 1) for word in argv[3:] if word.startswith("--") and "=" in word
    )
    if not {"cache", "key", "cmd"} <= values.keys():
        return None
    return Path(values["cache"]) / values["key"] / values["cmd"]


def _answer_initialize(reason: str) -> None:
    """Answer the client's ``initialize`` (if it comes within a few seconds) with ``reason``
    as a JSON-RPC error, so the client reports it rather than this process's exit."""
    try:
        ready, _, _ = select.select([sys.stdin], [], [], _ANSWER_WAIT)
        line = sys.stdin.buffer.readline() if ready else b""
        request = json.loads(line) if line.strip() else None
    except (OSError, ValueError):
        return
    if not isinstance(request, dict) or "id" not in request:
        return
    answer = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32603, "message": reason}}
    with contextlib.suppress(OSError):
        sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n")
        sys.stdout.buffer.flush()


def _terminated(signum: int, frame: FrameType | None) -> None:
    # unwinds the download so its work directory is removed
    raise SystemExit(128 + signum)


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
    signal.signal(signal.SIGTERM, _terminated)
    try:
        program = ensure(args.cache, args.key, args.archive, args.cmd, args.sha256)
        os.execv(program, [str(program), *args.args])
    except AgentArchiveError as e:
        return _fail(args.key, str(e))
    except OSError as e:
        # e.g. ENOEXEC: what the archive holds is no program this machine runs
        return _fail(
            args.key, f"cannot run {args.cmd!r} of {redact(args.archive)}: {e.strerror or e}"
        )
    except KeyboardInterrupt:
        return 130
    return 127  # pragma: no cover - execv does not return


def _fail(key: str, reason: str) -> int:
    message = f"registry agent {key}: {' '.join(reason.split())}"
    print(f"orchestrator: {message}", file=sys.stderr, flush=True)
    _answer_initialize(message)
    return 127


if __name__ == "__main__":
    sys.exit(main())
