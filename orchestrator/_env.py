"""Environment variables: what a terminal starts with, which are secrets, which change what runs.

A pure leaf (standard library only) holding the lists every code path uses, each once:

- :data:`TERMINAL_ENV`: the orchestrator's variables a terminal starts with
  (:func:`terminal_environment`); everything else stays out unless passed through by name;
- :data:`SECRET_NAMES`: names whose values are hidden where an agent's settings are shown or
  recorded (:func:`is_secret`, which also hides any value holding URL credentials);
- :data:`FREE_ENV`: the few names a command may set without a policy rule allowing them
  (:func:`is_free`): locale, time zone, terminal size and colour; a command may set any other
  variable only where the rule that allows it lists it.

An agent process itself gets the orchestrator's whole environment (it needs its own API keys
and login); see the README, "What an agent and a terminal receive".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "FREE_ENV",
    "LOCALE_CATEGORIES",
    "SECRET_NAMES",
    "TERMINAL_ENV",
    "is_free",
    "is_secret",
    "is_switch",
    "terminal_environment",
]

#: The locale categories of POSIX and glibc: ``LC_*`` is not a glob here, so a name such as
#: ``LC_SECRET_TOKEN`` is no locale variable.
LOCALE_CATEGORIES = (
    "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC", "LC_TIME",
    "LC_ADDRESS", "LC_IDENTIFICATION", "LC_MEASUREMENT", "LC_NAME", "LC_PAPER", "LC_TELEPHONE",
)  # fmt: skip

#: The orchestrator's variables a terminal starts with (globs, case-sensitive): what nearly
#: every program needs to find itself, its user and its files, none of which holds a
#: credential. Proxies are left out (their URLs often carry a password), and so are toolchain
#: locations: pass those by name.
TERMINAL_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL",           # who, where, and how to find programs
    "LANG", "LANGUAGE", *LOCALE_CATEGORIES, "TZ",         # language, encoding, time zone
    "TERM", "COLORTERM", "NO_COLOR",                      # output to a terminal
    "TMPDIR", "TMP", "TEMP",                              # temporary files
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",  # tools' own dirs
)  # fmt: skip

#: Names whose values are secrets (globs, case-insensitive). ``*PASS*`` anywhere (``PGPASS``,
#: ``SMTP_PASSWORD``), sessions and signatures too: hiding a harmless value costs little, showing
#: a secret one is not undone.
SECRET_NAMES = (
    "*KEY*", "*TOKEN*", "*SECRET*", "*PASS*", "*_PWD", "*CREDENTIAL*", "*PRIVATE*", "*AUTH*",
    "*COOKIE*", "*SESSION*", "*SIGNATURE*", "*WEBHOOK*", "*_PAT", "*_DSN", "DATABASE_URL",
)  # fmt: skip

#: Names a command may set without a policy rule mentioning them (exact, case-sensitive): they
#: change how output looks, never which program runs, what it loads or reads, nor its options.
#: Any other variable a command sets must match the ``env`` of the rule that allows it.
FREE_ENV = frozenset((
    "LANG", *LOCALE_CATEGORIES, "TZ",                      # language, encoding, time zone
    "TERM", "COLUMNS", "LINES",                            # the terminal's kind and size
    "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE",  # colour on or off
    "CI", "PYTHONUNBUFFERED",                              # no prompts; unbuffered output
))  # fmt: skip

# scheme://user:password@host or scheme://token@host (a password may hold an unescaped "/")
_URL_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s@]+@")


def _matches(name: str, patterns: Iterable[str]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


def terminal_environment(
    environ: Mapping[str, str], *, passthrough: Iterable[str] = ()
) -> dict[str, str]:
    """The variables of ``environ`` a terminal starts with: :data:`TERMINAL_ENV`, and those
    named by ``passthrough`` (globs, case-insensitive), whatever they hold.

    The basic list never passes a secret-looking name (:data:`SECRET_NAMES`), whatever it
    matches; ``passthrough`` is the caller's own choice and passes what it names.
    """
    extra = tuple(passthrough)
    return {
        name: value
        for name, value in environ.items()
        if _matches(name, extra)
        or (
            any(fnmatch.fnmatchcase(name, p) for p in TERMINAL_ENV)
            and not _matches(name, SECRET_NAMES)
        )
    }


def is_secret(name: str, value: str = "") -> bool:
    """Whether a variable's value must be hidden: a secret-looking name
    (:data:`SECRET_NAMES`), or a value holding URL credentials (``http://user:pass@proxy``)."""
    return _matches(name, SECRET_NAMES) or _URL_CREDENTIALS.search(value) is not None


# A value that is a plain switch: it can name no program, path, option or configuration.
_SWITCH = re.compile(r"[0-9]{1,9}|true|false|yes|no|on|off", re.IGNORECASE)
# Names whose switches still change what runs or loads, or how safely (TLS checks off).
_SWITCH_UNSAFE = re.compile(
    r"^(LD_|DYLD_|PYTHON|NODE_|NPM_|GIT_|BASH|PERL|RUBY|JAVA|_JAVA|JDK_|MALLOC|GLIBC|GCONV|LUA)"
    r"|SSL|TLS|VERIFY|INSECURE|CERT|CA_BUNDLE|TRUST",
    re.IGNORECASE,
)


def is_switch(name: str, value: str) -> bool:
    """Whether setting ``name`` to ``value`` is a plain switch a command may set without a rule.

    Agents mark the commands they start (Claude Code's adapter sets ``CLAUDECODE=1``); a value
    that is a number or a yes/no word names no program, path, option or file, so it cannot
    change what runs, unless the name belongs to a loader or a TLS check (``LD_BIND_NOW=1``,
    ``NODE_TLS_REJECT_UNAUTHORIZED=0``, ``GIT_SSL_NO_VERIFY=1``): those still need a rule.
    """
    return bool(_SWITCH.fullmatch(value)) and not _SWITCH_UNSAFE.search(name)


def is_free(name: str) -> bool:
    """Whether a command may set ``name`` without a rule allowing it (:data:`FREE_ENV`)."""
    return name in FREE_ENV
