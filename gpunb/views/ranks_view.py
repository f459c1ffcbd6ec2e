"""The per-rank table of a profiled multi-GPU cell, as text and HTML (every dynamic string
escaped). Kept apart from ``profile_view`` so the profile report's layout and this table can
change on their own; the profile report appends it where a cell had worker processes."""

from __future__ import annotations

import html

from gpunb.analysis.ranks.records import RanksPart, RankStats
from gpunb.display import register_views
from gpunb.units import gib, milliseconds

HEADER = ["rank", "GPU", "steps", "first step", "median", "p90", "data wait", "peak allocated", "NVML peak",
          "all-reduce (not hidden)"]


def _headline(part: RanksPart) -> str:
    n = len(part.ranks)
    world = f" (world size {part.world_size})" if part.world_size and part.world_size != n else ""
    names = sorted({r.gpu_name for r in part.ranks if r.gpu_name})
    line = f"{n} rank{'s' if n != 1 else ''}{world} reported" + (f" · {' / '.join(names)}" if names else "")
    if part.link:
        line += f" · their GPUs are joined by {part.link}"
    if part.slowest is not None and part.balanced:
        line += " · the ranks keep the same pace"
    elif part.slowest is not None:
        slow = part.ranks[part.slowest]
        if part.slowest_by == "all-reduce wait":
            line += (f" · slowest: {slow.name}, the others wait {part.wait_ms:.2f} ms for it at each all-reduce "
                     f"({part.spread:.0%} of a step)")
        else:
            fastest = part.ranks[part.fastest].name if part.fastest is not None else "the others"
            line += f" · slowest: {slow.name}, {part.spread:.0%} longer steps than {fastest}"
    return line


def _row(part: RanksPart, i: int, r: RankStats) -> list[str]:
    name = str(r.rank) if r.rank is not None else f"pid {r.pid}"
    if i == part.slowest and not part.balanced:
        name += " (slowest)"
    gpu = "CPU" if r.device is None else (f"{r.nvml_index}" if r.nvml_index is not None else f"cuda:{r.device}")
    wait = f"{r.data_wait_s:.2f} s" + (f" ({r.data_share:.0%})" if r.data_share is not None else "")
    comm = ""
    if r.ddp is not None and r.ddp.backward_comm_ms is not None:
        comm = f"{r.ddp.backward_comm_ms:.2f} ms ({r.ddp.exposed_comm_ms:.2f} ms)"
    steps = str(r.steps) + ("" if r.finished else " (still running)")
    return [name, gpu, steps, milliseconds(r.first_ms), milliseconds(r.median_ms), milliseconds(r.p90_ms), wait,
            gib(r.peak_allocated_bytes), gib(r.nvml_peak_bytes), comm or "n/a"]


def _footer(part: RanksPart) -> list[str]:
    lines = []
    if part.nvlink_traffic:
        lines.append("NVLink traffic during the cell (NVML counters): "
                     + ", ".join(f"GPU {i} {b / 1e9:.2f} GB" for i, b in sorted(part.nvlink_traffic.items())))
    sources = {r.source for r in part.ranks}
    line = "step times: " + " / ".join(sorted(sources)) + " in each rank"
    if any(r.ddp is not None for r in part.ranks):
        line += ("; all-reduce: DDP's own timing, mean of its sampled iterations after the first (in brackets the "
                 "part not overlapped with the backward pass)")
    lines.append(line)
    lines += list(part.notes)
    return lines


def ranks_text(part: RanksPart) -> list[str]:
    rows = [HEADER] + [_row(part, i, r) for i, r in enumerate(part.ranks)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(HEADER))]
    lines = [f"  {'ranks':<11} {_headline(part)}"]
    lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"    {line}" for line in _footer(part)]
    return lines


def ranks_html(part: RanksPart) -> str:
    e = html.escape
    head = "".join(f"<th style='text-align:left;padding-right:0.8em'>{e(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left;padding-right:0.8em'>{e(c)}</td>"
                                    for c in _row(part, i, r)) + "</tr>" for i, r in enumerate(part.ranks))
    notes = "".join(f"<div><small>{e(line)}</small></div>" for line in _footer(part))
    return (f"<div class='gpunb-ranks'><b>{e(_headline(part))}</b>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}</div>")


# How the record shows (gpunb.display looks it up; the record never imports a view).
register_views(RanksPart, {"text/plain": lambda r: "\n".join(ranks_text(r)), "text/html": ranks_html})
