"""How the GPUs are joined: NVLink per GPU, and per pair the PCIe path and peer access.

All from NVML, none from CUDA (the kernel stays fork-safe). Per GPU: the NVLink link count
(field ``NVLINK_LINK_COUNT``), each link's state, version and speed in one batched field-value
query (``NVLINK_GET_STATE`` / ``NVLINK_GET_VERSION`` / ``NVLINK_GET_SPEED`` with the link as
scope), and what is at the other end of each active link (a GPU's PCI bus id, or an NVSwitch).
Per pair: NVML's peer-to-peer status (read, write, over NVLink, atomics) and the closest PCIe
ancestor (the ``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` of ``nvidia-smi topo -m``).

Recorded on two H200s (benchmarks/results/h200x2_record.json): 18 active NVLink 4 links per GPU,
each to an NVSwitch, 26 562 MB/s per link; P2P read/write/nvlink/atomics OK; common ancestor
HOSTBRIDGE. These are static facts: read them for a check, never per sampler tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunb.readings.nvml import NOT_SUPPORTED, NvmlSession, Unavailable, is_available

# nvml.h field ids (nvmlFieldValue_t); spelt out so that the fake and old bindings agree.
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB of payload sent over all links, a running counter
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_NVLINK_GET_SPEED = 164  # MB/s of one link, one direction (scope: the link)
FI_NVLINK_GET_STATE = 165
FI_NVLINK_GET_VERSION = 166
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvidia-ml-py 13
# NVML time budgets (readings/nvml.py): the whole link map of a check, one GPU's NVLink counters
LINKS_BUDGET_S = 2.0
COUNTERS_BUDGET_S = 0.5

# nvmlDeviceGetP2PStatus's p2pIndex values, nvml.h nvmlGpuP2PCapsIndex_t (pynvml's READ constant
# is the tuple (0,), a trailing-comma slip, so the numbers are written here).
P2P_INDEX = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
# nvmlGpuP2PStatus_t, in words
P2P_STATUS = {
    0: "ok",
    1: "not supported by the chipset",
    2: "not supported by the GPU",
    3: "not supported for this PCIe topology",
    4: "disabled in the driver's settings",
    5: "not supported",
    6: "unknown",
}
# nvmlGpuTopologyLevel_t -> (nvidia-smi topo -m's name, words)
TOPOLOGY = {
    0: ("SELF", "the same board"),
    10: ("PIX", "through one PCIe switch"),
    20: ("PXB", "through several PCIe switches, not the CPU"),
    30: ("PHB", "through a PCIe host bridge (the CPU)"),
    40: ("NODE", "across PCIe host bridges within one NUMA node"),
    50: ("SYS", "across the link between CPU sockets (QPI/UPI)"),
}
# nvmlNvLinkVersion_t -> the NVLink generation NVIDIA names
NVLINK_VERSION = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
# nvmlIntNvLinkDeviceType_t
REMOTE_KIND = {0: "gpu", 1: "cpu", 2: "switch"}


def bus_key(bus_id: Any) -> str:
    """A PCI bus id in one spelling: NVML writes an 8-digit domain ("00000000:07:00.0"),
    other places 4 digits; the NVSwitch's remote id "FFFFFFFF:FF:FF.0" stays itself."""
    text = str(bus_id).strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{int(domain, 16) & 0xFFFF:04x}:{rest}" if all(c in "0123456789abcdef" for c in domain) else text


@dataclass(frozen=True)
class NvLinkPort:
    """One NVLink link of a GPU."""

    link: int
    active: bool
    version: Any  # NVML's version number (6 = NVLink 4.0); Unavailable when not said
    remote_kind: str  # "gpu", "switch", "cpu" or "unknown"
    remote_bus_id: str | None  # the GPU at the other end (None for a switch or when unknown)


@dataclass(frozen=True)
class GpuLinks:
    """A GPU's NVLink links as NVML reports them; ``note`` says why they are unknown."""

    index: int
    bus_id: Any
    link_count: int  # 0: no NVLink (or NVML cannot tell, see ``note``)
    ports: tuple[NvLinkPort, ...] = ()
    link_speed_mbps: int | None = None  # one link, one direction
    note: str = ""

    @property
    def active(self) -> tuple[NvLinkPort, ...]:
        return tuple(p for p in self.ports if p.active)

    @property
    def version(self) -> Any:
        versions = {p.version for p in self.active if is_available(p.version)}
        return versions.pop() if len(versions) == 1 else None


@dataclass(frozen=True)
class PairLink:
    """How two GPUs (NVML indices ``a`` < ``b``) reach each other."""

    a: int
    b: int
    nvlinks: int  # active links joining them (direct, or each side's links into NVSwitches)
    via_switch: bool
    nvlink_gbps: float | None  # one direction, nvlinks x per-link speed; None without NVLink
    topology: Any  # NVML's common-ancestor level (int) or Unavailable
    p2p: dict[str, Any] = field(default_factory=dict)  # "read"/"write"/"nvlink"/"atomics" -> status int or Unavailable

    @property
    def topology_name(self) -> str:
        return TOPOLOGY.get(self.topology, ("?", ""))[0] if is_available(self.topology) else "?"

    @property
    def topology_words(self) -> str:
        return TOPOLOGY.get(self.topology, ("", "an unknown PCIe path"))[1] if is_available(self.topology) \
            else f"PCIe path unknown ({self.topology.reason})"

    def p2p_ok(self, kind: str = "read") -> bool | None:
        status = self.p2p.get(kind)
        return None if status is None or not is_available(status) else status == 0

    def p2p_words(self, kind: str = "read") -> str:
        status = self.p2p.get(kind)
        if status is None:
            return "not read"
        return P2P_STATUS.get(status, f"status {status}") if is_available(status) else str(status)


@dataclass(frozen=True)
class LinkMap:
    gpus: tuple[GpuLinks, ...]
    pairs: tuple[PairLink, ...]

    def gpu(self, index: int) -> GpuLinks | None:
        return next((g for g in self.gpus if g.index == index), None)

    def pair(self, a: int, b: int) -> PairLink | None:
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if (p.a, p.b) == (lo, hi)), None)


def field_values(nvml: NvmlSession, index: int, ids: Sequence[Any]) -> list[Any]:
    """``nvmlDeviceGetFieldValues`` in one driver call: each id (an int, or a (field, scope)
    pair) gives its value or an :class:`Unavailable` with NVML's reason for that field."""
    got = nvml.device_query(index, "nvmlDeviceGetFieldValues", list(ids))
    if is_available(got) and len(got) != len(ids):  # the shape is checked in nvml_values; the count here
        got = Unavailable(f"NVML returned {len(got)} field values for {len(ids)} fields asked")
    if not is_available(got):
        return [got] * len(ids)
    out = []
    for v in got:
        if v.nvmlReturn != 0:
            out.append(Unavailable("not supported on this GPU/driver" if v.nvmlReturn == NOT_SUPPORTED
                                   else f"NVML error {v.nvmlReturn}", v.nvmlReturn))
            continue
        kind = int(v.valueType)
        out.append({0: v.value.dVal, 1: v.value.uiVal, 2: v.value.ulVal, 3: v.value.ullVal,
                    4: v.value.sllVal, 5: v.value.siVal, 6: v.value.usVal}.get(kind, v.value.ullVal))
    return out


def _decode(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def read_gpu_links(nvml: NvmlSession, index: int, bus_id: Any = None) -> GpuLinks:
    """GPU ``index``'s NVLink links (a handful of driver calls: two batched field reads, then
    two per active link to see what is at its other end)."""
    (count,) = field_values(nvml, index, [FI_NVLINK_LINK_COUNT])
    if not is_available(count):
        # Older drivers lack the field: ask link 0 directly; NOT_SUPPORTED there means no NVLink.
        state = nvml.device_query(index, "nvmlDeviceGetNvLinkState", 0)
        if not is_available(state):
            note = "" if state.code == NOT_SUPPORTED else f"NVLink state unknown ({state.reason})"
            return GpuLinks(index, bus_id, 0, note=note)
        count = MAX_LINKS
    count = int(count)
    if count == 0:
        return GpuLinks(index, bus_id, 0)
    ids = [(FI_NVLINK_GET_STATE, link) for link in range(count)] + \
          [(FI_NVLINK_GET_VERSION, link) for link in range(count)] + [(FI_NVLINK_GET_SPEED, 0)]
    values = field_values(nvml, index, ids)
    states, versions, speed = values[:count], values[count:2 * count], values[-1]
    ports = []
    for link in range(count):
        state = states[link]
        if not is_available(state):  # the batched field is missing: one call for this link
            state = nvml.device_query(index, "nvmlDeviceGetNvLinkState", link)
            if not is_available(state):
                if count == MAX_LINKS:  # probing without a link count: the first refusal ends the list
                    break
                ports.append(NvLinkPort(link, False, state, "unknown", None))
                continue
        version = versions[link] if is_available(versions[link]) else \
            nvml.device_query(index, "nvmlDeviceGetNvLinkVersion", link)
        active = bool(state)
        kind, remote = "unknown", None
        if active:
            code = nvml.device_query(index, "nvmlDeviceGetNvLinkRemoteDeviceType", link)
            kind = REMOTE_KIND.get(code, "unknown") if is_available(code) else "unknown"
            if kind != "switch":
                pci = nvml.device_query(index, "nvmlDeviceGetNvLinkRemotePciInfo", link)
                remote = bus_key(_decode(pci.busId)) if is_available(pci) else None
                kind = "gpu" if kind == "unknown" and remote else kind
        ports.append(NvLinkPort(link, active, version, kind, remote))
    return GpuLinks(index, bus_id, len(ports), tuple(ports),
                    int(speed) if is_available(speed) and speed else None)


def _pair(nvml: NvmlSession, a: GpuLinks, b: GpuLinks) -> PairLink:
    direct = [p for p in a.active if p.remote_kind == "gpu" and p.remote_bus_id == bus_key(b.bus_id)]
    a_switch = [p for p in a.active if p.remote_kind == "switch"]
    b_switch = [p for p in b.active if p.remote_kind == "switch"]
    if direct:
        links, via_switch = len(direct), False
    elif a_switch and b_switch:  # both reach the same NVSwitch fabric: the thinner side limits
        links, via_switch = min(len(a_switch), len(b_switch)), True
    else:
        links, via_switch = 0, False
    speeds = [s for s in (a.link_speed_mbps, b.link_speed_mbps) if s]
    gbps = links * min(speeds) / 1000.0 if links and speeds else None
    ha, hb = nvml.handle(a.index), nvml.handle(b.index)
    if not is_available(ha) or not is_available(hb):
        lost = ha if not is_available(ha) else hb
        return PairLink(a.index, b.index, links, via_switch, gbps, lost, {k: lost for k in P2P_INDEX})
    p2p = {kind: nvml.query("nvmlDeviceGetP2PStatus", ha, hb, idx) for kind, idx in P2P_INDEX.items()}
    topology = nvml.query("nvmlDeviceGetTopologyCommonAncestor", ha, hb)
    return PairLink(a.index, b.index, links, via_switch, gbps, topology, p2p)


def read_link_map(nvml: NvmlSession, gpus: Sequence[Any], budget_s: float = LINKS_BUDGET_S) -> LinkMap:
    """Links of ``gpus`` (records with ``index`` and ``pci_bus_id``, as ``GpuInfo``) and of every
    pair of them. Lost GPUs are left out. All reads share ``budget_s`` (a slow or hung NVML
    leaves the rest ``Unavailable``, see readings/nvml.py)."""
    with nvml.budget(budget_s, "the links between GPUs"):
        found = tuple(read_gpu_links(nvml, g.index, g.pci_bus_id) for g in gpus if not getattr(g, "lost", False))
        pairs = tuple(_pair(nvml, x, y) for i, x in enumerate(found) for y in found[i + 1:])
    return LinkMap(found, pairs)


def read_nvlink_traffic(nvml: NvmlSession, index: int) -> tuple[int, int] | None:
    """NVLink payload bytes sent and received by GPU ``index`` so far (NVML's running KiB
    counters); None where NVML does not count them (no NVLink, older drivers)."""
    with nvml.budget(COUNTERS_BUDGET_S, "the NVLink counters"):
        tx, rx = field_values(nvml, index, [FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX])
    if not is_available(tx) or not is_available(rx):
        return None
    return int(tx) * 1024, int(rx) * 1024


def read_nvlink_link_bytes(nvml: NvmlSession, index: int, links: Sequence[int]) -> tuple[int, int] | Unavailable:
    """NVLink payload bytes (sent, received) so far by GPU ``index``, summed over ``links`` (its
    active links): NVML's per-link running KiB counters (field 138/139 with the link as scope, as
    nvml.h says), all in one driver call. Unavailable where NVML does not count them (no NVLink,
    older drivers) or a link's counter is missing: a sum over some links only would read low."""
    if not links:
        return Unavailable("no active NVLink link", NOT_SUPPORTED)
    ids = [(FI_NVLINK_THROUGHPUT_DATA_TX, link) for link in links] + \
          [(FI_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
    values = field_values(nvml, index, ids)
    missing = [v for v in values if isinstance(v, Unavailable)]
    if missing:
        return missing[0]
    n = len(links)
    return sum(int(v) for v in values[:n]) * 1024, sum(int(v) for v in values[n:]) * 1024
