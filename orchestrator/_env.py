"""Environment variables: what a terminal starts with, which are secrets, which change what runs.

A pure leaf (standard library only) holding the three lists every code path uses, each once:

- :data:`TERMINAL_ENV`: the orchestrator's variables a terminal starts with
  (:func:`terminal_environment`); everything else stays out unless passed through by name;
- :data:`SECRET_NAMES`: names whose values are hidden where an agent's settings are shown or
  recorded (:func:`is_secret`, which also hides any value holding URL credentials);
- :data:`LOADER_ENV`: names that change which program a command runs or what it loads, which
  a command may set only where a policy rule allows them (:func:`is_loader`).

An agent process itself gets the orchestrator's whole environment (it needs its own API keys
and login); see the README, "What an agent and a terminal receive".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "LOADER_ENV",
    "SECRET_NAMES",
    "TERMINAL_ENV",
    "is_loader",
    "is_secret",
    "terminal_environment",
]

#: The orchestrator's variables a terminal starts with (globs, case-sensitive): what nearly
#: every program needs to find itself, its user and its files, none of which holds a
#: credential. Proxies are left out (their URLs often carry a password), and so are toolchain
#: locations: pass those by name.
TERMINAL_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL",           # who, where, and how to find programs
    "LANG", "LANGUAGE", "LC_*", "TZ",                     # language, encoding, time zone
    "TERM", "COLORTERM", "NO_COLOR",                      # output to a terminal
    "TMPDIR", "TMP", "TEMP",                              # temporary files
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",  # tools' own dirs
)  # fmt: skip

#: Names whose values are secrets (globs, case-insensitive).
SECRET_NAMES = (
    "*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*_PASS", "*_PWD", "*PASSPHRASE*",
    "*CREDENTIAL*", "*PRIVATE*", "*AUTH*", "*COOKIE*", "*WEBHOOK*", "*_PAT", "*_DSN",
    "DATABASE_URL",
)  # fmt: skip

#: Names a command may set only where a policy rule allows them (globs, case-insensitive):
#: they change which program runs, what it loads or which configuration it reads.
LOADER_ENV = (
    # where programs and libraries are found
    "PATH", "LD_*", "DYLD_*", "GCONV_PATH", "LOCPATH", "OPENSSL_CONF", "OPENSSL_ENGINES",
    # shells: startup files, exported functions, tracing and word splitting
    "BASH_ENV", "ENV", "BASH_FUNC_*", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS",
    "CDPATH", "FPATH", "ZDOTDIR", "SHELL",
    # the home directory and config directories (their rc files run commands: ~/.gitconfig)
    "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS",
    # interpreters and their module paths, startup code and options
    "PYTHON*", "NODE_OPTIONS", "NODE_PATH", "NODE_REPL_EXTERNAL_MODULE", "NPM_CONFIG_*",
    "PERL5*", "PERLLIB", "RUBYOPT", "RUBYLIB", "GEM_HOME", "GEM_PATH", "LUA_INIT*",
    "LUA_PATH*", "LUA_CPATH*", "PHPRC", "PHP_INI_SCAN_DIR", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "JAVA_HOME", "CLASSPATH", "GOFLAGS", "GOROOT",
    "GOTOOLCHAIN", "GOENV", "RUSTC", "RUSTC_WRAPPER", "CARGO_HOME", "CARGO_BUILD_*",
    # git: programs it runs, the config and repository it uses, files it writes
    "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_CONFIG*", "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR", "GIT_PAGER", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_EXTERNAL_DIFF",
    "GIT_PROXY_COMMAND", "GIT_TEMPLATE_DIR", "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR",
    "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_ALLOW_PROTOCOL", "GIT_TRACE*",
    # programs other programs start
    "EDITOR", "VISUAL", "PAGER", "MANPAGER", "BROWSER", "LESS", "LESSOPEN", "LESSCLOSE",
    "LESSKEY*", "VIMINIT", "EXINIT",
)  # fmt: skip

# scheme://user:password@host or scheme://token@host (a password may hold an unescaped "/")
_URL_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s@]+@")


def _matches(name: str, patterns: Iterable[str]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


def terminal_environment(
    environ: Mapping[str, str], *, passthrough: Iterable[str] = ()
) -> dict[str, str]:
    """The variables of ``environ`` a terminal starts with: :data:`TERMINAL_ENV`, and those
    named by ``passthrough`` (globs, case-insensitive), whatever they hold."""
    extra = tuple(passthrough)
    return {
        name: value
        for name, value in environ.items()
        if any(fnmatch.fnmatchcase(name, p) for p in TERMINAL_ENV) or _matches(name, extra)
    }


def is_secret(name: str, value: str = "") -> bool:
    """Whether a variable's value must be hidden: a secret-looking name
    (:data:`SECRET_NAMES`), or a value holding URL credentials (``http://user:pass@proxy``)."""
    return _matches(name, SECRET_NAMES) or _URL_CREDENTIALS.search(value) is not None


def is_loader(name: str) -> bool:
    """Whether setting ``name`` changes which program a command runs or what it loads
    (:data:`LOADER_ENV`)."""
    return _matches(name, LOADER_ENV)
