"""Reports of compare and pipeline runs: one self-contained HTML page and a Markdown summary.

The input is the JSON result object of a run (``orchestrator compare --json``, ``run --json``, or
``prompt --json`` shown as a compare of one agent), as a plain dict, so reports can be rendered
later from a saved result and this package never touches agents or branches::

    from orchestrator.report import render_report
    paths = render_report(result, "out/report")    # writes report.html and report.md
    print(paths.html.as_uri())                     # open it in any browser, offline

The HTML page holds its CSS and the pipeline graph (SVG) inline and runs no script; everything
that came from an agent is escaped. Sections have stable ids: ``#summary``, ``#agents``
(compare) or ``#dag`` (pipeline), ``#steps``, ``#conflicts``, ``#diffs``, ``#permissions``.
Any key of the result may be missing or null; it is shown as ``-``.

A batch run's report (:func:`render_batch_report`) takes the batch object and each repository's
diff: a table with a row per repository, then the diffs (sections ``#summary``, ``#diffs``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from .._log import get_logger
from ._batch import batch_html, batch_markdown
from ._html import html_page
from ._markdown import markdown_document
from ._model import ReportError, load

__all__ = [
    "ReportError",
    "ReportPaths",
    "dir_problem",
    "render_batch_report",
    "render_html",
    "render_markdown",
    "render_report",
]

log = get_logger(__name__)

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"


@frozen
class ReportPaths:
    """Where :func:`render_report` wrote the two reports."""

    html: Path
    markdown: Path


def render_html(result: Mapping[str, Any]) -> str:
    """The HTML report of a ``compare``, ``pipeline`` or ``prompt`` result, as one string.

    Raises :class:`ReportError` if ``result`` is not a result object of a known kind.
    """
    return html_page(load(result))


def render_markdown(result: Mapping[str, Any]) -> str:
    """The Markdown report of a ``compare``, ``pipeline`` or ``prompt`` result.

    Raises :class:`ReportError` if ``result`` is not a result object of a known kind.
    """
    return markdown_document(load(result))


def render_report(result: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> ReportPaths:
    """Write ``out_dir/report.html`` and ``out_dir/report.md`` (creating ``out_dir``).

    Both are rendered before either is written, and each file is replaced atomically, so a
    failure never leaves a half-written report. Blocking file I/O: from trio, call it through
    ``trio.to_thread.run_sync``. Raises :class:`ReportError` for a bad result or an unwritable
    directory.
    """
    view = load(result)
    html_text = html_page(view)
    md_text = markdown_document(view)
    out = _make_dir(out_dir)
    paths = ReportPaths(html=out / HTML_NAME, markdown=out / MARKDOWN_NAME)
    try:
        _write(paths.html, html_text)
        _write(paths.markdown, md_text)
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e}") from e
    log.info("report written", html=str(paths.html), markdown=str(paths.markdown), kind=view.kind)
    return paths


def render_batch_report(
    batch: Mapping[str, Any], diffs: Mapping[str, str], out_dir: str | os.PathLike[str]
) -> ReportPaths:
    """Write the report of a batch run, ``out_dir/report.html`` and ``out_dir/report.md``: its
    table and each repository's diff.

    ``batch`` is the batch object (``batch --json``); ``diffs`` each repository's diff (its
    child run's final changes) by the repository's name, a missing one read as no changes. As
    :func:`render_report`: both rendered before either is written, each replaced atomically,
    blocking file I/O, :class:`ReportError` for a directory that cannot be written.
    """
    if not isinstance(batch, Mapping):
        raise ReportError(
            f"a batch report needs a batch object (a dict), not {type(batch).__name__}"
        )
    html_text = batch_html(batch, diffs)
    md_text = batch_markdown(batch, diffs)
    out = _make_dir(out_dir)
    paths = ReportPaths(html=out / HTML_NAME, markdown=out / MARKDOWN_NAME)
    try:
        _write(paths.html, html_text)
        _write(paths.markdown, md_text)
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e}") from e
    log.info("report written", html=str(paths.html), markdown=str(paths.markdown), kind="batch")
    return paths


def _make_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create the directory ``out_dir`` for a report (and its parents) if need be; returns it
    absolute (the paths of a report can become file:// URIs). Raises :class:`ReportError`
    saying why it cannot be one."""
    out = Path(out_dir).absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {dir_problem(out, e)}") from e
    return out


def dir_problem(path: Path, error: OSError) -> str:
    """Why ``path`` could not be made a directory, said of ``path`` (``not a directory``: a
    file is there) or of the first path above it that is no directory."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        # mkdir says "File exists" of a file standing where the directory should be
        for above in (path, *path.parents):
            if os.path.lexists(above) and not above.is_dir():
                return "not a directory" if above == path else f"{above} is not a directory"
    return error.strerror or str(error)


def _write(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory, then rename over ``path``."""
    # open(..., "x") rather than mkstemp: the file gets the usual umask permissions, not 0600
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
