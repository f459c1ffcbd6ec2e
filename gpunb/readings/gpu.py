"""GPU readings from NVML as frozen records, units in the field names.

A field NVML cannot give holds an :class:`~gpunb.readings.nvml.Unavailable` (falsy) with
the reason, so views can print ``n/a (not supported on this GPU/driver)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpunb.readings.nvml import HUNG_FIX, TIMEOUT, NvmlSession, NvmlStatus, Unavailable, is_available

# Clock-event ("throttle") reason bits, nvml.h ``nvmlClocksEventReason*``; words are ours.
CLOCK_EVENT_REASONS: tuple[tuple[int, str, str], ...] = (
    (0x1, "idle", "GPU idle: clocks are low because nothing runs"),
    (0x2, "app clocks", "application clock setting caps the clocks"),
    (0x4, "power cap", "software power cap: the board draws its power limit"),
    (0x8, "hw slowdown", "hardware slowdown (thermal or power brake): clocks cut hard"),
    (0x10, "sync boost", "sync boost: held to the slowest GPU of its group"),
    (0x20, "sw thermal", "software thermal slowdown: GPU or memory too hot"),
    (0x40, "hw thermal", "hardware thermal slowdown: GPU too hot"),
    (0x80, "power brake", "hardware power brake: external power-brake signal"),
    (0x100, "display clocks", "display clock setting"),
)
# Reasons that mean the GPU runs slower than it could while working.
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80


def clock_event_names(mask: int) -> list[str]:
    return [short for bit, short, _ in CLOCK_EVENT_REASONS if mask & bit]


def clock_event_explanations(mask: int) -> list[str]:
    return [words for bit, _, words in CLOCK_EVENT_REASONS if mask & bit]


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    memory_total_bytes: Any


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while a GPU runs (read once per check)."""

    index: int
    name: Any
    uuid: Any
    pci_bus_id: Any
    memory_total_bytes: Any
    compute_capability: Any  # (major, minor)
    power_limit_w: Any
    max_sm_clock_mhz: Any
    pcie_gen_max: Any
    pcie_width_max: Any
    temp_slowdown_c: Any
    temp_shutdown_c: Any
    persistence_mode: Any  # bool
    compute_mode: Any  # "default" | "exclusive-process" | "prohibited"
    mig_enabled: Any  # bool
    ecc_enabled: Any  # bool
    ecc_uncorrected_volatile: Any  # count since last driver load
    mig_devices: tuple[MigDevice, ...] = ()
    lost: bool = False


@dataclass(frozen=True)
class GpuSample:
    """One reading of the values that move, at ``t_s`` on the session clock."""

    index: int
    t_s: float
    memory_used_bytes: Any
    memory_free_bytes: Any
    memory_total_bytes: Any
    util_gpu_pct: Any
    util_memory_pct: Any
    power_w: Any
    temp_c: Any
    sm_clock_mhz: Any
    mem_clock_mhz: Any
    clock_event_reasons: Any  # bitmask, see CLOCK_EVENT_REASONS
    pcie_gen: Any
    pcie_width: Any
    lost: bool = False


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: Any  # None/Unavailable where the driver does not say (MIG, WDDM)
    name: str = ""


@dataclass(frozen=True)
class DriverInfo:
    nvml: Any  # NvmlStatus
    driver_version: Any
    cuda_driver_version: Any  # "13.0": the newest CUDA runtime this driver supports
    gpu_count: int


_COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}


def _w(milliwatts: Any) -> Any:
    return milliwatts / 1000.0 if is_available(milliwatts) else milliwatts


def _first(pair: Any) -> Any:
    """NVML returns (current, pending) pairs for modes; keep the current one."""
    if isinstance(pair, (tuple, list)):
        return pair[0]
    return pair


def read_driver(nvml: NvmlSession) -> DriverInfo:
    status = nvml.start()
    count: Any = nvml.query("nvmlDeviceGetCount") if status.ok else 0
    if status.ok and not is_available(count):  # NVML runs but cannot count the GPUs (a timeout, a lost bus)
        status = NvmlStatus(False, f"NVML started but could not count the GPUs: {count.reason}.",
                            "Run `nvidia-smi`; if it hangs or fails too, the driver needs attention "
                            "(`dmesg` shows Xid errors). gpunb asks again next time.", count.code)
    if not status.ok:
        reason = Unavailable(status.cause, status.code)
        return DriverInfo(status, reason, reason, 0)
    cuda = nvml.query("nvmlSystemGetCudaDriverVersion")
    if is_available(cuda):
        cuda = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    return DriverInfo(status, nvml.query("nvmlSystemGetDriverVersion"), cuda, count)


def unread_driver(reason: str) -> DriverInfo:
    """The driver facts when NVML did not answer at all in time."""
    status = NvmlStatus(False, f"NVML did not answer: {reason}.", HUNG_FIX, TIMEOUT)
    gap = Unavailable(status.cause, TIMEOUT)
    return DriverInfo(status, gap, gap, 0)


def _is_lost(value: Any) -> bool:
    return isinstance(value, Unavailable) and value.code == 15


def read_mig_devices(nvml: NvmlSession, index: int) -> tuple[MigDevice, ...]:
    """The MIG instances of GPU ``index`` (empty when MIG is off or NVML cannot list them)."""
    parent = nvml.handle(index)
    count = nvml.query("nvmlDeviceGetMaxMigDeviceCount", parent)
    if not is_available(count):
        return ()
    found = []
    for slot in range(count):
        mig = nvml.query("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)
        if not is_available(mig):
            continue  # empty slot: NVML says NOT_FOUND
        uuid = nvml.query("nvmlDeviceGetUUID", mig)
        mem = nvml.query("nvmlDeviceGetMemoryInfo", mig)
        found.append(MigDevice(uuid if is_available(uuid) else "", mem.total if is_available(mem) else mem))
    return tuple(found)


def read_info(nvml: NvmlSession, index: int) -> GpuInfo:
    def q(name: str, *args: Any) -> Any:
        return nvml.device_query(index, name, *args)

    c = nvml.constant
    name = q("nvmlDeviceGetName")
    pci = q("nvmlDeviceGetPciInfo")
    mem = q("nvmlDeviceGetMemoryInfo")
    mig_mode = q("nvmlDeviceGetMigMode")
    ecc_mode = q("nvmlDeviceGetEccMode")
    cc = q("nvmlDeviceGetCudaComputeCapability")
    mig_enabled = bool(_first(mig_mode)) if is_available(mig_mode) else mig_mode
    ecc_errors = q(
        "nvmlDeviceGetTotalEccErrors",
        c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        c("NVML_VOLATILE_ECC", 0),
    )
    compute_mode = q("nvmlDeviceGetComputeMode")
    persistence = q("nvmlDeviceGetPersistenceMode")
    return GpuInfo(
        index=index,
        name=name,
        uuid=q("nvmlDeviceGetUUID"),
        pci_bus_id=(_decode(pci.busId) if is_available(pci) else pci),
        memory_total_bytes=(mem.total if is_available(mem) else mem),
        compute_capability=(tuple(cc) if is_available(cc) else cc),
        power_limit_w=_w(q("nvmlDeviceGetEnforcedPowerLimit")),
        max_sm_clock_mhz=q("nvmlDeviceGetMaxClockInfo", c("NVML_CLOCK_SM", 1)),
        pcie_gen_max=q("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width_max=q("nvmlDeviceGetMaxPcieLinkWidth"),
        temp_slowdown_c=q("nvmlDeviceGetTemperatureThreshold", c("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)),
        temp_shutdown_c=q("nvmlDeviceGetTemperatureThreshold", c("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)),
        persistence_mode=(bool(persistence) if is_available(persistence) else persistence),
        compute_mode=(_COMPUTE_MODES.get(compute_mode, str(compute_mode)) if is_available(compute_mode)
                      else compute_mode),
        mig_enabled=mig_enabled,
        ecc_enabled=(bool(_first(ecc_mode)) if is_available(ecc_mode) else ecc_mode),
        ecc_uncorrected_volatile=ecc_errors,
        mig_devices=read_mig_devices(nvml, index) if mig_enabled is True else (),
        lost=_is_lost(name),
    )


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def read_sample(nvml: NvmlSession, index: int, clock: Callable[[], float] = time.monotonic) -> GpuSample:
    """The moving values of one GPU: about 15 µs of NVML time on an H200 (see research)."""
    def q(name: str, *args: Any) -> Any:
        return nvml.device_query(index, name, *args)

    c = nvml.constant
    t = clock()
    mem = q("nvmlDeviceGetMemoryInfo", c("nvmlMemory_v2", 0x02000028))
    if not is_available(mem) and mem.code != 15:
        mem = q("nvmlDeviceGetMemoryInfo")  # v1 where the driver lacks v2
    util = q("nvmlDeviceGetUtilizationRates")
    return GpuSample(
        index=index,
        t_s=t,
        memory_used_bytes=(mem.used if is_available(mem) else mem),
        memory_free_bytes=(mem.free if is_available(mem) else mem),
        memory_total_bytes=(mem.total if is_available(mem) else mem),
        util_gpu_pct=(util.gpu if is_available(util) else util),
        util_memory_pct=(util.memory if is_available(util) else util),
        power_w=_w(q("nvmlDeviceGetPowerUsage")),
        temp_c=q("nvmlDeviceGetTemperature", c("NVML_TEMPERATURE_GPU", 0)),
        sm_clock_mhz=q("nvmlDeviceGetClockInfo", c("NVML_CLOCK_SM", 1)),
        mem_clock_mhz=q("nvmlDeviceGetClockInfo", c("NVML_CLOCK_MEM", 2)),
        clock_event_reasons=q("nvmlDeviceGetCurrentClocksEventReasons"),
        pcie_gen=q("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_width=q("nvmlDeviceGetCurrPcieLinkWidth"),
        lost=_is_lost(mem),
    )


def unread_sample(index: int, t_s: float, reason: str) -> GpuSample:
    """A sample whose every reading is missing for ``reason`` (NVML did not answer in time)."""
    gap = Unavailable(reason, TIMEOUT)
    return GpuSample(index, t_s, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap)


def unread_info(index: int, reason: str) -> GpuInfo:
    """A GPU's facts, every one missing for ``reason``."""
    gap = Unavailable(reason, TIMEOUT)
    return GpuInfo(index, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap, gap)


# Process names are one driver call each: with 60,000 processes listed (a shared node) naming
# them all took %gpumem 5.4 s (issue 22). The largest this many are named; the rest are counted.
MAX_NAMED_PROCESSES = 64


def read_processes(nvml: NvmlSession, index: int, *, names: bool = True) -> tuple[GpuProcess, ...] | Unavailable:
    """Compute processes on GPU ``index`` (tens of µs per call: not for every sampler tick).
    ``names=False`` skips the name query, one more driver call per process."""
    procs = nvml.device_query(index, "nvmlDeviceGetComputeRunningProcesses")
    if isinstance(procs, Unavailable):
        return procs
    named: set[int] = set()
    if names:  # the largest ones only: every view names a few, and a shared node may list thousands
        by_size = sorted(procs, key=lambda p: -(_bytes(getattr(p, "usedGpuMemory", None)) or 0))
        named = {id(p) for p in by_size[:MAX_NAMED_PROCESSES]}
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        name = nvml.query("nvmlSystemGetProcessName", p.pid) if id(p) in named else ""
        out.append(GpuProcess(p.pid, used, name if is_available(name) else ""))
    return tuple(out)


def _bytes(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# NVML time %gpucheck may spend on the snapshot (plus one call's timeout): a hung driver
# costs the cell at most this, and what was not read in time says so.
SNAPSHOT_BUDGET_S = 1.0


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything NVML says about every GPU, once (what ``%gpucheck`` starts from)."""

    driver: DriverInfo
    gpus: tuple[GpuInfo, ...] = ()
    samples: tuple[GpuSample, ...] = ()
    processes: tuple[tuple[GpuProcess, ...] | Unavailable, ...] = ()  # per GPU
    nvml_trouble: tuple[str, ...] = ()  # NVML calls skipped because they hung or answered slowly


def _unread_sample_now(index: int) -> Callable[[str], GpuSample]:
    """The fallback of one GPU's sample: missing for the reason given, stamped when it is given."""
    return lambda why: unread_sample(index, time.monotonic(), why)


def read_snapshot(nvml: NvmlSession, budget_s: float = SNAPSHOT_BUDGET_S) -> GpuSnapshot:
    """Each part is read on the NVML worker within one shared budget, so a call that hangs
    costs one part (given back as ``Unavailable`` with the reason), not the snapshot."""
    with nvml.budget(budget_s, "the GPU snapshot"):
        driver = nvml.run(read_driver, nvml, fallback=unread_driver)
        if not driver.nvml.ok:
            return GpuSnapshot(driver, nvml_trouble=nvml.trouble())
        indices = range(driver.gpu_count)
        gpus = tuple(nvml.run(read_info, nvml, i, fallback=partial(unread_info, i)) for i in indices)
        samples = tuple(nvml.run(read_sample, nvml, i, fallback=_unread_sample_now(i)) for i in indices)
        processes = tuple(nvml.run(read_processes, nvml, i, fallback=lambda why: Unavailable(why, TIMEOUT))
                          for i in indices)
    return GpuSnapshot(driver, gpus, samples, processes, nvml.trouble())
