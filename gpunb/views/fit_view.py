"""Text, HTML and the memory chart for ``%gpufit`` (one source, two forms)."""

from __future__ import annotations

import base64
import io
from html import escape
from typing import Any

from gpunb.analysis.fit.records import BatchFit
from gpunb.display import register_views
from gpunb.views import chart
from gpunb.views.memory_tables import GiB, size, table

# -- %gpufit ------------------------------------------------------------------------------------

def fit_headline(f: Any) -> str:
    """The answer: the batch size to use."""
    return f"recommended batch: {f.recommended}"


def fit_basis(f: Any) -> str:
    """The measurement behind the answer, in one sentence."""
    t = f.verified_trial
    if t is None or t.peak_reserved_bytes is None or not f.capacity_bytes:
        return ""
    which = (f"{f.verified} trained" if f.safety and f.verified is not None else "It trained")
    below = (f"; {f.recommended} is {f.safety * 100:.0f} % below it" if f.safety and f.verified is not None else "")
    return (f"{which} {t.steps_done} steps from a fresh start at {size(t.peak_reserved_bytes)} peak reserved of "
            f"{size(f.capacity_bytes)}, {size(f.headroom_bytes)} free{below}.")


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
    return ("  Why below: near the limit fresh processes differ by a sample or two, because the allocator's "
            "layout depends on the exact sizes.")


def fit_text(f: Any) -> str:
    if not f.ok:
        return f"gpunb %gpufit: {f.problem}"
    lines = [f"gpunb %gpufit on {f.device}: {fit_headline(f)}"]
    if fit_basis(f):
        lines.append(f"  {fit_basis(f)}")
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
    """The answer and its basis, the memory chart; the trials' table one click away."""
    if not f.ok:
        return f"<div><b>gpunb %gpufit</b>: {escape(f.problem)}</div>"
    rows = [[str(t.index), str(t.batch), t.purpose, t.verdict, size(t.peak_allocated_bytes),
             size(t.peak_reserved_bytes), f"{t.steps_done}/{t.steps}", f"{t.seconds:.1f} s"] for t in f.trials]
    predicted = (f"Predicted {f.predicted} from the allocated-memory line"
                 + (f", {f.predicted_reserved} from the reserved-memory line" if f.predicted_reserved is not None
                    else "") + ". ") if f.predicted is not None else ""
    head = (f"<div style='font-size:14px'><b>gpunb %gpufit</b> on {escape(f.device)}: "
            f"<b>{escape(fit_headline(f))}</b></div>"
            + (f"<div>{escape(fit_basis(f))}</div>" if fit_basis(f) else ""))
    notes = "".join(f"<div>note: {escape(n)}</div>" for n in f.notes)
    trials = (f"<details style='margin:4px 0'><summary style='cursor:pointer'>{f.trial_count} trials in "
              f"{f.seconds:.1f} s</summary><div>{escape(predicted)}Each trial is a sustained run of {f.steps} steps "
              f"from a fresh start.{(' ' + escape(_why_below(f).strip())) if _why_below(f) else ''}</div>"
              + table(["#", "batch", "why", "result", "peak allocated", "peak reserved", "steps", "time"], rows)
              + "</details>")
    return ("<div class='gpunb-fit' style='font-family:var(--jp-ui-font-family,sans-serif);font-size:13px'>"
            + head + notes + fit_chart_html(f) + trials + "</div>")


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
    # Points of one trial lie close together: the reserved square is largest and drawn first,
    # the allocated dot on it, the before-step triangle hollow on top, so each stays visible.
    ax.scatter([t.batch for t in ok], [(t.peak_reserved_bytes or 0) / GiB for t in ok], marker="s", s=64,
               color=chart.ORANGE, label="peak reserved", zorder=3)
    ax.scatter([t.batch for t in ok], [t.peak_allocated_bytes / GiB for t in ok], color=chart.BLUE, s=22,
               label="peak allocated", zorder=4)
    fb = [t for t in ok if getattr(t, "peak_before_step_bytes", None) is not None]
    if fb:
        ax.scatter([t.batch for t in fb], [t.peak_before_step_bytes / GiB for t in fb], marker="^", s=40,
                   facecolors="none", edgecolors=chart.PURPLE, linewidths=1.2,
                   label="peak before optimizer.step, fitted", zorder=5)
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
    _plain_batch_ticks(ax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size, log scale")
    ax.set_ylabel("GiB")
    if title:
        ax.set_title(f"peak memory over {f.steps} training steps", color=chart.GREY, fontsize=10)
    # beside the plot, not on it: the capacity line and the curve stay clear
    legend = ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    # each entry in its series' colour: those read on light and dark pages alike, a grey did not
    for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=False):
        text.set_color(_handle_color(handle))
    fig.tight_layout()
    return fig


def _plain_batch_ticks(ax: Any) -> None:
    """Batch sizes as numbers people use (1, 2, 5, 10, 20, 50, 100…), not 10¹ and 10²."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _handle_color(handle: Any) -> str:
    """The colour a legend entry is drawn in: a line's colour, a marker's face (its edge when
    hollow); grey when it has none."""
    from matplotlib.colors import to_hex

    try:
        if not hasattr(handle, "get_offsets"):  # a line
            return str(to_hex(handle.get_color()))
        for colors in (handle.get_facecolor(), handle.get_edgecolor()):
            if len(colors) and colors[0][3] > 0:
                return str(to_hex(colors[0]))
    except (AttributeError, TypeError, ValueError, IndexError):
        pass
    return chart.GREY


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
            f"alt='{words}' title='{words}' style='display:block;max-width:100%;height:auto'></div>")


# How the record shows. The memory curve is inside its HTML (a separate image/png would lose
# to the HTML in JupyterLab); ``BatchFit.figure()`` gives it as a matplotlib Figure.
register_views(BatchFit, {"text/plain": fit_text, "text/html": fit_html}, figure=fit_figure)
