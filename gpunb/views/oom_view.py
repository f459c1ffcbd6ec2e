"""Text and HTML for the OOM doctor's diagnosis (one source, two forms)."""

from __future__ import annotations

from html import escape
from typing import Any

from gpunb.analysis.memory.oom_records import OomDiagnosis
from gpunb.display import register_views
from gpunb.views.memory_tables import TENSOR_HEAD, group_lines, size, table, tensor_rows

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


def diagnosis_text(d: Any, top: int = 8) -> str:
    m = d.message
    lines = [f"gpunb OOM doctor: {d.exception_type}: {d.headline}"]
    if m is not None:
        gpu = f"GPU {m.device if m.device is not None else '?'} total"
        facts = [f"{label} {size(n)}" for label, n in (
            ("asked", m.requested_bytes), ("free", m.free_bytes), (gpu, m.total_bytes),
            ("torch allocated", m.allocated_bytes), ("reserved-unallocated", m.reserved_unallocated_bytes),
            ("context/non-torch", m.non_torch_bytes)) if n is not None]
        if facts:
            lines.append("  " + ", ".join(facts))
    for p in d.other_processes:
        lines.append(f"  other process PID {p.pid} {p.name}{' = ' + p.holder if p.holder else ''}: "
                     f"{size(p.used_bytes)}")
    lines.append("Why:")
    for c in d.causes:
        lines.append(f"  - [{c.code}] {c.summary}")
    if d.census is not None and d.census.entries:
        lines.append("Largest live tensors (" + "; ".join(group_lines(d.census)) + ")" + _off_gpu(d.census) + ":")
        for e in d.census.entries[:top]:
            lines.append(f"  {size(e.nbytes):>11}  {e.name}  {e.dtype} {e.device} [{e.role}; {e.source}]")
    if d.fixes:
        lines.append("Fixes (estimated saving for this case):")
        for i, f in enumerate(d.fixes, 1):
            saving = fix_saving(f, d)
            lines.append(f"  {i}. {f.title}" + (f" ({saving})" if saving else "") + f" — {f.reason}")
            for h in f.how.splitlines():
                lines.append(f"       {h}")
    for n in d.notes:
        lines.append(f"Note: {n}")
    if d.release is not None:
        lines.extend(release_lines(d.release))
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
            line += f" ({r.returned_fraction * 100:.0f} % of the {size(r.pinned_bytes)} the failed cell held)"
        out.append(line)
        if r.after.torch_allocated_bytes is not None:
            out.append(f"  now: torch allocated {size(r.after.torch_allocated_bytes)}, reserved "
                       f"{size(r.after.torch_reserved_bytes)}")
    if not r.kept_traceback and r.cleared:
        out.append("  released: " + "; ".join(r.cleared)
                   + " (%debug has no frames for this error; %gpumem --keep-traceback on keeps them)")
    return out


def diagnosis_html(d: Any, top: int = 8) -> str:
    m = d.message
    parts = [f"<div style='border-left:3px solid #c0392b;padding-left:8px'><b>gpunb OOM doctor</b>: "
             f"{escape(d.exception_type)}: <b>{escape(d.headline)}</b>"]
    if m is not None:
        rows = [[k, size(v)] for k, v in (
            ("asked", m.requested_bytes), ("free", m.free_bytes), ("GPU total", m.total_bytes),
            ("this process", m.process_bytes), ("allocated by torch", m.allocated_bytes),
            ("reserved, unallocated", m.reserved_unallocated_bytes), ("context / non-torch", m.non_torch_bytes))
            if v is not None]
        if rows:
            parts.append(table(["", "bytes"], rows))
    if d.other_processes:
        parts.append(table(["other process", "name", "whose", "memory"],
                            [[str(p.pid), p.name, p.holder, size(p.used_bytes)] for p in d.other_processes]))
    parts.append("<b>Why</b><ul>" + "".join(f"<li><code>{escape(c.code)}</code> {escape(c.summary)}</li>"
                                            for c in d.causes) + "</ul>")
    if d.census is not None and d.census.entries:
        parts.append("<b>Largest live tensors</b> (" + escape("; ".join(group_lines(d.census))) + ")"
                     + escape(_off_gpu(d.census)))
        parts.append(table(TENSOR_HEAD, tensor_rows(d.census.entries, top)))
    if d.fixes:
        items = "".join(
            f"<li><b>{escape(f.title)}</b>"
            + (f" <i>({escape(fix_saving(f, d))})</i>" if fix_saving(f, d) else "") + f" — {escape(f.reason)}"
            + (f"<pre style='margin:2px 0'>{escape(f.how)}</pre>" if f.how else "")
            + (f" <a href='{escape(f.link)}' target='_blank'>docs</a>" if f.link else "") + "</li>"
            for f in d.fixes)
        parts.append(f"<b>Fixes</b> (estimated saving for this case)<ol>{items}</ol>")
    for n in d.notes:
        parts.append(f"<div>Note: {escape(n)}</div>")
    if d.release is not None:
        parts.append("<div>" + "<br>".join(escape(x) for x in release_lines(d.release)) + "</div>")
    return "".join(parts) + "</div>"


# How the record shows (gpunb.display looks it up; the record never imports a view).
register_views(OomDiagnosis, {"text/plain": diagnosis_text, "text/html": diagnosis_html})
