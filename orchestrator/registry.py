"""The official ACP registry: its agents, listed and made runnable by id (``registry:ID``).

The registry (https://github.com/agentclientprotocol/registry) publishes ``registry.json``:
``{"version", "agents": [...], "extensions": [...]}``, each agent with ``id``, ``name``,
``version``, ``description`` and a ``distribution`` of one or more kinds:

- ``npx``: ``{"package", "args", "env"}``, run as ``npx -y PACKAGE ARGS``;
- ``uvx``: the same for a PyPI package, run as ``uvx PACKAGE ARGS``;
- ``binary``: per platform (``linux-x86_64``, ``darwin-aarch64``, ...) an ``archive`` URL, the
  ``cmd`` to run once it is extracted, ``args`` and ``env``.

A snapshot of the registry ships with the package (``orchestrator/data/registry.json``, its
provenance beside it in ``registry.provenance.json``; ``tools/build_registry_snapshot.py``
rebuilds both from a clone of the registry). :func:`load_registry` reads it, a file, or (with
:func:`fetch_registry`) a URL. :func:`registry_spec` turns an entry into an
:class:`~orchestrator.agents.AgentSpec`; :func:`~orchestrator.agents.resolve_agent` does so for
``registry:ID``, from the registry named by ``$ORCHESTRATOR_REGISTRY`` (a file) or else the
snapshot. Binary agents start through :mod:`orchestrator._agent_archive`, which downloads the
archive into the state directory's cache on first use.
"""

from __future__ import annotations

import difflib
import json
import os
import platform
import re
import shutil
import stat
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any, Literal

from attrs import field, frozen

from ._fetch import OFFICIAL_REGISTRY_URL, fetch, url_problem
from .agents import AgentNeeds, AgentSpec
from .errors import RegistryError

__all__ = [
    "BUILTIN",
    "ENV_VAR",
    "OFFICIAL_URL",
    "PREFIX",
    "Registry",
    "RegistryAgent",
    "fetch_registry",
    "load_registry",
    "platform_key",
    "registry_spec",
]

#: the word that names the vendored snapshot (``--registry builtin``, ``$ORCHESTRATOR_REGISTRY``)
BUILTIN = "builtin"
#: the variable naming the registry file ``registry:ID`` reads (default: the snapshot)
ENV_VAR = "ORCHESTRATOR_REGISTRY"
#: how ``--agent`` names an agent of the registry
PREFIX = "registry:"
#: where the registry publishes each build (a release asset of its repository)
OFFICIAL_URL = OFFICIAL_REGISTRY_URL
#: a registry fetched from a URL: at most this many bytes, within this many seconds in all
MAX_BYTES = 8 * 1024 * 1024
FETCH_TIMEOUT = 30.0

Kind = Literal["npx", "uvx", "binary"]
#: the distribution kinds, in the order :func:`registry_spec` prefers them
KINDS: tuple[Kind, ...] = ("npx", "uvx", "binary")
#: the launcher each package kind needs on PATH
_LAUNCHERS = {"npx": "npx", "uvx": "uvx"}
_ID = re.compile(r"^[a-z][a-z0-9-]*$")
# what npx and uvx may be given: a package name (npm: an optional @scope; PyPI: optional
# [extras]) and an optional version, nothing that reads as an option or holds a space
_NPM_WORD = r"[A-Za-z0-9~][A-Za-z0-9._~-]*"
# a version, range or tag never starts with '-' (npx would read it as an option)
_NPM_PACKAGE = re.compile(
    rf"(?:@{_NPM_WORD}/)?{_NPM_WORD}(?:@[A-Za-z0-9.+^~<>=*_][A-Za-z0-9.+^~<>=*_-]*)?"
)
_PYPI_WORD = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PYPI_PACKAGE = re.compile(
    rf"{_PYPI_WORD}(?:\[{_PYPI_WORD}(?:,{_PYPI_WORD})*\])?"
    r"(?:(?:@|==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!_][A-Za-z0-9.*+!_-]*)?"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@frozen
class RegistryAgent:
    """One agent of the registry, as its entry says."""

    id: str
    name: str
    version: str
    description: str
    #: the ``distribution`` object: kind -> its fields
    distribution: Mapping[str, Mapping[str, Any]] = field(factory=dict)
    license: str | None = None
    repository: str | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distribution kinds the entry offers, in the registry's order."""
        return tuple(self.distribution)

    def binary_target(self) -> Mapping[str, Any] | None:
        """The ``binary`` target for this platform, if the entry has one."""
        key = platform_key()
        targets = self.distribution.get("binary") or {}
        return targets.get(key) if key is not None else None

    def problem(self, kind: str) -> str | None:
        """Why the entry's ``kind`` cannot start here (None when it can): a field the
        orchestrator refuses (a package that is no package name, arguments or environment
        values that are not strings, an archive URL or ``cmd`` it would not use), no binary
        for this platform, or its launcher missing from PATH. Listing and launch both ask
        this, so what the listing says runs is what launches."""
        dist = self.distribution.get(kind)
        if dist is None:
            return f"no {kind} distribution"
        if kind == "binary":
            target = self.binary_target()
            if target is None:
                return f"no binary for {platform_key() or sys.platform}"
            return _field_problem(kind, target) or _binary_problem(target)
        if kind not in _LAUNCHERS:
            return f"no distribution this orchestrator knows ({kind})"
        grammar, registry_name = (
            (_NPM_PACKAGE, "an npm") if kind == "npx" else (_PYPI_PACKAGE, "a PyPI")
        )
        package = dist.get("package")
        if not isinstance(package, str) or not grammar.fullmatch(package):
            return (
                f"{kind} package {package!r} is not"
                f" {registry_name} package name (with an optional version)"
            )
        # the entry's version is appended when the package names none: the same grammar
        if not grammar.fullmatch(_with_version(package, self.version, "@")):
            return f"{kind} version {self.version!r} is not a version {kind} can be given"
        found = _field_problem(kind, dist)
        if found is not None:
            return found
        if shutil.which(_LAUNCHERS[kind]) is None:
            return f"{_LAUNCHERS[kind]} not found"
        return None

    def runnable(self) -> Kind | None:
        """The kind that can start here (no :meth:`problem`), in the order of
        :data:`KINDS`; None when none can."""
        for kind in KINDS:
            if kind in self.distribution and self.problem(kind) is None:
                return kind
        return None

    def why_not(self) -> str:
        """Why no kind can start here (empty when one can)."""
        if self.runnable() is not None:
            return ""
        reasons = [self.problem(kind) or "" for kind in self.kinds]
        return "; ".join(r for r in reasons if r) or "no distribution this orchestrator knows"

    def to_json(self) -> dict[str, Any]:
        """The entry's row in ``orchestrator agents --registry --json``."""
        kind = self.runnable()
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "distributions": list(self.kinds),
            "runnable": kind is not None,
            "runWith": kind,
            "whyNot": self.why_not() or None,
            "license": self.license,
            "agent": f"{PREFIX}{self.id}",
        }


@frozen
class Registry:
    """A registry: its format version, agents, where it came from and its provenance."""

    version: str
    agents: tuple[RegistryAgent, ...]
    #: ``builtin``, a file path or a URL
    source: str
    #: for the snapshot: repository, commit, date and licence of what it was built from
    provenance: Mapping[str, Any] | None = None

    def get(self, agent_id: str) -> RegistryAgent:
        """The agent ``agent_id``; :class:`RegistryError` (naming a close id) if none."""
        for agent in self.agents:
            if agent.id == agent_id:
                return agent
        ids = [a.id for a in self.agents]
        close = difflib.get_close_matches(agent_id, ids, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f" (it has {len(ids)} agents)"
        raise RegistryError(f"no agent {agent_id!r} in the registry {self.source}{hint}")


def platform_key() -> str | None:
    """This machine as the registry names platforms (``linux-x86_64``), or None."""
    system = {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform)
    machine = platform.machine().lower()
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
    if system is None or machine not in arch:
        return None
    return f"{system}-{arch[machine]}"


def _field_problem(kind: str, dist: Mapping[str, Any]) -> str | None:
    """Why ``dist``'s ``args`` or ``env`` cannot be passed on as they are (None if they can)."""
    where = kind
    args = dist.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return f"{where} args must be a list of strings"
    if any("\0" in a for a in args):
        return f"{where} args hold a NUL character"
    env = dist.get("env", {})
    if not isinstance(env, dict):
        return f"{where} env must be an object of strings"
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            return f"{where} env name {name!r} is not a variable name"
        if not isinstance(value, str) or "\0" in value:
            return f"{where} env {name} must be a string"
    return None


def _binary_problem(target: Mapping[str, Any]) -> str | None:
    """Why a binary target's archive URL or ``cmd`` is refused (None when neither is)."""
    cmd = target["cmd"]
    if (
        not cmd
        or cmd.startswith("-")
        or os.path.isabs(cmd)
        or os.path.normpath(cmd).split(os.sep)[0] == ".."
        or any(ord(c) < 0x20 or c == "\x7f" for c in cmd)
    ):
        return f"binary cmd {cmd!r} is not a path inside the archive"
    problem = url_problem(target["archive"], allow_file=True)
    if problem is not None:
        return f"binary archive {problem}"
    return None


def parse_registry(data: Any, source: str, provenance: Mapping[str, Any] | None = None) -> Registry:
    """A :class:`Registry` from decoded JSON; :class:`RegistryError` naming the first fault.

    A malformed entry (no id, name, ...) or two entries with the same id refuse the whole
    registry; an entry whose fields the orchestrator will not pass on (see
    :meth:`RegistryAgent.problem`) is kept, and says it cannot run."""
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise RegistryError(f'{source}: not an ACP registry (no "agents" list)')
    agents = []
    seen: set[str] = set()
    for i, raw in enumerate(data["agents"]):
        agent = _entry(raw, f"{source}: agents[{i}]")
        if agent.id in seen:
            raise RegistryError(f"{source}: agents[{i}]: the id {agent.id!r} appears twice")
        seen.add(agent.id)
        agents.append(agent)
    version = data.get("version")
    return Registry(str(version) if version is not None else "", tuple(agents), source, provenance)


def _entry(raw: Any, where: str) -> RegistryAgent:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where} is not an object")
    for key in ("id", "name", "version", "description"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise RegistryError(f"{where} has no {key!r} string")
    if not _ID.match(raw["id"]):
        raise RegistryError(f"{where}: id {raw['id']!r} is not lowercase letters, digits, -")
    dist = raw.get("distribution")
    if not isinstance(dist, dict) or not dist:
        raise RegistryError(f"{where} ({raw['id']}) has no distribution")
    for kind, value in dist.items():
        if not isinstance(value, dict):
            raise RegistryError(f"{where} ({raw['id']}): distribution {kind!r} is not an object")
        if kind in ("npx", "uvx") and not isinstance(value.get("package"), str):
            raise RegistryError(f"{where} ({raw['id']}): {kind} has no package")
        if kind == "binary":
            for plat, target in value.items():
                if not (
                    isinstance(target, dict)
                    and isinstance(target.get("archive"), str)
                    and isinstance(target.get("cmd"), str)
                ):
                    raise RegistryError(
                        f"{where} ({raw['id']}): binary {plat} needs archive and cmd strings"
                    )
    return RegistryAgent(
        raw["id"],
        raw["name"],
        raw["version"],
        raw["description"],
        dist,
        license=raw.get("license") if isinstance(raw.get("license"), str) else None,
        repository=raw.get("repository") if isinstance(raw.get("repository"), str) else None,
    )


def _builtin() -> Registry:
    data = resources.files("orchestrator") / "data"
    registry = json.loads((data / "registry.json").read_text("utf-8"))
    provenance = json.loads((data / "registry.provenance.json").read_text("utf-8"))
    return parse_registry(registry, BUILTIN, provenance)


def is_url(source: str) -> bool:
    """Whether ``source`` is a URL to fetch (``http(s)://``) rather than a file path."""
    return source.startswith(("https://", "http://"))


def _file_path(source: str) -> str:
    """The file ``source`` names: a path, or a ``file://`` URL; another URL scheme is refused."""
    import urllib.parse
    import urllib.request

    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", source)
    if scheme is None:
        return os.path.expanduser(source)
    if scheme.group(1).lower() != "file":
        raise RegistryError(
            f"{scheme.group(1)}:// is not a registry source: give a file, a file:// URL or an"
            " https:// URL"
        )
    parts = urllib.parse.urlsplit(source)
    if parts.netloc not in ("", "localhost"):
        raise RegistryError(f"{source}: a file:// URL must name a file on this machine")
    return urllib.request.url2pathname(parts.path)


def load_registry(source: str | os.PathLike[str] | None = None) -> Registry:
    """The registry in ``source``: a file, or the snapshot (None or ``builtin``).

    A URL is :func:`fetch_registry`'s: it waits on the network. :class:`RegistryError` for a
    file that cannot be read or is no registry.
    """
    if source is None or os.fspath(source) == BUILTIN:
        return _builtin()
    path = os.fspath(source)
    if is_url(path):
        raise RegistryError(f"{_redact(path)}: a registry URL must be fetched, not loaded")
    file = _file_path(path)
    try:
        # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; it is refused below
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise RegistryError(f"cannot read registry {path}: {e.strerror or e}") from e
    try:
        # checked on the descriptor before a file object is made of it: open() of a
        # directory's descriptor raises IsADirectoryError, and every OSError is one line
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RegistryError(f"cannot read registry {path}: not a regular file")
        with open(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise RegistryError(f"cannot read registry {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    return parse_registry(_decode(raw, path), path)


def fetch_registry(
    url: str, *, timeout: float = FETCH_TIMEOUT, max_bytes: int = MAX_BYTES
) -> Registry:
    """The registry at ``url`` (HTTPS; plain HTTP only to this machine, every redirect
    checked alike), fetched within ``timeout`` seconds in all and at most ``max_bytes``
    bytes. Blocking: call it in a thread the caller may abandon."""
    parts: list[bytes] = []
    fetch(
        url,
        parts.append,
        error=RegistryError,
        what="registry",
        deadline=timeout,
        max_bytes=max_bytes,
    )
    shown = _redact(url)
    return parse_registry(_decode(b"".join(parts), shown), shown)


def _redact(url: str) -> str:
    from ._fetch import redact

    return redact(url)


def _decode(raw: bytes, where: str) -> Any:
    if len(raw) > MAX_BYTES:
        raise RegistryError(f"registry {where} is larger than {MAX_BYTES} bytes")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise RegistryError(f"registry {where} is not JSON: {e}") from e
    except RecursionError as e:  # arrays or objects nested thousands deep
        raise RegistryError(f"registry {where} is nested too deeply to read") from e


def registry_source() -> str:
    """The registry read when none is named: ``$ORCHESTRATOR_REGISTRY`` (a file), else the
    snapshot (``builtin``)."""
    return os.environ.get(ENV_VAR) or BUILTIN


def registry_from_env() -> Registry:
    """The registry ``registry:ID`` reads: :func:`registry_source`. A URL there is refused
    (resolving an agent never waits on the network): save the registry to a file."""
    source = registry_source()
    if is_url(source):
        raise RegistryError(
            f"${ENV_VAR} names a URL ({_redact(source)}): it must name a registry file"
            " (save the registry to a file first)"
        )
    return load_registry(source)


def _with_version(package: str, version: str, sep: str) -> str:
    """``package`` pinned to ``version`` unless it names a version itself (``@scope/p@1.2``,
    ``p==1.2``, ``p>=1``)."""
    name = package[1:] if package.startswith("@") else package
    if "@" in name or any(op in name for op in ("==", ">=", "<=", "~=", "!=")):
        return package
    return f"{package}{sep}{version}"


def registry_spec(
    agent: RegistryAgent, *, registry: Registry | None = None, cache_dir: str | None = None
) -> AgentSpec:
    """An :class:`AgentSpec` that starts ``agent`` as its registry entry says.

    The first kind of :data:`KINDS` that can start here is used (else the first the entry
    has, which then fails to start saying what is missing): ``npx -y PACKAGE@VERSION ARGS``,
    ``uvx PACKAGE@VERSION ARGS`` (a package naming its own version is kept as is), or for a
    binary this interpreter running :mod:`orchestrator._agent_archive`, which downloads and
    unpacks the archive into ``cache_dir`` (default: the state directory's ``cache/agents``)
    once and then execs its ``cmd``. The entry's ``env`` is the spec's.
    """
    kind = agent.runnable() or next((k for k in KINDS if k in agent.distribution), None)
    if kind is None:
        raise RegistryError(
            f"registry agent {agent.id!r} has no distribution this orchestrator can run"
            f" (it offers {', '.join(agent.kinds)})"
        )
    problem = agent.problem(kind)
    # a missing launcher is left to the start, which says how to install it
    if problem is not None and not problem.endswith(" not found"):
        raise RegistryError(f"registry agent {agent.id!r} cannot run: {problem}")
    source = registry.source if registry is not None else BUILTIN
    where = f"{agent.name} {agent.version} from the ACP registry ({source})"
    dist = agent.distribution[kind]
    command: tuple[str, ...]
    if kind == "npx":
        command = ("npx", "-y", _with_version(dist["package"], agent.version, "@"))
        install = "needs Node.js (npx fetches the package on first use)"
        needs = AgentNeeds(runtime="Node.js (npx)")
    elif kind == "uvx":
        command = ("uvx", _with_version(dist["package"], agent.version, "@"))
        install = "needs uv (uvx fetches the package on first use)"
        needs = AgentNeeds(runtime="uv (uvx)")
    else:
        dist = agent.binary_target() or {}
        if not dist:
            raise RegistryError(
                f"registry agent {agent.id!r} has no binary for {platform_key() or sys.platform}"
            )
        command = _archive_command(agent, dist, cache_dir)
        install = f"downloads {dist['archive']} into the cache on first use"
        needs = AgentNeeds()
    # checked by problem(): strings only, passed on as they are
    args = tuple(dist.get("args") or ())
    env = dict(dist.get("env") or {})
    return AgentSpec(
        agent.id,
        (*command, *args),
        env=env,
        description=f"{where}: {agent.description}",
        install=install,
        # how many sessions one process serves is not in the registry: one always works
        sessions_per_process=1,
        startup_timeout=300.0,
        needs=needs,
    )


def _archive_command(
    agent: RegistryAgent, target: Mapping[str, Any], cache_dir: str | None
) -> tuple[str, ...]:
    from .state import state_path

    cache = cache_dir or str(state_path() / "cache" / "agents")
    key = f"{agent.id}-{agent.version}-{platform_key()}"
    command = [sys.executable, "-m", "orchestrator._agent_archive", f"--cache={cache}"]
    # one word each (--NAME=VALUE), so that no value is read as a path to resolve
    command += [f"--key={key}", f"--archive={target['archive']}", f"--cmd={target['cmd']}"]
    digest = target.get("sha256")
    if isinstance(digest, str):
        command += [f"--sha256={digest}"]
    return (*command, "--")


def resolve_registry_agent(text: str) -> AgentSpec:
    """``registry:ID`` as an :class:`AgentSpec`, from :func:`registry_from_env`."""
    agent_id = text[len(PREFIX) :].strip()
    if not agent_id:
        raise RegistryError(f"{PREFIX} needs an agent id ({PREFIX}ID)")
    registry = registry_from_env()
    return registry_spec(registry.get(agent_id), registry=registry)
