"""Reading gpunb's HTML back in tests: the chart images (decoded) and the words around them."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

SVG = "{http://www.w3.org/2000/svg}"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> _Collect:
    c = _Collect()
    c.feed(html)
    return c


def images(html: str, css_class: str | None = None) -> list[dict]:
    return [i for i in parse(html).images if css_class is None or css_class in i.get("class", "").split()]


def svg_of(image: dict) -> ET.Element:
    """The SVG inside a data-URI image (fails if the image is anything else)."""
    prefix = "data:image/svg+xml;base64,"
    assert image["src"].startswith(prefix), image["src"][:40]
    return ET.fromstring(base64.b64decode(image["src"][len(prefix):]).decode("utf-8"))


def words(html: str) -> str:
    return " ".join(t.strip() for t in parse(html).text if t.strip())


def runs_of(root: ET.Element, stroke: str) -> list[list[tuple[float, float]]]:
    """The runs of points ("M" starts one) of the paths drawn in ``stroke``."""
    runs: list[list[tuple[float, float]]] = []
    for path in root.iter(SVG + "path"):
        if path.get("stroke") != stroke:
            continue
        for token in path.get("d").split():
            x, y = (float(v) for v in token[1:].split(","))
            if token[0] == "M":
                runs.append([])
            runs[-1].append((x, y))
    return runs
