"""Small pieces of HTML every view shares: code spans from `backticks`, dimmed words.

Words in a report's HTML keep the theme's own text colour (JupyterLab light or dark,
VS Code, an exported page); secondary words are dimmed with ``opacity`` instead of a grey
that would vanish on one of the backgrounds.
"""

from __future__ import annotations

import re
from html import escape

DIM = "opacity:0.72"


def code_html(text: str) -> str:
    """``text`` escaped, its `backticked` parts shown as code (a fix's command stays one
    piece to copy; the text view keeps the backticks, which read fine in a terminal)."""
    return re.sub(r"`([^`]+)`", lambda m: f"<code>{m.group(1)}</code>", escape(text))


def dim(html: str) -> str:
    return f'<span style="{DIM}">{html}</span>'
