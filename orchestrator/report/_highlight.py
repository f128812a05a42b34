"""Syntax colouring of the code inside diffs, with pygments when it is installed.

The language comes from the file name. Each hunk is lexed as one piece (so a multi-line string
or comment is coloured as such), then cut back into lines. Tokens become ``<span class="t-XX">``
with pygments' short token names, and :func:`token_css` gives the matching colours for a light
and a dark page. Without pygments, or for an unknown language, lines are only escaped: the
diff colouring (added/removed backgrounds) does not depend on this module.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Sequence

from ._markup import Markup, el, escape

__all__ = ["highlight_lines", "token_css"]

try:
    from pygments.lexer import Lexer
    from pygments.lexers import get_all_lexers, get_lexer_for_filename
    from pygments.styles import get_style_by_name
    from pygments.token import STANDARD_TYPES, _TokenType
    from pygments.util import ClassNotFound
except ImportError:  # pragma: no cover - the report still works, in two colours
    HAVE_PYGMENTS = False
else:
    HAVE_PYGMENTS = True

#: lexing is skipped above this many characters per hunk (a report must stay quick to build)
MAX_LEX_CHARS = 200_000


@functools.lru_cache(maxsize=1)
def _special_patterns() -> tuple[str, ...]:
    """File name patterns that are more than ``*.ext`` (``Makefile``, ``*.cmake.in``...)."""
    patterns: set[str] = set()
    for _, _, filenames, _ in get_all_lexers():
        for pattern in filenames:
            if not (pattern.startswith("*.") and not any(c in pattern[2:] for c in "*?[")):
                patterns.add(pattern)
    return tuple(sorted(patterns))


def _lexer_key(filename: str) -> str:
    """A cache key: the extension when only ``*.ext`` patterns can match the name.

    Looking a lexer up scans every pattern pygments has (milliseconds), so a diff of thousands
    of ``.py`` files must look ``.py`` up once; names that special patterns match keep their own.
    """
    _, ext = os.path.splitext(filename)
    if not ext or any(fnmatch.fnmatchcase(filename, p) for p in _special_patterns()):
        return filename
    return "file" + ext


@functools.lru_cache(maxsize=512)
def _lexer_for_key(key: str) -> Lexer | None:
    try:
        return get_lexer_for_filename(key, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return None
    except Exception:  # a broken third-party lexer plugin must not break a report
        return None


def _lexer(filename: str) -> Lexer | None:
    if not HAVE_PYGMENTS:
        return None
    try:
        key = _lexer_key(filename)
    except Exception:  # plugin lexers with odd metadata: look the name up as it is
        key = filename
    return _lexer_for_key(key)


def _css_class(ttype: _TokenType) -> str:
    while ttype not in STANDARD_TYPES and ttype.parent is not None:
        ttype = ttype.parent
    return STANDARD_TYPES.get(ttype, "")


def highlight_lines(path: str, lines: Sequence[str]) -> list[Markup]:
    """``lines`` (consecutive source lines of ``path``) as HTML, one item per line."""
    plain = [escape(line) for line in lines]
    lexer = _lexer(os.path.basename(path)) if path else None
    if lexer is None or not lines:
        return plain
    source = "\n".join(lines) + "\n"
    if len(source) > MAX_LEX_CHARS or "\r" in source:
        # pygments turns a lone CR into a line break, which would shift every later line
        return plain
    out: list[list[Markup]] = [[]]
    try:
        for ttype, value in lexer.get_tokens(source):
            cls = _css_class(ttype)
            for n, piece in enumerate(value.split("\n")):
                if n:
                    out.append([])
                if piece:
                    out[-1].append(el("span", piece, class_=f"t-{cls}") if cls else escape(piece))
    except Exception:  # lexers are third-party code: fall back to plain text
        return plain
    if out and not out[-1]:
        out.pop()  # the newline we appended
    if len(out) != len(lines):
        return plain
    return [Markup("".join(parts)) for parts in out]


def _style_rules(style_name: str, scope: str) -> list[str]:
    style = get_style_by_name(style_name)
    rules: list[str] = []
    for ttype, spec in style:
        cls = STANDARD_TYPES.get(ttype)
        if not cls:
            continue
        decls = []
        if spec["color"]:
            decls.append(f"color:#{spec['color']}")
        if spec["bold"]:
            decls.append("font-weight:bold")
        if spec["italic"]:
            decls.append("font-style:italic")
        if decls:
            rules.append(f"{scope} .t-{cls}{{{';'.join(decls)}}}")
    return rules


@functools.lru_cache(maxsize=1)
def token_css() -> str:
    """CSS colouring the token spans, light by default and dark when the reader prefers it."""
    if not HAVE_PYGMENTS:
        return ""
    try:
        light = _style_rules("default", ".code")
        dark = _style_rules("github-dark", ".code")
    except ClassNotFound:
        return ""
    return "\n".join(light) + "\n@media (prefers-color-scheme: dark) {\n" + "\n".join(dark) + "\n}"
