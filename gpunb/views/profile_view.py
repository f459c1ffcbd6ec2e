"""Cell profiles as text and HTML, their memory timeline as a chart, the one-line summary,
the history table. Pure functions of the records: every dynamic string is escaped.

A report starts with its conclusion (the verdict and its reason), then says how the wall
time splits into set-up, the training loop and what came after, then the measurements
(one function per section below: ``_rows`` gives the table's rows, ``_advice_*`` the ranked
advice, ``timeline_html`` the chart), so a new kind of measurement adds a row or a section.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from gpunb.analysis.profile.history import compare, variant_sentence
from gpunb.analysis.profile.records import CellProfile, HistoryReport
from gpunb.analysis.steps.plan import COUNTED_STEP
from gpunb.display import register_views
from gpunb.readings.devices import OWN_BY_RESERVE
from gpunb.units import byte_rate, flop_count, flop_rate, milliseconds, seconds
from gpunb.views import chart
from gpunb.views.chart import DIM, SMALL
from gpunb.views.energy_view import energy_cell, energy_html, energy_text, watt_hours
from gpunb.views.leak_view import leak_html, leak_text
from gpunb.views.markup import code_html
from gpunb.views.per_gpu import without_qualifiers
from gpunb.views.ranks_view import ranks_html, ranks_text
from gpunb.views.timeline_view import fmt_bytes, timeline_html

if TYPE_CHECKING:
    from gpunb.analysis.profile.meter import CellLine

# How each verdict is marked: green when the GPU itself is the limit (as it should be).
VERDICT_COLOR = {"compute-bound": chart.GREEN, "none": chart.GREY, "cpu-only": chart.GREY, "multi-process": chart.GREY,
                 "on-cpu": chart.RED,
                 "memory-bound": chart.RED}


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


# -- the conclusion ------------------------------------------------------------------------

def _cell_name(p: CellProfile) -> str:
    return f"In [{p.cell}]" if p.cell is not None else "block"


def headline(p: CellProfile) -> str:
    """The report's first line: the verdict, and whose."""
    v = p.verdict
    if v.kind == "none":
        return f"gpuprofile {_cell_name(p)}: {v.headline or 'not judged'}"
    return f"gpuprofile {_cell_name(p)}: {v.kind} — {v.headline}"


def _identity(p: CellProfile) -> str:
    where = p.gpu.name if p.gpu is not None else "CPU"
    parts = [f"cell {_cell_name(p)}"]
    if p.label:
        parts.append(p.label)
    parts += [where, f"started {p.started}"]
    return " · ".join(parts)


# -- the measurements ----------------------------------------------------------------------

def time_words(p: CellProfile) -> str:
    """The wall time split into set-up, loop and after, so "first step", "loop" and "wall"
    add up in the reader's head."""
    sh = p.shares
    wall = p.wall_s
    if p.steps.count or sh.batches:
        start = sh.loop_start_s or 0.0
        after = max(wall - start - sh.loop_s, 0.0)
        begin = "first batch" if sh.batches else "cell start"
        pieces = []
        if start >= 0.0005:
            pieces.append(f"{seconds(start)} set-up before the loop")
        pieces.append(f"{seconds(sh.loop_s)} loop ({begin} to last optimizer step: the shares under "
                      "'where' are of this)")
        if after >= 0.0005:
            pieces.append(f"{seconds(after)} after it")
        t = f"{seconds(wall)} wall = " + " + ".join(pieces)
    else:
        t = f"wall {seconds(wall)}"
    if p.synced_wall_s is not None:
        t += f" · GPU work done at {seconds(p.synced_wall_s)}"
    if p.gpu_time_s is not None:
        t += f" · GPU clock {seconds(p.gpu_time_s)}"
    return t + f" · CPU {seconds(p.cpu_s)}"


def steps_words(p: CellProfile) -> str:
    st = p.steps
    if not st.count:
        if p.ranks is not None:
            return "none in this process: the worker processes below trained"
        return ("no optimizer.step() seen (steps are found by torch's global optimizer hook, torch >= 2.0; "
                "optimizers outside torch.optim are not seen)")
    s = f"{st.count} optimizer steps"
    if p.optimizers > 1:
        s += f" (of the first of {p.optimizers} optimizers)"
    s += f" · the first ended {milliseconds(st.first_ms)} into the cell (set-up included)"
    if st.median_ms is not None:
        warm = f"; {st.skipped} warm-up step{'s' if st.skipped != 1 else ''} left out" if st.skipped else ""
        s += (f" · then a median {milliseconds(st.median_ms)} per step (p90 {milliseconds(st.p90_ms)}{warm}"
              f"{_excluded_words(p)})")
    if st.steps_per_s:  # the rates are of the mean step (a median hides stalls): said with it
        s += f" · a mean {milliseconds(1000.0 / st.steps_per_s)} per step = {st.steps_per_s:.1f} steps/s"
    if st.samples_per_s:
        s += f" = {st.samples_per_s:,.0f} samples/s at batch {st.batch_size}"
    if st.tokens_per_s:
        s += f" = {st.tokens_per_s:,.0f} tokens/s at {st.tokens_per_sample:,} per sample"
    return s + f" · timed by {st.source}"


def gpu_memory_words(p: CellProfile) -> str:
    g = p.gpu
    assert g is not None
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
    return m


def where_words(p: CellProfile) -> str:
    sh = p.shares
    # shares as "= 40%", not in parentheses: the short rows drop parenthesised asides
    w = [f"data wait {seconds(sh.data_wait_s)} = {_pct(sh.data_wait_s, sh.loop_s)} over {sh.batches} batches"
         if sh.batches else "no DataLoader batches"]
    if sh.sync_n:
        w.append(f"{sh.sync_n} host syncs {seconds(sh.sync_s)} = {_pct(sh.sync_s, sh.loop_s)} "
                 f"({sh.sync_gpu_n} from GPU tensors)")
    else:
        w.append("no host syncs")
    w.append(f"output {seconds(sh.output_s)} = {_pct(sh.output_s, sh.loop_s)} in {sh.output_writes} writes"
             if sh.output_writes else "no output")
    g = p.gpu
    if g is not None:
        w.append(f"GPU util {g.util_mean_pct:.0f}% mean over {g.util_samples} NVML samples"
                 if g.util_mean_pct is not None else "GPU util: no NVML samples")
    return " · ".join(w) + f" — of the {seconds(sh.loop_s)} loop"


def _rows(p: CellProfile) -> list[tuple[str, str]]:
    """(heading, text) rows shared by the text and HTML forms; a new measurement adds a row."""
    rows: list[tuple[str, str]] = [("time", time_words(p)), ("steps", steps_words(p))]
    if p.gpu is not None:
        rows.append(("GPU memory", gpu_memory_words(p)))
    else:
        rows.append(("GPU", f"absent: {p.gpu_absent}"))
    if p.peak_rss_bytes is not None:
        rows.append(("host memory", f"peak RSS {fmt_bytes(p.peak_rss_bytes)}"
                     + ("" if p.peak_rss_is_cell else " (lifetime peak of the process; per-cell peak needs Linux)")))
    rows.append(("where", where_words(p)))
    rows += throughput_rows(p) + ops_rows(p)
    if p.other_thread_steps:
        rows.append(("other threads", f"{p.other_thread_steps} optimizer steps ran in other threads during the "
                                      "cell; not counted as the cell's"))
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

    return " · ".join(f"{name(r.name)} {milliseconds(r.ms_per_step)} = {100 * r.share:.0f}% {r.category}"
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
    # The traced steps are slower than the cell's (the profiler costs +17 % to +190 % a step,
    # op_trace.py) and are left out of its step times: their span is named as theirs.
    text = f"torch.profiler over step{'s' if len(o.steps) > 1 else ''} {_step_list(o.steps)}: {clock} {shares} " \
           f"of {milliseconds(o.window_ms)} per traced step, slowed by the profiler and left out of the step times"
    if o.note:
        text += f" ({o.note})"
    rows = [("ops", text), ("top ops", f"{clock} per traced step: " + _op_list(o.top_ops))]
    if o.top_kernels:
        rows.append(("top kernels", _op_list(o.top_kernels)))
    if o.trace_path:
        rows.append(("trace", f"{o.trace_path} ({fmt_bytes(o.trace_bytes)}; open it in ui.perfetto.dev or "
                              f"chrome://tracing) · summarized in {seconds(o.processing_s)} at the cell's end"))
    return rows


# -- text ----------------------------------------------------------------------------------

def _advice_text(p: CellProfile) -> list[str]:
    lines = []
    for i, a in enumerate(p.advice, 1):
        gain = f" [up to {100 * a.gain:.0f}% of the loop]" if a.gain else ""
        lines.append(f"  {i}. {a.title}{gain}: {a.reason}" + (f"\n       {a.how}" if a.how else ""))
    return lines


def profile_text(p: CellProfile) -> str:
    lines = [headline(p)]
    if p.verdict.reason:
        lines.append(f"  {'why':<11} {p.verdict.reason}")
    lines += leak_text(p.leak)  # memory that grows every step: right under the verdict
    lines.append(f"  {'cell':<11} {_identity(p)}")
    lines += energy_text(p)  # the finding about energy, near the top (views/energy_view.py)
    lines += [f"  {h:<11} {t}" for h, t in _rows(p)]  # in full: a terminal has no click for details
    if p.ranks is not None:  # worker processes of a multi-GPU cell (views/ranks_view.py)
        lines += ranks_text(p.ranks)
    if p.advice:
        lines.append("  what to do")
        lines += _advice_text(p)
    return "\n".join(lines)


# -- HTML ----------------------------------------------------------------------------------

def _verdict_html(p: CellProfile) -> str:
    v = p.verdict
    color = VERDICT_COLOR.get(v.kind, chart.AMBER)
    tag = (f'<span style="display:inline-block;padding:0 6px;border-radius:8px;border:1px solid {color};'
           f'color:{color};font-weight:600;margin-right:6px">'
           f'{escape(v.kind if v.kind != "none" else "no verdict")}</span>')
    head = f'<div style="font-size:14px">{tag}<b>{escape(v.headline or "not judged")}</b></div>'
    reason = f"<div>{code_html(v.reason)}</div>" if v.reason else ""
    who = f'<div style="{SMALL};{DIM};margin:2px 0 6px 0">gpuprofile · {escape(_identity(p))}</div>'
    return head + reason + who


def _table_html(rows: Sequence[tuple[str, str]]) -> str:
    th = "text-align:left;padding:2px 1em 2px 0;vertical-align:top;white-space:nowrap"
    body = "".join(f"<tr><th style='{th}'>{escape(h)}</th><td style='text-align:left;padding:2px 0'>"
                   f"{escape(t)}</td></tr>" for h, t in rows)
    return f"<table style='border-collapse:collapse;margin:0'>{body}</table>"


def _rows_html(p: CellProfile) -> str:
    """One short sentence per row; the rows with their asides (what a share is of, which steps
    were left out and why) one click away."""
    rows = _rows(p)
    short = [(h, without_qualifiers(t)) for h, t in rows]
    html = _table_html(short)
    if short != rows:
        html += (f"<details style='margin:2px 0'><summary style='cursor:pointer;{DIM}'>every row in full</summary>"
                 f"{_table_html(rows)}</details>")
    return html


def _advice_html(p: CellProfile) -> str:
    if not p.advice:
        return ""
    items = "".join(
        f"<li><b>{escape(a.title)}</b>" + (f" (up to {100 * a.gain:.0f}% of the loop)" if a.gain else "")
        + f": {code_html(a.reason)}" + (f"<br><code>{escape(a.how)}</code>" if a.how else "") + "</li>"
        for a in p.advice)
    return f"<div style='margin-top:6px'><b>What to do</b><ol style='margin:2px 0'>{items}</ol></div>"


# The loop's parts in the time bar: (name, colour). "compute" is what the other three leave.
TIME_PARTS = (("data wait", chart.ORANGE), ("host syncs", chart.PINK), ("output", chart.PURPLE),
              ("compute", chart.BLUE))


def time_parts(p: CellProfile) -> list[tuple[str, float, float]]:
    """(part, seconds, share) of the loop: data wait, host syncs, output and the rest (compute).
    The shares are of one whole and add up to 1 (when the measured parts overlap, e.g. printing a
    tensor is output and a sync, they are of their own sum instead of the loop)."""
    sh = p.shares
    measured = [sh.data_wait_s, sh.sync_s, sh.output_s]
    whole = max(sh.loop_s, sum(measured))
    if whole <= 0:
        return []
    seconds_ = [*measured, whole - sum(measured)]
    return [(name, t, t / whole) for (name, _), t in zip(TIME_PARTS, seconds_, strict=True)]


def time_bar_html(p: CellProfile) -> str:
    """One stacked bar of the loop (plain HTML, no SVG: it survives an untrusted notebook) and
    its legend with seconds and shares."""
    parts = time_parts(p)
    if not parts:
        return ""
    colors = dict(TIME_PARTS)
    segments = "".join(f"<div class='gpunb-time-part' title='{escape(name)} {seconds(t)} = {share:.0%}' "
                       f"style='width:{100 * share:.3f}%;"
                       f"background:{colors[name]}'></div>" for name, t, share in parts if share > 0)
    legend = " · ".join(f"{chart.swatch(colors[name])} {escape(name)} {seconds(t)} = {share:.0%}"
                        for name, t, share in parts if t > 0 or name == "compute")
    return (f"<div class='gpunb-time-bar' style='margin:4px 0 2px 0;max-width:640px'>"
            f"<div style='{SMALL};{DIM}'>where the {escape(seconds(p.shares.loop_s))} loop went</div>"
            f"<div style='display:flex;height:12px;border-radius:3px;overflow:hidden;"
            f"background:rgba(140,149,159,0.25)'>{segments}</div>"
            f"<div class='gpunb-time-legend' style='{SMALL};margin-top:2px'>{legend}</div></div>")


def big_numbers(p: CellProfile) -> list[tuple[str, str]]:
    """At most three (value, what it is) for the head of the report: wall time, the median step,
    the peak memory of the device that trained."""
    out = [(seconds(p.wall_s), "wall")]
    if p.steps.median_ms is not None:
        out.append((milliseconds(p.steps.median_ms), "median step"))
    if p.gpu is not None and p.gpu.peak_allocated_bytes is not None:
        out.append((fmt_bytes(p.gpu.peak_allocated_bytes), "peak VRAM, torch"))
    elif p.peak_rss_bytes is not None:
        out.append((fmt_bytes(p.peak_rss_bytes), "peak RAM"))
    return out[:3]


def _numbers_html(p: CellProfile) -> str:
    cells = "".join(f"<div style='margin-right:18px'><b style='font-size:16px'>{escape(v)}</b> "
                    f"<span style='{DIM}'>{escape(what)}</span></div>" for v, what in big_numbers(p))
    return f"<div class='gpunb-numbers' style='display:flex;flex-wrap:wrap;align-items:baseline'>{cells}</div>"


def profile_html(p: CellProfile) -> str:
    """The finding (verdict) first, then one stacked bar of where the loop's time went and at most
    three big numbers, the advice; every measured row, the energy, the ranks and the memory
    timeline one click away."""
    ranks = ranks_html(p.ranks) if p.ranks is not None else ""
    details = (f"<details class='gpunb-profile-rows' style='margin:4px 0'><summary style='cursor:pointer'>"
               f"every measurement</summary>{energy_html(p)}{_rows_html(p)}{ranks}{timeline_html(p)}</details>")
    return (f"<div class='gpunb-profile' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px'>"
            f"{_verdict_html(p)}{leak_html(p.leak)}{_numbers_html(p)}{time_bar_html(p)}"
            f"{_advice_html(p)}{details}</div>")


# -- one line per cell ---------------------------------------------------------------------

def one_line_text(line: CellLine) -> str:
    parts = [seconds(line.wall_s)]
    if line.synced_wall_s is not None and line.synced_wall_s - line.wall_s > 0.0005:
        parts[0] += f" (GPU done at {seconds(line.synced_wall_s)})"
    if line.peak_vram_bytes is not None:
        parts.append(f"peak VRAM {fmt_bytes(line.peak_vram_bytes)}")
    elif line.gpu_note:
        parts.append(line.gpu_note)
    if line.util_pct is not None:
        parts.append(f"GPU util {line.util_pct:.0f}%")
    if line.energy_j is not None:
        watts = line.energy_j / line.synced_wall_s if line.synced_wall_s else None
        parts.append(watt_hours(line.energy_j / 3600.0) + (f" at {watts:,.0f} W" if watts else ""))
    if line.peak_rss_bytes is not None:
        parts.append(f"peak RSS {fmt_bytes(line.peak_rss_bytes)}")
    who = f" In [{line.cell}]" if line.cell is not None else ""
    return f"gpuprofile{who}: " + " · ".join(parts)


# -- history -----------------------------------------------------------------------------

HISTORY_HEADER = ["#", "cell", "label", "wall", "median step", "steps", "peak mem", "energy", "verdict", "compared"]


def _history_row(i: int, p: Any, previous: Any | None, j: int | None) -> list[str]:
    """One row; ``previous`` is the earlier run of the same cell (entry ``j``), if any."""
    versus = compare(previous, p).words() if previous is not None else ""
    against = f"vs #{(j or 0) + 1}: {versus}" if versus else ""
    cell = f"[{p.cell}]" if p.cell is not None else "api"
    if getattr(p, "steps", None) is None:  # a cell of the one-line mode: timed, not judged
        peak = p.peak_vram_bytes if p.peak_vram_bytes is not None else p.peak_rss_bytes
        used = watt_hours(p.energy_j / 3600.0) if getattr(p, "energy_j", None) is not None else "-"
        return [str(i + 1), cell, p.label or "", seconds(p.wall_s), "-", "-", fmt_bytes(peak), used, "one-line",
                against]
    peak = p.gpu.peak_allocated_bytes if p.gpu is not None else p.peak_rss_bytes
    return [str(i + 1), cell, p.label or "", seconds(p.wall_s), milliseconds(p.steps.median_ms),
            str(p.steps.count), fmt_bytes(peak), energy_cell(p), p.verdict.kind, against]


def history_rows(entries: Sequence[Any], baselines: Sequence[int | None] = ()) -> list[list[str]]:
    """The table's rows; each cell is compared only with ``baselines[i]``, the earlier run of
    the same cell (same label or same code), never with whatever ran before it."""
    def base(i: int) -> int | None:
        return baselines[i] if i < len(baselines) else None

    return [_history_row(i, p, entries[b] if (b := base(i)) is not None else None, base(i))
            for i, p in enumerate(entries)]


def _history_head(entries: Sequence[Any], baselines: Sequence[int | None], versus: str = "") -> str:
    head = f"gpuprofile history: {len(entries)} cell{'s' if len(entries) != 1 else ''}"
    if versus:  # the variants the user named, each against the baseline, in one sentence each
        sentences = [variant_sentence(entries[b], p, b, i) for i, (p, b) in enumerate(zip(entries, baselines))
                     if b is not None]
        return head + f' against "{versus}": ' + (" ".join(sentences) or "no other cell to compare with.")
    last = baselines[len(entries) - 1] if len(baselines) >= len(entries) else None
    if last is not None:
        words = compare(entries[last], entries[-1]).words()
        head += f"; the last against its earlier run #{last + 1}: {words or 'nothing comparable'}"
    elif len(entries) > 1:
        head += ("; the last cell has no earlier run to compare with (same label or same code; "
                 "`--vs LABEL` compares every cell with the run so labelled)")
    return head


def history_text(entries: Sequence[Any], baselines: Sequence[int | None] = (), versus: str = "") -> str:
    if not entries:
        return ("gpuprofile history: no profiled cells yet (run a cell with %%gpuprofile, or "
                "%gpuprofile on for a line after every cell)")
    rows = [HISTORY_HEADER, *history_rows(entries, baselines)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HISTORY_HEADER))]
    head = _history_head(entries, baselines, versus)
    return head + "\n" + "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def history_html(entries: Sequence[Any], baselines: Sequence[int | None] = (), versus: str = "") -> str:
    if not entries:
        return f"<p>{escape(history_text(entries))}</p>"
    cell = "text-align:left;padding:2px 8px;vertical-align:top"
    # the comparison keeps a readable width in a narrow window; the table scrolls instead
    widths = {"label": "min-width:8em", "compared": "min-width:14em"}
    head = "".join(f"<th style='{cell};{widths.get(h, 'white-space:nowrap')}'>{escape(h)}</th>"
                   for h in HISTORY_HEADER)
    body = "".join("<tr>" + "".join(
        f"<td style='{cell};{'' if h in widths else 'white-space:nowrap'}'>{escape(c)}</td>"
        for h, c in zip(HISTORY_HEADER, r)) + "</tr>" for r in history_rows(entries, baselines))
    return (f"<div><b>{escape(_history_head(entries, baselines, versus))}</b></div><div style='overflow-x:auto'>"
            f"<table class='gpunb-history' style='border-collapse:collapse'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


# How the records show (gpunb.display looks these up; the records never import a view).
register_views(CellProfile, {"text/plain": profile_text, "text/html": profile_html})
register_views(HistoryReport, {"text/plain": lambda r: history_text(r.entries, r.baselines, r.versus),
                               "text/html": lambda r: history_html(r.entries, r.baselines, r.versus)})
