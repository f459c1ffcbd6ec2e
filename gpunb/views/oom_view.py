"""Text and HTML for the OOM doctor's diagnosis (one source, two forms)."""

from __future__ import annotations

from html import escape
from typing import Any

from gpunb.analysis.memory.oom_records import OomDiagnosis
from gpunb.display import register_views
from gpunb.views import chart
from gpunb.views.markup import DIM
from gpunb.views.memory_tables import TENSOR_HEAD, group_lines, size, table, tensor_rows
from gpunb.views.trace_view import oom_sites_html, oom_sites_lines

# -- OOM diagnosis -----------------------------------------------------------------------------

def _off_gpu(census: Any) -> str:
    if any(e.device.startswith("cuda") for e in census.entries):
        return ""
    return ", none on a GPU: they hold no GPU memory and count toward no saving"


def fix_saving(f: Any, d: Any) -> str:
    """"saves ≈ 8.40 GiB: covers the 16.80 GiB short" (or says it is not enough alone)."""
    saving = getattr(f, "saving_bytes", None)
    if saving is None:
        return ""
    short = d.shortfall_bytes
    if not short:
        return f"saves ≈{size(saving)}"
    if f.severity >= 2 and saving >= short:
        return f"saves ≈{size(saving)}: covers the {size(short)} short"
    return f"saves ≈{size(saving)} of the {size(short)} short: not enough alone"


def _fix_head(f: Any, d: Any) -> str:
    saving = fix_saving(f, d)
    return f.title + (f" — {saving}" if saving else "")


def _plain_cleared(cleared: Any) -> list[str]:
    """What the release let go, in the user's words: IPython's ``sys.last_*`` trio is "the last
    error" (said once), the rest as the release names it."""
    words: list[str] = []
    for item in cleared:
        item = "the last error" if str(item).startswith("sys.last_") else str(item)
        if item not in words:
            words.append(item)
    return words


def _detail_lines(d: Any, top: int) -> list[str]:
    """Everything behind the verdict: the message's numbers, other processes, the largest
    tensors, notes, what the release let go."""
    m = d.message
    lines = []
    if m is not None:
        gpu = f"GPU {m.device if m.device is not None else '?'} total"
        facts = [f"{label} {size(n)}" for label, n in (
            ("asked", m.requested_bytes), ("free", m.free_bytes), (gpu, m.total_bytes),
            ("torch allocated", m.allocated_bytes), ("reserved-unallocated", m.reserved_unallocated_bytes),
            ("context/non-torch", m.non_torch_bytes)) if n is not None]
        if facts:
            lines.append(", ".join(facts))
    for p in d.other_processes:
        lines.append(f"other process PID {p.pid} {p.name}{' = ' + p.holder if p.holder else ''}: "
                     f"{size(p.used_bytes)}")
    if d.census is not None and d.census.entries:
        lines.append("Largest live tensors: " + "; ".join(group_lines(d.census)) + _off_gpu(d.census))
        for e in d.census.entries[:top]:
            lines.append(f"  {size(e.nbytes):>11}  {e.name}  {e.dtype} {e.device} {e.role}"
                         + ("" if e.source == "namespace" else f", held by {e.source}"))
    lines += [f"Note: {n}" for n in d.notes]
    return lines


def diagnosis_text(d: Any, top: int = 8) -> str:
    """The shortfall, why, what to do, the memory given back; then the details."""
    lines = [f"gpunb OOM doctor: {d.exception_type}: {d.headline}"]
    lines += [f"Why: {c.summary}" for c in d.causes]
    lines += oom_sites_lines(d.alloc_sites)
    if d.fixes:
        lines.append("What to do:")
        for i, f in enumerate(d.fixes, 1):
            lines.append(f"  {i}. {_fix_head(f, d)}")
            lines.append(f"     {f.reason}")
            lines += [f"       {h}" for h in f.how.splitlines()]
    if d.release is not None:
        lines.extend(release_lines(d.release))
    details = _detail_lines(d, top)
    if details:
        lines.append("Details:")
        lines += [f"  {x}" for x in details]
    return "\n".join(lines)


def release_lines(r: Any) -> list[str]:
    out = []
    if r.kept_traceback:
        out.append("Memory: the failed cell's frames are KEPT for %debug (%gpumem --keep-traceback off to change; "
                   "%gpumem --release frees them now).")
    parts = [f"{label} {size(n)}" for label, n in (
        ("tensors", r.freed_allocated_bytes), ("torch reserved", r.freed_reserved_bytes),
        ("process (NVML)", r.freed_process_bytes)) if n is not None]
    if parts:
        line = "Memory given back: " + ", ".join(parts)
        if r.returned_fraction is not None:
            line += f": {r.returned_fraction * 100:.0f} % of the {size(r.pinned_bytes)} the failed cell held"
        out.append(line)
        if r.after.torch_allocated_bytes is not None:
            out.append(f"  now: torch allocated {size(r.after.torch_allocated_bytes)}, reserved "
                       f"{size(r.after.torch_reserved_bytes)}")
    if not r.kept_traceback and r.cleared:
        out.append("  Let go of what the error held: " + "; ".join(_plain_cleared(r.cleared))
                   + ". So %debug cannot open this error; `%gpumem --keep-traceback on` keeps it next time.")
    return out


_P = "margin:3px 0"


def diagnosis_html(d: Any, top: int = 8) -> str:
    """As the text: the shortfall, why, what to do, what came back; the numbers and tensors
    one click away (a table of CPU tensors would push the first fix off the screen)."""
    m = d.message
    parts = [f"<div class='gpunb-oom' style='border-left:3px solid {chart.RED};padding-left:8px;"
             f"font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;overflow-wrap:anywhere'>"
             f"<div style='font-size:14px'><b>gpunb OOM doctor</b>: <b>{escape(d.headline)}</b> "
             f"<span style='{DIM}'>{escape(d.exception_type)}</span></div>"]
    parts += [f"<div style='{_P}'><b>Why:</b> {escape(c.summary)}</div>" for c in d.causes]
    parts.append(oom_sites_html(d.alloc_sites))
    if d.fixes:
        items = "".join(
            f"<li style='{_P}'><b>{escape(f.title)}</b>"
            + (f" — {escape(fix_saving(f, d))}" if fix_saving(f, d) else "")
            + f"<div style='{DIM}'>{escape(f.reason)}</div>"
            + (f"<pre style='margin:2px 0;white-space:pre-wrap'>{escape(f.how)}</pre>" if f.how else "")
            + (f"<a href='{escape(f.link, quote=True)}' target='_blank' rel='noopener noreferrer'>docs</a>"
               if f.link else "") + "</li>"
            for f in d.fixes)
        parts.append(f"<div style='{_P}'><b>What to do</b></div><ol style='margin:0;padding-left:22px'>{items}</ol>")
    release = release_lines(d.release) if d.release is not None else []
    if release:
        parts.append(f"<div style='{_P}'>{escape(release[0])}</div>")
    inner = []
    if m is not None:
        rows = [[k, size(v)] for k, v in (
            ("asked", m.requested_bytes), ("free", m.free_bytes), ("GPU total", m.total_bytes),
            ("this process", m.process_bytes), ("allocated by torch", m.allocated_bytes),
            ("reserved, unallocated", m.reserved_unallocated_bytes), ("context / non-torch", m.non_torch_bytes))
            if v is not None]
        if rows:
            inner.append(table(["", "bytes"], rows))
    if d.other_processes:
        inner.append(table(["other process", "name", "whose", "memory"],
                           [[str(p.pid), p.name, p.holder, size(p.used_bytes)] for p in d.other_processes]))
    if d.census is not None and d.census.entries:
        inner.append(f"<div style='{_P}'><b>Largest live tensors</b>: "
                     + escape("; ".join(group_lines(d.census)) + _off_gpu(d.census)) + "</div>")
        inner.append(table(TENSOR_HEAD, tensor_rows(d.census.entries, top)))
    inner += [f"<div style='{_P}'>Note: {escape(n)}</div>" for n in d.notes]
    inner += [f"<div style='{_P};{DIM}'>{escape(x)}</div>" for x in release[1:]]
    if inner:
        parts.append("<details style='margin:4px 0'><summary style='cursor:pointer'>Details: the memory in numbers, "
                     "the largest tensors, what was released</summary>" + "".join(inner) + "</details>")
    return "".join(parts) + "</div>"


# How the record shows (gpunb.display looks it up; the record never imports a view).
register_views(OomDiagnosis, {"text/plain": diagnosis_text, "text/html": diagnosis_html})
