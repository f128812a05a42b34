"""The report's stylesheet (inlined into the page: the report is one file that opens from disk)."""

from __future__ import annotations

__all__ = ["CSS"]

CSS = """
:root {
  --fg: #1f2328; --muted: #656d76; --bg: #ffffff; --panel: #f6f8fa; --border: #d0d7de;
  --accent: #0969da;
  --ok: #1a7f37; --ok-bg: #dafbe1; --bad: #cf222e; --bad-bg: #ffebe9;
  --warn: #9a6700; --warn-bg: #fff8c5; --info: #0969da; --info-bg: #ddf4ff;
  --idle: #6e7781; --idle-bg: #eaeef2; --purple: #8250df; --purple-bg: #fbefff;
  --add-bg: #e6ffec; --add-num: #ccffd8; --del-bg: #ffebe9; --del-num: #ffd7d5;
  --hunk-bg: #ddf4ff; --mark-bg: #fff3b0;
  --mono: ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", monospace;
}
@media (prefers-color-scheme: dark) {
  :root {
    --fg: #e6edf3; --muted: #8d96a0; --bg: #0d1117; --panel: #161b22; --border: #30363d;
    --accent: #4493f8;
    --ok: #3fb950; --ok-bg: #12261e; --bad: #f85149; --bad-bg: #2d1517;
    --warn: #d29922; --warn-bg: #2e2410; --info: #4493f8; --info-bg: #121d2f;
    --idle: #8d96a0; --idle-bg: #21262d; --purple: #ab7df8; --purple-bg: #231a36;
    --add-bg: #12261e; --add-num: #1b4721; --del-bg: #2d1517; --del-num: #5c1d20;
    --hunk-bg: #121d2f; --mark-bg: #4b3d08;
  }
}
* { box-sizing: border-box; }
html { background: var(--bg); color: var(--fg); color-scheme: light dark; }
a { color: var(--accent); }
body {
  margin: 0; font: 14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", "Noto Sans",
  Helvetica, Arial, sans-serif;
}
header.top { padding: 20px 32px 12px; border-bottom: 1px solid var(--border); }
header.top h1 { margin: 0 0 6px; font-size: 22px; font-weight: 600; word-break: break-word; }
header.top .meta { color: var(--muted); display: flex; flex-wrap: wrap; gap: 4px 18px; }
header.top .notice {
  margin: 10px 0 0; padding: 8px 12px; border-radius: 6px; border: 1px solid var(--warn);
  background: var(--warn-bg); color: var(--fg);
}
nav.toc {
  position: sticky; top: 0; z-index: 2; background: var(--bg); padding: 8px 32px;
  border-bottom: 1px solid var(--border); display: flex; flex-wrap: wrap; gap: 4px 16px;
}
nav.toc a { color: var(--accent); text-decoration: none; font-weight: 500; }
nav.toc a:hover { text-decoration: underline; }
main { padding: 8px 32px 40px; max-width: 1600px; }
section { margin-top: 28px; scroll-margin-top: 48px; }
section > h2 {
  font-size: 18px; font-weight: 600; margin: 0 0 12px; padding-bottom: 6px;
  border-bottom: 1px solid var(--border);
}
h3 { font-size: 15px; margin: 18px 0 8px; }
h4 { font-size: 14px; margin: 14px 0 6px; }
code, pre, .mono { font-family: var(--mono); font-size: 12.5px; }
pre {
  margin: 0; padding: 10px 12px; background: var(--panel); border: 1px solid var(--border);
  border-radius: 6px; overflow: auto; max-height: 480px; white-space: pre-wrap;
  word-break: break-word;
}
p.empty { color: var(--muted); font-style: italic; }
.muted { color: var(--muted); }
.scroll { overflow-x: auto; }
table.grid { border-collapse: collapse; min-width: 40%; }
table.grid th, table.grid td {
  border: 1px solid var(--border); padding: 5px 10px; text-align: left; vertical-align: top;
}
table.grid thead th { background: var(--panel); font-weight: 600; white-space: nowrap; }
table.grid tbody th { background: var(--panel); font-weight: 500; white-space: nowrap; }
/* long words (rule names, ids, paths, commands) may break anywhere, so a table can shrink to
   its container instead of pushing its last columns out of view */
table.grid td { overflow-wrap: anywhere; }
table.grid td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.grid td.wrap { max-width: 520px; word-break: break-word; }
table.kv th { width: 1%; }
/* agents side by side: headings wrap too; past what fits, the table scrolls in its own box
   with the row labels kept in view */
table.agents td { min-width: 130px; }
table.agents thead th { white-space: normal; overflow-wrap: anywhere; min-width: 130px; }
table.agents tbody th { position: sticky; left: 0; z-index: 1; }
table.agents th.winner, table.agents td.winner { background: var(--ok-bg); }
.badge {
  display: inline-block; padding: 0 8px; border-radius: 999px; font-size: 12px; font-weight: 600;
  line-height: 20px; white-space: nowrap; border: 1px solid transparent;
  background: var(--idle-bg); color: var(--idle);
}
.badge.s-succeeded, .badge.v-allow, .badge.ok, .badge.r-resolved
  { background: var(--ok-bg); color: var(--ok); }
.badge.s-failed, .badge.v-reject, .badge.bad, .badge.r-fail
  { background: var(--bad-bg); color: var(--bad); }
.badge.s-interrupted, .badge.v-cancelled, .badge.warn
  { background: var(--warn-bg); color: var(--warn); }
.badge.s-running, .badge.info { background: var(--info-bg); color: var(--info); }
.badge.s-conflicts { background: var(--purple-bg); color: var(--purple); }
.add { color: var(--ok); font-weight: 600; }
.del { color: var(--bad); font-weight: 600; }
.bar {
  display: inline-flex; width: 60px; height: 8px; border-radius: 2px; overflow: hidden;
  vertical-align: middle; margin-left: 6px; background: var(--idle-bg);
}
.bar .a { background: var(--ok); } .bar .d { background: var(--bad); }
.error {
  color: var(--bad); background: var(--bad-bg); border-radius: 6px; padding: 6px 10px;
  margin: 6px 0; white-space: pre-wrap; word-break: break-word;
}
pre.tool-error {
  margin-top: 4px; color: var(--bad); background: var(--bad-bg); border-color: transparent;
  max-height: 240px;
}
details { margin: 6px 0; }
details > summary { cursor: pointer; padding: 4px 0; }
details.card {
  border: 1px solid var(--border); border-radius: 6px; padding: 4px 12px; margin: 10px 0;
}
details.card > summary { font-weight: 600; }
details.card[open] > summary { border-bottom: 1px solid var(--border); margin-bottom: 8px; }
details.traceback { margin-top: -2px; }
details.traceback > summary { color: var(--bad); font-size: 0.9em; }
details.traceback pre { font-size: 0.85em; }
.facts { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 6px 0; }
.facts b { font-weight: 600; }
/* diffs */
details.file {
  border: 1px solid var(--border); border-radius: 6px; margin: 10px 0; overflow: hidden;
}
details.file > summary {
  background: var(--panel); padding: 6px 12px; font-family: var(--mono); font-size: 12.5px;
  display: flex; gap: 10px; align-items: center;
}
details.file[open] > summary { border-bottom: 1px solid var(--border); }
details.file > summary .path { flex: 1; word-break: break-all; }
.chg {
  display: inline-block; min-width: 18px; text-align: center; border-radius: 4px;
  font-weight: 700; font-size: 11px; padding: 0 4px; background: var(--idle-bg); color: var(--idle);
}
.chg.c-added { background: var(--ok-bg); color: var(--ok); }
.chg.c-deleted { background: var(--bad-bg); color: var(--bad); }
.chg.c-modified { background: var(--warn-bg); color: var(--warn); }
.chg.c-renamed { background: var(--info-bg); color: var(--info); }
table.diff { border-collapse: collapse; width: 100%; font-family: var(--mono); font-size: 12.5px; }
table.diff td { padding: 0 8px; vertical-align: top; line-height: 20px; }
table.diff td.no {
  width: 1%; min-width: 44px; text-align: right; color: var(--muted); user-select: none;
  white-space: nowrap;
}
table.diff td.code { white-space: pre-wrap; word-break: break-all; }
table.diff .sign { user-select: none; display: inline-block; width: 1.2em; color: var(--muted); }
table.diff tr.l-add td { background: var(--add-bg); }
table.diff tr.l-add td.no { background: var(--add-num); }
table.diff tr.l-del td { background: var(--del-bg); }
table.diff tr.l-del td.no { background: var(--del-num); }
table.diff tr.l-hunk td { background: var(--hunk-bg); color: var(--muted); }
table.diff tr.l-meta td, table.diff tr.l-note td { color: var(--muted); font-style: italic; }
.diff-totals { margin: 4px 0 8px; }
/* conflicts */
.conflict { border: 1px solid var(--border); border-radius: 6px; margin: 12px 0; }
.conflict > .head {
  padding: 8px 12px; background: var(--panel); border-bottom: 1px solid var(--border);
  display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center;
}
.conflict > p.also { margin: 0; padding: 6px 12px; border-top: 1px solid var(--border); }
.three { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 0; }
.three > div { min-width: 0; border-right: 1px solid var(--border); }
.three > div:last-child { border-right: 0; }
.three h4 {
  margin: 0; padding: 6px 12px; font-size: 12.5px; border-bottom: 1px solid var(--border);
  word-break: break-word;
}
.three pre { border: 0; border-radius: 0; max-height: 420px; background: transparent; }
.three .absent { padding: 10px 12px; color: var(--muted); font-style: italic; }
.three mark { background: var(--mark-bg); color: inherit; }
/* the graph */
/* the graph shrinks to its box's width down to its min-width (set on the svg: text stays
   readable); past that it scrolls in its box, where a fade at each cut edge shows there is more
   (at rest each fade lies over the box's side padding, where there is nothing to fade) */
.dag-wrap {
  display: flex; align-items: flex-start; overflow-x: auto; border: 1px solid var(--border);
  border-radius: 6px; padding: 8px 20px;
}
svg.dag { display: block; font-family: inherit; flex: 1 1 auto; width: 100%; height: auto; }
.dag-wrap .fade {
  position: sticky; z-index: 1; flex: 0 0 20px; align-self: stretch; margin: -8px 0;
  pointer-events: none;
}
.dag-wrap .fade.start {
  left: -20px; margin-left: -20px; background: linear-gradient(to left, transparent, var(--bg));
}
.dag-wrap .fade.end {
  right: -20px; margin-right: -20px; background: linear-gradient(to right, transparent, var(--bg));
}
svg.dag .node rect { stroke-width: 1.5; fill: var(--idle-bg); stroke: var(--idle); }
svg.dag .node .name { font-size: 13.5px; font-weight: 600; fill: var(--fg); }
svg.dag .node .sub, svg.dag .node .more { font-size: 11.5px; fill: var(--muted); }
svg.dag a:hover rect { stroke-width: 3; }
svg.dag .edge { fill: none; stroke: var(--muted); stroke-width: 1.6; }
svg.dag .edge.s-skipped, svg.dag .edge.s-pending { stroke-dasharray: 5 4; }
svg.dag marker path { fill: var(--muted); }
svg.dag .s-succeeded rect { fill: var(--ok-bg); stroke: var(--ok); }
svg.dag .s-failed rect { fill: var(--bad-bg); stroke: var(--bad); }
svg.dag .s-interrupted rect, svg.dag .s-cancelled rect
  { fill: var(--warn-bg); stroke: var(--warn); }
svg.dag .s-running rect { fill: var(--info-bg); stroke: var(--info); }
svg.dag .s-conflicts rect { fill: var(--purple-bg); stroke: var(--purple); }
svg.dag .s-skipped rect { stroke-dasharray: 4 3; }
svg.dag .dot { fill: var(--idle); }
svg.dag .dot.s-succeeded { fill: var(--ok); }
svg.dag .dot.s-failed { fill: var(--bad); }
svg.dag .dot.s-interrupted, svg.dag .dot.s-cancelled { fill: var(--warn); }
svg.dag .dot.s-running { fill: var(--info); }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 8px; color: var(--muted); }
.legend .sw {
  display: inline-block; width: 12px; height: 12px; border-radius: 3px; vertical-align: -1px;
  margin-right: 5px; border: 1.5px solid var(--idle); background: var(--idle-bg);
}
.legend .sw.s-succeeded { border-color: var(--ok); background: var(--ok-bg); }
.legend .sw.s-failed { border-color: var(--bad); background: var(--bad-bg); }
.legend .sw.s-interrupted, .legend .sw.s-cancelled
  { border-color: var(--warn); background: var(--warn-bg); }
.legend .sw.s-running { border-color: var(--info); background: var(--info-bg); }
.legend .sw.s-skipped { border-style: dashed; }
footer {
  color: var(--muted); padding: 16px 32px; border-top: 1px solid var(--border); font-size: 12px;
}
@media print {
  nav.toc { display: none; }
  pre { max-height: none; }
}
"""
