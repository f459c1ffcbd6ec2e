"""``%gpuenergy``'s report (:class:`~gpunb.analysis.energy.since_load.SessionEnergy`): the energy
first, money and CO₂ only when a tariff is set, the last profiled cell, details one click away."""

from __future__ import annotations

from html import escape

from gpunb.analysis.energy.since_load import SessionEnergy
from gpunb.display import register_views
from gpunb.units import energy as energy_words
from gpunb.views.markup import code_html, dim

HOW = ("Measured with NVML's energy counter (millijoules since the driver loaded): its value now minus its "
       "value after `%load_ext gpunb`, per GPU. The counter moves about 10 times a second on an H200.")
NO_TARIFF = ("No price set, so no money or CO₂: `%gpuenergy --price 0.25/kWh --carbon 350g/kWh` "
             "(or GPUNB_ENERGY_PRICE / GPUNB_CARBON_INTENSITY) uses your own figures.")


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    h, m = divmod(round(s / 60), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def _price_words(r: SessionEnergy, wh: float) -> str:
    parts = []
    if r.tariff.price_per_kwh is not None:
        parts.append(r.tariff.spent_words(wh))
    co2 = r.tariff.co2_g(wh)
    if co2 is not None:
        parts.append(f"{co2:,.1f} g CO₂" if co2 < 1000 else f"{co2 / 1000:,.2f} kg CO₂")
    return ", ".join(parts)


def headline(r: SessionEnergy) -> str:
    if r.problem:
        # the machine's own statement (gpunb.analysis.machine), word for word as every magic says it
        return f"gpunb: {r.problem.strip()} %gpuenergy has nothing to measure."
    if r.just_started:
        return (f"gpunb: counting this kernel's GPU energy from now ({r.since}); run %gpuenergy again after "
                "some work.")
    who = "This kernel's GPU" if len(r.gpus) == 1 else f"This kernel's {len(r.gpus)} GPUs"
    avg = f", {r.average_w:,.0f} W on average" if r.average_w is not None else ""
    money = _price_words(r, r.wh)
    return (f"{who} spent {energy_words(r.joules)} in the {_duration(r.seconds)} {r.since}{avg}"
            + (f": {money}" if money else "") + ".")


def _last_cell(r: SessionEnergy) -> str:
    c = r.last_cell
    if c is None:
        return ""
    parts = [f"{energy_words(c.joules)} in {_duration(c.seconds)}"]
    if c.average_w is not None:
        parts.append(f"{c.average_w:,.0f} W on average")
    if c.sample_joules is not None:
        parts.append(f"{c.sample_joules:.3g} J per sample")
    elif c.step_joules is not None:
        parts.append(f"{c.step_joules:.3g} J per step")
    money = _price_words(r, c.wh)
    if money:
        parts.append(money)
    if c.estimated:
        parts.append("estimated from power samples")
    return f"Last profiled {r.last_cell_name or 'cell'}: {', '.join(parts)}."


def _tariff_line(r: SessionEnergy) -> str:
    if r.tariff.empty:
        return ""
    return f"Priced at {r.tariff.words()}, {r.tariff_source}."


def _detail_lines(r: SessionEnergy) -> list[str]:
    lines = []
    if len(r.gpus) > 1 or r.no_counter:
        for g in r.gpus:
            avg = f", {g.average_w:,.0f} W on average" if g.average_w is not None else ""
            per_gpu = energy_words(g.joules, like=r.joules)  # in the headline's unit
            lines.append(f"GPU {g.index} {g.name}: {per_gpu}{avg}".replace("  ", " "))
        lines += [f"Left out: {why}." for why in r.no_counter]
    if r.tariff.empty:
        lines.append(NO_TARIFF)
    else:
        lines.append("`%gpuenergy --forget` clears a price set in this kernel.")
    lines += [f"Not read: {note}" for note in r.tariff_notes]
    if not r.problem:
        lines.append(HOW)
    return lines


def energy_text(r: SessionEnergy) -> str:
    lines = [headline(r)]
    lines += [x for x in (_last_cell(r), _tariff_line(r)) if x]
    if not r.problem:
        lines += [f"  {x}" for x in _detail_lines(r)]
    return "\n".join(lines)


def energy_html(r: SessionEnergy) -> str:
    body = [f"<div><b>{escape(headline(r))}</b></div>"]
    body += [f"<div>{escape(x)}</div>" for x in (_last_cell(r), _tariff_line(r)) if x]
    if not r.problem:
        items = "".join(f"<li>{code_html(x)}</li>" for x in _detail_lines(r))
        body.append(f"<details><summary>{dim('Per GPU, price and how it is measured')}</summary>"
                    f"<ul style='margin:2px 0'>{items}</ul></details>")
    return f"<div class='gpunb-energy'>{''.join(body)}</div>"


register_views(SessionEnergy, {"text/plain": energy_text, "text/html": energy_html})
