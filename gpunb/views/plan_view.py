"""Text and HTML for a planned step (``%gpuplan`` / ``gpunb.plan``).

At a glance: the answer in one sentence (the peak, where, the first GPU, its largest batch), the
error band, one row per GPU. Then the peak by role and by line, and the memory over the step:
``%%gpumem --trace``'s own view of the plan's trace record, so a plan and a measured cell read the
same. One click away: the first and later steps, what the GPU adds, what was not modelled.
"""

from __future__ import annotations

from html import escape

from gpunb.analysis.plan.records import StepPlan
from gpunb.display import register_views
from gpunb.views.markup import DIM
from gpunb.views.memory_tables import size
from gpunb.views.trace_view import trace_html, trace_text

_P = "margin:3px 0"
_TD = "padding:1px 8px;text-align:left;border-bottom:1px solid rgba(140,149,159,0.35);white-space:nowrap"


def band_line(p: StepPlan) -> str:
    return (f"The GPU's own peak may be up to {p.band_under:.0%} above this plan or {p.band_over:.0%} below it "
            f"(the largest errors seen in calibration, {p.calibrated_on}); the largest batches allow for it.")


def gpu_rows(p: StepPlan) -> list[list[str]]:
    rows = []
    for g in p.gpus:
        now = f"fits, {size(g.spare_bytes)} to spare" if g.fits else f"does not fit, {size(-g.spare_bytes)} short"
        if g.largest_batch is None:
            best = "—"
        elif g.largest_batch == 0:
            best = "not even 1"
        else:
            best = f"≈ {g.largest_batch}" + ("" if g.largest_exact else " or more")
        rows.append([g.name, size(g.usable_bytes), now, best])
    return rows


def detail_lines(p: StepPlan) -> list[str]:
    lines = [f"First step (the optimizer makes its state): {size(p.first_step_peak_bytes)} allocated at the peak; "
             f"later steps: {size(p.steady_peak_bytes)}; reserved by torch's allocator: {size(p.peak_reserved_bytes)}.",
             f"Before the step: {size(p.before_bytes)} (weights, buffers, what the model already held). Added for "
             f"the GPU: cuBLAS's workspaces and the allocator's rounding in the peak, the CUDA context "
             f"({size(p.context_bytes)}) in what the batch needs.",
             f"Planned on stand-in tensors ({p.planned_on}), batches {', '.join(map(str, p.batches_planned))}, "
             f"in {p.seconds:.1f} s; nothing trained, no GPU memory used."]
    if p.per_sample_bytes:
        lines.append(f"Each sample adds ≈ {size(p.per_sample_bytes)} to the peak.")
    return lines


def plan_text(p: StepPlan) -> str:
    if p.problem:
        return f"gpunb plan of {p.step_name}({p.batch_size}): {p.headline}"
    lines = [f"gpunb plan of {p.step_name}({p.batch_size}): {p.headline}", band_line(p)]
    if p.gpus:
        rows = gpu_rows(p)
        w = max(len(f"batch {p.batch_size}"), *(len(r[2]) for r in rows)) + 2
        lines.append(f"  {'GPU':<14}{'usable':>11}  {'batch ' + str(p.batch_size):<{w}}largest batch")
        lines += [f"  {n:<14}{u:>11}  {now:<{w}}{best}" for n, u, now, best in rows]
    if p.trace is not None:
        lines += trace_text(p.trace).splitlines()[1:]
    lines += detail_lines(p)
    lines += [f"Not modelled: {n}" for n in p.notes]
    return "\n".join(lines)


def _table(p: StepPlan) -> str:
    head = ["GPU", "usable", f"batch {p.batch_size}", "largest batch"]
    th = "".join(f"<th style='{_TD}'>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='{_TD}'>{escape(c)}</td>" for c in row) + "</tr>"
                   for row in gpu_rows(p))
    return f"<table style='font-size:12px;border-collapse:collapse;margin:4px 0'><tr>{th}</tr>{body}</table>"


def plan_html(p: StepPlan) -> str:
    box = ("<div class='gpunb-plan' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
           "overflow-wrap:anywhere'>")
    head = f"<div style='font-size:14px'><b>gpunb plan</b>: <b>{escape(p.headline)}</b></div>"
    if p.problem:
        return box + head + "</div>"
    parts = [box, head, f"<div style='{_P};{DIM}'>{escape(band_line(p))}</div>"]
    if p.gpus:
        parts.append(_table(p))
    if p.trace is not None:
        parts.append(trace_html(p.trace))
    inner = "".join(f"<div style='{_P}'>{escape(x)}</div>" for x in detail_lines(p))
    inner += "".join(f"<div style='{_P}'>Not modelled: {escape(n)}</div>" for n in p.notes)
    parts.append("<details style='margin:4px 0'><summary style='cursor:pointer'>Details: first and later steps, "
                 "what the GPU adds, what was not modelled</summary>" + inner + "</details>")
    return "".join(parts) + "</div>"


register_views(StepPlan, {"text/plain": plan_text, "text/html": plan_html})
