"""Reports opened from disk in real headless chromium: they render, and log no console errors.

Needs ``/usr/bin/chromium`` (Debian: ``apt-get install -y chromium``). Without it the tests skip,
except under CI (``CI`` set), where a missing browser is a failure: CI must install it.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
import uuid
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen
from conftest import pid_gone
from test_report import (
    chain_pipeline,
    compare_result,
    fan_out_pipeline,
    hostile_compare,
    hostile_pipeline,
    pipeline_result,
    six_agent_compare,
)

from orchestrator.report import render_report
from orchestrator.report._html import CSP

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
#: one chromium run may take this long before it is killed and the test fails
RUN_TIMEOUT = 90.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--enable-logging=stderr",
    "--v=0",
)
#: how chromium logs a page's console messages and uncaught errors on stderr
CONSOLE = re.compile(r":CONSOLE[:(\]]|Uncaught ")

SECTIONS = {
    "compare": ["summary", "agents", "steps", "conflicts", "diffs", "permissions"],
    "pipeline": ["summary", "dag", "steps", "conflicts", "diffs", "permissions"],
}
RESULTS: dict[str, Callable[[], dict[str, Any]]] = {
    "compare": compare_result,
    "pipeline": pipeline_result,
}


@pytest.fixture
def chromium() -> str:
    """The chromium binary; skip without it, but fail under CI, which must provide it."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing under CI: install it (apt-get install -y chromium)")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    return found


@frozen
class Run:
    """What one chromium run printed."""

    stdout: str
    stderr: str

    def console_lines(self) -> list[str]:
        """The page's console messages and uncaught errors, as chromium logged them."""
        return [line for line in self.stderr.splitlines() if CONSOLE.search(line)]


def _our_processes(session: int, profile: Path) -> list[int]:
    """Processes of the chromium run: in its session, or naming its fresh profile directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == session or os.fsencode(str(profile)) in cmdline:
            found.append(pid)
    return found


def _kill_all(session: int, profile: Path) -> None:
    """SIGKILL every process of the run and wait until they are gone."""
    deadline = time.monotonic() + 10
    while (left := _our_processes(session, profile)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)  # polling for the kernel to reap, not ordering anything


def run_chromium(binary: str, tmp_path: Path, *args: str) -> Run:
    """Run chromium once with a fresh profile, bounded in time; no process of it survives."""
    profile = tmp_path / f"profile-{uuid.uuid4().hex[:8]}"
    cmd = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own session: every helper process can be found and ended
    )
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {RUN_TIMEOUT:.0f} s: {cmd}")
    finally:
        _kill_all(proc.pid, profile)
    assert _our_processes(proc.pid, profile) == [], "no chromium process survives the run"
    assert pid_gone(proc.pid)
    return Run(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)


def dom_of(run: Run) -> _Dom:
    dom = _Dom()
    dom.feed(run.stdout)
    dom.close()
    return dom


@pytest.mark.parametrize("kind", ["compare", "pipeline"])
def test_report_renders_in_chromium(chromium: str, tmp_path: Path, kind: str) -> None:
    """The page opens from disk; its DOM has every section; the console stays silent."""
    paths = render_report(RESULTS[kind](), tmp_path / kind)
    run = run_chromium(chromium, tmp_path, "--dump-dom", paths.html.as_uri())
    dom = dom_of(run)
    assert set(SECTIONS[kind]) <= dom.ids, run.stderr[-2000:]
    assert "script" not in dom.tags
    assert run.console_lines() == []
    if kind == "pipeline":
        assert "svg" in dom.tags and "path" in dom.tags and "marker" in dom.tags


@pytest.mark.parametrize("make", [hostile_compare, hostile_pipeline])
def test_hostile_report_stays_inert_in_chromium(
    chromium: str, tmp_path: Path, make: Callable[[], dict[str, Any]]
) -> None:
    """Injected markup in agent output makes no element and runs nothing in a real browser."""
    paths = render_report(make(), tmp_path / "hostile")
    run = run_chromium(chromium, tmp_path, "--dump-dom", paths.html.as_uri())
    dom = dom_of(run)
    assert "summary" in dom.ids
    assert "script" not in dom.tags
    assert run.console_lines() == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in run.stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG file"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("kind", ["compare", "pipeline"])
def test_report_screenshot(chromium: str, tmp_path: Path, kind: str) -> None:
    """A screenshot of the report is a non-empty PNG of the requested size."""
    paths = render_report(RESULTS[kind](), tmp_path / kind)
    shot = tmp_path / f"{kind}.png"
    run_chromium(
        chromium,
        tmp_path,
        "--hide-scrollbars",
        "--window-size=1280,1600",
        f"--screenshot={shot}",
        paths.html.as_uri(),
    )
    data = shot.read_bytes()
    assert len(data) > 10_000, "more than a blank page"
    assert _png_size(data) == (1280, 1600)


def test_console_errors_are_caught(chromium: str, tmp_path: Path) -> None:
    """The console check sees a page's errors (so a silent report proves something)."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><title>bad</title><p id=x>x</p>"
        "<script>console.error('boom'); missing_function();</script>",
        encoding="utf-8",
    )
    run = run_chromium(chromium, tmp_path, "--dump-dom", page.as_uri())
    lines = run.console_lines()
    assert any("boom" in line for line in lines), run.stderr[-2000:]
    assert any("missing_function" in line for line in lines)


def test_report_csp_refuses_scripts_in_chromium(chromium: str, tmp_path: Path) -> None:
    """The report's Content-Security-Policy stops an inline script, should one ever slip in."""
    page = tmp_path / "csp.html"
    page.write_text(
        f'<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="{CSP}">'
        "<title>unchanged</title><script>document.title = 'script ran'</script>",
        encoding="utf-8",
    )
    run = run_chromium(chromium, tmp_path, "--dump-dom", page.as_uri())
    assert "<title>unchanged</title>" in run.stdout
    assert "script ran</title>" not in run.stdout
    assert any("Content Security Policy" in line for line in run.console_lines())


#: measures, in the page, every cell of the tables named: is it inside its table's box and the
#: window, and does its content fit it (the test copy of the page drops the CSP to run it)
MEASURE = """<script>
const found = [];
for (const table of document.querySelectorAll(%s)) {
  const box = table.parentElement, edge = box.getBoundingClientRect().right;
  found.push({table: table.className, scrollWidth: box.scrollWidth, clientWidth: box.clientWidth});
  for (const c of table.querySelectorAll("th, td")) {
    const right = c.getBoundingClientRect().right;
    if (c.scrollWidth > c.clientWidth + 1 || right > edge + 1 || right > window.innerWidth)
      found.push({cell: c.textContent.slice(0, 60), right, edge});
  }
}
found.push({page: document.documentElement.scrollWidth, window: window.innerWidth});
document.body.setAttribute("data-measured", JSON.stringify(found));
</script>"""


def measure(binary: str, tmp_path: Path, page: str, script: str, width: int) -> Any:
    """What ``script`` puts in the body's ``data-measured``, ``page`` shown ``width`` px wide."""
    test_copy = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    path = tmp_path / f"measure-{uuid.uuid4().hex[:8]}.html"
    path.write_text(test_copy.replace("</body>", script + "</body>"), encoding="utf-8")
    run = run_chromium(binary, tmp_path, f"--window-size={width},900", "--dump-dom", path.as_uri())
    found = re.search(r'data-measured="([^"]*)"', run.stdout)
    assert found is not None, run.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def measure_tables(
    binary: str, tmp_path: Path, page: str, selectors: list[str], width: int
) -> list[dict[str, Any]]:
    """What :data:`MEASURE` finds in ``page`` shown in a window ``width`` pixels wide."""
    measured: list[dict[str, Any]] = measure(
        binary, tmp_path, page, MEASURE % json.dumps(", ".join(selectors)), width
    )
    return measured


def test_six_agents_fit_side_by_side_at_1400_px(chromium: str, tmp_path: Path) -> None:
    """At 1400 px, no cell of the six-agent table or of the permissions table is clipped."""
    paths = render_report(six_agent_compare(), tmp_path / "six")
    page = paths.html.read_text(encoding="utf-8")
    found = measure_tables(
        chromium, tmp_path, page, ["table.agents", "#permissions table"], width=1400
    )
    tables = [f for f in found if "table" in f]
    assert [t["table"] for t in tables] == ["grid agents", "grid"]
    assert all(t["scrollWidth"] <= t["clientWidth"] for t in tables), tables
    assert [f for f in found if "cell" in f] == []
    (page_size,) = [f for f in found if "page" in f]
    assert page_size["page"] <= page_size["window"]


def test_many_agents_scroll_inside_their_table_not_the_page(chromium: str, tmp_path: Path) -> None:
    """Twelve agents at 1000 px: the table scrolls in its own box; the page keeps its width."""
    result = six_agent_compare()
    result["agents"] = [
        {**a, "name": f"{a['name']}-{n}"} for n in range(2) for a in result["agents"]
    ]
    paths = render_report(result, tmp_path / "twelve")
    found = measure_tables(
        chromium, tmp_path, paths.html.read_text(encoding="utf-8"), ["table.agents"], width=1000
    )
    (table,) = [f for f in found if "table" in f]
    assert table["scrollWidth"] > table["clientWidth"], "wider than its box: it scrolls there"
    (page_size,) = [f for f in found if "page" in f]
    assert page_size["page"] <= page_size["window"]


#: measures the graph: its box's visible area, the node boxes outside it, the rendered size of
#: every text, and where the fade at the box's right edge lies
MEASURE_DAG = """<script>{
const wrap = document.querySelector(".dag-wrap"), svg = wrap.querySelector("svg.dag");
const outer = wrap.getBoundingClientRect();
const left = outer.left + wrap.clientLeft, top = outer.top + wrap.clientTop;
const right = left + wrap.clientWidth, bottom = top + wrap.clientHeight;
const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
const cut = [];
for (const node of svg.querySelectorAll(".node")) {
  const r = node.querySelector("rect").getBoundingClientRect();
  if (r.left < left - 0.5 || r.right > right + 0.5 || r.top < top - 0.5 || r.bottom > bottom + 0.5)
    cut.push({name: node.querySelector("text").textContent, left: r.left, right: r.right});
}
const fonts = [...svg.querySelectorAll("text")].map(
  t => parseFloat(getComputedStyle(t).fontSize) * scale);
const fade = wrap.querySelector(".fade.end");
const cue = fade && {left: fade.getBoundingClientRect().left,
  right: fade.getBoundingClientRect().right, image: getComputedStyle(fade).backgroundImage};
document.body.setAttribute("data-measured", JSON.stringify({
  left, right, scale, cut, smallestText: Math.min(...fonts), cue,
  scrolls: wrap.scrollWidth > wrap.clientWidth, overflowX: getComputedStyle(wrap).overflowX,
  page: document.documentElement.scrollWidth, window: window.innerWidth}));
}</script>"""

GRAPHS: dict[str, Callable[[], dict[str, Any]]] = {
    "chain-3": lambda: chain_pipeline(3),
    "chain-8": lambda: chain_pipeline(8),
    "chain-20": lambda: chain_pipeline(20),
    "fan-out-12": lambda: fan_out_pipeline(12),
}


@pytest.mark.parametrize(
    ("graph", "width", "fits"),
    [
        ("chain-3", 1400, True),
        ("chain-3", 800, True),
        ("chain-8", 1400, True),
        ("chain-8", 800, False),
        ("chain-20", 1400, True),
        ("chain-20", 800, False),
        ("fan-out-12", 1400, True),
        ("fan-out-12", 800, True),
    ],
)
def test_the_graph_fits_its_box_or_shows_where_it_is_cut(
    chromium: str, tmp_path: Path, graph: str, width: int, fits: bool
) -> None:
    """Every node is in view, or the graph scrolls in its own box with a fade at the cut edge."""
    paths = render_report(GRAPHS[graph](), tmp_path / graph)
    m = measure(chromium, tmp_path, paths.html.read_text(encoding="utf-8"), MEASURE_DAG, width)
    assert m["page"] <= m["window"], "the page itself never scrolls sideways"
    assert m["smallestText"] >= 9, m
    if fits:
        assert m["cut"] == [] and not m["scrolls"], m
        return
    assert m["cut"] and m["scrolls"] and m["overflowX"] == "auto", m
    cue = m["cue"]
    assert cue is not None and "gradient" in cue["image"], m
    # the fade lies on the visible right edge, over the first node cut there
    assert abs(cue["right"] - m["right"]) <= 1 and cue["right"] - cue["left"] >= 20, m
    first_cut = m["cut"][0]
    assert first_cut["left"] < cue["right"] and first_cut["right"] > cue["left"], m
