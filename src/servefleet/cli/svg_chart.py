"""Small SVG charts drawn server-side for the HTML reports: lines over time or over concurrency, with
shaded intervals (outages) and marks (restarts, run boundaries). No JavaScript library, no network.

Every series is a ``<g class="series" data-series=NAME data-values=[...]>`` of polylines (a ``None``
value breaks the line), and every chart an ``<svg class="chart" data-chart=ID data-ymax=... data-xmax=...>``,
so a test (or a reader) can take the numbers back from the page.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Series", "Band", "Mark", "line_chart", "bar_pairs", "nice_max", "PALETTE"]

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
W, H = 920, 250
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 16, 40


@dataclass
class Series:
    name: str
    xs: list[float | None]
    ys: list[float | None]
    color: str
    dash: str | None = None
    width: float = 1.8
    points: bool = False  # a dot (with a tooltip) at every value
    key: str | None = None  # the legend entry that hides and shows it (default: its name)


@dataclass
class Band:
    x0: float
    x1: float
    color: str
    label: str
    cls: str = "outage"
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Mark:
    x: float
    color: str
    label: str
    cls: str = "restart"
    attrs: dict[str, str] = field(default_factory=dict)
    bottom: bool = False  # label at the bottom of the plot (run boundaries), not the top (restarts)


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def nice_max(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``v``."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp * 1.0000001:
            return m * exp
    return 10 * exp


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _fmt_time(s: float) -> str:
    if s < 120:
        return f"{s:g}s"
    if s < 7200:
        return f"{s / 60:.0f}m" if s % 60 == 0 else f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def _time_ticks(x_max: float) -> list[float]:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400):
        if x_max / step <= 10:
            return [i * step for i in range(int(x_max // step) + 1)]
    step = 86400 * math.ceil(x_max / 86400 / 10)
    return [i * step for i in range(int(x_max // step) + 1)]


def line_chart(
    chart_id: str,
    *,
    series: list[Series],
    x_max: float,
    y_label: str,
    x_label: str = "time",
    bands: Sequence[Band] = (),
    marks: Sequence[Mark] = (),
    x_log2: bool = False,
    x_min: float = 0.0,
    y_max: float | None = None,
    time_axis: bool = True,
) -> str:
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    ys = [y for s in series for y in s.ys if y is not None]
    top = nice_max(max(ys, default=0.0) * 1.05) if y_max is None else y_max
    x_max = max(x_max, x_min + 1e-9)
    if x_log2:
        lo, hi = math.log2(max(x_min, 1e-9)), math.log2(x_max)
        span = max(hi - lo, 1e-9)

        def px(x: float) -> float:
            return LEFT + (math.log2(max(x, 1e-9)) - lo) / span * pw
    else:

        def px(x: float) -> float:
            return LEFT + (x - x_min) / (x_max - x_min) * pw

    def py(y: float) -> float:
        return TOP + ph - (y / top) * ph

    out = [
        f'<svg class="chart" data-chart="{_esc(chart_id)}" data-ymax="{top:g}" data-xmax="{x_max:g}" data-xmin="{x_min:g}" '
        f'data-xlog2="{int(x_log2)}" data-plot="{LEFT},{TOP},{pw},{ph}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{_esc(y_label)} over {_esc(x_label)}">'
    ]
    # grid and axes
    for i in range(6):
        v = top * i / 5
        gy = py(v)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end" class="tick">{_fmt(v)}</text>')
    xticks = (
        [2**k for k in range(int(math.floor(math.log2(max(x_min, 1e-9)))), int(math.ceil(math.log2(x_max))) + 1)]
        if x_log2
        else _time_ticks(x_max - x_min)
        if time_axis
        else [x_min + (x_max - x_min) * i / 8 for i in range(9)]
    )
    for xv in xticks:
        if x_min <= xv <= x_max:
            tx = px(xv)
            out.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#f0f0f0"/>')
            label = _fmt_time(xv) if time_axis and not x_log2 else _fmt(xv)
            out.append(f'<text x="{tx:.1f}" y="{TOP + ph + 16}" text-anchor="middle" class="tick">{label}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 4}" text-anchor="middle" class="axis">{_esc(x_label)}</text>')
    out.append(
        f'<text x="14" y="{TOP + ph / 2}" text-anchor="middle" class="axis" transform="rotate(-90 14 {TOP + ph / 2})">'
        f"{_esc(y_label)}</text>"
    )
    for b in bands:
        x0, x1 = px(b.x0), px(max(b.x1, b.x0))
        extra = "".join(f' {k}="{_esc(v)}"' for k, v in b.attrs.items())
        out.append(
            f'<rect class="{b.cls}"{extra} x="{x0:.1f}" y="{TOP}" width="{max(1.5, x1 - x0):.1f}" height="{ph}" '
            f'fill="{b.color}" fill-opacity="0.14"><title>{_esc(b.label)}</title></rect>'
        )
    for s in series:
        values = [None if y is None else round(float(y), 4) for y in s.ys]
        xs = [None if x is None else round(float(x), 4) for x in s.xs]
        out.append(
            f'<g class="series" data-series="{_esc(s.name)}" data-key="{_esc(s.key or s.name)}" data-values="{_esc(json.dumps(values))}" '
            f'data-x="{_esc(json.dumps(xs))}">'
        )
        run: list[str] = []
        dots: list[str] = []
        for x, y in zip(s.xs, s.ys, strict=True):
            if x is None or y is None:
                if run:
                    out.append(_polyline(run, s))
                run = []
                continue
            run.append(f"{px(x):.2f},{py(y):.2f}")
            if s.points:
                dots.append(
                    f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" fill="{s.color}">'
                    f"<title>{_esc(s.name)}: {_fmt(x)} -> {y:,.1f}</title></circle>"
                )
        if run:
            out.append(_polyline(run, s))
        out.extend(dots)
        out.append("</g>")
    rows: dict[tuple[bool, int], float] = {}  # (bottom, row) -> right end of the last label drawn there
    for m in sorted(marks, key=lambda m: m.x):
        x = px(m.x)
        extra = "".join(f' {k}="{_esc(v)}"' for k, v in m.attrs.items())
        near_right = x > LEFT + pw - 100  # label on the line's left, inside the plot
        tx, anchor = (x - 3, "end") if near_right else (x + 3, "start")
        width = 6.2 * len(m.label)
        start = tx - width if near_right else tx
        row = next(r for r in range(8) if rows.get((m.bottom, r), -1e9) < start - 4)  # the first row with room
        rows[(m.bottom, row)] = start + width
        ty = TOP + ph - 5 - 12 * row if m.bottom else TOP + 11 + 12 * row
        out.append(
            f'<g class="{m.cls}"{extra}><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="{m.color}" '
            f'stroke-width="1.5" stroke-dasharray="3,3"/><text x="{tx:.1f}" y="{ty}" text-anchor="{anchor}" class="mark" '
            f'fill="{m.color}">{_esc(m.label)}</text><title>{_esc(m.label)} at {_fmt_time(m.x)}</title></g>'
        )
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append("</svg>")
    return "".join(out)


def _polyline(points: list[str], s: Series) -> str:
    dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
    if len(points) == 1:  # one value: a dot, still a polyline so its number can be read back
        x, y = points[0].split(",")
        points = [points[0], f"{float(x) + 0.01:.2f},{y}"]
    return (
        f'<polyline points="{" ".join(points)}" fill="none" stroke="{s.color}" stroke-width="{s.width}"{dash} '
        f'stroke-linejoin="round"/>'
    )


def bar_pairs(chart_id: str, rows: list[tuple[str, float, str]], unit: str) -> str:
    """Horizontal bars (label, value, color) on one scale, e.g. predicted against measured makespan."""
    h = 34 * len(rows) + 30
    top = nice_max(max((v for _, v, _ in rows), default=1.0) * 1.05)
    pw = W - 220 - RIGHT
    out = [
        f'<svg class="chart" data-chart="{_esc(chart_id)}" data-ymax="{top:g}" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img">'
    ]
    for i, (label, value, color) in enumerate(rows):
        y = 10 + 34 * i
        width = value / top * pw
        out.append(f'<text x="210" y="{y + 17}" text-anchor="end" class="axis">{_esc(label)}</text>')
        out.append(
            f'<rect class="bar" data-label="{_esc(label)}" data-value="{value:g}" x="220" y="{y}" width="{width:.1f}" '
            f'height="24" fill="{color}"/>'
        )
        out.append(f'<text x="{224 + width:.1f}" y="{y + 17}" class="tick">{value:,.1f} {_esc(unit)}</text>')
    out.append("</svg>")
    return "".join(out)
