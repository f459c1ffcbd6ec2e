"""The chart base: colours that read on every background, images that survive sanitizers."""

from __future__ import annotations

import pytest

from gpunb.views import chart
from gpunb.views.check_view import COLOR as CHECK_COLORS
from gpunb.views.markup import code_html
from tests.chart_html import images, svg_of


def _luminance(color: str) -> float:
    r, g, b = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("color", sorted(set(chart.SERIES_COLORS) | set(CHECK_COLORS.values())))
@pytest.mark.parametrize("background", sorted(chart.BACKGROUNDS))
def test_every_colour_reads_on_light_and_dark_backgrounds(color, background):
    # Inside an image no CSS variable reaches: one colour must do for both themes.
    # 3:1 is WCAG's minimum for graphics and large text.
    assert contrast(color, chart.BACKGROUNDS[background]) >= 3.0


def test_a_chart_is_a_data_uri_image_with_words():
    svg = chart.svg_document(10, 5, '<path d="M0,0H10" stroke="#3b7dd8"/>')
    html = chart.img(svg, width=10, height=5, alt='memory "peak" <1 GiB>')
    [image] = images(html)
    assert image["src"].startswith("data:image/svg+xml;base64,") and "<svg" not in html
    assert image["alt"] == 'memory "peak" <1 GiB>' and image["width"] == "10"
    assert svg_of(image).get("viewBox") == "0 0 10 5"


def test_stacked_bar_parts_are_to_scale():
    svg = chart.stacked_bar_svg([(25, chart.BLUE), (0, chart.ORANGE), (50, chart.GREY)], 100, 200, 10)
    rects = [r for r in svg_of({"src": chart.data_uri(svg)}).iter("{http://www.w3.org/2000/svg}rect")]
    widths = [float(r.get("width")) for r in rects if r.get("fill") != "none"]
    assert widths == [50.0, 100.0]  # the empty part is left out, the rest scaled to 200 px


def test_axis_words():
    numbers = (0, 0.25, 1.5, 12.5, 140, 1980)
    assert [chart.axis_number(v) for v in numbers] == ["0", "0.25", "1.5", "12.5", "140", "1980"]
    assert [chart.span_words(s) for s in (30, 120, 300, 5400)] == ["30 s", "2 min", "5 min", "1.5 h"]


def test_backticks_become_code_and_the_rest_is_escaped():
    assert code_html("run `pip install torch<3` & retry") == "run <code>pip install torch&lt;3</code> &amp; retry"
