"""Cell profiles as text, HTML and an inline SVG memory timeline; the one-line summary;
the history table. Pure functions of the records: every dynamic string is escaped."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpunb.analysis.profile_history import compare
from gpunb.analysis.step_plan import COUNTED_STEP
from gpunb.readings.devices import OWN_BY_RESERVE
from gpunb.units import byte_rate, flop_count, flop_rate, gib, milliseconds, seconds

if TYPE_CHECKING:  # the records import this module lazily to display themselves
    from gpunb.analysis.cell_meter import CellLine
    from gpunb.analysis.profile_records import CellProfile


def fmt_bytes(n: int | float | None) -> str:
    return gib(n, digits=2)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _rows(p: CellProfile) -> list[tuple[str, str]]:
    """(heading, text) lines shared by the text and HTML forms."""
    rows: list[tuple[str, str]] = []
    t = f"wall {seconds(p.wall_s)}"
    if p.synced_wall_s is not None:
        t += f" · GPU-synchronized {seconds(p.synced_wall_s)}"
    if p.gpu_time_s is not None:
        t += f" · GPU clock {seconds(p.gpu_time_s)}"
    t += f" · CPU {seconds(p.cpu_s)}"
    rows.append(("time", t))
    st = p.steps
    if st.count:
        s = f"{st.count} optimizer steps"
        if p.optimizers > 1:
            s += f" (first of {p.optimizers} optimizers)"
        s += f" · first {milliseconds(st.first_ms)}"
        if st.median_ms is not None:
            s += f" · median {milliseconds(st.median_ms)} · p90 {milliseconds(st.p90_ms)} (after {st.skipped} warm-up"
            s += _excluded_words(p) + ")"
        if st.steps_per_s:
            s += f" · {st.steps_per_s:.1f} steps/s"
        if st.samples_per_s:
            s += f" · {st.samples_per_s:,.0f} samples/s (batch {st.batch_size})"
        s += f" · timed by {st.source}"
    else:
        s = "no optimizer.step() seen (steps are detected with a global optimizer hook, torch >= 2.0)"
    rows.append(("steps", s))
    g = p.gpu
    if g is not None:
        m = (f"torch peak {fmt_bytes(g.peak_allocated_bytes)} allocated / {fmt_bytes(g.peak_reserved_bytes)} reserved"
             if g.peak_allocated_bytes is not None else
             "torch peak: not above the earlier peak (--no-reset left the global counter)")
        if g.nvml_process_bytes is not None:
            m += f" · NVML this process {fmt_bytes(g.nvml_process_bytes)} at cell end"
            rest = g.nvml_process_bytes - g.end_reserved_bytes
            if rest > 0:
                m += (f" (+{fmt_bytes(rest)} outside torch's cache: CUDA context, cuBLAS/cuDNN/NCCL workspaces, "
                      "other libraries)")
            if g.process_match == OWN_BY_RESERVE:
                m += " (NVML lists it under a container's host PID: matched by torch's reserve)"
        else:
            m += " · NVML: this process's memory unknown (MIG, no permission, or a container PID it cannot match)"
        if g.child_processes_bytes:
            m += f" · its child processes {fmt_bytes(g.child_processes_bytes)}"
        if g.nvml_device_peak_bytes is not None:
            m += f" · NVML device peak {fmt_bytes(g.nvml_device_peak_bytes)} used (all processes)"
        m += f" · device {fmt_bytes(g.total_bytes)}"
        if g.other_processes_bytes:
            m += f", other processes hold {fmt_bytes(g.other_processes_bytes)}"
        if g.alloc_retries:
            m += f" · {g.alloc_retries} cudaMalloc retries"
        rows.append(("GPU memory", m))
    else:
        rows.append(("GPU", f"absent: {p.gpu_absent}"))
    if p.peak_rss_bytes is not None:
        rows.append(("host memory", f"peak RSS {fmt_bytes(p.peak_rss_bytes)}"
                     + ("" if p.peak_rss_is_cell else " (lifetime peak of the process; per-cell peak needs Linux)")))
    sh = p.shares
    w = [f"data wait {seconds(sh.data_wait_s)} ({_pct(sh.data_wait_s, sh.loop_s)}) over {sh.batches} batches"
         if sh.batches else "no DataLoader batches"]
    if sh.sync_n:
        w.append(f"host syncs {sh.sync_n} ({sh.sync_gpu_n} from GPU tensors) {seconds(sh.sync_s)} "
                 f"({_pct(sh.sync_s, sh.loop_s)})")
    else:
        w.append("no host syncs")
    w.append(f"output {seconds(sh.output_s)} ({_pct(sh.output_s, sh.loop_s)}) in {sh.output_writes} writes"
             if sh.output_writes else "no output")
    if g is not None:
        w.append(f"GPU util {g.util_mean_pct:.0f}% mean over {g.util_samples} NVML samples"
                 if g.util_mean_pct is not None else "GPU util: no NVML samples")
    rows.append(("where", " · ".join(w) + f" — of a {seconds(sh.loop_s)} loop"))
    rows += throughput_rows(p) + ops_rows(p)
    if p.error:
        rows.append(("stopped", f"the cell raised {p.error} (report covers the part that ran)"))
    return rows


# -- FLOPs, MFU and the top operations (step 2 counted, --ops) ---------------------------------

def _step_list(indices: Sequence[int]) -> str:
    """0-based step indices as the user counts them: "2", "3-7", "2, 4-6"."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0] + 1}" if len(run) == 1 else f"{run[0] + 1}-{run[-1] + 1}")
        run = [i]
    if run:
        out.append(f"{run[0] + 1}" if len(run) == 1 else f"{run[0] + 1}-{run[-1] + 1}")
    return ", ".join(out)


def _excluded_words(p: CellProfile) -> str:
    excluded = p.steps.excluded
    if not excluded:
        return ""
    why = []
    if p.flops is not None and COUNTED_STEP in excluded:
        why.append("FLOP count")
    if p.ops is not None and p.ops.steps:
        why.append("torch.profiler")
    plural = "s" if len(excluded) > 1 else ""
    return f"; step{plural} {_step_list(excluded)} left out" + (f": {', '.join(why)}" if why else "")


def throughput_rows(p: CellProfile) -> list[tuple[str, str]]:
    """FLOPs per step, achieved TFLOP/s, MFU and, when memory traffic dominates, bandwidth."""
    t = p.flops
    if t is None:
        return []
    c = t.count
    if c is None:
        return [("FLOPs", t.why_not)]
    if c.flops == 0:
        text = (f"no matmul, convolution or attention FLOPs in step {c.step + 1} ({c.ops} operations seen; "
                "work inside CUDA graphs or fused compiled kernels is not seen)")
    else:
        mix = ", ".join(f"{name} {100 * share:.0f}%" for name, share in c.precision_mix())
        text = f"{flop_count(c.flops)} per step, counted on step {c.step + 1} ({mix})"
        text += (f" · {flop_rate(t.achieved_tflops * 1e12)} over the {milliseconds(t.step_ms)} median step"
                 if t.achieved_tflops is not None else " · no steady steps to time (warm-up and counted step left out)")
    if t.step_ms:
        text += f" · counting made step {c.step + 1} take {milliseconds(c.host_ms)} on the host"
    if c.uncounted:
        text += f" · {c.uncounted}"
    rows = [("FLOPs", text)]
    if t.mfu is not None and t.peak_tflops is not None:  # (an MFU comes with its peak)
        shares = c.precision_mix()
        kind = shares[0][0] if len(shares) == 1 else "mixed-precision"
        m = f"{100 * t.mfu:.0f}% of the {t.gpu_model}'s {flop_rate(t.peak_tflops * 1e12)} {kind} datasheet peak"
        if t.mfu_measured is not None and t.measured_peak_tflops is not None:
            m += (f" · {100 * t.mfu_measured:.0f}% of the {flop_rate(t.measured_peak_tflops * 1e12)} "
                  f"measured by {t.measured_source}")
        elif t.measured_source:
            m += f" · measured peak: {t.measured_source}"
        rows.append(("MFU", m))
    elif p.gpu is not None and c.flops and t.achieved_tflops is not None and not t.gpu_model:
        rows.append(("MFU", f"no datasheet peak known for {p.gpu.name}"))
    if t.memory_bound and t.bandwidth_gbps is not None and t.peak_bandwidth_gbps:
        rows.append(("bandwidth", f"memory-bound at the datasheet peaks: ~{c.bytes_moved / 1e9:.2f} GB moved per step "
                                  "(estimated: every operation's inputs read and outputs written once) · "
                                  f"{byte_rate(t.bandwidth_gbps * 1e9)} = "
                                  f"{100 * t.bandwidth_gbps / t.peak_bandwidth_gbps:.0f}% "
                                  f"of the {t.gpu_model}'s {byte_rate(t.peak_bandwidth_gbps * 1e9)}"))
    return rows


def _op_list(rows: Sequence, width: int = 60) -> str:
    def name(text: str) -> str:
        return text if len(text) <= width else text[: width - 1] + "…"

    return " · ".join(f"{name(r.name)} {milliseconds(r.ms_per_step)} ({100 * r.share:.0f}%, {r.category})"
                      for r in rows[:5])


def ops_rows(p: CellProfile) -> list[tuple[str, str]]:
    """--ops: where a few traced steps spent their time, the top operators and kernels, the trace."""
    o = p.ops
    if o is None:
        return []
    if not o.shares:
        return [("ops", f"no trace: {o.note}" if o.note else "no trace")]
    clock = "GPU time" if o.device_time else "CPU time"
    idle = "idle" if o.device_time else "outside operators"
    shares = " · ".join(f"{idle if k == 'idle' else k} {100 * v:.0f}%"
                        for k, v in sorted(o.shares.items(), key=lambda kv: -kv[1]))
    text = f"torch.profiler over step{'s' if len(o.steps) > 1 else ''} {_step_list(o.steps)}: {clock} {shares} " \
           f"of {milliseconds(o.window_ms)} per step"
    if o.note:
        text += f" ({o.note})"
    rows = [("ops", text), ("top ops", f"{clock} per step: " + _op_list(o.top_ops))]
    if o.top_kernels:
        rows.append(("top kernels", _op_list(o.top_kernels)))
    if o.trace_path:
        rows.append(("trace", f"{o.trace_path} ({fmt_bytes(o.trace_bytes)}; open it in ui.perfetto.dev or "
                              f"chrome://tracing) · summarized in {seconds(o.processing_s)} at the cell's end"))
    return rows


def _title(p: CellProfile) -> str:
    where = p.gpu.name if p.gpu is not None else "CPU"
    label = f" · {p.label}" if p.label else ""
    cell = f" · cell [{p.cell}]" if p.cell is not None else ""
    return f"gpuprofile{cell}{label} · {where}"


def profile_text(p: CellProfile) -> str:
    lines = [_title(p)]
    lines += [f"  {h:<11} {t}" for h, t in _rows(p)]
    v = p.verdict
    lines.append(f"  {'verdict':<11} {v.kind.upper()}: {v.headline} — {v.reason}" if v.kind != "none"
                 else f"  {'verdict':<11} {v.headline} ({v.reason})")
    for i, a in enumerate(p.advice, 1):
        gain = f" [up to {100 * a.gain:.0f}% of the loop]" if a.gain else ""
        lines.append(f"  {i}. {a.title}{gain}: {a.reason}" + (f"\n       {a.how}" if a.how else ""))
    return "\n".join(lines)


def timeline_svg(p: CellProfile, width: int = 560, height: int = 90) -> str:
    """Memory over the cell (allocated, and reserved on a GPU), step ends as ticks."""
    pts = p.memory_timeline
    if len(pts) < 2:
        return ""
    t_end = max(max(t for t, _, _ in pts), p.wall_s, 1e-9)
    top = max(max(a for _, a, _ in pts), max((r or 0) for _, _, r in pts), 1)
    pad = 4

    def xy(t: float, v: float) -> str:
        return f"{pad + (width - 2 * pad) * t / t_end:.1f},{height - pad - (height - 2 * pad) * v / top:.1f}"

    alloc = " ".join(xy(t, a) for t, a, _ in pts)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="memory over the cell">',
             f'<rect width="{width}" height="{height}" fill="none" stroke="#ccc"/>']
    marks = p.step_marks_s
    step = max(1, len(marks) // 200)  # at most ~200 ticks
    for t in marks[::step]:
        x = pad + (width - 2 * pad) * t / t_end
        parts.append(f'<line x1="{x:.1f}" y1="{height - pad}" x2="{x:.1f}" y2="{height - pad - 6}" stroke="#999"/>')
    if any(r is not None for _, _, r in pts):
        reserved = " ".join(xy(t, r) for t, _, r in pts if r is not None)
        parts.append(f'<polyline points="{reserved}" fill="none" stroke="#e69f00" stroke-width="1.5"/>')
    parts.append(f'<polyline points="{alloc}" fill="none" stroke="#0072b2" stroke-width="1.5"/>')
    parts.append(f'<text x="{pad + 2}" y="12" font-size="10" fill="#555">{html.escape(fmt_bytes(top))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def profile_html(p: CellProfile) -> str:
    e = html.escape
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em;vertical-align:top'>{e(h)}</th>"
                   f"<td style='text-align:left'>{e(t)}</td></tr>" for h, t in _rows(p))
    v = p.verdict
    out = [f"<div class='gpunb-profile'><b>{e(_title(p))}</b>",
           f"<table>{rows}</table>",
           (f"<p><b>verdict: {e(v.kind)}</b> — {e(v.headline)}: {e(v.reason)}</p>" if v.kind != "none"
            else f"<p>{e(v.headline)} ({e(v.reason)})</p>")]
    if p.advice:
        items = "".join(
            f"<li><b>{e(a.title)}</b>" + (f" (up to {100 * a.gain:.0f}% of the loop)" if a.gain else "")
            + f": {e(a.reason)}" + (f"<br><code>{e(a.how)}</code>" if a.how else "") + "</li>" for a in p.advice)
        out.append(f"<ol>{items}</ol>")
    svg = timeline_svg(p) if p.extra.get("timeline", True) else ""
    if svg:
        label = "allocated (blue) and reserved (orange)" if p.gpu is not None else "resident memory"
        out.append(f"<div>{svg}<br><small>memory over the cell: {e(label)}; ticks = optimizer steps</small></div>")
    out.append("</div>")
    return "".join(out)


# -- one line per cell ---------------------------------------------------------------------

def one_line_text(line: CellLine) -> str:
    parts = [f"⏱ {seconds(line.wall_s)}"]
    if line.synced_wall_s is not None and line.synced_wall_s - line.wall_s > 0.0005:
        parts[0] += f" (GPU done at {seconds(line.synced_wall_s)})"
    if line.peak_vram_bytes is not None:
        parts.append(f"peak VRAM {fmt_bytes(line.peak_vram_bytes)}")
    elif line.gpu_note:
        parts.append(line.gpu_note)
    if line.util_pct is not None:
        parts.append(f"GPU util {line.util_pct:.0f}%")
    if line.peak_rss_bytes is not None:
        parts.append(f"peak RSS {fmt_bytes(line.peak_rss_bytes)}")
    return "gpuprofile: " + " · ".join(parts)


# -- history -----------------------------------------------------------------------------

def history_rows(entries: Sequence[CellProfile]) -> list[list[str]]:
    rows = []
    for i, p in enumerate(entries):
        versus = compare(entries[i - 1], p).words() if i else ""
        peak = p.gpu.peak_allocated_bytes if p.gpu is not None else p.peak_rss_bytes
        rows.append([str(i + 1), f"[{p.cell}]" if p.cell is not None else "api", p.label or "", seconds(p.wall_s),
                     milliseconds(p.steps.median_ms), str(p.steps.count), fmt_bytes(peak), p.verdict.kind,
                     f"vs #{i}: {versus}" if versus else ""])
    return rows


HISTORY_HEADER = ["#", "cell", "label", "wall", "median step", "steps", "peak mem", "verdict", "compared"]


def history_text(entries: Sequence[CellProfile]) -> str:
    if not entries:
        return "gpuprofile history: no profiled cells yet (run a cell with %%gpuprofile)"
    rows = [HISTORY_HEADER, *history_rows(entries)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HISTORY_HEADER))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def history_html(entries: Sequence[CellProfile]) -> str:
    e = html.escape
    if not entries:
        return f"<p>{e(history_text(entries))}</p>"
    head = "".join(f"<th>{e(h)}</th>" for h in HISTORY_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in history_rows(entries))
    return f"<table class='gpunb-history'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
