"""Tests for orchestrator.report: compare and pipeline reports, HTML and Markdown (no browser)."""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from run_helpers import CLI, agent_command, run_cli, write_script

from orchestrator.errors import UsageError
from orchestrator.report import (
    ReportError,
    ReportPaths,
    _highlight,
    render_html,
    render_markdown,
    render_report,
)
from orchestrator.report._dag import dag_svg
from orchestrator.report._diff import parse_diff
from orchestrator.report._format import cost_text, seconds_text
from orchestrator.report._markdown import cell, fence, paragraph
from orchestrator.report._markup import Markup, el, escape, join
from orchestrator.report._model import PipelineView, layers
from orchestrator.testing import Say, ToolCall, ToolUpdate, Turn, WriteDisk

HOSTILE = "<script>alert(1)</script>"
#: an attribute break-out attempt: closes the quote and adds an event handler
BREAKOUT = '" onmouseover="alert(2)'

DIFF_A = '''diff --git a/src/a.py b/src/a.py
index 1111111..2222222 100644
--- a/src/a.py
+++ b/src/a.py
@@ -1,5 +1,6 @@
 """Module a."""
-def greet(name):
-    return "hi " + name
+def greet(name: str) -> str:
+    """Say hello."""
+    return f"hello {name}"
\x20
 print(greet("x"))
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+<script>alert(1)</script>
'''

DIFF_B = """diff --git a/src/a.py b/src/a.py
--- a/src/a.py
+++ b/src/a.py
@@ -2,2 +2,2 @@
 def greet(name):
-    return "hi " + name
+    return "hello " + name
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1,2 +0,0 @@
---- a removed line that starts with dashes
-bye
"""


def compare_result() -> dict[str, Any]:
    """A compare of three agents: a winner, a failure, and one with nothing but a name."""
    return {
        "kind": "compare",
        "runId": "ab12",
        "task": "Add type hints to greet()",
        "cwd": "/abs/project",
        "agents": [
            {
                "name": "claude",
                "status": "succeeded",
                "error": None,
                "sessionId": "s1",
                "agent": {"name": "claude", "version": "1.2"},
                "stopReason": "end_turn",
                "text": "Done. I added type hints.",
                "wallSeconds": 12.3,
                "toolCalls": [
                    {
                        "toolCallId": "t1",
                        "title": "Edit a.py",
                        "kind": "edit",
                        "status": "completed",
                    },
                    {
                        "toolCallId": "t2",
                        "title": "Run pytest",
                        "kind": "execute",
                        "status": "completed",
                    },
                ],
                "permissions": [
                    {
                        "toolCallId": "t1",
                        "kind": "edit",
                        "title": "Edit a.py",
                        "verdict": "allow",
                        "optionId": "allow-once",
                        "rule": "allow edit",
                    },
                    {
                        "toolCallId": "t2",
                        "kind": "execute",
                        "title": "Run pytest",
                        "verdict": "allow",
                        "optionId": "allow-once",
                        "rule": "allow pytest",
                    },
                ],
                "usage": {
                    "used": 1200,
                    "size": 200000,
                    "cost": {"amount": 0.02, "currency": "USD"},
                    "tokens": {"inputTokens": 900, "outputTokens": 300, "totalTokens": 1200},
                },
                "changes": [
                    {"path": "src/a.py", "change": "modified"},
                    {"path": "docs/new.md", "change": "added"},
                ],
                "diff": DIFF_A,
                "verify": {"command": "pytest -q", "exitCode": 0, "output": "3 passed"},
                "applied": True,
            },
            {
                "name": "codex",
                "status": "failed",
                "error": "turn timed out after 600 s",
                "agent": {"name": "codex", "version": "0.9"},
                "text": "I changed the greeting.",
                "wallSeconds": 600.0,
                "toolCalls": [
                    {"toolCallId": "c1", "title": "rm -rf /", "kind": "execute", "status": "failed"}
                ],
                "permissions": [
                    {
                        "toolCallId": "c1",
                        "kind": "execute",
                        "title": "rm -rf /",
                        "verdict": "reject",
                        "optionId": "reject-once",
                        "rule": "default",
                    }
                ],
                "usage": {"tokens": {"inputTokens": 5000, "outputTokens": 1000}},
                "changes": [
                    {"path": "src/a.py", "change": "modified"},
                    {"path": "old.txt", "change": "deleted"},
                ],
                "diff": DIFF_B,
                "verify": {"command": "pytest -q", "exitCode": 1, "output": "1 failed"},
                "applied": False,
            },
            {"name": "gemini"},
        ],
        "winner": "claude",
        "applied": "claude",
    }


SIX_AGENTS = ("claude-code", "codex-acp", "gemini-cli", "qwen-code", "opencode", "goose")


def six_agent_compare() -> dict[str, Any]:
    """A compare of six agents with realistic long names, versions, titles, ids and rules."""
    agents = []
    for n, name in enumerate(SIX_AGENTS):
        command = "npm test -- --runInBand && npm run lint > /tmp/lint_output_of_all_packages.txt"
        # a named rule from a policy file: one long word
        rule = f"allow_npm_test_and_lint_in_frontend_packages_under_the_ci_profile_{n}"
        agents.append(
            {
                "name": name,
                "status": "failed" if n == 5 else "succeeded",
                "error": "turn timed out after 600 s waiting on session/prompt" if n == 5 else None,
                "agent": {
                    "name": name,
                    "version": f"0.{n}.12-nightly.20261130",
                    "reportedName": f"@vendor/{name}-acp-adapter",
                },
                "sessionId": f"sess-{n}-0f8e2b1c9d7a4e6f",
                "stopReason": "max_turn_requests" if n == 4 else "end_turn",
                "text": f"{name} made the change.",
                "wallSeconds": 61.5 + n,
                "toolCalls": [
                    {
                        "toolCallId": f"toolu_01ABCDEFGHJKLMNPQRSTUVWX{n}",
                        "title": command,
                        "kind": "execute",
                        "status": "completed",
                    }
                ],
                "permissions": [
                    {
                        "toolCallId": f"toolu_01ABCDEFGHJKLMNPQRSTUVWX{n}",
                        "kind": "execute",
                        "title": command,
                        "verdict": "allow",
                        "optionId": "proceed_always_tool_execute",
                        "rule": rule,
                    }
                ],
                "usage": {
                    "used": 153_000,
                    "size": 200_000,
                    "cost": {"amount": 1.2345, "currency": "USD"},
                    "tokens": {
                        "inputTokens": 1_234_567,
                        "outputTokens": 45_678,
                        "totalTokens": 1_280_245,
                    },
                },
                "changes": [{"path": "src/a.py", "change": "modified"}],
                "diff": DIFF_A,
                "verify": {"command": "npm test", "exitCode": n % 2, "output": "ok"},
            }
        )
    return {
        "kind": "compare",
        "runId": "6a6a6a6a6a6a",
        "task": "Fix the flaky test",
        "cwd": "/abs/project",
        "agents": agents,
        "winner": "codex-acp",
        "applied": "codex-acp",
    }


def _instance(name: str, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "status": status,
        "agent": name,
        "wallSeconds": 1.1,
        "text": f"{name} did it",
        "stopReason": "end_turn",
        "toolCalls": [],
        "permissions": [],
        "usage": {"tokens": {"totalTokens": 500}, "cost": {"amount": 0.01, "currency": "USD"}},
        "changes": [],
        "diff": "",
        "error": None,
        **extra,
    }


def pipeline_result() -> dict[str, Any]:
    """A pipeline with fan-out, a python step, a failure, a skip and two conflicts."""
    return {
        "kind": "pipeline",
        "runId": "cd34",
        "pipeline": "/abs/pipeline.py",
        "name": "demo",
        "status": "conflicts",
        "cwd": "/abs/project",
        "inputs": {"task": "make it better", "n": 3},
        "wallSeconds": 3.2,
        "graph": {
            "nodes": [
                {"name": "plan", "kind": "agent", "agents": ["claude"], "merge": "fail"},
                {"name": "files", "kind": "python", "description": "list files"},
                {"name": "implement", "kind": "agent", "agents": ["alice", "bob", "carol"]},
                {"name": "review", "kind": "agent", "agents": ["claude"]},
                {"name": "verify", "kind": "python"},
            ],
            "edges": [
                ["plan", "implement"],
                ["files", "implement"],
                ["implement", "review"],
                ["implement", "verify"],
            ],
        },
        "steps": {
            "plan": {
                "status": "succeeded",
                "wallSeconds": 1.2,
                "instances": {
                    "claude": _instance(
                        "claude",
                        "succeeded",
                        permissions=[
                            {
                                "toolCallId": "p1",
                                "kind": "read",
                                "title": "Read README.md",
                                "verdict": "allow",
                                "optionId": "allow-once",
                                "rule": "read-only",
                            }
                        ],
                    )
                },
            },
            "files": {
                "status": "succeeded",
                "instances": {"python": {"status": "succeeded", "value": ["a.py", "b.py"]}},
            },
            "implement": {
                "status": "succeeded",
                "wallSeconds": 2.0,
                "instances": {
                    "alice": _instance("alice", "succeeded", diff=DIFF_B),
                    "bob": _instance("bob", "succeeded", diff=DIFF_A),
                    "carol": _instance("carol", "failed", error="agent exited with status 1"),
                },
            },
            "review": {"status": "failed", "error": "merge conflict in README.md"},
            "verify": {"status": "skipped", "cause": "skipped because implement failed"},
        },
        "conflicts": [
            {
                "step": "review",
                "path": "README.md",
                "kind": "content",
                "branches": ["implement[alice]", "implement[bob]"],
                "base": "# Title\nline 1\nline 2\n",
                "ours": "# Title\nline 1 by alice\nline 2\n",
                "theirs": "# Title\nline 1 by bob\nline 2\n",
                "resolution": "fail",
            },
            {
                "step": "review",
                "path": "gone.txt",
                "kind": "delete-modify",
                "branches": ["implement[alice]", "implement[bob]"],
                "base": "x\n",
                "ours": None,
                "theirs": "y\n",
                "resolution": "theirs",
            },
        ],
        "changes": [{"path": "src/a.py", "change": "modified"}],
        "diff": DIFF_A,
        "applied": False,
    }


def _graph_result(names: list[str], edges: list[tuple[str, str]]) -> dict[str, Any]:
    """A finished pipeline result with the graph given, every step succeeded."""
    return {
        "kind": "pipeline",
        "runId": "ef56",
        "name": "shape",
        "status": "succeeded",
        "graph": {
            "nodes": [{"name": n, "kind": "agent", "agents": ["claude"]} for n in names],
            "edges": [list(e) for e in edges],
        },
        "steps": {
            n: {"status": "succeeded", "instances": {"claude": _instance("claude", "succeeded")}}
            for n in names
        },
    }


def chain_pipeline(n: int) -> dict[str, Any]:
    """A pipeline of ``n`` steps in a chain, each step after the one before."""
    names = [f"stage-{i + 1:02d}-implement" for i in range(n)]
    return _graph_result(names, list(itertools.pairwise(names)))


def fan_out_pipeline(n: int) -> dict[str, Any]:
    """One step fanning out to ``n`` parallel steps that join in a last one."""
    middle = [f"worker-{i + 1:02d}" for i in range(n)]
    edges = [("plan", m) for m in middle] + [(m, "merge") for m in middle]
    return _graph_result(["plan", *middle, "merge"], edges)


def hostile_compare() -> dict[str, Any]:
    """A compare whose every agent-provided string tries to inject markup."""
    diff = DIFF_A.replace("docs/new.md", f"docs/{HOSTILE}.md")
    return {
        "kind": "compare",
        "runId": HOSTILE,
        "task": HOSTILE,
        "cwd": BREAKOUT,
        "agents": [
            {
                "name": HOSTILE,
                "status": BREAKOUT,
                "error": HOSTILE,
                "agent": {"name": HOSTILE, "version": HOSTILE},
                "stopReason": HOSTILE,
                "text": HOSTILE,
                "toolCalls": [{"toolCallId": BREAKOUT, "title": HOSTILE, "kind": HOSTILE}],
                "permissions": [
                    {"toolCallId": HOSTILE, "title": HOSTILE, "verdict": BREAKOUT, "rule": HOSTILE}
                ],
                "changes": [{"path": HOSTILE, "change": BREAKOUT}],
                "diff": diff,
                "verify": {"command": HOSTILE, "exitCode": 1, "output": HOSTILE},
                "applyConflicts": [HOSTILE],
            }
        ],
        "winner": HOSTILE,
        "applied": HOSTILE,
    }


def hostile_pipeline() -> dict[str, Any]:
    """A pipeline whose step names, inputs, values and conflicts try to inject markup."""
    return {
        "kind": "pipeline",
        "name": HOSTILE,
        "pipeline": BREAKOUT,
        "status": BREAKOUT,
        "inputs": {HOSTILE: HOSTILE},
        "graph": {
            "nodes": [
                {"name": HOSTILE, "kind": HOSTILE, "description": HOSTILE},
                {"name": BREAKOUT},
            ],
            "edges": [[HOSTILE, BREAKOUT]],
        },
        "steps": {
            HOSTILE: {
                "status": BREAKOUT,
                "error": HOSTILE,
                "cause": HOSTILE,
                "traceback": f"Traceback (most recent call last):\n{HOSTILE}\n",
                "instances": {
                    HOSTILE: {"status": BREAKOUT, "value": {HOSTILE: HOSTILE}, "traceback": HOSTILE}
                },
            }
        },
        "conflicts": [
            {
                "step": HOSTILE,
                "path": HOSTILE,
                "kind": HOSTILE,
                "branches": [HOSTILE, BREAKOUT],
                "base": HOSTILE,
                "ours": HOSTILE + "\nmore",
                "theirs": BREAKOUT,
                "resolution": HOSTILE,
            }
        ],
        "diff": DIFF_A.replace("src/a.py", HOSTILE),
    }


# --------------------------------------------------------------------------- an HTML checker

VOID = {"meta", "br", "img", "input", "link", "hr", "wbr", "col", "source", "area", "base"}


class Structure(HTMLParser):
    """Parses a page and records what the tests rely on; fails on unbalanced tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if "id" in attributes and attributes["id"] is not None:
            self.ids.append(attributes["id"])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        """Start tags named ``tag`` whose attributes include ``attrs`` (class: one of them)."""
        out = []
        for name, a in self.tags:
            if name != tag:
                continue
            ok = True
            for k, v in attrs.items():
                key = k.rstrip("_").replace("_", "-")
                if key == "class":
                    ok = ok and v in (a.get("class") or "").split()
                else:
                    ok = ok and a.get(key) == v
            if ok:
                out.append(a)
        return out


def parse(page: str) -> Structure:
    s = Structure()
    s.feed(page)
    s.close()
    assert s.doctype, "the page starts with <!DOCTYPE html>"
    assert s.errors == [], s.errors
    assert s.stack == [], f"unclosed tags: {s.stack}"
    assert len(s.ids) == len(set(s.ids)), "ids are unique"
    return s


def sections(s: Structure) -> list[str | None]:
    return [a.get("id") for a in s.find("section")]


# --------------------------------------------------------------------------- HTML structure


#: the sections of a compare report (and of a prompt's), in order
COMPARE_SECTIONS = ("summary", "agents", "steps", "conflicts", "diffs", "permissions", "notices")


def test_compare_html_has_its_sections_in_order() -> None:
    """A compare report has summary, agents, steps, conflicts, diffs, permissions and
    notices."""
    s = parse(render_html(compare_result()))
    assert sections(s) == [*COMPARE_SECTIONS]
    toc = [a.get("href") for a in s.find("a")][:7]
    assert toc == [f"#{section}" for section in COMPARE_SECTIONS]


def test_pipeline_html_has_its_sections_in_order() -> None:
    """A pipeline report has summary, dag, steps, conflicts, diffs, permissions and notices."""
    s = parse(render_html(pipeline_result()))
    assert sections(s) == [
        "summary",
        "dag",
        "steps",
        "conflicts",
        "diffs",
        "permissions",
        "notices",
    ]


def test_page_is_self_contained() -> None:
    """No script, no external resource; a CSP that forbids both is in the head."""
    for result in (compare_result(), pipeline_result()):
        page = render_html(result)
        s = parse(page)
        assert s.find("script") == []
        assert s.find("link") == []
        assert s.find("img") == []
        for _, attrs in s.tags:
            for key in ("src", "href"):
                value = attrs.get(key)
                assert value is None or value.startswith("#"), (key, value)
        csp = s.find("meta", http_equiv="Content-Security-Policy")
        assert len(csp) == 1
        assert "default-src 'none'" in (csp[0]["content"] or "")
        assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in page


def test_compare_agents_side_by_side() -> None:
    """The agents table has one column per agent and one row per measure."""
    page = render_html(compare_result())
    s = parse(page)
    table = s.find("table", class_="agents")
    assert len(table) == 1
    head_cells = [a for a in s.find("th", scope="col") if a.get("class") == "winner"]
    assert len(head_cells) == 1, "the winner's column is marked"
    text = "".join(s.text)
    for row in ("Outcome", "Verify", "Files changed", "Lines", "Tool calls", "Permissions"):
        assert row in text
    for row in ("Tokens", "Cost", "Time"):
        assert row in text
    assert "passed (exit 0)" in text
    assert "failed (exit 1)" in text
    assert "2 asked: 2 allowed, 0 rejected" in text
    assert "1 asked: 0 allowed, 1 rejected" in text
    assert "1,200 (900 in / 300 out)" in text
    assert "6,000 (5,000 in / 1,000 out)" in text, "total = in + out when totalTokens is missing"
    assert "0.0200 USD" in text
    assert "10 min 00 s" in text
    assert "1 (1 failed)" in text


def test_lines_added_and_removed_are_counted() -> None:
    """+/- lines are counted per file and per agent; a removed '---' line is a removal."""
    a = parse_diff(DIFF_A)
    assert [(f.path, f.added, f.removed) for f in a] == [("src/a.py", 3, 2), ("docs/new.md", 2, 0)]
    b = parse_diff(DIFF_B)
    assert [(f.path, f.change, f.added, f.removed) for f in b] == [
        ("src/a.py", "modified", 1, 1),
        ("old.txt", "deleted", 0, 2),
    ]
    page = render_html(compare_result())
    assert '<span class="add">+5</span> <span class="del">-2</span>' in page
    assert '<span class="add">+1</span> <span class="del">-3</span>' in page
    md = render_markdown(compare_result())
    assert "| Lines | +5 -2 | +1 -3 | +0 -0 |" in md


def test_diff_without_hunk_counts_falls_back_to_the_plain_rule() -> None:
    """A hunk header without counts: '+'/'-' lines count, '+++'/'---' lines do not."""
    files = parse_diff("--- a/x\n+++ b/x\n@@ broken @@\n+new\n-old\n+++not counted\n ctx\n")
    assert [(f.path, f.added, f.removed) for f in files] == [("x", 1, 1)]


def test_diff_parser_reads_git_headers() -> None:
    """Renames, binary files, mode changes and quoted paths get their file and kind."""
    text = (
        "diff --git a/m.txt b/n.txt\nsimilarity index 100%\nrename from m.txt\nrename to n.txt\n"
        "diff --git a/img.png b/img.png\nBinary files a/img.png and b/img.png differ\n"
        "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
        'diff --git "a/caf\\303\\251.txt" "b/caf\\303\\251.txt"\n'
        '--- "a/caf\\303\\251.txt"\n+++ "b/caf\\303\\251.txt"\n@@ -1 +1 @@\n-a\n+b\n'
    )
    files = parse_diff(text)
    assert [(f.path, f.change, f.binary) for f in files] == [
        ("n.txt", "renamed", False),
        ("img.png", "modified", True),
        ("run.sh", "modified", False),
        ("caf\u00e9.txt", "modified", False),
    ]
    assert files[0].old_path == "m.txt"
    assert parse_diff("") == ()
    assert parse_diff(None) == ()


def test_diff_line_numbers_follow_the_hunks() -> None:
    """Context, removed and added lines carry their old/new line numbers."""
    f = parse_diff(DIFF_A)[0]
    numbered = [(d.kind, d.old_no, d.new_no) for d in f.lines if d.kind != "hunk"]
    assert numbered == [
        ("ctx", 1, 1),
        ("del", 2, None),
        ("del", 3, None),
        ("add", None, 2),
        ("add", None, 3),
        ("add", None, 4),
        ("ctx", 4, 5),
        ("ctx", 5, 6),
    ]


def test_each_file_diff_is_collapsible_and_coloured() -> None:
    """Every file is a <details class=file>; lines are classed add/del; code gets tokens."""
    page = render_html(compare_result())
    s = parse(page)
    files = s.find("details", class_="file")
    assert len(files) == 4  # two files for each of the two agents that changed something
    assert len(s.find("tr", class_="l-add")) == 6
    assert len(s.find("tr", class_="l-del")) == 5
    assert _highlight.HAVE_PYGMENTS
    assert '<span class="t-k">def</span>' in page, "python keywords are coloured"
    assert ".code .t-k{" in page, "the token colours are in the stylesheet"


def test_diffs_render_without_pygments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pygments, diff lines are plain escaped text and keep their add/del colours."""
    monkeypatch.setattr(_highlight, "HAVE_PYGMENTS", False)
    assert _highlight._lexer("a.py") is None
    assert _highlight.token_css.__wrapped__() == ""
    page = render_html(compare_result())
    s = parse(page)
    assert 't-k"' not in page
    assert len(s.find("tr", class_="l-add")) == 6
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_highlighting_keeps_lines_aligned() -> None:
    """A multi-line string is coloured across lines; output has exactly one item per line."""
    lines = ['x = """start', "middle <b>", 'end"""', "y = 1"]
    out = _highlight.highlight_lines("m.py", lines)
    assert len(out) == 4
    assert "t-s" in out[1] and "&lt;b&gt;" in out[1]
    assert _highlight.highlight_lines("m.py", ["a\rb"]) == [escape("a\rb")]
    assert _highlight.highlight_lines("unknown.zzz-no-lexer", ["<x>"]) == ["&lt;x&gt;"]


# --------------------------------------------------------------------------- escaping


@pytest.mark.parametrize("make", [hostile_compare, hostile_pipeline])
def test_hostile_agent_text_is_escaped(make: Any) -> None:
    """Markup in agent text, names, diffs and file names shows as text and never acts."""
    page = render_html(make())
    s = parse(page)
    assert s.find("script") == [], "no <script> element anywhere"
    for tag, attrs in s.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>" not in page
    # the reader sees the agent's text as written
    assert HOSTILE in "".join(s.text)


@pytest.mark.parametrize("make", [hostile_compare, hostile_pipeline])
def test_hostile_text_never_becomes_a_class(make: Any) -> None:
    """Statuses and verdicts from the result pick CSS classes from a fixed list only."""
    s = parse(render_html(make()))
    for _, attrs in s.tags:
        assert "alert" not in (attrs.get("class") or "")
        assert "alert" not in (attrs.get("id") or "")


def test_markdown_escapes_hostile_text() -> None:
    """In Markdown, hostile text is backslash-escaped, or literal inside code spans and fences."""
    md = render_markdown(hostile_compare())
    outside = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", md)  # fenced blocks
    outside = re.sub(r"(`+).*?\1", "", outside)  # code spans: literal text in CommonMark
    assert "<script>" not in outside.replace("\\<script>", "")
    assert "\\<script>alert(1)\\</script>" in outside
    assert "```text\n<script>alert(1)</script>\n```" in md
    # rendered by a CommonMark renderer, the text is text: no element comes out of it
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_markdown_shows_no_html_entities_in_a_terminal() -> None:
    """Text outside fences reads as written: no ``&gt;`` or ``&amp;``, and renders back the same."""
    text = "make && ./run > out.txt; a<b"
    assert cell(text) == "make && ./run > out.txt; a\\<b"
    result = compare_result()
    result["agents"][1]["error"] = text
    result["task"] = "echo ok && exit 1 > log"
    md = render_markdown(result)
    assert "&gt;" not in md and "&amp;" not in md and "&lt;" not in md
    assert "# Compare: echo ok && exit 1 > log" in md
    # what a forge draws is the text itself, entities included literally
    literal = "&amp; is not &lt;"
    assert MarkdownIt("commonmark").renderInline(cell(literal)) == "&amp;amp; is not &amp;lt;"
    row = next(line for line in md.splitlines() if line.startswith("| Error |"))
    assert "make && ./run > out.txt; a\\<b" in row


def test_markup_helpers_escape_by_default() -> None:
    """Strings are escaped in text and attributes; Markup passes; + keeps escaping."""
    assert el("p", "<b>", title='"x"') == '<p title="&quot;x&quot;">&lt;b&gt;</p>'
    assert join(Markup("<br>"), "<", None, ["&"]) == "<br>&lt;&amp;"
    assert Markup("<i>") + "<" == "<i>&lt;"
    assert "<" + Markup("<i>") == "&lt;<i>"
    assert isinstance(Markup("a") + "b", Markup)


# --------------------------------------------------------------------------- missing data


@pytest.mark.parametrize(
    "result",
    [
        {"kind": "compare"},
        {"kind": "compare", "agents": None, "winner": None},
        {"kind": "compare", "agents": [{}, None, "junk", {"name": None, "usage": None}]},
        {
            "kind": "compare",
            "agents": [
                {
                    "name": "x",
                    "status": None,
                    "agent": None,
                    "toolCalls": None,
                    "permissions": [None, {"verdict": None}],
                    "usage": {"tokens": None, "cost": {"amount": None}},
                    "changes": None,
                    "diff": None,
                    "verify": {"exitCode": None},
                    "wallSeconds": "soon",
                }
            ],
        },
        {"kind": "pipeline"},
        {"kind": "pipeline", "graph": None, "steps": None, "conflicts": None, "inputs": None},
        {
            "kind": "pipeline",
            "graph": {"nodes": [{"name": None}, {}, "x"], "edges": [["a"], "ab", ["a", "b"]]},
            "steps": {"a": None, "c": {"instances": {"i": None}}},
            "conflicts": [{}, None, {"branches": None, "base": None}],
        },
    ],
)
def test_missing_keys_render_as_dashes(result: dict[str, Any]) -> None:
    """Absent, null or mistyped keys render as '-' in both formats, never raise."""
    page = render_html(result)
    s = parse(page)
    assert "-" in "".join(s.text)
    assert render_markdown(result).startswith("# ")


def test_a_prompt_result_renders_as_a_one_agent_compare() -> None:
    """``prompt --json`` output (no kind, agent fields at the top) is a compare of one."""
    prompt = dict(compare_result()["agents"][0])
    del prompt["name"]
    del prompt["status"]
    prompt["runId"] = "p1"
    s = parse(render_html(prompt))
    assert sections(s) == [*COMPARE_SECTIONS]
    text = "".join(s.text)
    assert "claude" in text and "succeeded" in text
    assert render_markdown({**prompt, "kind": "prompt"}).startswith("# Prompt")


def test_kind_is_guessed_from_the_shape() -> None:
    """Without ``kind``, a graph means pipeline and an agents list means compare."""
    pipeline = pipeline_result()
    del pipeline["kind"]
    assert 'id="dag"' in render_html(pipeline)
    compare = compare_result()
    del compare["kind"]
    assert 'id="agents"' in render_html(compare)


@pytest.mark.parametrize("bad", [{"kind": "weird"}, {}, ["kind"], None, "text"])
def test_what_is_not_a_result_is_a_report_error(bad: Any) -> None:
    """A non-result or an unknown kind raises ReportError (a UsageError)."""
    with pytest.raises(ReportError):
        render_html(bad)
    with pytest.raises(UsageError):
        render_markdown(bad)


# --------------------------------------------------------------------------- pipeline parts


def test_dag_draws_every_node_and_edge() -> None:
    """The SVG has a node per step coloured by status and an arrowed path per edge."""
    page = render_html(pipeline_result())
    s = parse(page)
    assert len(s.find("svg", class_="dag")) == 1
    nodes = s.find("g", class_="node")
    assert [n["class"] for n in nodes] == [
        "node s-succeeded",
        "node s-succeeded",
        "node s-succeeded",
        "node s-failed",
        "node s-skipped",
    ]
    edges = s.find("path", class_="edge")
    assert len(edges) == 4
    assert all(e.get("marker-end") == "url(#dag-arrow)" for e in edges)
    assert len(s.find("marker", id="dag-arrow")) == 1
    assert len(s.find("circle", class_="dot")) == 3, "one dot per instance of the fan-out"
    # each node links to its step's details, which exist
    links = [a["href"] for a in s.find("a") if (a.get("href") or "").startswith("#step-")]
    assert links and all(h is not None and h[1:] in s.ids for h in links)


def test_dag_places_nodes_by_generation() -> None:
    """Layers follow the longest path; a cycle is drawn, not looped on forever."""
    names = ["plan", "files", "implement", "review", "verify", "late"]
    edges = [
        ("plan", "implement"),
        ("files", "implement"),
        ("implement", "review"),
        ("implement", "verify"),
        ("plan", "late"),
        ("review", "late"),
    ]
    assert layers(names, edges) == [
        ["plan", "files"],
        ["implement"],
        ["review", "verify"],
        ["late"],
    ]
    assert layers(["a", "b", "c"], [("a", "b"), ("b", "a"), ("c", "c")]) == [["c"], ["a", "b"]]
    view = PipelineView.from_json(
        {"graph": {"nodes": [{"name": "a"}, {"name": "b"}], "edges": [["a", "b"], ["b", "a"]]}}
    )
    assert "<svg" in dag_svg(view.steps, view.edges)


def test_dag_nodes_move_right_with_their_layer() -> None:
    """A child is drawn to the right of its parent."""
    view = PipelineView.from_json(pipeline_result())
    svg = dag_svg(view.steps, view.edges)
    xs = {
        m.group(2): float(m.group(1))
        for m in re.finditer(r'<rect x="([\d.]+)"[^>]*></rect><text[^>]*>([^<]+)</text>', svg)
    }
    assert xs["plan"] == xs["files"] < xs["implement"] < xs["review"] == xs["verify"]


def test_steps_table_and_details() -> None:
    """Every step has a row and a details card with its instances, errors and causes."""
    page = render_html(pipeline_result())
    s = parse(page)
    text = "".join(s.text)
    assert len(s.find("details", class_="card", id="step-1")) == 1
    assert "merge conflict in README.md" in text
    assert "skipped because implement failed" in text
    assert "agent exited with status 1" in text
    assert '"a.py"' in text, "a python step's value is shown as JSON"
    assert "5 (1 failed, 1 skipped, 3 succeeded)" in text


TRACE_FILES = (
    "Traceback (most recent call last):\n"
    '  File "/abs/pipeline.py", line 9, in files\n'
    "    return sorted(listing())\n"
    "OSError: no listing\n"
)
TRACE_CAROL = (
    'Traceback (most recent call last):\n  File "/abs/pipeline.py", line 12\nKeyError: 1\n'
)
TRACE_VERIFY = (
    'Traceback (most recent call last):\n  File "/abs/pipeline.py", line 20, in ready\n'
    "ZeroDivisionError: division by zero\n"
)


def traceback_result() -> dict[str, Any]:
    """The pipeline result with Python tracebacks: of an instance, of a step's set-up."""
    result = pipeline_result()
    steps = result["steps"]
    files = steps["files"]
    files["status"] = files["instances"]["python"]["status"] = "failed"
    files["error"] = files["instances"]["python"]["error"] = "OSError: no listing"
    files["traceback"] = files["instances"]["python"]["traceback"] = TRACE_FILES
    steps["implement"]["instances"]["carol"]["traceback"] = TRACE_CAROL
    steps["implement"]["traceback"] = TRACE_CAROL
    steps["verify"] = {
        "status": "failed",
        "error": "ZeroDivisionError: division by zero",
        "traceback": TRACE_VERIFY,
        "instances": {},
    }
    return result


def test_tracebacks_are_collapsed_under_their_errors() -> None:
    """Each traceback is a collapsed <details> under its error, once: an instance's or a step's."""
    s = parse(render_html(traceback_result()))
    blocks = s.find("details", class_="traceback")
    assert len(blocks) == 3, "files' and implement's are their instances', shown with them"
    assert all("open" not in attrs for attrs in blocks)
    text = "".join(s.text)
    for trace in (TRACE_FILES, TRACE_CAROL, TRACE_VERIFY):
        assert text.count(trace) == 1
    assert "in files\n    return sorted(listing())" in text, "the lines keep their indentation"


def test_markdown_tracebacks_are_fenced_under_their_errors() -> None:
    """In Markdown each traceback is a fenced pytb block after its error, once."""
    md = render_markdown(traceback_result())
    for trace in (TRACE_FILES, TRACE_CAROL, TRACE_VERIFY):
        assert md.count(f"Traceback:\n\n```pytb\n{trace}```\n") == 1
    step_verify = md.index("### Step verify")
    assert md.index("Error: ZeroDivisionError", step_verify) < md.index(TRACE_VERIFY, step_verify)


def test_conflicts_show_base_ours_theirs_side_by_side() -> None:
    """Each conflict has three columns; lines that differ from base are marked."""
    page = render_html(pipeline_result())
    s = parse(page)
    assert len(s.find("div", class_="conflict")) == 2
    assert len(s.find("div", class_="three")) == 2
    assert "<mark>line 1 by alice\n</mark>" in page
    assert "<mark>line 1 by bob\n</mark>" in page
    text = "".join(s.text)
    assert "Ours: implement[alice]" in text and "Theirs: implement[bob]" in text
    assert "(deleted)" in text
    assert "unresolved" in text and "resolved: theirs" in text


def test_permissions_table_lists_every_request() -> None:
    """The permissions section has a row per request with its verdict."""
    s = parse(render_html(compare_result()))
    assert len(s.find("span", class_="v-allow")) == 2
    assert len(s.find("span", class_="v-reject")) == 1
    s = parse(render_html(pipeline_result()))
    assert "plan[claude]" in "".join(s.text)


def test_notices_are_listed_with_their_agent_in_both_reports() -> None:
    """The notices section has a row per notice (its agent, severity, title, description),
    in the HTML and the Markdown report; without notices it says so."""
    result = compare_result()
    result["agents"][0]["notices"] = [
        {"severity": "warning", "title": "Context <almost> full", "description": "Summarizing"}
    ]
    html = render_html(result)
    notices = html[html.index('id="notices"') :]
    assert "warning" in notices and "Context &lt;almost&gt; full" in notices
    assert "Summarizing" in notices
    md = render_markdown(result)
    assert "## Notices" in md
    assert "| claude | warning | Context <almost> full | Summarizing |" in md.replace("\\", "")
    assert "No notices." in render_html(compare_result())
    assert "No notices." in render_markdown(pipeline_result())


# --------------------------------------------------------------------------- Markdown


def test_compare_markdown_has_tables_and_diff_fences() -> None:
    """The Markdown compare has the summary and agents tables and one diff fence per file."""
    md = render_markdown(compare_result())
    assert md.startswith("# Compare: Add type hints to greet()\n")
    for heading in ("## Summary", "## Agents", "## Steps", "## Conflicts", "## Diffs"):
        assert heading in md
    assert "|  | claude (winner, applied) | codex | gemini |" in md
    assert "| Verify | passed (exit 0) | failed (exit 1) | - |" in md
    assert md.count("```diff\n") == 4
    assert "```diff\ndiff --git a/old.txt b/old.txt\n" in md
    assert "| codex | `c1` | execute | rm -rf / | reject | `reject-once` | default |" in md


def test_pipeline_markdown_has_graph_steps_and_conflicts() -> None:
    """The Markdown pipeline has a mermaid graph, a steps table and three-way conflicts."""
    md = render_markdown(pipeline_result())
    assert "```mermaid\nflowchart LR\n" in md
    assert "  n0 --> n2" in md
    assert "| Step | Kind | Status | Agents | Instances | Time | Lines | Error / cause |" in md
    assert "**Base**\n\n```text\n# Title\nline 1\nline 2\n```" in md
    assert "**Ours: implement[alice]**\n\n```text\n# Title\nline 1 by alice\n" in md
    assert "**Theirs: implement[bob]**\n\n```text\n# Title\nline 1 by bob\n" in md
    assert "(deleted)" in md
    assert "## Final diff" in md and "```diff\n" in md


def test_markdown_graph_of_a_long_chain_reads_top_down_in_one_path() -> None:
    """Twenty steps in a chain: a top-down mermaid graph and one path naming each step once."""
    md = render_markdown(chain_pipeline(20))
    assert "```mermaid\nflowchart TD\n" in md
    names = [f"stage-{i + 1:02d}-implement" for i in range(20)]
    assert "Edges:\n\n- " + " → ".join(names) + "\n\n" in md
    fan = render_markdown(fan_out_pipeline(3))
    assert "```mermaid\nflowchart LR\n" in fan
    assert "- plan → worker-01\n- plan → worker-02\n- plan → worker-03\n" in fan
    assert "- worker-03 → merge\n" in fan
    cycle = _graph_result(["a", "b"], [("a", "b"), ("b", "a")])
    assert "- a → b → a\n" in render_markdown(cycle), "a cycle ends where it began"


def test_markdown_fences_outlast_backticks_inside() -> None:
    """A fence is longer than any backtick run in its text, so the text cannot close it."""
    assert fence("a\n```\nb", "text") == ["````text", "a\n```\nb", "````", ""]
    assert fence("plain")[0] == "```"
    result = compare_result()
    result["agents"][0]["text"] = "```\n# not a heading\n````"
    md = render_markdown(result)
    assert "`````text\n```\n# not a heading\n````\n`````" in md


#: text that reads as written: identifiers, shell lines, paths; no Markdown can start in them
PLAIN = ["edit[alice]", "end_turn", "my_var_name", "a > b", "2 * 3", "C:\\dir\\file", "x[0] = 1"]

#: text that would be Markdown if left as it is: each must render as itself
MARKUP = [
    "[click](http://evil.example)",
    "![img](http://evil.example/x.png)",
    "[ref][1]",
    "<http://evil.example>",
    "<b>bold</b> <!-- c -->",
    "**strong** *em* _em_ __init__ a*b*c",
    "`code` ``more``",
    "\\*not em\\* and \\[x\\](y)",
    "&amp; &#60; &copy;",
    "a|b",
    "[a](b)](c) [x] (y)",
]


@pytest.mark.parametrize("text", PLAIN + MARKUP)
def test_markdown_cells_render_as_their_text(text: str) -> None:
    """Every cell renders (CommonMark) to exactly its text: no link, tag, emphasis or entity."""
    rendered = MarkdownIt("commonmark").renderInline(cell(text))
    assert rendered == escape(text), cell(text)


@pytest.mark.parametrize("text", PLAIN)
def test_markdown_leaves_text_without_markup_alone(text: str) -> None:
    """Identifiers, instance keys and stop reasons read as written, without backslashes."""
    assert cell(text) == text


@pytest.mark.parametrize(
    "text", ["# title", "> quote", "- item", "+ item", "1. first", "2) b", "==="]
)
def test_markdown_paragraphs_cannot_start_a_block(text: str) -> None:
    """A value on a line of its own (a step's description) stays a paragraph of its text."""
    html = MarkdownIt("commonmark").render(paragraph(text))
    assert html == f"<p>{escape(text)}</p>\n"


def test_markdown_single_instance_steps_and_failed_values() -> None:
    """A step run once is headed by its name alone (not polite[polite]); a failed step shows no
    value (it returned none)."""
    result = pipeline_result()
    result["graph"]["nodes"].append({"name": "polite", "kind": "agent", "agents": ["demo"]})
    result["steps"]["polite"] = {
        "status": "failed",
        "instances": {"polite": {**_instance("polite", "failed", error="boom"), "value": None}},
    }
    md = render_markdown(result)
    assert "#### polite\n" in md and "polite[polite]" not in md
    section = md[md.index("### Step polite") :]
    assert "Error: boom" in section and "Value:" not in section
    assert "#### implement[alice]\n" in md  # a fanned-out step keeps its keys
    assert render_html(result).count("<h4>Value</h4>") == 1  # the python step's, not polite's


def test_markdown_cells_stay_in_their_column() -> None:
    """Pipes and line breaks in a value cannot add columns or rows to a table."""
    assert cell("a|b\nc") == "a\\|b c"
    assert cell("") == "-"
    result = compare_result()
    result["agents"][1]["error"] = "bad | worse\nworst"
    md = render_markdown(result)
    row = next(line for line in md.splitlines() if line.startswith("| Error |"))
    assert row.count(" | ") == 3


# --------------------------------------------------------------------------- files


def test_render_report_writes_both_files(tmp_path: Path) -> None:
    """render_report creates the directory and writes report.html and report.md."""
    out = tmp_path / "a" / "b"
    paths = render_report(pipeline_result(), out)
    assert paths == ReportPaths(html=out / "report.html", markdown=out / "report.md")
    assert paths.html.read_text(encoding="utf-8") == render_html(pipeline_result())
    assert paths.markdown.read_text(encoding="utf-8") == render_markdown(pipeline_result())
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]
    again = render_report(compare_result(), str(out))  # replaces, accepts str
    assert 'id="agents"' in again.html.read_text(encoding="utf-8")


def test_render_report_into_a_file_is_a_report_error(tmp_path: Path) -> None:
    """An out_dir that cannot be created raises ReportError and writes nothing."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ReportError, match="cannot write the report"):
        render_report(compare_result(), blocker)
    with pytest.raises(ReportError):
        render_report({"kind": "nope"}, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_numbers_are_formatted_for_people() -> None:
    """Seconds, minutes and costs read naturally; unknown is '-'."""
    assert seconds_text(None) == "-"
    assert seconds_text(0.04) == "0.04 s"
    assert seconds_text(12.34) == "12.3 s"
    assert seconds_text(125) == "2 min 05 s"
    assert seconds_text(3725) == "1 h 02 min"
    assert cost_text(0.0031, "USD") == "0.0031 USD"
    assert cost_text(1.5, "EUR") == "1.50 EUR"


def test_run_store_shapes_render() -> None:
    """Results as the run store rebuilds them: agentInfo, items, attempts, times, conflicts."""
    compare = {
        "kind": "compare",
        "runId": "r1",
        "status": "succeeded",
        "created": 1_700_000_000.0,
        "finished": 1_700_000_001.5,
        "applied": True,
        "agents": [
            {
                "name": "a",
                "agent": "a",
                "agentInfo": {"name": "demo-agent", "version": "1.0.0"},
                "status": "succeeded",
                "applied": True,
            }
        ],
        "conflicts": [pipeline_result()["conflicts"][0]],
    }
    s = parse(render_html(compare))
    text = "".join(s.text)
    assert "2023-11-14 22:13:20 UTC" in text
    assert "1.5 s" in text, "the time is derived from created and finished"
    assert "demo-agent 1.0.0" in text
    assert len(s.find("div", class_="conflict")) == 1
    assert len(s.find("span", class_="info")) == 1, "the applied agent is tagged"
    md = render_markdown(compare)
    assert "| Applied | yes |" in md and "**Base**" in md

    pipeline = pipeline_result()
    rename = {
        "status": "succeeded",
        "instances": {
            "shop/cart.py": {
                "agent": "demo",
                "item": "shop/cart.py",
                "attempt": 2,
                "wallSeconds": 4,
            },
            "shop/a.py": {"agent": "demo", "item": "shop/a.py", "wallSeconds": 7},
        },
    }
    pipeline["steps"]["plan"] = rename
    page = render_html(pipeline)
    text = "".join(parse(page).text)
    assert "Item" in text and "attempt 2" in text
    assert "7.0 s" in text, "a step without its own time took as long as its slowest instance"
    md = render_markdown(pipeline)
    assert "| Instance | Agent | Item | Status |" in md
    assert "attempt 2" in md


def test_prompt_json_agent_identity() -> None:
    """``prompt --json`` nests the agent as {name, version, reportedName}; all are shown."""
    prompt = {
        "runId": "p",
        "sessionId": "s",
        "agent": {"name": "mine", "version": "2.0", "reportedName": "My Agent"},
        "stopReason": "end_turn",
        "text": "hello",
    }
    text = "".join(parse(render_html(prompt)).text)
    assert "mine" in text and "My Agent 2.0" in text


def test_a_huge_file_diff_is_cut_in_html_but_whole_in_markdown() -> None:
    """The page shows the first lines of a huge file and says how many more report.md has."""
    n = 5003
    diff = "--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,5003 @@\n" + "".join(
        f"+line {i}\n" for i in range(n)
    )
    result = compare_result()
    result["agents"][0]["diff"] = diff
    s = parse(render_html(result))
    # 5000 rows: the hunk header and 4999 added lines; plus the other agent's one added line
    assert len(s.find("tr", class_="l-add")) == 4999 + 1
    assert "4 more lines of this file are not shown here" in "".join(s.text)
    assert '<span class="add">+5003</span>' in render_html(result)
    assert f"+line {n - 1}\n" in render_markdown(result)


def test_lexers_are_looked_up_once_per_extension() -> None:
    """Plain '*.ext' names share one lookup; names with special patterns keep their own."""
    assert _highlight._lexer_key("a.py") == _highlight._lexer_key("b.py") == "file.py"
    assert _highlight._lexer_key("Makefile") == "Makefile"
    assert _highlight._lexer_key("CMakeLists.txt") == "CMakeLists.txt"
    assert type(_highlight._lexer("CMakeLists.txt")).__name__ == "CMakeLexer"
    assert _highlight._lexer("notes.unknown-extension") is None


# --------------------------------------------------------------------------- a real comparison


@pytest.mark.slow
@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_report_of_a_real_compare_shows_the_failed_agent_and_the_winner(
    tmp_path: Path, state_dir: Path
) -> None:
    """compare --report: the agent that failed verify shows failed; the one that passed wins."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("hello\n")
    argv = ["compare", "--cwd", str(project), "--no-progress", "--verify", "test -f ok.txt"]
    for name, path in (("alice", "wrong.txt"), ("bob", "ok.txt")):
        turn = Turn(steps=(WriteDisk(path=path, content="x\n"), Say(text="done")))
        script = write_script(tmp_path / f"{name}.json", turn)
        argv += ["--agent", f"{name}={shlex.join(agent_command(script))}"]
    out = tmp_path / "out"
    done = await run_cli(*argv, "--report", str(out), "do it", cwd=tmp_path, state=state_dir)
    assert done.returncode == 0, done.stderr.decode()

    page = (out / "report.html").read_text()
    s = parse(page)
    [outcome] = re.findall(r'<tr><th scope="row">Outcome</th>.*?</tr>', page)
    assert re.findall(r'class="badge s-(\w+)"', outcome) == ["failed", "succeeded"]
    winners = [a for a in s.find("th", scope="col") if a.get("class") == "winner"]
    assert len(winners) == 1
    assert re.search(r'<th scope="col" class="winner">bob <span class="badge ok">winner', page)
    assert "verify failed: exit 1" in page

    md = (out / "report.md").read_text()
    assert "| Outcome | failed | succeeded |" in md
    assert "| Winner | bob |" in md
    assert "bob (winner)" in md


async def test_report_of_a_real_compare_shows_a_failed_tool_calls_error(
    tmp_path: Path, state_dir: Path
) -> None:
    """The error text an agent sends with a failed tool call is in --json and both reports."""
    project = tmp_path / "project"
    project.mkdir()
    error = "npm ERR! <missing> script: test && exit 1\n" + "x" * 3000
    turn = Turn(
        steps=(
            ToolCall(id="t1", title="npm test", kind="execute", status="in_progress"),
            ToolUpdate(
                id="t1",
                status="failed",
                content=({"type": "content", "content": {"type": "text", "text": error}},),
            ),
            ToolCall(id="t2", title="cat x", kind="read", status="in_progress"),
            ToolUpdate(id="t2", status="failed", raw_output={"error": "no such file: x"}),
            Say(text="the tests do not run"),
        )
    )
    script = write_script(tmp_path / "alice.json", turn)
    argv = ["compare", "--cwd", str(project), "--no-progress", "--json"]
    argv += ["--agent", f"alice={shlex.join(agent_command(script))}"]
    out = tmp_path / "out"
    done = await run_cli(*argv, "--report", str(out), "test it", cwd=tmp_path, state=state_dir)
    assert done.returncode == 0, done.stderr.decode()  # the turn itself ended well
    [agent] = json.loads(done.stdout)["agents"]
    first, second = agent["toolCalls"]
    # bounded: 2,000 characters and how many more there were
    assert first["error"].startswith("npm ERR! <missing> script: test && exit 1\n")
    assert first["error"].endswith(f"\u2026 ({len(error) - 2000:,} more characters)")
    assert len(first["error"]) < 2100
    assert json.loads(second["error"]) == {"error": "no such file: x"}

    page = (out / "report.html").read_text()
    assert "npm ERR! &lt;missing&gt; script: test &amp;&amp; exit 1" in page
    assert "<missing>" not in page
    assert "no such file: x" in page
    md = (out / "report.md").read_text()
    assert "Tool call 1 failed:" in md and "npm ERR! <missing> script: test && exit 1" in md
    assert "Tool call 2 failed:" in md


# --------------------------------------------------------------------------- conflicts of a fan-in


def test_a_conflict_shows_its_labels_and_the_branches_that_joined_it() -> None:
    """The labels come from oursLabel/theirsLabel; alsoChanged versions are shown with theirs."""
    result = pipeline_result()
    result["conflicts"][0].update(
        branches=["implement[alice]", "implement[bob]", "implement[carol]"],
        oursLabel="implement[alice]",
        theirsLabel="implement[bob]",
        alsoChanged=[{"label": "implement[carol]", "content": "# Title\nline 1 by carol\n"}],
    )
    page = render_html(result)
    assert page.count('class="conflict"') == 2
    assert "Ours: implement[alice]" in page and "Theirs: implement[bob]" in page
    assert "Also: implement[carol]" in page and "line 1 by carol" in page
    md = render_markdown(result)
    assert "**Also changed by: implement[carol]**" in md
    assert "line 1 by carol" in md


def test_conflicts_recorded_once_per_later_branch_show_as_one() -> None:
    """Older results listed an unresolved path again per later branch: shown as one conflict."""
    result = pipeline_result()
    first = result["conflicts"][0]
    result["conflicts"].insert(
        1,
        {
            **first,
            # the old shape: the merge-so-far label, but the first conflict's ours content
            "branches": ["implement[alice]+implement[bob]", "implement[carol]"],
            "theirs": "# Title\nline 1 by carol\nline 2\n",
        },
    )
    page = render_html(result)
    assert page.count('class="conflict"') == 2
    assert "implement[alice]+implement[bob]" not in page
    assert "Ours: implement[alice]" in page and "Also: implement[carol]" in page
    md = render_markdown(result)
    assert "### 3." not in md and md.count("`README.md` in step") == 1
    assert "2 (1 unresolved)" in md


# --------------------------------------------------------------------------- graph edges


def _svg_geometry(svg: str) -> tuple[dict[str, tuple[float, ...]], list[tuple[str, str, str]]]:
    """The boxes (name -> x, y, w, h) and edges (from, to, path data) of a graph's SVG."""
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    boxes: dict[str, tuple[float, ...]] = {}
    for node in root.iter(f"{ns}g"):
        if "node" not in (node.get("class") or "").split():
            continue
        title = node.find(f"{ns}title")
        rect = node.find(f"{ns}rect")
        assert title is not None and title.text and rect is not None
        name = title.text.split("\n")[0].rsplit(": ", 1)[0]
        boxes[name] = tuple(float(rect.get(k) or 0) for k in ("x", "y", "width", "height"))
    edges = []
    for path in root.iter(f"{ns}path"):
        if "edge" not in (path.get("class") or "").split():
            continue
        title = path.find(f"{ns}title")
        assert title is not None and title.text
        a, b = title.text.split(" \u2192 ")
        edges.append((a, b, path.get("d") or ""))
    return boxes, edges


def _samples(d: str, per_segment: int = 60) -> list[tuple[float, float]]:
    """Points along an SVG path made of M, L and C commands."""
    tokens = re.findall(r"[MLC]|-?[\d.]+(?:e-?\d+)?", d)
    points: list[tuple[float, float]] = []
    at = (0.0, 0.0)
    i = 0
    while i < len(tokens):
        cmd = tokens[i]
        i += 1
        size = {"M": 1, "L": 1, "C": 3}[cmd]
        xy = [float(t) for t in tokens[i : i + 2 * size]]
        i += 2 * size
        ctrl = [(xy[k], xy[k + 1]) for k in range(0, len(xy), 2)]
        if cmd == "M":
            at = ctrl[0]
            points.append(at)
            continue
        p0 = at
        for n in range(1, per_segment + 1):
            t = n / per_segment
            if cmd == "L":
                q = ctrl[0]
                points.append((p0[0] + (q[0] - p0[0]) * t, p0[1] + (q[1] - p0[1]) * t))
            else:
                (x1, y1), (x2, y2), (x3, y3) = ctrl
                u = 1 - t
                points.append(
                    (
                        u**3 * p0[0] + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3,
                        u**3 * p0[1] + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3,
                    )
                )
        at = ctrl[-1]
    return points


def _edges_crossing_boxes(names: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """Each (edge, box) where the drawn edge passes through a box it does not connect."""
    view = PipelineView.from_json(
        {"graph": {"nodes": [{"name": n} for n in names], "edges": [list(e) for e in edges]}}
    )
    boxes, drawn = _svg_geometry(str(dag_svg(view.steps, view.edges)))
    assert len(drawn) == len(set(edges))
    crossing = []
    for a, b, d in drawn:
        for name, (x, y, w, h) in boxes.items():
            if name in (a, b):
                continue
            if any(x < px < x + w and y < py < y + h for px, py in _samples(d)):
                crossing.append(f"{a} -> {b} crosses {name}")
    return crossing


def test_an_edge_that_skips_a_column_goes_around_the_box_between() -> None:
    """annotate -> summary skips the column of check: it runs in a gap, not under check's box."""
    names = ["plan", "annotate", "review", "check", "summary"]
    edges = [
        ("plan", "annotate"),
        ("plan", "review"),
        ("review", "check"),
        ("check", "summary"),
        ("annotate", "summary"),
    ]
    assert _edges_crossing_boxes(names, edges) == []
    long_jump = [("plan", "implement"), ("implement", "review"), ("review", "late")]
    assert (
        _edges_crossing_boxes(
            ["plan", "implement", "review", "late"], [*long_jump, ("plan", "late")]
        )
        == []
    )


def test_no_edge_of_any_dag_crosses_a_box() -> None:
    """Over many generated DAGs (full columns, several skips), no edge runs under a box."""
    rng = random.Random(14)
    for _ in range(60):
        n = rng.randint(4, 12)
        names = [f"s{i}" for i in range(n)]
        edges = [
            (names[i], names[j])
            for j in range(1, n)
            for i in rng.sample(range(j), k=min(j, rng.randint(1, 3)))
        ]
        assert _edges_crossing_boxes(names, edges) == [], edges


def test_a_long_graph_wraps_to_rows_and_no_edge_crosses_a_box() -> None:
    """Past 8 generations the graph continues on a row below; edges between rows avoid boxes."""
    view = PipelineView.from_json(chain_pipeline(20))
    boxes, _ = _svg_geometry(str(dag_svg(view.steps, view.edges)))
    rows = sorted({y for _, y, _, _ in boxes.values()})
    assert len(rows) == 3
    assert [sum(1 for b in boxes.values() if b[1] == y) for y in rows] == [8, 8, 4]
    assert boxes["stage-09-implement"][0] == boxes["stage-01-implement"][0]
    chain = [f"s{i}" for i in range(20)]
    assert _edges_crossing_boxes(chain, list(itertools.pairwise(chain))) == []
    rng = random.Random(20)
    for _ in range(40):
        n = rng.randint(12, 30)
        names = [f"s{i}" for i in range(n)]
        # mostly a chain (so it runs long and wraps), with skips and fan-outs across rows
        edges = [(names[j - 1], names[j]) for j in range(1, n)]
        edges += [
            (names[i], names[rng.randint(i + 1, n - 1)]) for i in rng.sample(range(n - 1), n // 3)
        ]
        edges = list(dict.fromkeys(edges))
        assert _edges_crossing_boxes(names, edges) == [], edges


ROUND_DIFF = "--- a/src/b.py\n+++ b/src/b.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def rounds_result() -> dict[str, Any]:
    """The pipeline result with an instance that needed three rounds of its check."""
    result = pipeline_result()
    carol = result["steps"]["implement"]["instances"]["carol"]
    carol["rounds"] = [
        {
            "turn": 1,
            "stopReason": "end_turn",
            "check": {
                "passed": False,
                "exitCode": 1,
                "output": "FAILED test_a <b>",
                "timedOut": False,
            },
        },
        {
            "turn": 2,
            "stopReason": "end_turn",
            "check": {"passed": False, "exitCode": 2, "output": "FAILED test_b", "timedOut": False},
            "diff": ROUND_DIFF,
        },
        {
            "turn": 3,
            "stopReason": "end_turn",
            "check": {"passed": True, "exitCode": 0, "output": "2 passed", "timedOut": False},
        },
    ]
    return result


def test_rounds_are_listed_with_each_failed_check_output() -> None:
    """An instance's rounds are listed, each failed check's output under its round (HTML and
    Markdown, escaped); instances without rounds have no such list."""
    page = render_html(rounds_result())
    assert len(parse(page).find("ol", class_="rounds")) == 1
    assert (
        '<ol class="rounds"><li>round 1: check failed (exit 1): FAILED test_a &lt;b&gt;'
        "<pre>FAILED test_a &lt;b&gt;</pre></li>"
        "<li>round 2: check failed (exit 2): FAILED test_b<pre>FAILED test_b</pre>"
    ) in page
    assert "<li>round 3: check passed (exit 0): 2 passed</li></ol>" in page
    # round 2's own diff is in its item, as a file diff
    second = page.split("<li>round 2:")[1].split("<li>round 3:")[0]
    assert 'class="file"' in second and "src/b.py" in second
    md = render_markdown(rounds_result())
    assert (
        "Rounds:\n\n"
        "- round 1: check failed (exit 1): FAILED test_a \\<b>\n"
        "- round 2: check failed (exit 2): FAILED test_b\n"
        "- round 3: check passed (exit 0): 2 passed\n\n"
        "Check output, round 1:\n\n```\nFAILED test_a <b>\n```\n\n"
        "Check output, round 2:\n\n```\nFAILED test_b\n```\n\n"
        f"Changed in round 2:\n\n```diff\n{ROUND_DIFF}```\n"
    ) in md
    assert "Check output, round 3" not in md
    assert "Rounds:" not in render_markdown(pipeline_result())
