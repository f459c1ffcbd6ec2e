"""A profiled cell's energy and link traffic: one line near the top of the report (the finding:
Wh, average W, J per step and per sample, the idle share, money and CO₂ when the user named a
price), and the details one click away (per GPU, per rank, the steady windows and their spread,
PCIe and NVLink, tokens). Text and HTML from the same rows; every dynamic string escaped.
"""

from __future__ import annotations

from html import escape

from gpunb.analysis.energy.links import CellLinks
from gpunb.analysis.energy.meter import COUNTER, ESTIMATE_NOTE, MARK_EVERY_S, MIN_WINDOW_S, CellEnergy
from gpunb.analysis.energy.tariff import Tariff, session_tariff
from gpunb.analysis.profile.cell_energy import steady_from
from gpunb.analysis.profile.link_verdict import nvlink_words, pcie_words
from gpunb.analysis.profile.records import CellProfile
from gpunb.units import seconds
from gpunb.views.chart import DIM


def joules(j: float | None) -> str:
    """3.1 J, 24 mJ, 1.52 kJ, 410 µJ."""
    if j is None:
        return "-"
    a = abs(j)
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ")):
        if a >= scale or scale == 1e-6:
            v = j / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:,.0f} {unit}"
    return f"{j:g} J"


def watt_hours(wh: float) -> str:
    if wh >= 1000:
        return f"{wh / 1000:.3g} kWh"
    return f"{wh:.3g} Wh" if wh >= 0.001 else f"{wh * 1000:.3g} mWh"


def _rate(per: float) -> str:
    return f"{per:,.0f}" if per >= 100 else f"{per:.3g}"


def price_words(e: CellEnergy, tariff: Tariff) -> str:
    """"€0.0001, 0.15 g CO₂" for the cell's Wh; "" when the user named no price nor carbon."""
    if tariff.empty:
        return ""
    parts = []
    cost = tariff.cost(e.wh)
    if cost is not None:  # a short cell costs fractions of a cent: "under €0.0001", not "€0.0000"
        if cost >= 0.0001:
            parts.append(tariff.spent_words(e.wh))
        else:
            symbol = tariff.currency
            parts.append("under " + (f"{symbol}0.0001" if len(symbol) == 1 else f"0.0001 {symbol}".strip()))
    co2 = tariff.co2_g(e.wh)
    if co2 is not None:
        parts.append(f"{co2:.3g} g CO₂" if co2 < 1000 else f"{co2 / 1000:.3g} kg CO₂")
    return ", ".join(parts)


def energy_cell(p: CellProfile) -> str:
    """The history table's energy column: per sample, else per step, else the cell's Wh."""
    e = p.energy
    if e is None:
        return "-"
    if e.sample_joules is not None:
        return f"{joules(e.sample_joules)}/sample"
    if e.step_joules is not None:
        return f"{joules(e.step_joules)}/step"
    return watt_hours(e.wh)


def energy_line(p: CellProfile, tariff: Tariff | None = None) -> str:
    """"Energy 0.42 Wh in 12.0 s, 126 W average: 3.1 J per step, 24 mJ per sample = 41 samples/J,
    18% spent idle"; "" when energy was not asked for."""
    e = p.energy
    if e is None:  # (a cell without a GPU says so in its GPU row already)
        return f"Energy not measured: {p.energy_absent}" if p.energy_absent and p.gpu is not None else ""
    on = f" on {len(e.gpus)} GPUs" if len(e.gpus) > 1 else ""
    line = f"Energy {watt_hours(e.wh)}{on} in {seconds(e.seconds)}"
    if e.average_w is not None:
        line += f", {e.average_w:.0f} W average"
    figures = []
    if e.step_joules is not None:
        figures.append(f"{joules(e.step_joules)} per step")
    if e.sample_joules is not None and e.samples_per_joule is not None:
        figures.append(f"{joules(e.sample_joules)} per sample = {_rate(e.samples_per_joule)} samples/J")
    if e.tokens_per_joule is not None:
        figures.append(f"{_rate(e.tokens_per_joule)} tokens/J")
    if e.idle_share is not None:
        figures.append(f"{100 * e.idle_share:.0f}% spent idle")
    if figures:
        line += ": " + ", ".join(figures)
    money = price_words(e, tariff if tariff is not None else session_tariff())
    if money:
        line += f" · {money}"
    if e.estimated:
        line += " — an estimate from power samples, ~16% low"
    return line


def _gpu_words(e: CellEnergy) -> str:
    return " · ".join(f"GPU {g.index} {joules(g.joules)}, {g.average_w or 0:.0f} W "
                      f"({'energy counter' if g.source == COUNTER else 'estimate from power samples'})"
                      for g in e.gpus)


def _window_words(e: CellEnergy, first: int) -> str:
    if e.step_joules is None:
        return (f"no per-step figure: {e.note}" if "too short" in e.note else
                "no per-step figure: no steady steps were marked (the steps ran in other processes, or too "
                f"few of them: it needs {MIN_WINDOW_S:.0f} s after the warm-up)")
    text = (f"{joules(e.step_joules)} per step over {e.window_steps} steps in {seconds(e.window_s)}, "
            f"from step {first + 1} on")
    windows = e.window_step_joules
    if len(windows) > 1 and e.step_spread is not None:
        text += (f" · {len(windows)} windows of at least {MIN_WINDOW_S:.0f} s: {joules(min(windows))} to "
                 f"{joules(max(windows))} per step, spread {100 * e.step_spread:.1f}%")
        if e.step_time_spread is not None:  # the loop's own unsteadiness, beside the energy's
            text += f" (time per step: {100 * e.step_time_spread:.1f}%)"
    return text


def _rank_words(p: CellProfile) -> str:
    e, part = p.energy, p.ranks
    if e is None or part is None:
        return ""
    by_gpu = {g.index: g for g in e.gpus}
    out = []
    for r in part.ranks:
        g = by_gpu.get(r.nvml_index) if r.nvml_index is not None else None
        if g is None:
            continue
        per_step = f", {joules(g.joules / r.steps)} per step over the whole cell" if r.steps else ""
        out.append(f"{r.name} on GPU {g.index}: {joules(g.joules)}{per_step}")
    return " · ".join(out)


def _link_rows(links: CellLinks) -> list[tuple[str, str]]:
    rows = []
    if links.pcie:
        count = max(x.samples for x in links.pcie)
        pcie = " · ".join(f"GPU {x.index} host→GPU {x.rx_bytes_s / 1e9:.2f} GB/s = {x.rx_bytes / 1e9:.2f} GB, "
                          f"GPU→host {x.tx_bytes_s / 1e9:.2f} GB/s = {x.tx_bytes / 1e9:.2f} GB, "
                          f"highest host→GPU reading {x.peak_rx_bytes_s / 1e9:.2f} GB/s"
                          for x in links.pcie)
        pcie += (f" · sampled: the average of {count} NVML throughput readings, bytes = average × "
                 f"{seconds(links.seconds)}")
        if links.h2d_peak_gbps:
            pcie += f" · peak {links.h2d_peak_gbps:.0f} GB/s from {links.h2d_peak_source}"
        rows.append(("PCIe", pcie))
        said = pcie_words(links)
        if said:
            rows.append(("bus", said))
    if links.nvlink_bytes:
        moved = ", ".join(f"GPU {i} {b / 1e9:.2f} GB" for i, b in sorted(links.nvlink_bytes.items()))
        rows.append(("NVLink", f"{moved} sent + received (NVML's counters) · {nvlink_words(links)}"))
    return rows


def energy_rows(p: CellProfile) -> list[tuple[str, str]]:
    """The details under the energy line, as (heading, text)."""
    e = p.energy
    rows: list[tuple[str, str]] = []
    if e is not None:
        rows.append(("per GPU", _gpu_words(e)))
        ranks = _rank_words(p)
        if ranks:
            rows.append(("per rank", ranks))
        rows.append(("per step", _window_words(e, steady_from(p.steps, p.steps.skipped))))
        st = p.steps
        if st.tokens_per_sample:
            how = "given" if st.tokens_given else "the first batch's token ids"
            t = f"{st.tokens_per_sample:,} tokens per sample ({how})"
            if st.tokens_per_s:
                t += f" · {st.tokens_per_s:,.0f} tokens/s"
            if e.tokens_per_joule:
                t += f" · {_rate(e.tokens_per_joule)} tokens/J"
            rows.append(("tokens", t))
        tariff = session_tariff()
        if not tariff.empty:
            rows.append(("price", f"{price_words(e, tariff)} at {tariff.words()} (%gpuenergy or "
                                  "GPUNB_ENERGY_PRICE / GPUNB_CARBON_INTENSITY)"))
        if e.idle_share is not None:
            rows.append(("idle", f"{100 * e.idle_share:.0f}% of the energy: the time NVML saw no kernel running "
                                 "at the lowest power of the cell (an estimate)"))
        how = (f"NVML's energy counter read at the cell's start and end, and at step ends at most every "
               f"{MARK_EVERY_S:g} s in the background")
        if e.estimated:
            how += f"; {ESTIMATE_NOTE}"
        rows.append(("how", how))
        if e.note and "too short" not in e.note and e.note != ESTIMATE_NOTE:
            rows.append(("note", e.note))
    if p.links is not None:
        rows += _link_rows(p.links)
    return rows


def energy_text(p: CellProfile) -> list[str]:
    line = energy_line(p)
    if not line:
        return []
    return [f"  {'energy':<11} {line}"] + [f"  {'':<11} {h}: {t}" for h, t in energy_rows(p)]


def energy_html(p: CellProfile) -> str:
    line = energy_line(p)
    if not line:
        return ""
    rows = energy_rows(p)
    if not rows:
        return f"<div class='gpunb-energy'>{escape(line)}</div>"
    th = "text-align:left;padding:2px 1em 2px 0;vertical-align:top;white-space:nowrap"
    body = "".join(f"<tr><th style='{th}'>{escape(h)}</th><td style='text-align:left;padding:2px 0'>"
                   f"{escape(t)}</td></tr>" for h, t in rows)
    return (f"<details class='gpunb-energy' style='margin:2px 0 4px 0'><summary style='cursor:pointer'>"
            f"{escape(line)} <span style='{DIM}'>· per GPU, steps, links</span></summary>"
            f"<table style='border-collapse:collapse;margin:0'>{body}</table></details>")
