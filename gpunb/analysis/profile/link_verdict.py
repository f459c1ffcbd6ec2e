"""The links in the verdict: an input-bound cell says how busy PCIe was (so the user knows
whether the input pipeline or the bus is the limit), a multi-GPU cell how busy NVLink was.

The PCIe figure is sampled (``analysis/energy/links.py``) and measured against what
``%gpucheck``'s pinned copy reached on this GPU, else the link's datasheet rate. Under
``BUS_SHARE`` of it the bus had room to spare; from ``BUS_BUSY`` on the bus itself is named.
"""

from __future__ import annotations

import dataclasses
import re

from gpunb.analysis.energy.links import CellLinks
from gpunb.analysis.profile.records import Verdict

BUS_SHARE = 0.5
BUS_BUSY = 0.8
_PER_DIRECTION = re.compile(r"(\d+(?:\.\d+)?) GB/s per direction")  # ranks/summary.py's link words


def nvlink_peak_gbps(link_words: str) -> float | None:
    """Both directions of the weakest pair's NVLink, GB/s, from the ranks' link description
    ("NVLink × 18 through NVSwitch, 478 GB/s per direction"); None when it names no rate."""
    m = _PER_DIRECTION.search(link_words or "") if "NVLink" in (link_words or "") else None
    return 2 * float(m[1]) if m else None


def pcie_words(links: CellLinks | None) -> str:
    """"host→GPU 11 GB/s of the 53 GB/s %gpucheck measured: the input pipeline, not the bus, is
    the limit"; "" without a PCIe reading or a peak."""
    if links is None or links.rx_gbps is None or not links.h2d_peak_gbps:
        return ""
    rx, peak = links.rx_gbps, links.h2d_peak_gbps
    rate = f"{rx:.1f}" if rx >= 1 else f"{rx:.2g}"
    said = (f"host→GPU {rate} GB/s of the {peak:.0f} GB/s %gpucheck measured"
            if links.h2d_peak_source.startswith("%gpucheck") else
            f"host→GPU {rate} GB/s of the link's {peak:.0f} GB/s datasheet rate")
    share = rx / peak
    if share < BUS_SHARE:
        return f"{said}: the input pipeline, not the bus, is the limit"
    if share >= BUS_BUSY:
        return f"{said}: the bus itself is near its limit"
    return said


def nvlink_words(links: CellLinks | None) -> str:
    """"NVLink 41 of 956 GB/s (sent + received, busiest GPU, cell average)"; "" without counts."""
    gbps = links.nvlink_gbps if links is not None else None
    if gbps is None or links is None:
        return ""
    of = f" of {links.nvlink_peak_gbps:.0f}" if links.nvlink_peak_gbps else ""
    return f"NVLink {gbps:.1f}{of} GB/s (sent + received, busiest GPU, cell average)"


def with_links(verdict: Verdict, links: CellLinks | None) -> Verdict:
    """The verdict with its link's traffic in the reason, when the verdict is about that link."""
    words = ""
    if verdict.kind == "input-bound":
        words = pcie_words(links)
    elif verdict.kind == "multi-gpu":
        words = nvlink_words(links)
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; {words}") if words else verdict
