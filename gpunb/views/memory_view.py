"""Text and HTML for the OOM diagnosis, ``%gpumem`` and ``%gpufit`` (one source, two forms).

Every dynamic string in HTML goes through ``html.escape``: tensor names come from the
user's variables and process names from other users.
"""

from __future__ import annotations

import base64
import io
from html import escape
from typing import Any

from gpunb.analysis.tensor_census import GROUP_TITLES, ROLES
from gpunb.units import gib

GiB = 2**30


def size(n: Any) -> str:
    return gib(int(n) if isinstance(n, float) else n, digits=2)


_STYLE = ("font-family:var(--jp-code-font-family,monospace);font-size:12px;border-collapse:collapse")
_TD = "padding:1px 8px;text-align:left;border-bottom:1px solid #ddd"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='{_TD}'>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='{_TD}'>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table style='{_STYLE}'><tr>{head}</tr>{body}</table>"


def _tensor_rows(entries: Any, top: int) -> list[list[str]]:
    return [[e.name, size(e.nbytes), "×".join(map(str, e.shape)) or "scalar", e.dtype, e.device, e.role,
             e.source] for e in list(entries)[:top]]


_TENSOR_HEAD = ["reference", "size", "shape", "dtype", "device", "role", "held by"]


def _group_lines(census: Any) -> list[str]:
    by = census.by_role()
    return [f"{GROUP_TITLES[r]}: {size(by[r])}" for r in ROLES if by.get(r)]


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
        lines.append("Largest live tensors (" + "; ".join(_group_lines(d.census)) + ")" + _off_gpu(d.census) + ":")
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
            parts.append(_table(["", "bytes"], rows))
    if d.other_processes:
        parts.append(_table(["other process", "name", "whose", "memory"],
                            [[str(p.pid), p.name, p.holder, size(p.used_bytes)] for p in d.other_processes]))
    parts.append("<b>Why</b><ul>" + "".join(f"<li><code>{escape(c.code)}</code> {escape(c.summary)}</li>"
                                            for c in d.causes) + "</ul>")
    if d.census is not None and d.census.entries:
        parts.append("<b>Largest live tensors</b> (" + escape("; ".join(_group_lines(d.census))) + ")"
                     + escape(_off_gpu(d.census)))
        parts.append(_table(_TENSOR_HEAD, _tensor_rows(d.census.entries, top)))
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


# -- %gpumem ------------------------------------------------------------------------------------

def _gpu_rows(report: Any) -> list[list[str]]:
    def kernel(g: Any) -> str:  # this process, plus its child processes (workers, ranks) when they hold some
        children = getattr(g, "child_processes_bytes", None)
        return size(g.process_bytes) + (f" + {size(children)} in child processes" if children else "")

    return [[f"{g.index} {g.name}", size(g.total_bytes), size(g.used_bytes), kernel(g),
             size(g.torch_allocated_bytes), size(g.torch_reserved_bytes), size(g.non_torch_bytes),
             size(g.other_processes_bytes)] for g in report.gpus]


_GPU_HEAD = ["GPU", "total", "used (NVML)", "this kernel", "torch allocated", "torch reserved",
             "context/non-torch", "other processes"]


def _freed_line(f: Any) -> str:
    s = f"freed {', '.join(f.names) or 'nothing'}: {size(f.freed_tensor_bytes)} of tensors"
    if f.before.torch_reserved_bytes is not None and f.after.torch_reserved_bytes is not None:
        s += f"; torch reserved {size(f.before.torch_reserved_bytes)} → {size(f.after.torch_reserved_bytes)}"
    if f.missing:
        s += f" (not defined: {', '.join(f.missing)})"
    return s


def memory_text(r: Any) -> str:
    lines = ["gpunb memory"]
    if r.freed is not None:
        lines.append(_freed_line(r.freed))
    if r.gpus:
        w = [max(len(h), *(len(row[i]) for row in _gpu_rows(r))) for i, h in enumerate(_GPU_HEAD)]
        lines.append("  ".join(h.ljust(w[i]) for i, h in enumerate(_GPU_HEAD)))
        for row in _gpu_rows(r):
            lines.append("  ".join(c.ljust(w[i]) for i, c in enumerate(row)))
    for p in r.problems:
        lines.append(f"! {p}")
    c = r.census
    if c is not None:
        if c.entries:
            lines.append("Live tensors (" + ("CUDA" if r.devices_shown == "cuda" else "all devices") + "): "
                         + "; ".join(_group_lines(c)))
            for e in c.entries[:r.top]:
                lines.append(f"  {size(e.nbytes):>11}  {e.name}  {'×'.join(map(str, e.shape))} {e.dtype} "
                             f"{e.device} [{e.role}]" + ("" if e.source == "namespace" else f" held by {e.source}"))
            if len(c.entries) > r.top:
                lines.append(f"  … {len(c.entries) - r.top} more (top={r.top})")
        else:
            lines.append("No live tensors found in the notebook's variables.")
        left = c.leftovers
        if left:
            lines.append(f"Leftovers (no variable holds them): {size(sum(e.nbytes for e in left))}: "
                         + ", ".join(f"{e.name} ({size(e.nbytes)})" for e in left[:6])
                         + "  → %gpumem --release (old errors), %reset -f out (output history)")
    return "\n".join(lines)


def memory_html(r: Any) -> str:
    parts = ["<div><b>gpunb memory</b>"]
    if r.freed is not None:
        parts.append(f"<div>{escape(_freed_line(r.freed))}</div>")
    if r.gpus:
        parts.append(_table(_GPU_HEAD, _gpu_rows(r)))
    for p in r.problems:
        parts.append(f"<div style='color:#a15c00'>{escape(p)}</div>")
    c = r.census
    if c is not None:
        if c.entries:
            parts.append("<div>Live tensors: " + escape("; ".join(_group_lines(c))) + "</div>")
            parts.append(_table(_TENSOR_HEAD, _tensor_rows(c.entries, r.top)))
        else:
            parts.append("<div>No live tensors found in the notebook's variables.</div>")
        if c.leftovers:
            parts.append("<div>Leftovers (no variable holds them): " + escape(", ".join(
                f"{e.name} ({size(e.nbytes)})" for e in c.leftovers[:6])) + "</div>")
    return "".join(parts) + "</div>"


# -- %gpufit ------------------------------------------------------------------------------------

def fit_headline(f: Any) -> str:
    """The answer in one line, with the measurement that justifies it."""
    t = f.verified_trial
    line = f"recommended batch: {f.recommended}"
    basis = []
    if f.safety and f.verified is not None:
        basis.append(f"{f.safety * 100:.0f} % below {f.verified}, which")
    elif t is not None:
        basis.append("it")
    if t is not None and t.peak_reserved_bytes is not None and f.capacity_bytes:
        basis.append(f"trained {t.steps_done} steps from a fresh start at {size(t.peak_reserved_bytes)} peak reserved "
                     f"of {size(f.capacity_bytes)}: {size(f.headroom_bytes)} free")
    return line + (f" ({' '.join(basis)})" if len(basis) == 2 else "")


def _trial_line(t: Any) -> str:
    s = f"{t.index}. batch {t.batch:>6} ({t.purpose}): {t.verdict}"
    if t.peak_allocated_bytes is not None:
        s += f"; peak {size(t.peak_allocated_bytes)} allocated, {size(t.peak_reserved_bytes)} reserved"
        fb = getattr(t, "peak_before_step_bytes", None)
        if fb is not None:
            s += f", {size(fb)} before optimizer.step"
    return s + f"; {t.steps_done}/{t.steps} steps, {t.seconds:.1f} s"


def _why_below(f: Any) -> str:
    if not f.safety:
        return ""
    return (f"  {f.verified} trained; {f.recommended} is {f.safety * 100:.0f} % below it: near the limit fresh "
            "processes differ by a sample or two (the allocator's layout depends on the exact sizes)")


def fit_text(f: Any) -> str:
    if not f.ok:
        return f"gpunb %gpufit: {f.problem}"
    lines = [f"gpunb %gpufit on {f.device}: {fit_headline(f)}"]
    if _why_below(f):
        lines.append(_why_below(f))
    if f.predicted is not None:
        lines.append(f"  predicted from the allocated-memory line: {f.predicted}"
                     + (f"; from the reserved-memory line: {f.predicted_reserved}"
                        if f.predicted_reserved is not None else ""))
    lines.append(f"  {f.trial_count} trials in {f.seconds:.1f} s ({f.steps} steps each, a sustained run from a fresh "
                 "start: no optimizer state, no gradients, an empty cache):")
    for t in f.trials:
        lines.append("    " + _trial_line(t))
    if f.line_allocated is not None:
        line = f.line_allocated
        lines.append(f"  memory per sample ≈ {size(line.slope)}; fixed ≈ {size(line.intercept)}")
    for n in f.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def fit_html(f: Any) -> str:
    if not f.ok:
        return f"<div><b>gpunb %gpufit</b>: {escape(f.problem)}</div>"
    rows = [[str(t.index), str(t.batch), t.purpose, t.verdict, size(t.peak_allocated_bytes),
             size(t.peak_reserved_bytes), f"{t.steps_done}/{t.steps}", f"{t.seconds:.1f} s"] for t in f.trials]
    head = (f"<div><b>gpunb %gpufit</b> on {escape(f.device)}: <b>{escape(fit_headline(f))}</b></div>"
            + (f"<div>{escape(_why_below(f).strip())}</div>" if _why_below(f) else "")
            + f"<div>{f.trial_count} trials in {f.seconds:.1f} s, each a sustained run from a fresh start; "
            f"predicted {escape(str(f.predicted))} (allocated line), "
            f"{escape(str(f.predicted_reserved))} (reserved line)</div>")
    notes = "".join(f"<div>note: {escape(n)}</div>" for n in f.notes)
    return head + _table(["#", "batch", "why", "result", "peak allocated", "peak reserved", "steps", "time"],
                         rows) + notes


def fit_figure(f: Any) -> Any:
    """Peak memory against batch size: trials, fitted lines, capacity, the answer."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(6, 3.4), dpi=100)
    ax = fig.add_subplot()
    ok = [t for t in f.trials if t.fits and t.peak_allocated_bytes is not None]
    bad = [t for t in f.trials if not t.fits]
    edge = [t for t in ok if t.at_edge]
    ax.scatter([t.batch for t in ok], [t.peak_allocated_bytes / GiB for t in ok], label="peak allocated", zorder=3)
    ax.scatter([t.batch for t in ok], [(t.peak_reserved_bytes or 0) / GiB for t in ok], marker="s",
               label="peak reserved", zorder=3)
    fb = [t for t in ok if getattr(t, "peak_before_step_bytes", None) is not None]
    if fb:
        ax.scatter([t.batch for t in fb], [t.peak_before_step_bytes / GiB for t in fb], marker="^",
                   label="peak before optimizer.step (fitted)", zorder=3)
    if f.capacity_bytes:
        ax.axhline(f.capacity_bytes / GiB, color="#c0392b", lw=1, label="capacity")
        for t in bad:
            ax.scatter([t.batch], [f.capacity_bytes / GiB], marker="x", color="#c0392b", zorder=4)
        if edge:
            ax.scatter([t.batch for t in edge], [f.capacity_bytes / GiB] * len(edge), marker="o", facecolors="none",
                       edgecolors="#c0392b", zorder=4, label="trained, the cache given back")
    xmax = max([t.batch for t in f.trials] + [f.recommended or 0]) * 1.1
    for line, style, label in ((f.line_reserved, "--", "fit (reserved)"),
                               (f.line_allocated, ":", "fit (allocated, used to predict)")):
        if line is not None:
            ax.plot([0, xmax], [line.at(0) / GiB, line.at(xmax) / GiB], style, lw=1, label=label)
    if f.recommended:
        ax.axvline(f.recommended, color="#27ae60", lw=1, label=f"recommended {f.recommended}")
    ax.set_xlabel("batch size")
    ax.set_ylabel("GiB")
    ax.set_title(f"peak memory over {f.steps} training steps")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def fit_png(f: Any) -> str | None:
    try:
        fig = fit_figure(f)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return base64.b64encode(buf.getvalue()).decode()
    except Exception:
        return None
