"""Text and HTML for ``%gpumem``: how full each GPU is, whose memory it is, the live tensors."""

from __future__ import annotations

from html import escape
from typing import Any

from gpunb.analysis.memory.census import GROUP_TITLES, NAMESPACE, ROLES
from gpunb.analysis.memory.records import MemoryReport
from gpunb.display import register_views
from gpunb.views import chart
from gpunb.views.markup import DIM, code_html
from gpunb.views.memory_tables import TENSOR_HEAD, group_lines, size, table, tensor_rows
from gpunb.views.per_gpu import fold

# -- %gpumem ------------------------------------------------------------------------------------

_GPU_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("total", lambda g: g.total_bytes),
    ("used (NVML)", lambda g: g.used_bytes),
    ("this kernel", lambda g: g.process_bytes),
    ("torch allocated", lambda g: g.torch_allocated_bytes),
    ("torch reserved", lambda g: g.torch_reserved_bytes),
    ("context/non-torch", lambda g: g.non_torch_bytes),
    ("other processes", lambda g: g.other_processes_bytes),
)
# Why a column has no value on any GPU (said once, under the table, instead of a column of n/a).
_ABSENT = {
    "this kernel": "NVML lists no process of this kernel (no CUDA context yet, or a container's PID namespace)",
    "torch allocated": "torch holds no CUDA memory in this kernel (no CUDA context: a CPU-only build, or CUDA "
                       "not used yet)",
}
SMALL_TENSOR_SHARE = 0.005  # tensors under 0.5 % of all live tensor bytes, or...
SMALL_TENSOR_FLOOR = 4 * 2**10  # ...under 4 KiB (biases, step counters) are summed up in one line
BAR_W, BAR_H = 420, 14


def _gpu_columns(report: Any) -> list[tuple[str, Any]]:
    """The columns with a value on at least one GPU."""
    return [(h, get) for h, get in _GPU_COLUMNS if any(get(g) is not None for g in report.gpus)]


def _absent_note(report: Any) -> str:
    shown = {h for h, _ in _gpu_columns(report)}
    missing = [h for h, _ in _GPU_COLUMNS if h not in shown]
    if not report.gpus or not missing:
        return ""
    reasons = []
    if "this kernel" in missing:
        reasons.append(_ABSENT["this kernel"])
    if "torch allocated" in missing:
        reasons.append(_ABSENT["torch allocated"])
    return f"not shown ({', '.join(missing)}): " + "; ".join(reasons or ["no reading on any GPU"])


def _gpu_cell(heading: str, get: Any, g: Any) -> str:
    text = size(get(g))
    children = getattr(g, "child_processes_bytes", None)
    if heading == "this kernel" and children:  # its child processes (workers, ranks) when they hold some
        text += f" + {size(children)} in child processes"
    return text


def _gpu_table_rows(report: Any) -> tuple[list[str], list[list[str]]]:
    columns = _gpu_columns(report)
    head = ["GPU"] + [h for h, _ in columns]
    rows = [[f"{g.index} {g.name}"] + [_gpu_cell(h, get, g) for h, get in columns] for g in report.gpus]
    return head, rows


def memory_parts(g: Any) -> list[tuple[str, int, str]]:
    """(words, bytes, colour) pieces of one GPU's memory, in the order they stack; free is
    what stays empty. Parts whose numbers are unknown are folded into what is known."""
    used, total = g.used_bytes, g.total_bytes
    parts: list[tuple[str, int, str]] = []
    other = g.other_processes_bytes or 0
    mine = g.process_bytes
    if g.torch_allocated_bytes is not None and g.torch_reserved_bytes is not None:
        parts.append(("torch allocated", g.torch_allocated_bytes, chart.BLUE))
        parts.append(("reserved, not allocated", max(0, g.torch_reserved_bytes - g.torch_allocated_bytes),
                      chart.PURPLE))
        if g.non_torch_bytes is not None:
            parts.append(("CUDA context and other libraries", g.non_torch_bytes, chart.AMBER))
        mine = g.process_bytes if g.process_bytes is not None else g.torch_reserved_bytes
    elif mine is not None:
        parts.append(("this kernel", mine, chart.BLUE))
    children = getattr(g, "child_processes_bytes", None) or 0
    if children:
        parts.append(("this kernel's child processes", children, chart.TEAL))
    if other:
        parts.append(("other processes", other, chart.ORANGE))
    if used is not None:
        rest = used - (mine or 0) - children - other
        if rest > 2**20:  # NVML's used memory nobody here accounts for (driver reserve, hidden processes)
            parts.append(("used, not attributed", rest, chart.GREY))
    if total is not None and used is not None:
        parts.append(("free", max(0, total - used), ""))
    return parts


def memory_bar_html(g: Any, label: str = "") -> str:
    """One GPU's memory as a stacked bar with a legend that carries the numbers (``label``
    names the GPUs the bar stands for when several hold the same)."""
    total = g.total_bytes
    parts = memory_parts(g)
    if not total or not parts:
        return ""
    svg = chart.stacked_bar_svg([(n, c) for _, n, c in parts if c], total, BAR_W, BAR_H)
    words = ", ".join(f"{w} {size(n)}" for w, n, _ in parts)
    image = chart.img(svg, width=BAR_W, height=BAR_H, alt=f"GPU {g.index} memory of {size(total)}: {words}",
                      css_class="gpunb-chart")
    items = chart.legend([(c, f"{w} {size(n)}", False) for w, n, c in parts if n or w == "free"])
    return (f"<div style='margin:4px 0'><div style='margin-bottom:2px'><b>{escape(label or f'GPU {g.index}')}</b> "
            f"<span style='{DIM}'>{escape(g.name)} · {escape(size(total))}</span></div>{image}"
            f"<div style='font-size:11px;margin-top:2px'>{items}</div></div>")


def most_of(census: Any) -> str:
    """", most of it optimizer state" when one kind of tensor holds more than half; else ""."""
    total = census.total_bytes() if census is not None else 0
    if not total:
        return ""
    by = census.by_role()
    role = max(ROLES, key=lambda r: by.get(r, 0))
    return f", most of it {GROUP_TITLES[role]}" if by.get(role, 0) > total / 2 else ""


def _gpu_conclusion(g: Any) -> str:
    if g.used_bytes is None or not g.total_bytes:
        return f"GPU {g.index}: memory not readable"
    s = f"GPU {g.index}: {size(g.used_bytes)} of {size(g.total_bytes)} used"
    if g.other_processes_bytes:
        s += f", {size(g.other_processes_bytes)} by other processes"
    return s


def _idle(g: Any) -> bool:
    """A GPU nothing here or elsewhere uses (under 1 MiB): said in one line with the others."""
    return g.used_bytes is not None and g.used_bytes < 2**20


def _same_memory(gpus: Any) -> list[list[Any]]:
    """The GPUs in use, grouped where their bars would read the same (one bar says it once)."""
    groups: dict[tuple, list[Any]] = {}
    for g in gpus:
        if not _idle(g):
            key = (g.name, g.total_bytes, tuple((w, size(n)) for w, n, _ in memory_parts(g)))
            groups.setdefault(key, []).append(g)
    return list(groups.values())


def _group_label(group: list[Any]) -> str:
    if len(group) == 1:
        return f"GPU {group[0].index}"
    return "GPU " + ", ".join(str(g.index) for g in group) + ", each"


def memory_headline(r: Any) -> str:
    """The first line: how full each GPU is and what fills it; without a GPU, the tensors."""
    c = r.census
    where = "CUDA" if r.devices_shown == "cuda" else "live"
    tensors = (f"{size(c.total_bytes())} in {len(c.entries)} {where} tensors{most_of(c)}" if c is not None and c.entries
               else f"no {where} tensors")
    if not r.gpus:
        return f"gpunb memory: no GPU memory to show · {tensors}"
    busy = sorted((g for g in r.gpus if not _idle(g)), key=lambda g: -(g.used_bytes or 0))
    idle = [g for g in r.gpus if _idle(g)]
    folded = fold("; ".join(_gpu_conclusion(g).replace("GPU ", "GPU", 1) for g in busy))
    if len(busy) > 2 and folded.count(";") <= 1:  # all the same, or two kinds: said once each
        parts = [folded]
    else:
        parts = [_gpu_conclusion(g) for g in busy[:2]]
        if len(busy) > 2:
            parts.append(f"{len(busy) - 2} more GPUs in use")
    if idle:
        parts.append(f"GPU {idle[0].index} empty" if len(idle) == 1 else
                     f"{'all ' if not busy else ''}{len(idle)} GPUs empty")
    return "gpunb memory: " + "; ".join(parts) + f" · {tensors}"


MIN_LISTED = 5  # tensors always named (the largest), however small: a tiny notebook still shows its names


def _listed(c: Any, top: int) -> tuple[list[Any], list[Any]]:
    """The tensors worth a row (at most ``top``), and the small ones summed up instead."""
    limit = max(SMALL_TENSOR_FLOOR, SMALL_TENSOR_SHARE * c.total_bytes())
    count = max(sum(1 for e in c.entries if e.nbytes >= limit), min(MIN_LISTED, len(c.entries)))
    shown = list(c.entries[:min(count, top)])  # entries are largest first
    return shown, list(c.entries[len(shown):])


def _rest_line(rest: list[Any], top: int, shown: int) -> str:
    if not rest:
        return ""
    small = max(e.nbytes for e in rest)
    why = f"top={top} shown" if shown >= top else f"each {size(small)} or less"
    return f"… {len(rest)} more tensors ({why}): {size(sum(e.nbytes for e in rest))} in all"


def _freed_line(f: Any) -> str:
    s = f"freed {', '.join(f.names) or 'nothing'}: {size(f.freed_tensor_bytes)} of tensors"
    if f.before.torch_reserved_bytes is not None and f.after.torch_reserved_bytes is not None:
        s += f"; torch reserved {size(f.before.torch_reserved_bytes)} → {size(f.after.torch_reserved_bytes)}"
    if f.missing:
        s += f" (not defined: {', '.join(f.missing)})"
    return s


def _census_title(r: Any) -> str:
    c = r.census
    where = "CUDA" if r.devices_shown == "cuda" else "all devices"
    return (f"Live tensors ({where}): {size(c.total_bytes())} in {len(c.entries)} — "
            + "; ".join(group_lines(c)))


def memory_text(r: Any) -> str:
    lines = [memory_headline(r)]
    if r.freed is not None:
        lines.append(_freed_line(r.freed))
    if r.gpus:
        head, rows = _gpu_table_rows(r)
        w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w[i]) for i, h in enumerate(head)).rstrip())
        for row in rows:
            lines.append("  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip())
        note = _absent_note(r)
        if note:
            lines.append(note)
    for p in r.problems:
        lines.append(f"! {p}")
    c = r.census
    if c is not None:
        if c.entries:
            lines.append(_census_title(r))
            shown, rest = _listed(c, r.top)
            for e in shown:
                lines.append(f"  {size(e.nbytes):>11}  {e.name}  {'×'.join(map(str, e.shape))} {e.dtype} "
                             f"{e.device} {e.role}" + ("" if e.source == NAMESPACE else f", kept by {e.source}"))
            if rest:
                lines.append("  " + _rest_line(rest, r.top, len(shown)))
        else:
            lines.append("No live tensors found in the notebook's variables.")
        left = c.leftovers
        if left:
            lines.append(f"Leftovers (no variable holds them): {size(sum(e.nbytes for e in left))}: "
                         + ", ".join(f"{e.name} ({size(e.nbytes)})" for e in left[:6])
                         + "  → %gpumem --release (old errors), %reset -f out (output history)")
    return "\n".join(lines)


def memory_html(r: Any) -> str:
    """The headline, what is wrong, a bar per GPU in use (its legend carries the numbers), the
    largest tensors; the per-GPU table one click away (the same numbers, for reading off)."""
    parts = [f"<div class='gpunb-memory' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
             f"overflow-wrap:anywhere'><div style='font-weight:600;margin-bottom:4px'>"
             f"{escape(memory_headline(r))}</div>"]
    parts += [f"<div style='color:{chart.ORANGE}'>{code_html(p)}</div>" for p in r.problems]
    if r.freed is not None:
        parts.append(f"<div>{escape(_freed_line(r.freed))}</div>")
    idle = [g for g in r.gpus if _idle(g)]
    parts += [memory_bar_html(group[0], _group_label(group)) for group in _same_memory(r.gpus)]
    if idle:
        sizes = sorted({size(g.total_bytes) for g in idle})
        names = ", ".join(f"GPU {g.index}" for g in idle)
        parts.append(f"<div style='margin:4px 0'>{escape(names)}: empty, {escape(' / '.join(sizes))}"
                     f"{' each' if len(idle) > 1 else ''}</div>")
    if r.gpus:
        head, rows = _gpu_table_rows(r)
        note = _absent_note(r)
        parts.append("<details style='margin:2px 0'><summary style='cursor:pointer'>per GPU in numbers</summary>"
                     + table(head, rows)
                     + (f"<div style='font-size:11px;{DIM}'>{escape(note)}</div>" if note else "") + "</details>")
    c = r.census
    if c is not None:
        if c.entries:
            parts.append(f"<div style='margin-top:6px'><b>Largest tensors</b> "
                         f"<span style='{DIM}'>{escape('; '.join(group_lines(c)))}</span></div>")
            shown, rest = _listed(c, r.top)
            parts.append(table(TENSOR_HEAD, tensor_rows(shown, len(shown))))
            if rest:
                parts.append(f"<div style='font-size:11px;{DIM}'>{escape(_rest_line(rest, r.top, len(shown)))}</div>")
        else:
            parts.append("<div>No live tensors found in the notebook's variables.</div>")
        if c.leftovers:
            parts.append("<div>Leftovers no variable holds: " + escape(", ".join(
                f"{e.name} {size(e.nbytes)}" for e in c.leftovers[:6])) + "</div>")
    return "".join(parts) + "</div>"


# How the record shows (gpunb.display looks it up; the record never imports a view).
register_views(MemoryReport, {"text/plain": memory_text, "text/html": memory_html})
