"""What is not part of a workspace: VCS internals, ``.gitignore`` patterns and extra globs.

:class:`IgnoreRules` is the configuration; :class:`IgnoreMatcher` the compiled form that a
snapshot builds while it walks the workspace (reading every ``.gitignore`` on the way, and
``.git/info/exclude``). Each branch's working directory gets a :meth:`~IgnoreMatcher.fork` of it
that its harvests keep in step with the ``.gitignore`` files on disk there (the step's tools may
write, change or delete them), so what git would ignore in the branch is never harvested.

Pattern syntax and precedence follow gitignore(5): ``#`` comments, ``!`` negation, a trailing
``/`` for directories only, a leading or inner ``/`` anchors the pattern to its file's directory,
``*``, ``?``, ``[...]`` and ``**``; a deeper ``.gitignore`` overrides a shallower one, the last
matching line of a file wins, and nothing inside an ignored directory can be re-included. The extra
globs take precedence over every ``.gitignore``; ``.git/info/exclude`` has the lowest. Where the
workspace is below the top of its work tree, the ``.gitignore`` files of the directories above it
apply too (below those of the workspace), each matched against paths from its own directory, and
so does ``info/exclude``; a linked worktree's is its repository's. As in git, a ``.gitignore``
that is a symlink is not followed. The user's global excludes file (``core.excludesFile``) is
not read.

As in git, a file the repository tracks is never ignored by those patterns (one added with
``git add -f``, or committed before a pattern came to match it): :meth:`IgnoreMatcher.load_tracked`
asks git for the files it tracks (its index: no pattern file is read for that), and they stay
part of the workspace, with the directories above them; what else a directory the patterns ignore
holds stays ignored. The extra globs still
leave them out: they are the run's own choice, not the repository's.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess

from attrs import define, field, frozen

from .._log import get_logger
from .._names import name_of

__all__ = [
    "VCS_DIRS",
    "IgnoreMatcher",
    "IgnoreRules",
    "is_vcs_name",
    "read_rules",
    "tracked_files",
]

log = get_logger(__name__)

#: version-control internals, never part of a branch (at any depth)
VCS_DIRS: frozenset[str] = frozenset({".git", ".hg", ".svn", ".bzr", ".jj", "_darcs"})


@functools.lru_cache(maxsize=16)
def _folded(names: frozenset[str]) -> frozenset[str]:
    return frozenset(name.casefold() for name in names)


def is_vcs_name(name: str, vcs_dirs: frozenset[str] = VCS_DIRS) -> bool:
    """Whether ``name`` is one of ``vcs_dirs`` in any case: on a case-insensitive file system
    (macOS, Windows, ext4 with casefold, FAT) ``.GIT/hooks/x`` written there is ``.git/hooks/x``."""
    return name in vcs_dirs or name.casefold() in _folded(vcs_dirs)


@frozen
class IgnoreRules:
    """How a workspace decides which files are not part of it."""

    #: read ``.gitignore`` files (at every level) and ``.git/info/exclude``
    use_gitignore: bool = True
    #: extra patterns in gitignore syntax, relative to the workspace root (e.g. ``node_modules/``)
    extra: tuple[str, ...] = ()
    #: directory (or file) names skipped at any depth: version-control internals
    vcs_dirs: frozenset[str] = VCS_DIRS


@frozen
class _Group:
    regex: re.Pattern[str]
    negate: bool


@frozen
class _RuleFile:
    #: the directory the patterns are relative to ("" for the workspace root)
    base: str
    #: pattern groups for files and for directories, last line first
    file_groups: tuple[_Group, ...]
    dir_groups: tuple[_Group, ...]
    #: for a file of the repository outside the workspace (above it, or its ``info/exclude``):
    #: the path from the file's directory to the workspace root, with a trailing ``/``
    prefix: str = ""


def _translate_class(pat: str, i: int) -> tuple[str, int] | None:
    """Translate ``[...]`` starting at ``pat[i] == "["``; None if it is not closed."""
    j = i + 1
    if j < len(pat) and pat[j] in "!^":
        j += 1
    if j < len(pat) and pat[j] == "]":
        j += 1
    while j < len(pat) and pat[j] != "]":
        j += 1
    if j >= len(pat):
        return None
    body = pat[i + 1 : j]
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    escaped = "".join("\\" + c if c in "\\[]^" else c for c in body)
    return ("[^/" + escaped + "]" if negate else "[" + escaped + "]"), j + 1


def _translate(pat: str) -> str:
    """The regex (without anchors) for one gitignore pattern body, matched against a rel path."""
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            j = i
            while j < n and pat[j] == "*":
                j += 1
            whole_segment = (i == 0 or pat[i - 1] == "/") and (j == n or pat[j] == "/")
            if j - i >= 2 and whole_segment:
                if j == n:
                    out.append(".*")
                    i = j
                else:
                    out.append("(?:.*/)?")
                    i = j + 1
            else:
                out.append("[^/]*")
                i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            translated = _translate_class(pat, i)
            if translated is None:
                out.append(re.escape(c))
                i += 1
            else:
                out.append(translated[0])
                i = translated[1]
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pat[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _parse_line(line: str) -> tuple[str, bool, bool] | None:
    """(regex, negate, dir_only) for one gitignore line, None for blanks and comments."""
    line = line.removesuffix("\r")  # of a CRLF line end
    if not line or line.startswith("#"):
        return None
    # Trailing spaces are dropped unless escaped with a backslash.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    body = _translate(line.lstrip("/"))
    return (body if anchored else "(?:.*/)?" + body), negate, dir_only


def _groups(parsed: list[tuple[str, bool, bool]], for_dirs: bool) -> tuple[_Group, ...]:
    """Consecutive patterns of one polarity as one alternation; last group first."""
    runs: list[tuple[bool, list[str]]] = []
    for regex, negate, dir_only in parsed:
        if dir_only and not for_dirs:
            continue
        if runs and runs[-1][0] == negate:
            runs[-1][1].append(regex)
        else:
            runs.append((negate, [regex]))
    groups = [
        # DOTALL: a name may hold a line break, which "*" and "**" match as any character
        _Group(
            re.compile("(?:" + "|".join(f"(?:{r})" for r in regexes) + r")\Z", re.DOTALL), negate
        )
        for negate, regexes in runs
    ]
    return tuple(reversed(groups))


def _rule_file(base: str, text: str, prefix: str = "") -> _RuleFile | None:
    # as git reads them: a UTF-8 byte-order mark dropped, lines ended by "\n" alone
    lines = text.removeprefix("\ufeff").split("\n")
    parsed = [p for p in map(_parse_line, lines) if p is not None]
    if not parsed:
        return None
    return _RuleFile(base, _groups(parsed, for_dirs=False), _groups(parsed, for_dirs=True), prefix)


def _work_tree_top(root: str) -> str | None:
    """The top of the git work tree ``root`` is in: ``root`` itself or the nearest directory
    above it holding a ``.git`` (a directory with a ``HEAD``, or a ``gitdir:`` file), on the
    same file system (git does not look across one either); or None."""
    try:
        device = os.stat(root).st_dev
    except OSError:
        return None
    here = root
    while True:
        dot_git = os.path.join(here, ".git")
        if os.path.isfile(os.path.join(dot_git, "HEAD")) or (
            os.path.isfile(dot_git) and (_first_line(here, ".git") or "").startswith("gitdir:")
        ):
            return here
        up = os.path.dirname(here)
        try:
            if up == here or os.stat(up).st_dev != device:
                return None
        except OSError:
            return None
        here = up


#: how long git may take to list the tracked files
_GIT_TIMEOUT = 60.0

#: the git variables that say where to look for a repository, kept
_GIT_KEEP = frozenset({"GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM"})

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a FIFO opens at once (and is refused), a symlink is not followed
_RULES_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_rules(
    dir_fd: int, name: str = ".gitignore", *, follow: bool = False
) -> tuple[str, os.stat_result] | None:
    """The text of the patterns file ``name`` in the directory ``dir_fd``, and the stat it was
    read with; None if there is no regular file of that name or it cannot be read. A symlink
    is followed only with ``follow`` (git follows none in the work tree, but follows the
    repository's own files). A FIFO or a device is never opened for long."""
    flags = _RULES_FLAGS & ~os.O_NOFOLLOW if follow else _RULES_FLAGS
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 65536)):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return name_of(b"".join(chunks)), st  # patterns match names: decoded as names are


def _read_in(directory: str, name: str, *, follow: bool = False) -> str | None:
    """The text of the patterns file ``name`` in ``directory`` (see :func:`read_rules`)."""
    try:
        dir_fd = os.open(directory, _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS)
    except OSError:
        return None
    try:
        read = read_rules(dir_fd, name, follow=follow)
    finally:
        os.close(dir_fd)
    return None if read is None else read[0]


def _info_dir(root: str) -> str | None:
    """The ``info`` directory of the repository whose work tree is ``root``: ``.git/info``,
    or, where ``.git`` is a file naming the git directory (a linked worktree, a submodule),
    that of the directory it names, or of its common directory."""
    dot_git = os.path.join(root, ".git")
    try:
        st = os.stat(dot_git)  # a symlink to the git directory is followed, as git does
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return os.path.join(dot_git, "info")
    first = _first_line(root, ".git")
    if first is None or not first.startswith("gitdir:"):
        return None
    git_dir = os.path.join(root, first[len("gitdir:") :].strip())
    common = _first_line(git_dir, "commondir")
    if common is not None:  # a submodule's git directory has none: it is its own
        git_dir = os.path.join(git_dir, common.strip())
    return os.path.join(git_dir, "info")


def _first_line(directory: str, name: str) -> str | None:
    """The first line of the small regular file ``name`` in ``directory`` (never waiting on
    a FIFO), or None."""
    text = _read_in(directory, name, follow=True)
    return None if text is None or len(text) > 65536 else text.partition("\n")[0].strip()


def tracked_files(root: str) -> frozenset[str] | None:
    """The files git tracks under the directory ``root`` (the top of a git work tree or below
    it), relative to ``root``: its index, read without any pattern file (so none is waited
    on); None when ``root`` is in no work tree, there is no git, or git failed.

    The repository's configuration runs nothing: ``core.fsmonitor`` is turned off.
    """
    git = shutil.which("git")
    if git is None:
        return None
    args = [git, "-c", "core.fsmonitor=false", "-C", root, "ls-files", "-z", "--cached"]
    # the workspace's own repository, whatever the caller's shell says (GIT_DIR, GIT_CONFIG_*,
    # ...), found as git finds it
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _GIT_KEEP}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        done = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=_GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("tracked files not listed: ignored ones are left out", root=root, error=str(e))
        return None
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip().splitlines()
        if any("not a git repository" in line for line in error):
            return None  # a .git that is none (a bare copy, a stand-in): patterns only
        # git's own reason (its "fatal:" line), not the advice it prints after
        reason = next((line for line in error if line.startswith("fatal:")), None)
        log.warning(
            "tracked files not listed: ignored ones are left out",
            root=root,
            error=reason or (error[-1] if error else f"git exited with {done.returncode}"),
        )
        return None
    return frozenset(name_of(raw) for raw in done.stdout.split(b"\0") if raw)


def _ancestors(paths: frozenset[str]) -> frozenset[str]:
    """The directories above ``paths`` (the root, "", left out)."""
    out: set[str] = set()
    for rel in paths:
        head = rel.rpartition("/")[0]
        while head and head not in out:
            out.add(head)
            head = head.rpartition("/")[0]
    return frozenset(out)


@define
class IgnoreMatcher:
    """Compiled ignore rules for one workspace root. Paths are ``/``-separated and relative."""

    rules: IgnoreRules
    _files: dict[str, _RuleFile] = field(factory=dict, alias="_files")
    _extra: _RuleFile | None = field(default=None, alias="_extra")
    _exclude: _RuleFile | None = field(default=None, alias="_exclude")
    #: the ``.gitignore`` files of the work tree above the workspace root, nearest first
    _outer: tuple[_RuleFile, ...] = field(default=(), alias="_outer")
    #: the workspace root is in a directory those patterns ignore: every untracked file is
    _root_hidden: bool = field(default=False, alias="_root_hidden")
    _chains: dict[str, tuple[_RuleFile, ...]] = field(factory=dict, alias="_chains")
    #: files the repository tracks that the patterns match: never ignored by them
    _tracked: frozenset[str] = field(default=frozenset(), alias="_tracked")
    #: the directories above them
    _tracked_dirs: frozenset[str] = field(default=frozenset(), alias="_tracked_dirs")
    #: which of those directories the patterns ignore (or one above them does), as computed
    _hidden: dict[str, bool] = field(factory=dict, alias="_hidden")

    @classmethod
    def from_rules(cls, rules: IgnoreRules) -> IgnoreMatcher:
        """A matcher with the extra globs compiled and no ``.gitignore`` loaded yet."""
        return cls(rules, _extra=_rule_file("", "\n".join(rules.extra)))

    def fork(self) -> IgnoreMatcher:
        """A copy that takes patterns of its own (those compiled so far are shared, not redone)."""
        return IgnoreMatcher(
            self.rules,
            _files=dict(self._files),
            _extra=self._extra,
            _exclude=self._exclude,
            _outer=self._outer,
            _root_hidden=self._root_hidden,
            _chains=dict(self._chains),
            _tracked=self._tracked,
            _tracked_dirs=self._tracked_dirs,
        )

    @property
    def tracked(self) -> frozenset[str]:
        """The files the repository tracks: kept whatever the patterns say."""
        return self._tracked

    def set_tracked(self, paths: frozenset[str]) -> None:
        """Keep ``paths`` (files the repository tracks) whatever the patterns say, as git does;
        the extra globs and the VCS names still apply to them."""
        self._tracked = frozenset(paths)
        self._tracked_dirs = _ancestors(self._tracked)
        self._hidden.clear()

    def load_tracked(self, root: str) -> None:
        """Ask git which files it tracks under ``root`` and keep them (:meth:`set_tracked`), if
        the rules use gitignore and ``root`` is in a git work tree."""
        if not self.rules.use_gitignore:
            return
        found = tracked_files(root)
        if found:
            self.set_tracked(found)

    def add_patterns(self, base: str, text: str) -> None:
        """Set the lines of the ``.gitignore`` in directory ``base`` ("" for the root).

        They replace the patterns set for ``base`` before; a text without any removes them.
        """
        compiled = _rule_file(base, text)
        if compiled is not None:
            self._files[base] = compiled
            self._patterns_changed()
        else:
            self.remove_patterns(base)

    def remove_patterns(self, base: str) -> None:
        """Forget the patterns of the ``.gitignore`` in directory ``base`` (gone from disk)."""
        if self._files.pop(base, None) is not None:
            self._patterns_changed()

    def set_exclude(self, text: str) -> None:
        """Set the patterns of ``.git/info/exclude`` (root-relative, lowest precedence)."""
        self._exclude = _rule_file("", text)
        self._patterns_changed()

    def _patterns_changed(self) -> None:
        self._chains.clear()
        self._hidden.clear()

    def load_dir(self, root: str, base: str) -> None:
        """Read ``base/.gitignore`` under ``root`` if the rules use gitignore and it is a
        regular file (see :func:`read_rules`)."""
        if not self.rules.use_gitignore:
            return
        text = _read_in(os.path.join(root, base) if base else root, ".gitignore")
        if text is not None:
            self.add_patterns(base, text)

    def load_exclude(self, root: str) -> None:
        """Read the patterns of the repository that apply to the workspace at ``root`` from
        outside it, if the rules use gitignore: its ``info/exclude`` (through a ``.git`` file
        too, as a linked worktree or a submodule has) and, where ``root`` is below the top of
        the work tree, the ``.gitignore`` files of the directories above it, each matched
        against paths from its own directory as git matches them."""
        if not self.rules.use_gitignore:
            return
        top = _work_tree_top(root)
        if top is None:
            return
        below = os.path.relpath(root, top)
        prefix = "" if below == "." else below.replace(os.sep, "/") + "/"
        info = _info_dir(top)
        read = None if info is None else _read_in(info, "exclude", follow=True)
        self._exclude = None if read is None else _rule_file("", read, prefix)
        outer: list[_RuleFile] = []
        if prefix:
            parts = prefix.rstrip("/").split("/")
            for depth in range(len(parts)):  # the top first, the root's parent last
                here = os.path.join(top, *parts[:depth])
                text = _read_in(here, ".gitignore")
                rest = "/".join(parts[depth:]) + "/"
                if text is not None and (compiled := _rule_file("", text, rest)) is not None:
                    outer.append(compiled)
        self._outer = tuple(reversed(outer))
        self._root_hidden = bool(prefix) and self._below_ignored(prefix.rstrip("/").split("/"))
        if self._root_hidden:
            log.warning(
                "the workspace is in a directory its git repository ignores: only the files "
                "git tracks there are part of it",
                root=root,
                top=top,
            )
        self._patterns_changed()

    def _below_ignored(self, parts: list[str]) -> bool:
        """Whether the patterns from outside the workspace ignore a directory from the top of
        the work tree down to the workspace root (``parts``: the path from the top)."""
        outside = (*self._outer, *((self._exclude,) if self._exclude is not None else ()))
        for depth in range(1, len(parts) + 1):  # each directory, from the top down
            for rule_file in outside:  # nearest first
                # the rule file's directory is ``parts`` less the components of its prefix
                own = len(parts) - len(rule_file.prefix.rstrip("/").split("/"))
                if own >= depth:
                    continue  # a file at or below this directory: it does not judge it
                sub = "/".join(parts[own:depth])
                verdict = _says(rule_file, sub, True)
                if verdict is not None:
                    if verdict:
                        return True
                    break
        return False

    def _chain(self, parent: str) -> tuple[_RuleFile, ...]:
        chain = self._chains.get(parent)
        if chain is not None:
            return chain
        # the rule files from ``parent`` up, nearest first, until a directory whose chain is
        # known (walks go down: usually the parent's), so a deep tree costs no more per level
        own: list[_RuleFile] = []
        above: tuple[_RuleFile, ...] | None = None
        base = parent
        while True:
            rule_file = self._files.get(base)
            if rule_file is not None:
                own.append(rule_file)
            if not base:
                break
            base = base.rpartition("/")[0]
            above = self._chains.get(base)
            if above is not None:
                break
        head = (self._extra,) if self._extra is not None else ()
        if above is None:
            tail = (*self._outer, *((self._exclude,) if self._exclude is not None else ()))
            chain = (*head, *own, *tail)
        else:  # ``above`` is the extra globs, the rule files from ``base`` up, the excludes
            chain = (*head, *own, *above[len(head) :])
        self._chains[parent] = chain
        return chain

    def has_rules(self, parent: str) -> bool:
        """Whether any pattern applies to entries of directory ``parent`` (VCS names aside)."""
        return self._root_hidden or parent in self._tracked_dirs or bool(self._chain(parent))

    def ignored(self, rel: str, parent: str, name: str, is_dir: bool) -> bool:
        """Whether the entry ``rel`` (in directory ``parent``, named ``name``) is ignored itself.

        Ancestors are not checked: walks prune ignored directories. See :meth:`is_ignored`.
        A tracked file (:meth:`set_tracked`) and the directories above one are ignored only by
        the extra globs; what else a directory the patterns ignore holds is ignored.
        """
        if is_vcs_name(name, self.rules.vcs_dirs):
            return True
        if self._tracked or self._root_hidden:
            if rel in self._tracked_dirs if is_dir else rel in self._tracked:
                extra = self._extra
                return extra is not None and _verdict((extra,), rel, is_dir) is True
            if self._root_hidden:
                return True  # the whole workspace is in an ignored directory
            if parent and parent in self._tracked_dirs and self._is_hidden(parent):
                return True  # in a directory kept only for the tracked files it holds
        return _verdict(self._chain(parent), rel, is_dir) is True

    def _is_hidden(self, directory: str) -> bool:
        """Whether the patterns ignore ``directory`` (one above a tracked file), or a
        directory above it."""
        known = self._hidden
        hidden = known.get(directory)
        if hidden is not None:
            return hidden
        # from the top down to ``directory``, without recursion: a path may be thousands deep
        unknown = [directory]
        while (parent := unknown[-1].rpartition("/")[0]) and parent not in known:
            unknown.append(parent)
        above = known.get(parent, False) if parent else False
        for rel in reversed(unknown):
            head = rel.rpartition("/")[0]
            above = above or _verdict(self._chain(head), rel, True) is True
            known[rel] = above
        return above

    def is_ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether ``rel`` is ignored, itself or because a directory above it is."""
        parts = rel.split("/")
        parent = ""
        for depth, name in enumerate(parts):
            path = f"{parent}/{name}" if parent else name
            last = depth == len(parts) - 1
            if self.ignored(path, parent, name, is_dir or not last):
                return True
            parent = path
        return False


def _verdict(chain: tuple[_RuleFile, ...], rel: str, is_dir: bool) -> bool | None:
    """What the first pattern of ``chain`` matching ``rel`` says: ignored (True), re-included
    (False), or None when none matches."""
    for rule_file in chain:
        sub = rule_file.prefix + (rel[len(rule_file.base) + 1 :] if rule_file.base else rel)
        verdict = _says(rule_file, sub, is_dir)
        if verdict is not None:
            return verdict
    return None


def _says(rule_file: _RuleFile, sub: str, is_dir: bool) -> bool | None:
    """What the last line of ``rule_file`` matching ``sub`` (a path from the file's own
    directory) says: ignored, re-included, or None when none matches."""
    for group in rule_file.dir_groups if is_dir else rule_file.file_groups:
        if group.regex.match(sub):
            return not group.negate
    return None
