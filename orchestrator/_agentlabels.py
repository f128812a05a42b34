"""Labels derived from agent command lines: the package or script an agent runs, by name.

``derive_label(argv)`` looks past the programs that only run something else (interpreters,
package runners, ``env``, shells, ``nohup`` and the like) to what they run:

- ``python x/agent.py`` -> ``agent``; ``python -m pkg.agent`` -> ``agent``;
- ``node /opt/x/node_modules/@scope/pkg/dist/cli.js`` -> ``pkg`` (the package holding the
  script); ``node /opt/tool/dist/index.js`` -> ``tool`` (generic file and folder names such as
  ``index``, ``cli``, ``dist`` are passed over for the folder they are in);
- ``npx -y @scope/pkg@1.2`` -> ``pkg``; ``uvx --from hermes-agent hermes acp`` -> ``hermes``;
- ``sh -c 'cd x && exec my-agent --acp'`` -> ``my-agent`` (the first command of the line that
  is not a shell utility);
- anything else -> the program's own name (``/usr/local/bin/gemini --acp`` -> ``gemini``).

Labels are made of letters, digits, ``.``, ``_`` and ``-`` (other characters become ``-``), so
they work as ``NAME`` in ``NAME=COMMAND``, in instance keys and in file names. When nothing
names the agent (``python -c 'print(1)'``) the label is ``agent``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Literal

from attrs import field, frozen

__all__ = ["derive_label", "package_runner"]

#: the label when a command line names nothing better
FALLBACK = "agent"

_Operand = Literal["command", "package", "script", "none"]
_Code = Literal["python", "shell", "other"]


def _words(*names: str) -> frozenset[str]:
    return frozenset(names)


@frozen
class _Launcher:
    """A program that runs something else, and how to find what it runs in its arguments."""

    #: what its first operand is: a command line, a package, a script file, or nothing useful
    operand: _Operand
    #: options whose value is the next word (or follows ``=``), so it is no operand
    valued: frozenset[str] = frozenset()
    #: options whose value is code to run, and in which language
    code: frozenset[str] = frozenset()
    language: _Code = "other"
    #: options whose value names a module to run (``python -m``)
    module: frozenset[str] = frozenset()
    #: subcommands that run something (``uv run``, ``npm exec``)
    sub: Mapping[str, _Launcher] = field(factory=dict)
    #: operands before the one that counts (``timeout 10 CMD``)
    skip: int = 0


_COMMAND = _Launcher("command")
_PACKAGE_RUNNER = _Launcher(
    "package",
    valued=_words("-p", "--package", "--registry", "--cache", "--userconfig"),
    code=_words("-c", "--call"),
    language="shell",
)
_UVX = _Launcher(
    "package",
    valued=_words(
        "--from", "--with", "--with-editable", "--with-requirements", "--python", "-p",
        "--index", "--index-url", "--extra-index-url", "--default-index", "--directory",
        "--project", "--cache-dir", "--constraints", "--overrides", "--env-file",
    ),
)  # fmt: skip
_UV_RUN = _Launcher(
    "command",
    valued=_words(
        "--with", "--with-editable", "--with-requirements", "--python", "-p", "--project",
        "--directory", "--package", "--env-file", "--extra", "--group", "--index",
        "--index-url", "--extra-index-url", "--default-index", "--cache-dir",
    ),
)  # fmt: skip
_SCRIPT_PYTHON = _Launcher(
    "script",
    valued=_words("-W", "-X", "--check-hash-based-pycs"),
    code=_words("-c"),
    language="python",
    module=_words("-m"),
)
_SCRIPT_NODE = _Launcher(
    "script",
    valued=_words(
        "-r", "--require", "--import", "--loader", "--experimental-loader", "-C",
        "--conditions", "--env-file", "--title",
    ),
    code=_words("-e", "--eval", "-p", "--print"),
)  # fmt: skip
_SCRIPT_SHELL = _Launcher(
    "script", valued=_words("-o", "+o", "-O", "+O"), code=_words("-c"), language="shell"
)

_LAUNCHERS: dict[str, _Launcher] = {
    # run a command line
    "env": _Launcher(
        "command",
        valued=_words("-u", "--unset", "-C", "--chdir"),
        code=_words("-S", "--split-string"),
        language="shell",
    ),
    "exec": _Launcher("command", valued=_words("-a")),
    "nohup": _COMMAND,
    "setsid": _COMMAND,
    "time": _Launcher("command", valued=_words("-f", "--format", "-o", "--output")),
    "nice": _Launcher("command", valued=_words("-n", "--adjustment")),
    "ionice": _Launcher("command", valued=_words("-c", "--class", "-n", "--classdata")),
    "stdbuf": _Launcher("command", valued=_words("-i", "-o", "-e")),
    "timeout": _Launcher("command", valued=_words("-s", "--signal", "-k", "--kill-after"), skip=1),
    "sudo": _Launcher("command", valued=_words("-u", "--user", "-g", "--group")),
    # run a package, fetched if need be
    "npx": _PACKAGE_RUNNER,
    "bunx": _PACKAGE_RUNNER,
    "pnpx": _PACKAGE_RUNNER,
    "uvx": _UVX,
    "npm": _Launcher("none", sub={"exec": _PACKAGE_RUNNER, "x": _PACKAGE_RUNNER}),
    "pnpm": _Launcher("none", sub={"dlx": _PACKAGE_RUNNER, "exec": _COMMAND}),
    "yarn": _Launcher("none", sub={"dlx": _PACKAGE_RUNNER}),
    "pipx": _Launcher("none", sub={"run": _Launcher("package", valued=_words("--spec"))}),
    "uv": _Launcher("none", sub={"run": _UV_RUN, "tool": _Launcher("none", sub={"run": _UVX})}),
    "poetry": _Launcher("none", sub={"run": _COMMAND}),
    "pipenv": _Launcher("none", sub={"run": _COMMAND}),
    # run a script
    "node": _SCRIPT_NODE,
    "nodejs": _SCRIPT_NODE,
    "deno": _Launcher("none", sub={"run": _Launcher("script", valued=_words("--config", "-c"))}),
    "bun": _Launcher("script", sub={"run": _Launcher("script"), "x": _PACKAGE_RUNNER}),
    "ruby": _Launcher("script", valued=_words("-I", "-r"), code=_words("-e")),
    "perl": _Launcher("script", valued=_words("-I", "-M"), code=_words("-e", "-E")),
    "php": _Launcher("script", valued=_words("-c", "-d"), code=_words("-r")),
    **dict.fromkeys(("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash"), _SCRIPT_SHELL),
}
_PYTHON = re.compile(r"(python|pypy)[0-9.]*[dmu]?(-dbg)?")

# Commands of a shell line that do not name the agent it runs (``cd dir && exec agent``).
_SHELL_UTILITIES = _words(
    "cd", "export", "set", "unset", "source", ".", ":", "true", "false", "echo", "printf",
    "test", "[", "[[", "sleep", "mkdir", "rm", "cp", "mv", "cat", "trap", "umask", "ulimit",
    "wait", "read", "shift", "local", "if", "then", "else", "fi", "do", "done", "while",
    "for", "until", "case", "esac", "{", "}", "!",
)  # fmt: skip

# File and folder names that say nothing about what a script is: look at the folder above.
_GENERIC_FILES = _words("index", "main", "cli", "__main__", "__init__", "run", "start", "entry")
_GENERIC_DIRS = _words(
    "dist", "build", "lib", "src", "bin", "out", "cli", "esm", "cjs", "scripts", "libexec",
    "sbin", ".bin",
)  # fmt: skip
_SUFFIXES = (
    ".py", ".pyz", ".js", ".mjs", ".cjs", ".ts", ".mts", ".cts", ".sh", ".bash", ".rb",
    ".pl", ".php", ".exe", ".cmd", ".bat",
)  # fmt: skip
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PY_IMPORT = re.compile(r"(?:^|[;\n])\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))")
_MAX_DEPTH = 8


def derive_label(argv: Sequence[str]) -> str:
    """The label that reads best for an agent run by ``argv`` (see the module doc)."""
    label = _command_label(list(argv), 0) or ""
    return _UNSAFE.sub("-", label).strip("-._") or FALLBACK


def package_runner(argv: Sequence[str]) -> str | None:
    """The package runner ``argv`` starts, which fetches what it runs on first use (``npx``,
    ``uvx``, ``npm exec``, ``pipx run``, ...), by name; None for any other command.

    Such a command works wherever the runner is installed, whether or not the agent was ever
    downloaded: ``npx -y @scope/pkg`` -> ``npx``, ``uv tool run x`` -> ``uv tool run``.
    """
    words = list(argv)
    while words and _ASSIGNMENT.fullmatch(words[0]):  # NAME=VALUE before a command
        words.pop(0)
    if not words:
        return None
    program = _basename(words[0])
    launcher = _launcher(program)
    name = [program.removesuffix(".exe")]
    # a subcommand that runs a package comes first (`npm exec`, `uv tool run`)
    for word in words[1:]:
        if launcher is None or launcher.operand == "package" or word not in launcher.sub:
            break
        launcher = launcher.sub[word]
        name.append(word)
    if launcher is None or launcher.operand != "package":
        return None
    return " ".join(name)


def _command_label(words: Sequence[str], depth: int) -> str | None:
    """What a command line runs, by name; None when it names nothing."""
    i = 0
    while i < len(words) and _ASSIGNMENT.fullmatch(words[i]):  # NAME=VALUE before a command
        i += 1
    if i >= len(words) or depth > _MAX_DEPTH:
        return None
    program = words[i]
    launcher = _launcher(_basename(program))
    if launcher is None:
        return _path_label(program)
    return _launched(launcher, words[i + 1 :], depth)


def _launcher(name: str) -> _Launcher | None:
    lower = name.lower().removesuffix(".exe")
    if _PYTHON.fullmatch(lower):
        return _SCRIPT_PYTHON
    return _LAUNCHERS.get(lower)


def _launched(launcher: _Launcher, args: Sequence[str], depth: int) -> str | None:
    """What ``launcher`` runs, from its arguments ``args``."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg == "-" or not arg.startswith(("-", "+")):
            break
        option, eq, value = arg.partition("=")
        if not eq and len(arg) > 2 and arg[1] != "-" and arg[:2] in _takes_value(launcher):
            option, eq, value = arg[:2], "=", arg[2:]  # -mpkg, -c'code'
        if option in _takes_value(launcher) and not eq:
            i += 1
            value = args[i] if i < len(args) else ""
        if option in launcher.module:
            return _module_label(value)
        if option in launcher.code:
            return _code_label(value, launcher.language, depth)
        i += 1
    operands = args[i:][launcher.skip :]
    if not operands:
        return None
    first = operands[0]
    if first in launcher.sub:
        return _launched(launcher.sub[first], operands[1:], depth)
    if launcher.operand == "command":
        return _command_label(operands, depth + 1)
    if launcher.operand == "package":
        return _package_label(first)
    if launcher.operand == "script":
        return _path_label(first)
    return None


def _takes_value(launcher: _Launcher) -> frozenset[str]:
    return launcher.valued | launcher.code | launcher.module


def _code_label(code: str, language: _Code, depth: int) -> str | None:
    if language == "shell":
        return _shell_label(code, depth)
    if language == "python":
        found = _PY_IMPORT.search(code)
        return _module_label(found.group(1) or found.group(2)) if found else None
    return None


def _shell_label(line: str, depth: int) -> str | None:
    """The first command of a shell line that names an agent (utilities like ``cd`` do not)."""
    for command in _shell_commands(line):
        words = [w for w in command if not _ASSIGNMENT.fullmatch(w)]
        if not words or _basename(words[0]) in _SHELL_UTILITIES:
            continue
        label = _command_label(words, depth + 1)
        if label:
            return label
    return None


def _shell_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, split at ``;``, ``&&``, ``|`` and new lines;
    the targets of redirections are left out."""
    lexer = shlex.shlex(line.replace("\n", ";"), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: words are still better than nothing
        tokens = line.split()
    commands: list[list[str]] = [[]]
    redirect = False
    for token in tokens:
        if token and all(c in "();<>|&" for c in token):
            redirect = any(c in "<>" for c in token)
            if not redirect and commands[-1]:
                commands.append([])
        elif redirect:
            redirect = False
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _basename(path: str) -> str:
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _stem(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _path_label(path: str) -> str | None:
    """A script or program by name: its package under ``node_modules``, else its file name,
    else (for ``index.js``, ``cli.js``, ``__main__.py`` ...) the folder it is in."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    if not parts:
        return None
    if "node_modules" in parts:
        rest = parts[len(parts) - parts[::-1].index("node_modules") :]
        if len(rest) >= 2 and rest[0] == ".bin":
            return _stem(rest[1])
        if len(rest) >= 2 and rest[0].startswith("@"):
            return rest[1]
        if rest:
            return rest[0]
    stem = _stem(parts[-1])
    if stem.lower() not in _GENERIC_FILES:
        return stem
    for folder in reversed(parts[:-1]):
        if folder.lower() not in _GENERIC_DIRS:
            return folder
    return stem


def _package_label(spec: str) -> str | None:
    """A package by name: ``@scope/pkg@1.2`` -> ``pkg``, ``pkg[extra]==1`` -> ``pkg``."""
    if spec.startswith("@") and "/" in spec:
        name = spec.split("/", 1)[1]  # a scoped package: the scope says little
    elif "/" in spec or ":" in spec:
        # a URL, a local path or a repository shorthand: named by its last part
        return _path_label(spec.split("#", 1)[0].removesuffix(".git"))
    else:
        name = spec
    return re.split(r"[@\[=<>~!;]", name, maxsplit=1)[0] or None


def _module_label(module: str) -> str | None:
    """A Python module by its last part, past ``__main__``, ``cli`` and the like."""
    parts = [p for p in module.split(".") if p]
    while len(parts) > 1 and parts[-1] in _GENERIC_FILES:
        parts.pop()
    return parts[-1] if parts else None
