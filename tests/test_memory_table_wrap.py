"""%gpumem's tables break lines between words only, never inside one ("floa/t32" at 1024 px).

The report's container wraps long paths anywhere (overflow-wrap:anywhere), which inside an
auto-layout table lets every column shrink to one character. Each cell must override that
with a wrap that keeps the column as wide as its longest word, and a table wider than the
output scrolls in its own box.
"""

from __future__ import annotations

import re

from gpunb.views.memory_tables import table


def test_cells_break_between_words_and_a_wide_table_scrolls():
    row = ["model.encoder.layers.0.self_attn.q_proj.weight", "float32", "4096×4096"]
    html = table(["name", "dtype", "shape"], [row])
    assert re.match(r"<div style='overflow-x:auto'><table", html)
    cells = re.findall(r"<t[dh] style='([^']*)'", html)
    assert len(cells) == 6
    for style in cells:
        assert "overflow-wrap:break-word" in style and "word-break:normal" in style and "anywhere" not in style
