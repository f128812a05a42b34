"""Environment variables that change what a command runs (a pure leaf: standard library only).

:data:`LOADER_ENV` lists the names that change which program a command runs or what it loads;
a command may set them only where a policy rule allows them (:func:`is_loader`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

__all__ = ["LOADER_ENV", "is_loader"]

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


def _matches(name: str, patterns: Iterable[str]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


def is_loader(name: str) -> bool:
    """Whether setting ``name`` changes which program a command runs or what it loads
    (:data:`LOADER_ENV`)."""
    return _matches(name, LOADER_ENV)
