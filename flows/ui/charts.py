"""Charts for the Prefect UI: SVG built in pure Python (no display server, no plotting library).

What the Prefect UI (3.x) renders in a markdown artifact, checked in headless Chromium (tests/flows/test_ui.py):
tables, headings, ``<details>``, and images, including ``data:`` URIs, but inline ``<svg>`` is sanitised away
(only its text survives). So a chart is an SVG document embedded as ``![alt](data:image/svg+xml;base64,...)``:
it has axes, ticks with values, axis labels and a legend, on a white card that reads on the UI's dark theme.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from flows.ui import readable

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
MAX_POINTS = 400  # a polyline beyond this many points only adds bytes to the artifact


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    markers: bool = False  # dots at every point (sparse series such as evaluations)


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]; whole steps only when ``integer``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"tick range must be finite, got [{lo}, {hi}]")
    if integer:
        hi = max(hi, lo + count - 1)  # small counts: 0, 1, 2, 3, 4 rather than 0, 0.25, ... 1
    if hi <= lo:
        lo, hi = lo - (abs(lo) or 1.0) * 0.5, hi + (abs(hi) or 1.0) * 0.5
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return list(points)
    stride = len(points) / MAX_POINTS
    return [points[int(i * stride)] for i in range(MAX_POINTS)] + [points[-1]]


def _text(x: float, y: float, s: str, *, size: int = 12, anchor: str = "middle", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {FONT} '
        f'fill="#222" {extra}>{escape(s)}</text>'
    )


def _frame(width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<rect width="{width}" height="{height}" rx="6" fill="#ffffff"/>',
        _text(width / 2, 22, title, size=15, extra='font-weight="bold" class="title"'),
    ]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 640,
    height: int = 300,
    y_format: Callable[[float], str] = readable.si,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """An SVG line chart: one polyline per series, x and y axes with ticks and labels, a legend, and a dashed
    vertical line with its label at each of ``marks`` (x, label), e.g. where a restarted job resumed."""
    pts = [p for s in series for p in s.points]
    if not pts:
        raise ValueError(f"chart {title!r} has no points")
    left, right, top, bottom = 70, 20, 40, 56
    xs, ys = (
        nice_ticks(min(p[0] for p in pts), max(p[0] for p in pts)),
        nice_ticks(min(p[1] for p in pts), max(p[1] for p in pts)),
    )
    x0, x1, y0, y1 = xs[0], xs[-1], ys[0], ys[-1]
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = _frame(width, height, title)
    for t in ys:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>')
        out.append(_text(left - 6, sy(t) + 4, y_format(t), size=11, anchor="end", extra='class="ytick"'))
    for t in xs:
        out.append(
            f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top + ph}" y2="{top + ph + 5}" stroke="#444"/>'
        )
        out.append(_text(sx(t), top + ph + 18, readable.si(t), size=11, extra='class="xtick"'))
    out.append(f'<path d="M{left},{top} V{top + ph} H{left + pw}" fill="none" stroke="#444"/>')
    out.append(_text(left + pw / 2, height - 10, x_label, size=12, extra='class="xlabel"'))
    out.append(
        _text(
            16,
            top + ph / 2,
            y_label,
            size=12,
            extra=f'class="ylabel" transform="rotate(-90 16 {top + ph / 2:.1f})"',
        )
    )
    for x, label in marks:
        if x0 <= x <= x1:
            out.append(
                f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#ff7f0e" '
                'stroke-dasharray="4 3" class="mark"/>'
            )
            out.append(_text(sx(x) + 3, top + 12, label, size=10, anchor="start", extra='class="mark"'))
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in _thin(s.points))
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2" '
            f'data-series="{escape(s.label)}"/>'
        )
        if s.markers or len(s.points) == 1:
            out += [
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>' for x, y in s.points
            ]
        lx = left + 10 + i * 150
        out.append(f'<rect x="{lx}" y="{top - 12}" width="14" height="4" fill="{color}"/>')
        out.append(_text(lx + 20, top - 7, s.label, size=11, anchor="start", extra='class="legend"'))
    return "\n".join([*out, "</svg>"])


def bar_chart(
    categories: Sequence[str],
    groups: dict[str, Sequence[float]],
    *,
    title: str,
    value_label: str,
    width: int = 640,
    value_format: Callable[[float], str] = readable.si,
) -> str:
    """Horizontal bars: one row per category, one bar per group, the value written at the end of each bar."""
    if not categories or not groups:
        raise ValueError(f"chart {title!r} has no bars")
    left = min(width // 2, max(90, 7 * max(len(c) for c in categories) + 16))  # room for the longest label
    right, top, bottom, bar, gap = 70, 44, 44, 14, 10
    row = bar * len(groups) + gap
    height = top + row * len(categories) + bottom
    counts = all(float(v).is_integer() for vs in groups.values() for v in vs)
    ticks = nice_ticks(0.0, max(max(v) for v in groups.values()) or 1.0, integer=counts)
    pw, hi = width - left - right, ticks[-1]

    def sx(v: float) -> float:
        return left + v / hi * pw

    out = _frame(width, height, title)
    base = top + row * len(categories)
    for t in ticks:
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{base}" stroke="#e5e5e5"/>')
        out.append(_text(sx(t), base + 16, value_format(t), size=11, extra='class="xtick"'))
    out.append(f'<path d="M{left},{top} V{base} H{left + pw}" fill="none" stroke="#444"/>')
    out.append(_text(left + pw / 2, height - 8, value_label, size=12, extra='class="xlabel"'))
    for r, name in enumerate(categories):
        y = top + r * row + gap / 2
        out.append(_text(left - 8, y + row / 2 - 1, name, size=12, anchor="end", extra='class="ytick"'))
        for g, (label, values) in enumerate(groups.items()):
            v, color = values[r], COLORS[g % len(COLORS)]
            out.append(
                f'<rect x="{left}" y="{y + g * bar:.1f}" width="{max(0.0, sx(v) - left):.1f}" '
                f'height="{bar - 2}" fill="{color}"><title>{escape(label)}</title></rect>'
            )
            out.append(
                _text(
                    sx(v) + 4,
                    y + g * bar + bar - 4,
                    value_format(v),
                    size=10,
                    anchor="start",
                    extra='class="value"',
                )
            )
    for g, label in enumerate(groups):
        lx = left + g * 150
        out.append(f'<rect x="{lx}" y="{top - 14}" width="12" height="8" fill="{COLORS[g % len(COLORS)]}"/>')
        out.append(_text(lx + 18, top - 7, label, size=11, anchor="start", extra='class="legend"'))
    return "\n".join([*out, "</svg>"])


def data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def markdown_image(svg: str, alt: str) -> str:
    """The chart as a markdown image the Prefect UI displays (alt text: what a screen reader and a test see)."""
    return f"![{alt.replace(']', ')')}]({data_uri(svg)})"
