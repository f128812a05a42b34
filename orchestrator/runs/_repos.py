"""The repositories of a batch: a repository list read, checked and labelled, without I/O.

A repository is given as ``LOCATION [REF]``: a line of a repository file, or one value given by
itself. ``LOCATION`` is a git URL (``scheme://...`` with scheme ``https``, ``http``, ``ssh``,
``git``, ``git+ssh``, ``ssh+git`` or ``file``, or scp-like ``user@host:path``) to clone into the
clone cache, or else a local directory (``~`` expanded, relative to a base directory) to use as
it is. ``REF`` (a branch, a tag or a commit id) is for URLs only: a local checkout is read as it
is. In a file, blank lines and comments (``#`` at the start of a line or after whitespace) are
ignored, and a field with spaces in it is quoted (``"my dir"`` or ``'my dir'``).

A local path is made absolute lexically (``..`` removed as written, as ``cd`` does) and not
resolved through symlinks: the path a run records is the one the user gave. Two spellings of
one directory are still found to be the same repository (:func:`label_repos` compares their
real paths, the one place here that reads the filesystem).

A URL keeps any credentials in it (the clone needs them); :func:`redact` is the form to show,
and every error here shows only that form.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from ..errors import StoreError, UsageError

__all__ = [
    "RepoSpec",
    "cache_key",
    "is_commit_id",
    "label_repos",
    "parse_repos",
    "redact",
    "repo_spec",
]

#: URL schemes git clones from that a repository list takes
SCHEMES = ("https", "http", "ssh", "git", "git+ssh", "ssh+git", "file")
#: schemes that name a host (``file`` names a path)
_HOSTED = frozenset(SCHEMES) - {"file"}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# scp-like: user@host:path (no slash before the colon, and not "host::" a transport helper)
_SCP = re.compile(r"^([^@/\s:]+)@([^@/\s:]+|\[[0-9A-Fa-f:.]+\]):(?!:)(.*)$")
_HEX = frozenset(string.hexdigits)
_UNSAFE_LABEL = re.compile(r"[^\w.+-]+")
#: the longest label derived from a location
_LABEL_CHARS = 60


@frozen
class RepoSpec:
    """One repository of a batch."""

    #: the location as the user wrote it (without its comment and ref; credentials kept)
    source: str
    #: a git URL to clone into the clone cache, or None for a local directory
    url: str | None
    #: the local directory, absolute (lexically, symlinks not resolved), or None for a URL
    path: Path | None
    #: the branch, tag or commit to check out (URLs only)
    ref: str | None
    #: a short label, unique within the batch once :func:`label_repos` has run
    name: str

    @property
    def shown(self) -> str:
        """The repository as messages show it: its location with credentials redacted, and
        its ref after a space."""
        where = redact(self.source)
        return f"{where} {self.ref}" if self.ref else where

    def to_json(self) -> dict[str, Any]:
        """``{"source", "url", "path", "ref", "name"}`` (``path`` as a string or null)."""
        return {
            "source": self.source,
            "url": self.url,
            "path": None if self.path is None else str(self.path),
            "ref": self.ref,
            "name": self.name,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RepoSpec:
        """The repository :meth:`to_json` wrote; :class:`~orchestrator.errors.StoreError` when
        ``data`` is not one (a field missing or of the wrong type, a bad URL, a relative path,
        both or neither of url and path, a ref on a path)."""
        if not isinstance(data, Mapping):
            raise StoreError(f"a repository is a JSON object, not {type(data).__name__}")
        values: dict[str, str | None] = {}
        for key in ("source", "url", "path", "ref", "name"):
            value = data.get(key)
            if not (value is None or isinstance(value, str)) or (
                value is None and key in ("source", "name")
            ):
                raise StoreError(f"a repository's {key!r} is not a string: {value!r:.80}")
            values[key] = value
        source, url, path, ref, name = (values[k] for k in ("source", "url", "path", "ref", "name"))
        assert source is not None and name is not None  # checked above
        problem: str | None
        if (url is None) == (path is None):
            problem = "has both a url and a path, or neither"
        elif url is not None:
            problem = _url_problem(url) or (_ref_problem(ref) if ref is not None else None)
        elif not os.path.isabs(path or ""):
            problem = "has a path that is not absolute"
        else:
            problem = "has a ref on a local path" if ref is not None else None
        if problem is None and not name:
            problem = "has an empty name"
        if problem:
            raise StoreError(f"the repository {redact(source)!r} {problem}")
        return cls(source, url, None if path is None else Path(path), ref, name)


def parse_repos(text: str, *, base: Path, origin: str) -> tuple[RepoSpec, ...]:
    """The repositories a repository file lists, in its order (names not yet unique: see
    :func:`label_repos`).

    ``origin`` names the file in errors (``"repos.txt:3: ..."``); a relative local path is
    relative to ``base`` (the file's directory). Raises :class:`~orchestrator.errors.UsageError`
    (one line, the first problem) for a bad line, a repository listed twice, or a file that
    lists none.
    """
    specs: list[RepoSpec] = []
    seen: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        where = f"{origin}:{number}"
        try:
            fields = _fields(line)
        except _Bad as e:
            raise UsageError(f"{where}: {e}") from None
        if not fields:
            continue
        try:
            spec = _spec(fields, base)
        except _Bad as e:
            raise UsageError(f"{where}: {redact(fields[0])}: {e}") from None
        key = _identity(spec, real=False)
        if key in seen:
            raise UsageError(
                f"{where}: {spec.shown} is listed twice (line {seen[key]} lists it first)"
            )
        seen[key] = number
        specs.append(spec)
    if not specs:
        raise UsageError(f"{origin}: lists no repository (only blank lines and comments)")
    return tuple(specs)


def repo_spec(source: str, *, base: Path) -> RepoSpec:
    """One repository given by itself: ``"PATH"``, ``"URL"`` or ``"URL REF"`` (quoted as in a
    file), a relative path being relative to ``base`` (the current directory).

    Raises :class:`~orchestrator.errors.UsageError` (one line) when it is not one.
    """
    try:
        fields = _fields(source)
        spec = _spec(fields, base) if fields else None
    except _Bad as e:
        raise UsageError(f"repository {redact(source.strip())!r}: {e}") from None
    if spec is None:
        raise UsageError("an empty repository location")
    return spec


def label_repos(specs: Sequence[RepoSpec]) -> tuple[RepoSpec, ...]:
    """``specs`` with names unique within them, in their order.

    A name is the directory's base name, or the URL's last path segment without ``.git``;
    the first of several alike keeps it and the others get ``-2``, ``-3`` ... (skipping names
    taken otherwise). Raises :class:`~orchestrator.errors.UsageError` for an empty list, and
    for one repository given twice: the same directory (compared by real path, so two spellings
    of it through a symlink are one), or the same URL (credentials aside) with the same ref.
    """
    if not specs:
        raise UsageError("no repositories given: a batch needs at least one")
    seen: dict[tuple[str, ...], RepoSpec] = {}
    for spec in specs:
        key = _identity(spec, real=True)
        first = seen.get(key)
        if first is not None:
            also = f" (as {first.shown})" if first.shown != spec.shown else ""
            raise UsageError(f"the repository {spec.shown} is given twice{also}")
        seen[key] = spec
    bases = [_label(spec) for spec in specs]
    wanted = set(bases)
    used: set[str] = set()
    out = []
    for spec, name in zip(specs, bases, strict=True):
        if name in used:
            n = 2
            while f"{name}-{n}" in used or f"{name}-{n}" in wanted:
                n += 1
            name = f"{name}-{n}"
        used.add(name)
        out.append(attrs.evolve(spec, name=name))
    return tuple(out)


def redact(text: str) -> str:
    """``text`` (a URL, or anything else unchanged) with the credentials in it replaced by
    ``***``: a password always (``https://user:***@host/...``), and a user name alone in an
    http(s) URL, where it is usually a token (``https://***@host/...``)."""
    match = _SCHEME.match(text)
    if not match:
        return text
    scheme = match.group(1).lower()
    rest = text[match.end() :]
    authority, sep, tail = _split_authority(rest)
    if "@" not in authority:
        return text
    userinfo, _, host = authority.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if colon:
        userinfo = f"{user}:***"
    elif scheme in ("http", "https"):
        userinfo = "***"
    return f"{text[: match.end()]}{userinfo}@{host}{sep}{tail}"


def cache_key(url: str) -> str:
    """The name of ``url``'s directory in the clone cache: a short hash of the URL (without a
    password: a changed token keeps the clone) and a safe form of its last path segment.

    The same URL gives the same name in every batch.
    """
    identity = _url_identity(url)
    digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", _url_label(url)).strip(".-")[:40] or "repo"
    return f"{digest}-{safe}"


# --------------------------------------------------------------------------- reading


class _Bad(Exception):
    """A problem with one line or value, described for people (the caller adds where)."""


def _fields(line: str) -> list[str]:
    """The fields of one line: split on whitespace, a field quoted whole with ``"`` or ``'``
    kept as one (no escapes), a ``#`` starting a field beginning a comment."""
    bad = next((c for c in line if _control(c)), None)
    if bad is not None:
        raise _Bad(f"a control character ({ord(bad):#04x}) in the line")
    fields: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c.isspace():
            i += 1
        elif c == "#":
            break
        elif c in "\"'":
            end = line.find(c, i + 1)
            if end < 0:
                raise _Bad(f"no closing {c} for the field {c}{redact(line[i + 1 :])[:30]}")
            if end + 1 < n and not line[end + 1].isspace():
                raise _Bad(f"text right after the closing {c}: quote a field whole")
            if end == i + 1:
                raise _Bad("an empty quoted field")
            fields.append(line[i + 1 : end])
            i = end + 1
        else:
            start = i
            while i < n and not line[i].isspace():
                i += 1
            fields.append(line[start:i])
    return fields


def _control(c: str) -> bool:
    return (ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) < 0xA0


def _spec(fields: list[str], base: Path) -> RepoSpec:
    if len(fields) > 2:
        extra = " ".join(redact(f) for f in fields[2:])
        raise _Bad(
            f"expected LOCATION [REF], found {len(fields)} fields (extra: {extra[:60]!r});"
            " quote a path with spaces in it"
        )
    location = fields[0]
    ref = fields[1] if len(fields) == 2 else None
    if _is_url(location):
        problem = _url_problem(location)
        if problem:
            raise _Bad(problem)
        if ref is not None:
            problem = _ref_problem(ref)
            if problem:
                raise _Bad(f"the ref {redact(ref)!r}: {problem}")
        return RepoSpec(location, location, None, ref, _url_label(location))
    scheme = _SCHEME.match(location)
    if scheme:
        raise _Bad(
            f"unsupported URL scheme {scheme.group(1)!r}"
            f" (one of {', '.join(SCHEMES)}, or user@host:path)"
        )
    expanded = os.path.expanduser(location)
    if expanded.startswith("~"):
        raise _Bad("no such user for '~' (write the path in full)")
    path = Path(os.path.abspath(base / expanded))
    if ref is not None:
        raise _Bad(
            f"a ref ({redact(ref)!r}) is given for a local directory: a local checkout is used"
            " as it is (check the ref out there, or give a git URL to clone)"
        )
    return RepoSpec(location, None, path, None, _path_label(path))


def _is_url(location: str) -> bool:
    match = _SCHEME.match(location)
    if match:
        return match.group(1).lower() in SCHEMES
    return _SCP.match(location) is not None


def _url_problem(url: str) -> str | None:
    """Why ``url`` (a scheme URL or scp-like) cannot be cloned, or None."""
    if any(c.isspace() or _control(c) for c in url):
        return "a URL has no spaces or control characters in it"
    if url.startswith("-"):
        return "a URL does not start with '-'"
    match = _SCHEME.match(url)
    if not match:
        scp = _SCP.match(url)
        if scp is None:
            return "not a URL (scheme://... or user@host:path)"
        if not scp.group(3).strip("/"):
            return "no repository path after the ':'"
        return None
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        return f"unsupported URL scheme {match.group(1)!r}"
    if "#" in url:
        fragment = url.partition("#")[2]
        return f"a URL fragment ('#{fragment}') is not a ref: write the ref after a space"
    authority, _, tail = _split_authority(url[match.end() :])
    host = authority.rpartition("@")[2]
    if scheme in _HOSTED and not host:
        return "no host in the URL"
    if scheme == "file" and not tail.strip("/"):
        return "no path in the file:// URL (file:///absolute/path)"
    if scheme in _HOSTED and not tail.strip("/"):
        return "no repository path in the URL"
    return None


def _ref_problem(ref: str) -> str | None:
    """Why ``ref`` cannot name a branch, tag or commit to fetch, or None (git's rules for ref
    names, so that it is never read as an option or a refspec)."""
    if ref.startswith("-"):
        return "a ref does not start with '-'"
    if any(c.isspace() or _control(c) or c in ":?*[\\^~" for c in ref):
        return "a ref has no spaces, control characters, or any of : ? * [ \\ ^ ~"
    if ".." in ref or "@{" in ref or ref == "@" or "//" in ref:
        return "a ref has no '..', '@{' or '//', and is not '@'"
    if ref.startswith(("/", ".", "+")) or ref.endswith(("/", ".", ".lock")):
        return "a ref does not start with '/', '.' or '+', nor end with '/', '.' or '.lock'"
    if any(part.startswith(".") or part.endswith(".lock") for part in ref.split("/")):
        return "a ref's parts do not start with '.' nor end with '.lock'"
    return None


def is_commit_id(ref: str) -> bool:
    """Whether ``ref`` may be a commit id, full or abbreviated (4 to 64 hex digits)."""
    return 4 <= len(ref) <= 64 and all(c in _HEX for c in ref)


def _split_authority(rest: str) -> tuple[str, str, str]:
    """``host-part``, the separator, and what follows, of what comes after ``scheme://``."""
    for i, c in enumerate(rest):
        if c in "/?#":
            return rest[:i], c, rest[i + 1 :]
    return rest, "", ""


def _url_identity(url: str) -> str:
    """``url`` as one repository: scheme and host lowercased, password dropped, trailing ``/``
    removed."""
    match = _SCHEME.match(url)
    if not match:
        return url.rstrip("/")
    authority, sep, tail = _split_authority(url[match.end() :])
    userinfo, at, host = authority.rpartition("@")
    user = userinfo.partition(":")[0]
    if match.group(1).lower() in ("http", "https"):
        user, at = "", ""  # a user name alone there is a token, not who the repository is
    authority = f"{user}{at}{host.lower()}"
    return f"{match.group(1).lower()}://{authority}{sep}{tail}".rstrip("/")


def _identity(spec: RepoSpec, *, real: bool) -> tuple[str, ...]:
    """What makes two repositories of a list the same one."""
    if spec.url is not None:
        return ("url", _url_identity(spec.url), spec.ref or "")
    assert spec.path is not None
    return ("path", os.path.realpath(spec.path) if real else str(spec.path))


# --------------------------------------------------------------------------- labels


def _label(spec: RepoSpec) -> str:
    if spec.url is not None:
        return _url_label(spec.url)
    assert spec.path is not None
    return _path_label(spec.path)


def _path_label(path: Path) -> str:
    return _safe_label(path.name)


def _url_label(url: str) -> str:
    match = _SCHEME.match(url)
    if match:
        authority, _, tail = _split_authority(url[match.end() :])
        path = urllib.parse.unquote(tail.partition("?")[0].partition("#")[0])
        host = authority.rpartition("@")[2]
    else:
        scp = _SCP.match(url)
        path = scp.group(3) if scp else url
        host = scp.group(2) if scp else ""
    last = path.rstrip("/").rpartition("/")[2].removesuffix(".git")
    return _safe_label(last or host)


def _safe_label(text: str) -> str:
    label = _UNSAFE_LABEL.sub("-", text).strip(".-")[:_LABEL_CHARS].strip(".-")
    return label or "repo"
