"""What energy costs, only when the user says so: a price per kWh and a carbon intensity.

gpunb never guesses a region's price or grid mix. The user names them (``%gpuenergy --price
0.25/kWh --carbon 350g/kWh``) or sets ``GPUNB_ENERGY_PRICE`` / ``GPUNB_CARBON_INTENSITY``;
without them energy is shown in Wh and J only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

PRICE_ENV = "GPUNB_ENERGY_PRICE"
CARBON_ENV = "GPUNB_CARBON_INTENSITY"
_PRICE = re.compile(r"^\s*(?P<pre>[^\d\s./-]{0,3})\s*(?P<amount>\d+(?:\.\d+)?)\s*(?P<post>[A-Za-z€$£¥]{0,3})\s*"
                    r"(?:/\s*(?P<unit>kWh|MWh|Wh))?\s*$", re.IGNORECASE)
_CARBON = re.compile(r"^\s*(?P<amount>\d+(?:\.\d+)?)\s*(?P<mass>g|kg)?\s*(?:CO2e?|CO₂e?)?\s*"
                     r"(?:/\s*(?P<unit>kWh|MWh))?\s*$", re.IGNORECASE)
_PER_KWH = {"wh": 1000.0, "kwh": 1.0, "mwh": 0.001}


@dataclass(frozen=True)
class Tariff:
    price_per_kwh: float | None = None
    currency: str = ""  # as the user wrote it: "€", "$", "EUR", or ""
    carbon_g_per_kwh: float | None = None

    @property
    def empty(self) -> bool:
        return self.price_per_kwh is None and self.carbon_g_per_kwh is None

    def cost(self, wh: float) -> float | None:
        return None if self.price_per_kwh is None else wh / 1000.0 * self.price_per_kwh

    def cost_words(self, wh: float) -> str:
        cost = self.cost(wh)
        if cost is None:
            return ""
        amount = f"{cost:.4f}" if cost < 0.01 else f"{cost:.2f}"
        symbol = self.currency
        return f"{symbol}{amount}" if len(symbol) == 1 else f"{amount} {symbol}".strip()

    def spent_words(self, wh: float) -> str:
        """What ``wh`` cost, as a figure's part: "€0.0004"; "cost 0.0004" when the price named no
        currency (a bare number beside Wh and CO₂ says nothing)."""
        words = self.cost_words(wh)
        return f"cost {words}" if words and not self.currency else words

    def co2_g(self, wh: float) -> float | None:
        return None if self.carbon_g_per_kwh is None else wh / 1000.0 * self.carbon_g_per_kwh

    def words(self) -> str:
        parts = []
        if self.price_per_kwh is not None:
            parts.append(f"{self.cost_words(1000.0)}/kWh")
        if self.carbon_g_per_kwh is not None:
            parts.append(f"{self.carbon_g_per_kwh:g} g CO₂/kWh")
        return ", ".join(parts)


def parse_price(text: str) -> tuple[float, str]:
    """``"0.25/kWh"``, ``"€0.25/kWh"``, ``"0.25 EUR/kWh"``, ``"0.00025/Wh"`` -> (per kWh, currency)."""
    m = _PRICE.match(text or "")
    if not m:
        raise ValueError(f"--price {text!r} is not a price per energy: write it as 0.25/kWh (€0.25/kWh, "
                         "0.25 EUR/kWh and 0.00025/Wh work too)")
    unit = (m["unit"] or "kWh").lower()
    currency = (m["pre"] or m["post"] or "").strip()
    if currency.lower() in _PER_KWH or currency.lower() in ("j", "kj", "mj"):  # "0.25 kWh": no "/"
        raise ValueError(f"--price {text!r} names an energy ({currency}) where the currency goes: write it as "
                         "0.25/kWh, with the slash")
    return _bounded(float(m["amount"]) * _PER_KWH[unit], MAX_PRICE_PER_KWH, f"--price {text!r}", "per kWh"), currency


# A price or an intensity past these is a typo (the dearest retail power is a few units of any
# currency per kWh; the dirtiest grid ~1,000 g CO2/kWh): refused, never shown as "cost inf".
MAX_PRICE_PER_KWH = 1e6
MAX_CARBON_G_PER_KWH = 1e5


def _bounded(value: float, limit: float, what: str, unit: str) -> float:
    if not math.isfinite(value) or not 0 <= value <= limit:
        raise ValueError(f"{what} is {value:g} {unit}, outside 0 to {limit:g} {unit}: check the number "
                         "(a missing decimal point?)")
    return value


def parse_carbon(text: str) -> float:
    """``"350g/kWh"``, ``"0.35kg/kWh"``, ``"350 gCO2/kWh"`` -> grams of CO₂ per kWh."""
    m = _CARBON.match(text or "")
    if not m:
        raise ValueError(f"--carbon {text!r} is not a carbon intensity: write it as 350g/kWh (grams of CO₂ per "
                         "kWh; your grid operator or electricitymaps.com gives the figure for your region)")
    grams = float(m["amount"]) * (1000.0 if (m["mass"] or "g").lower() == "kg" else 1.0)
    return _bounded(grams * _PER_KWH[(m["unit"] or "kWh").lower()], MAX_CARBON_G_PER_KWH, f"--carbon {text!r}",
                    "g CO2/kWh")


def tariff_from_env(environ: Mapping[str, str]) -> tuple[Tariff, list[str]]:
    """The tariff the environment names, and a note per variable that could not be read."""
    notes = []
    price, currency, carbon = None, "", None
    if environ.get(PRICE_ENV):
        try:
            price, currency = parse_price(environ[PRICE_ENV])
        except ValueError as err:
            notes.append(f"{PRICE_ENV}: {err}")
    if environ.get(CARBON_ENV):
        try:
            carbon = parse_carbon(environ[CARBON_ENV])
        except ValueError as err:
            notes.append(f"{CARBON_ENV}: {err}")
    return Tariff(price, currency, carbon), notes


_SESSION: Tariff | None = None  # what %gpuenergy --price/--carbon set in this kernel


def set_session_tariff(tariff: Tariff | None) -> None:
    """Remember the user's price and carbon for this kernel (``%gpuenergy``); None forgets them."""
    global _SESSION
    _SESSION = tariff


def session_tariff(environ: Mapping[str, str] | None = None) -> Tariff:
    """The tariff every energy figure is priced with: what ``%gpuenergy`` set, else the
    environment's (``GPUNB_ENERGY_PRICE`` / ``GPUNB_CARBON_INTENSITY``), else none (empty)."""
    if _SESSION is not None:
        return _SESSION
    import os

    return tariff_from_env(os.environ if environ is None else environ)[0]


SET_IN_KERNEL = "set with %gpuenergy in this kernel"


def tariff_in_effect(environ: Mapping[str, str] | None = None) -> tuple[Tariff, str, tuple[str, ...]]:
    """(the tariff :func:`session_tariff` prices with, where it came from in words, notes on
    environment variables that could not be read). The source is "" when no tariff is set."""
    if _SESSION is not None:
        return _SESSION, SET_IN_KERNEL, ()
    import os

    env = os.environ if environ is None else environ
    tariff, notes = tariff_from_env(env)
    used = [name for name, value in ((PRICE_ENV, tariff.price_per_kwh), (CARBON_ENV, tariff.carbon_g_per_kwh))
            if value is not None]
    return tariff, ("from the environment: " + ", ".join(used)) if used else "", tuple(notes)
