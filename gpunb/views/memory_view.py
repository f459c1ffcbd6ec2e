"""Text and HTML for the OOM diagnosis, ``%gpumem`` and ``%gpufit`` (one source, two forms).

Every dynamic string in HTML goes through ``html.escape``: tensor names come from the
user's variables and process names from other users.
"""

from __future__ import annotations

import base64
import io
from html import escape
from typing import Any

from gpunb.analysis.fit.records import BatchFit
from gpunb.analysis.memory.census import GROUP_TITLES, ROLES
from gpunb.analysis.memory.oom_records import OomDiagnosis
from gpunb.analysis.memory.records import MemoryReport
from gpunb.display import register_views
from gpunb.units import gib
from gpunb.views import chart
from gpunb.views.markup import DIM, code_html

GiB = 2**30


def size(n: Any) -> str:
    return gib(int(n) if isinstance(n, float) else n, digits=2)


_STYLE = ("font-family:var(--jp-code-font-family,monospace);font-size:12px;border-collapse:collapse")
_TD = "padding:1px 8px;text-align:left;border-bottom:1px solid rgba(140,149,159,0.35)"


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


def memory_bar_html(g: Any) -> str:
    """One GPU's memory as a stacked bar with a legend that carries the numbers."""
    total = g.total_bytes
    parts = memory_parts(g)
    if not total or not parts:
        return ""
    svg = chart.stacked_bar_svg([(n, c) for _, n, c in parts if c], total, BAR_W, BAR_H)
    words = ", ".join(f"{w} {size(n)}" for w, n, _ in parts)
    image = chart.img(svg, width=BAR_W, height=BAR_H, alt=f"GPU {g.index} memory of {size(total)}: {words}",
                      css_class="gpunb-chart")
    items = chart.legend([(c, f"{w} {size(n)}", False) for w, n, c in parts if n or w == "free"])
    return (f"<div style='margin:4px 0'><div style='margin-bottom:2px'><b>GPU {g.index}</b> "
            f"<span style='{DIM}'>{escape(g.name)} · {escape(size(total))}</span></div>{image}"
            f"<div style='font-size:11px;margin-top:2px'>{items}</div></div>")


def _gpu_conclusion(g: Any) -> str:
    if g.used_bytes is None or not g.total_bytes:
        return f"GPU {g.index}: memory not readable"
    s = f"GPU {g.index} {size(g.used_bytes)} of {size(g.total_bytes)} used"
    if g.process_bytes is not None:
        s += f", this kernel {size(g.process_bytes)}"
    if g.torch_allocated_bytes is not None:
        s += f" (torch {size(g.torch_allocated_bytes)} allocated, {size(g.torch_reserved_bytes)} reserved)"
    if g.other_processes_bytes:
        s += f", other processes {size(g.other_processes_bytes)}"
    return s


def memory_headline(r: Any) -> str:
    """The first line: how full each GPU is and who holds it; without a GPU, why, and the tensors."""
    c = r.census
    where = "CUDA" if r.devices_shown == "cuda" else "live"
    tensors = (f"{size(c.total_bytes())} in {len(c.entries)} {where} tensors" if c is not None and c.entries
               else f"no {where} tensors")
    if r.gpus:
        parts = [_gpu_conclusion(g) for g in r.gpus[:2]]
        if len(r.gpus) > 2:
            parts.append(f"and {len(r.gpus) - 2} more GPUs")
        return "gpunb memory: " + "; ".join(parts) + f" · {tensors}"
    return f"gpunb memory: no GPU memory to show · {tensors}"


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
            + "; ".join(_group_lines(c)))


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
                             f"{e.device} [{e.role}]" + ("" if e.source == "namespace" else f" held by {e.source}"))
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
    parts = [f"<div class='gpunb-memory' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px'>"
             f"<div style='font-weight:600;margin-bottom:4px'>{escape(memory_headline(r))}</div>"]
    if r.freed is not None:
        parts.append(f"<div>{escape(_freed_line(r.freed))}</div>")
    parts += [memory_bar_html(g) for g in r.gpus]
    if r.gpus:
        head, rows = _gpu_table_rows(r)
        parts.append(_table(head, rows))
        note = _absent_note(r)
        if note:
            parts.append(f"<div style='font-size:11px;{DIM}'>{escape(note)}</div>")
    for p in r.problems:
        parts.append(f"<div style='color:{chart.ORANGE}'>{code_html(p)}</div>")
    c = r.census
    if c is not None:
        if c.entries:
            parts.append(f"<div style='margin-top:6px'><b>{escape(_census_title(r))}</b></div>")
            shown, rest = _listed(c, r.top)
            parts.append(_table(_TENSOR_HEAD, _tensor_rows(shown, len(shown))))
            if rest:
                parts.append(f"<div style='font-size:11px;{DIM}'>{escape(_rest_line(rest, r.top, len(shown)))}</div>")
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
    return (head + _table(["#", "batch", "why", "result", "peak allocated", "peak reserved", "steps", "time"],
                          rows) + notes + fit_chart_html(f))


FIT_FIGSIZE = (7.6, 3.4)  # inches at 100 dpi: the plot and its legend beside it


def _theme_neutral(fig: Any, ax: Any) -> None:
    """A transparent figure whose words and axes read on light and dark pages alike."""
    fig.patch.set_alpha(0.0)
    ax.set_facecolor("none")
    for spine in ax.spines.values():
        spine.set_color(chart.NEUTRAL)
    ax.tick_params(colors=chart.GREY, which="both")
    ax.xaxis.label.set_color(chart.GREY)
    ax.yaxis.label.set_color(chart.GREY)
    ax.grid(True, which="major", color=chart.NEUTRAL, alpha=0.25, lw=0.6)


def fit_figure(f: Any, title: bool = True) -> Any:
    """Peak memory against batch size (log scale: probes at 8 and 64 stay apart from a
    prediction at 50,000): trials, fitted lines, capacity, the answer. ``title=False`` when
    the HTML around it says what it is."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=FIT_FIGSIZE, dpi=100)
    ax = fig.add_subplot()
    _theme_neutral(fig, ax)
    ok = [t for t in f.trials if t.fits and t.peak_allocated_bytes is not None]
    bad = [t for t in f.trials if not t.fits]
    edge = [t for t in ok if t.at_edge]
    ax.scatter([t.batch for t in ok], [t.peak_allocated_bytes / GiB for t in ok], color=chart.BLUE,
               label="peak allocated", zorder=3)
    ax.scatter([t.batch for t in ok], [(t.peak_reserved_bytes or 0) / GiB for t in ok], marker="s",
               color=chart.ORANGE, label="peak reserved", zorder=3)
    fb = [t for t in ok if getattr(t, "peak_before_step_bytes", None) is not None]
    if fb:
        ax.scatter([t.batch for t in fb], [t.peak_before_step_bytes / GiB for t in fb], marker="^",
                   color=chart.PURPLE, label="peak before optimizer.step (fitted)", zorder=3)
    if f.capacity_bytes:
        ax.axhline(f.capacity_bytes / GiB, color=chart.RED, lw=1, ls="--", label="capacity")
        for t in bad:
            ax.scatter([t.batch], [f.capacity_bytes / GiB], marker="x", color=chart.RED, zorder=4,
                       label="out of memory" if t is bad[0] else None)
        if edge:
            ax.scatter([t.batch for t in edge], [f.capacity_bytes / GiB] * len(edge), marker="o", facecolors="none",
                       edgecolors=chart.RED, zorder=4, label="trained, the cache given back")
    batches = [t.batch for t in f.trials] + [f.recommended or 1]
    xmin, xmax = max(1.0, min(batches) / 1.5), max(batches) * 1.5
    xs = [xmin * (xmax / xmin) ** (i / 60) for i in range(61)]  # a straight line is a curve on a log axis
    for line, style, color, label in ((f.line_reserved, "--", chart.ORANGE, "fit (reserved)"),
                                      (f.line_allocated, ":", chart.BLUE, "fit (allocated, used to predict)")):
        if line is not None:
            ax.plot(xs, [line.at(x) / GiB for x in xs], style, color=color, lw=1, label=label)
    if f.recommended:
        ax.axvline(f.recommended, color=chart.GREEN, lw=1.2, label=f"recommended {f.recommended}")
    ax.set_xscale("log")
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (log scale)")
    ax.set_ylabel("GiB")
    if title:
        ax.set_title(f"peak memory over {f.steps} training steps", color=chart.GREY, fontsize=10)
    # beside the plot, not on it: the capacity line and the curve stay clear
    legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    for text in legend.get_texts():
        text.set_color(chart.GREY)
    fig.tight_layout()
    return fig


def fit_png(f: Any, dpi: int = 100, title: bool = True) -> str | None:
    """The figure as base64 PNG (None when it cannot be drawn)."""
    try:
        fig = fit_figure(f, title=title)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, transparent=True)
        return base64.b64encode(buf.getvalue()).decode()
    except Exception:
        return None


def fit_chart_html(f: Any) -> str:
    """The memory curve inside the report's HTML (a separate image output would lose to the
    HTML table in JupyterLab and never be seen)."""
    if not f.ok or not f.trials:
        return ""
    png = fit_png(f, dpi=150, title=False)  # drawn at 1.5x: sharp on high-density screens
    if png is None:
        return ""
    ok = [t for t in f.trials if t.fits]
    alt = (f"peak memory against batch size (log scale): {len(f.trials)} trials, {len(ok)} trained; "
           f"capacity {size(f.capacity_bytes)}; largest batch that trained {f.verified}; recommended {f.recommended}")
    words = escape(alt, quote=True)
    width, height = (round(v * 100) for v in FIT_FIGSIZE)
    return (f"<div style='margin-top:6px'><b>Peak memory over {escape(str(f.steps))} training steps</b>"
            f"<img class='gpunb-chart' src='data:image/png;base64,{png}' width='{width}' height='{height}' "
            f"alt='{words}' title='{words}' style='display:block;max-width:none'></div>")


# How the records show (gpunb.display looks these up; the records never import a view). The
# memory curve of a fit is inside its HTML (a separate image/png would lose to the HTML in
# JupyterLab); ``BatchFit.figure()`` gives it as a matplotlib Figure.
register_views(OomDiagnosis, {"text/plain": diagnosis_text, "text/html": diagnosis_html})
register_views(MemoryReport, {"text/plain": memory_text, "text/html": memory_html})
register_views(BatchFit, {"text/plain": fit_text, "text/html": fit_html}, figure=fit_figure)
