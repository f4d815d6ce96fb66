"""The SVG charts and number formats the UI artifacts use: parseable SVG, axes with ticks and labels, round ticks."""

from __future__ import annotations

import base64
import itertools
import xml.etree.ElementTree as ET

import pytest

from flows.ui import charts, readable

NS = "{http://www.w3.org/2000/svg}"


def texts(svg: str, cls: str) -> list[str]:
    root = ET.fromstring(svg)
    return [t.text or "" for t in root.iter(f"{NS}text") if t.get("class") == cls]


@pytest.mark.parametrize(
    ("lo", "hi"), [(0, 1), (0.3, 7.1), (1, 200), (5.2, 5.2), (-3, 40), (1e-4, 3e-3), (0, 123456)]
)
def test_nice_ticks_cover_the_range_with_round_equal_steps(lo: float, hi: float) -> None:
    ticks = charts.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 9
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1
    mantissa = f"{steps.pop():e}".split("e")[0]
    assert float(mantissa) in (1.0, 2.0, 2.5, 5.0)


@pytest.mark.parametrize(
    ("hi", "expected"), [(1, [0, 1, 2, 3, 4]), (7, [0, 2, 4, 6, 8]), (3000, [0, 1000, 2000, 3000])]
)
def test_integer_ticks_are_whole_numbers(hi: int, expected: list[int]) -> None:
    assert charts.nice_ticks(0, hi, integer=True) == expected


def test_line_chart_has_axes_ticks_labels_legend_and_scaled_points() -> None:
    loss = charts.Series("train loss", [(s, 7.0 - s / 50) for s in range(1, 201)])
    valid = charts.Series("valid loss", [(50, 6.1), (100, 5.2), (200, 3.5)], markers=True)
    svg = charts.line_chart([loss, valid], title="Loss", x_label="step", y_label="loss")
    root = ET.fromstring(svg)
    assert texts(svg, "xlabel") == ["step"] and texts(svg, "ylabel") == ["loss"]
    assert texts(svg, "legend") == ["train loss", "valid loss"]
    assert texts(svg, "xtick")[0] == "0" and texts(svg, "xtick")[-1] == "200"
    assert all(len(t) <= 5 for t in texts(svg, "ytick")), texts(svg, "ytick")
    lines = root.findall(f"{NS}polyline")
    assert [p.get("data-series") for p in lines] == ["train loss", "valid loss"]
    first = [tuple(map(float, xy.split(","))) for xy in lines[0].get("points", "").split()]
    assert len(first) == 200 and first[0][1] < first[-1][1]  # falling loss: y grows downwards in SVG
    assert len(root.findall(f"{NS}circle")) == 3


def test_long_series_are_thinned_and_the_last_point_is_kept() -> None:
    svg = charts.line_chart(
        [charts.Series("x", [(i, i) for i in range(5000)])], title="t", x_label="a", y_label="b"
    )
    points = ET.fromstring(svg).find(f"{NS}polyline").get("points", "").split()  # type: ignore[union-attr]
    assert len(points) == charts.MAX_POINTS + 1


def test_bar_chart_writes_each_value_and_category() -> None:
    svg = charts.bar_chart(
        ["ingest", "clean"], {"in": [36, 30], "out": [30, 28]}, title="Docs", value_label="documents"
    )
    assert texts(svg, "ytick") == ["ingest", "clean"] and texts(svg, "xlabel") == ["documents"]
    assert texts(svg, "value") == ["36", "30", "30", "28"]


def test_markdown_image_embeds_the_svg_as_a_data_uri() -> None:
    svg = charts.bar_chart(["a"], {"n": [1.0]}, title="t", value_label="v")
    md = charts.markdown_image(svg, "alt [x]")
    assert md.startswith("![alt [x)](data:image/svg+xml;base64,")
    assert base64.b64decode(md.split(",", 1)[1].rstrip(")")).decode() == svg


def test_empty_charts_say_which_chart() -> None:
    with pytest.raises(ValueError, match="'Loss' has no points"):
        charts.line_chart([charts.Series("x", [])], title="Loss", x_label="s", y_label="l")


@pytest.mark.parametrize(
    ("fn", "value", "text"),
    [
        (readable.sig, 7.109127759933472, "7.11"),
        (readable.sig, 0.00745123, "0.00745"),
        (readable.sig, 12345.6, "12,346"),
        (readable.si, 1234567, "1.23M"),
        (readable.si, 950, "950"),
        (readable.si, 36.0, "36"),
        (readable.size, 4096, "4.1 kB"),
        (readable.size, 812, "812 B"),
        (readable.pct, 0.380952, "38.1%"),
        (readable.count, 1234567, "1,234,567"),
        (readable.seconds, 245.2, "4 min 05 s"),
        (readable.sig, None, "n/a"),
    ],
)
def test_readable_numbers(fn, value, text) -> None:  # type: ignore[no-untyped-def]
    assert fn(value) == text
