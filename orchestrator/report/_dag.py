"""The pipeline graph as an inline SVG: layers left to right, edges with arrowheads.

Nodes sit in columns by generation (see :func:`~._model.layers`), each column centred on the
tallest; edges run from the right side of a node to the left side of its child, curving only in
the gaps between columns. An edge that skips columns crosses each column between in a free lane
(a gap between two boxes, or above or below the column), so it never runs under a box it does
not connect. Past :data:`BAND` columns the drawing wraps onto a row below, like text; an edge to
a later row runs down the right margin, back left along the gap under its row and down the left
margin, where there are no boxes.
A node's colour says its status; a fan-out step shows one dot per instance, coloured the same
way. Every node links to its step's details in the page and carries a tooltip (``<title>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from attrs import frozen

from ._format import seconds_text
from ._markup import Markup, el, join
from ._model import StepView, layers

__all__ = ["STATUSES", "dag_svg", "status_class", "step_anchor"]

#: the statuses that have their own colour; anything else is drawn as "unknown"
STATUSES = (
    "succeeded",
    "failed",
    "skipped",
    "running",
    "pending",
    "interrupted",
    "conflicts",
    "cancelled",
)

# narrow enough that a chain of 8 steps fits a 1400 px window at a readable scale
NODE_W = 160
NODE_H = 54
GAP_X = 36
GAP_Y = 22
MARGIN = 16
#: columns in a row of the drawing (8 fit a 1400 px window); a longer graph wraps below
BAND = 8
#: between two rows: the gap where edges from one row run back left to the next
BAND_GAP = 40
MAX_DOTS = 8
#: an average glyph width of the node font, to cut long names before they overflow the box
CHAR_W = 7.6
#: the smallest the page may shrink the graph to fit its width: the smallest text in it (11.5 px,
#: see ``_style``) stays above 9 px. A graph that would need less scrolls in its own box instead.
MIN_SCALE = 0.8


def status_class(status: str | None) -> str:
    """A CSS class for a status; statuses from the result never become class names unchecked."""
    return f"s-{status}" if status in STATUSES else "s-unknown"


def step_anchor(index: int) -> str:
    """The element id of a step's details (by position: step names may contain anything)."""
    return f"step-{index + 1}"


def _fit(text: str, width: float) -> str:
    limit = max(4, int(width / CHAR_W))
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@frozen
class _Box:
    x: float
    y: float


class _Lanes:
    """Free horizontal lanes through each column: the gaps between its boxes, above and below.

    Edges that share a lane are spread a few pixels apart so each stays visible.
    """

    def __init__(
        self, grouped: Sequence[Sequence[str]], boxes: dict[str, _Box], height: float
    ) -> None:
        self._height = height
        self._lanes: list[list[float]] = []
        for group in grouped:
            tops = sorted(boxes[n].y for n in group)
            lanes = [tops[0] - GAP_Y / 2] if tops else []
            lanes += [(t + NODE_H + u) / 2 for t, u in pairwise(tops)]
            lanes += [tops[-1] + NODE_H + GAP_Y / 2] if tops else []
            self._lanes.append(lanes)
        self._used: dict[tuple[int, float], int] = {}

    def take(self, col: int, near: float) -> float:
        """The lane of column ``col`` nearest to ``near``, nudged if edges already use it."""
        lane = min(self._lanes[col], key=lambda y: (abs(y - near), y))
        n = self._used.get((col, lane), 0)
        self._used[(col, lane)] = n + 1
        # 0, +5, -5, +10 ... but never out of the gap (a gap is GAP_Y tall)
        step = (n + 1) // 2 * (1 if n % 2 else -1) * 5
        y = lane + max(-(GAP_Y / 2 - 3), min(GAP_Y / 2 - 3, step))
        return max(3.0, min(self._height - 3, y))  # the lane above a full column is the margin


def dag_svg(steps: Sequence[StepView], edges: Sequence[tuple[str, str]]) -> Markup:
    """The graph of ``steps`` (in report order) and ``edges`` as one ``<svg>`` element."""
    names = [s.name for s in steps]
    by_name = {s.name: (i, s) for i, s in enumerate(steps)}
    grouped = layers(names, edges)
    # past BAND columns the graph wraps to another row of columns below, like text
    bands = [grouped[n : n + BAND] for n in range(0, len(grouped), BAND)]
    row_h = [max(len(g) for g in band) * (NODE_H + GAP_Y) - GAP_Y for band in bands]
    tops = [MARGIN + sum(h + BAND_GAP for h in row_h[:n]) for n in range(len(bands))]
    shown = min(len(grouped), BAND)
    width = 2 * MARGIN + shown * NODE_W + max(0, shown - 1) * GAP_X
    height = (tops[-1] + row_h[-1] + MARGIN) if bands else 2 * MARGIN
    boxes: dict[str, _Box] = {}
    for col, group in enumerate(grouped):
        band = col // BAND
        offset = (row_h[band] - len(group) * (NODE_H + GAP_Y) + GAP_Y) / 2
        for row, name in enumerate(group):
            boxes[name] = _Box(_left(col), tops[band] + offset + row * (NODE_H + GAP_Y))

    column_of = {name: col for col, group in enumerate(grouped) for name in group}
    lanes = _Lanes(grouped, boxes, height)
    # where an edge to a later row turns: down the right margin, back left along the gap
    # under its row, down the left margin (nudged apart where edges share them)
    turns: dict[tuple[str, int], int] = {}

    def turn(kind: str, at: int, spread: float) -> float:
        n = turns.get((kind, at), 0)
        turns[(kind, at)] = n + 1
        step = (n + 1) // 2 * (1 if n % 2 else -1) * 4
        return float(max(-spread, min(spread, step)))

    edge_parts: list[Markup] = []
    seen: set[tuple[str, str]] = set()
    for a, b in edges:
        if a == b or (a, b) in seen or a not in boxes or b not in boxes:
            continue
        seen.add((a, b))
        src, dst = boxes[a], boxes[b]
        x1, y1 = src.x + NODE_W, src.y + NODE_H / 2
        x2, y2 = dst.x - 2, dst.y + NODE_H / 2  # stop short so the arrowhead stays visible
        first, last = column_of[a], column_of[b]
        if first == last:  # an edge inside a cycle's column: loop around below
            bend = max(src.y, dst.y) + NODE_H + GAP_Y / 2
            d = f"M{x1:g},{y1:g} C{x1 + 40:g},{bend:g} {x2 - 40:g},{bend:g} {x2:g},{y2:g}"
        elif first // BAND == last // BAND:
            # through each column between, a lane near the straight line; curves only in gaps
            points = [(x1, y1)]
            for col in range(first + 1, last):
                along = (col - first) / (last - first)
                points += _lane(lanes, col, y1 + (y2 - y1) * along)
            d = _path([*points, (x2, y2)])
        else:
            # to a later row: level through the rest of this row to the right margin, down to
            # the gap under the row, back left along it, down the left margin, then level
            # through the target's row (every turn in a margin or a gap, clear of the boxes)
            band = first // BAND
            right = width - MARGIN / 2 + turn("right", band, MARGIN / 2 - 3)
            gap = tops[band] + row_h[band] + BAND_GAP / 2 + turn("gap", band, BAND_GAP / 2 - 4)
            left = MARGIN / 2 + turn("left", last // BAND, MARGIN / 2 - 3)
            out = [(x1, y1)]
            for col in range(first + 1, (band + 1) * BAND):
                out += _lane(lanes, col, y1)
            py = out[-1][1]
            d = _path(out) + f" C{right:g},{py:g} {right:g},{py:g} {right:g},{gap:g}"
            d += f" L{left:g},{gap:g}"
            into: list[tuple[float, float]] = []
            for col in range(last // BAND * BAND, last):
                into += _lane(lanes, col, y2)
            into.append((x2, y2))
            qx, qy = into[0]
            d += f" C{left:g},{qy:g} {left:g},{qy:g} {qx:g},{qy:g}"
            if len(into) > 1:
                d += " L" + _path(into[1:])[1:]
        target = by_name[b][1]
        edge_parts.append(
            el(
                "path",
                el("title", f"{a} \u2192 {b}"),
                d=d,
                class_=f"edge {status_class(target.status)}",
                marker_end="url(#dag-arrow)",
            )
        )

    node_parts = [
        _node(index, step, boxes[step.name]) for step in steps for index in (by_name[step.name][0],)
    ]
    arrow = el(
        "marker",
        el("path", d="M0,0 L10,5 L0,10 z"),
        id="dag-arrow",
        viewBox="0 0 10 10",
        refX="10",
        refY="5",
        markerWidth="7",
        markerHeight="7",
        orient="auto",
        markerUnits="strokeWidth",
    )
    return el(
        "svg",
        el("title", "Pipeline graph"),
        el("defs", arrow),
        el("g", edge_parts, class_="edges"),
        el("g", node_parts, class_="nodes"),
        xmlns="http://www.w3.org/2000/svg",
        width=str(width),
        height=str(height),
        viewBox=f"0 0 {width} {height}",
        # the stylesheet scales the graph to its box's width (``width: 100%``): never larger
        # than drawn, never smaller than readable
        style=f"max-width:{width}px;min-width:{width * MIN_SCALE:g}px",
        role="img",
        aria_label="Pipeline graph",
        class_="dag",
    )


def _left(col: int) -> float:
    """The x of the boxes of column ``col`` (columns wrap to a new row every BAND)."""
    return MARGIN + col % BAND * (NODE_W + GAP_X)


def _lane(lanes: _Lanes, col: int, near: float) -> list[tuple[float, float]]:
    """The two points where an edge enters and leaves column ``col`` in a free lane."""
    y = lanes.take(col, near)
    return [(_left(col) - 2, y), (_left(col) + NODE_W + 2, y)]


def _path(points: Sequence[tuple[float, float]]) -> str:
    """Path data from ``points[0]`` through (enter, leave) pairs of points: curved in the gap
    before each pair, straight across the column between them."""
    (x1, y1), *_ = points
    d = f"M{x1:g},{y1:g}"
    for n, ((px, py), (qx, qy)) in enumerate(zip(points[::2], points[1::2], strict=False)):
        mid = (px + qx) / 2
        if n:
            d += f" L{px:g},{py:g}"
        d += f" C{mid:g},{py:g} {mid:g},{qy:g} {qx:g},{qy:g}"
    if len(points) % 2 and len(points) > 1:  # ends leaving a column, not at a box
        d += f" L{points[-1][0]:g},{points[-1][1]:g}"
    return d


def _node(index: int, step: StepView, box: _Box) -> Markup:
    status = step.status or "unknown"
    tooltip = [f"{step.name}: {status}"]
    if step.kind:
        tooltip.append(f"kind: {step.kind}")
    if step.agents:
        tooltip.append("agents: " + ", ".join(step.agents))
    if step.over:
        tooltip.append(f"over: {step.over}")
    if step.wall_seconds is not None:
        tooltip.append(f"time: {seconds_text(step.wall_seconds)}")
    if step.description:
        tooltip.append(step.description)
    if step.error:
        tooltip.append(f"error: {step.error}")
    if step.cause:
        tooltip.append(step.cause)
    subtitle = status + (f" \u00b7 {step.kind}" if step.kind else "")
    dots = list(step.instances) if len(step.instances) > 1 else []
    dot_space = min(len(dots), MAX_DOTS) * 11 + (14 if len(dots) > MAX_DOTS else 0)
    parts: list[Markup] = [
        el("title", "\n".join(tooltip)),
        el("rect", x=f"{box.x:g}", y=f"{box.y:g}", width=str(NODE_W), height=str(NODE_H), rx="8"),
        el(
            "text",
            _fit(step.name, NODE_W - 20),
            x=f"{box.x + 10:g}",
            y=f"{box.y + 22:g}",
            class_="name",
        ),
        el(
            "text",
            _fit(subtitle, NODE_W - 20 - dot_space),
            x=f"{box.x + 10:g}",
            y=f"{box.y + 42:g}",
            class_="sub",
        ),
    ]
    right = box.x + NODE_W - 12
    if len(dots) > MAX_DOTS:
        parts.append(
            el(
                "text",
                f"+{len(dots) - MAX_DOTS}",
                x=f"{right:g}",
                y=f"{box.y + 42:g}",
                class_="more",
                text_anchor="end",
            )
        )
        right -= 18
    for n, inst in enumerate(dots[:MAX_DOTS]):
        cx = right - (min(len(dots), MAX_DOTS) - 1 - n) * 11
        parts.append(
            el(
                "circle",
                el("title", f"{inst.name}: {inst.status or 'unknown'}"),
                cx=f"{cx:g}",
                cy=f"{box.y + 38:g}",
                r="4",
                class_=f"dot {status_class(inst.status)}",
            )
        )
    return el(
        "a",
        el("g", join(parts), class_=f"node {status_class(step.status)}"),
        href=f"#{step_anchor(index)}",
    )
