"""What each NVML function may return; anything else is a malformed reading.

A driver (or a binding) that lies must degrade a view, not crash it: a ``None`` where a
struct belongs, a NaN, a negative or absurdly large number, a megabyte-long string. The
query helper (:meth:`gpunb.readings.nvml.NvmlSession.query`) checks every value against
the shape below and turns a misfit into an ``Unavailable`` naming the function and the
value, so readers can use ``mem.used`` or ``int(temp)`` without guarding each field.

Bounds are generous physical limits, not tight expectations: they only have to tell a
real reading from garbage. Buffer sizes are nvml.h's (``NVML_DEVICE_NAME_V2_BUFFER_SIZE``
96, ``NVML_DEVICE_UUID_V2_BUFFER_SIZE`` 96, ``NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`` 80).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

TiB = 2**40
U64 = 2**64 - 1

Check = Callable[[Any], str]  # "" when the value fits, else what is wrong with it


def _preview(value: Any, limit: int = 48) -> str:
    """A short repr that cannot raise or flood a message."""
    try:
        text = repr(value)
    except Exception:  # a value whose repr raises is garbage too
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def number(low: float, high: float, *, whole: bool = True) -> Check:
    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        if isinstance(value, float):
            if not math.isfinite(value):
                return "not a finite number"
            if whole and not value.is_integer():
                return "not a whole number"
        if not low <= value <= high:
            return f"outside {low:g}..{high:g}"
        return ""

    return check


def text(max_len: int) -> Check:
    def check(value: Any) -> str:
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if not isinstance(value, str):
            return "not a string"
        if len(value) > max_len:
            return f"longer than {max_len} characters"
        return ""

    return check


def pair(item: Check) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            return "not a pair"
        return next((why for why in map(item, value) if why), "")

    return check


def struct(optional: tuple[str, ...] = (), **fields: Check) -> Check:
    """An object whose attributes ``fields`` hold values of those shapes."""

    def check(value: Any) -> str:
        for name, field_check in fields.items():
            try:
                got = getattr(value, name)
            except Exception:
                if name in optional:
                    continue
                return f"has no field {name}"
            why = field_check(got)
            if why:
                return f"field {name} {why}"
        return ""

    return check


def nullable(inner: Check) -> Check:
    return lambda value: "" if value is None else inner(value)


def handle(value: Any) -> str:
    return "no handle" if value is None else ""


def sequence(item: Check, max_items: int) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, (list, tuple)):
            return "not a list"
        if len(value) > max_items:
            return f"more than {max_items} entries"
        for entry in value:
            why = item(entry)
            if why:
                return f"entry {why}"
        return ""

    return check


def _sample_value(value: Any) -> str:
    """An ``nvmlValue_t`` union: one of its integer members holds the reading."""
    found = False
    for name in ("uiVal", "ulVal", "ullVal"):
        try:
            got = getattr(value, name)
        except Exception:
            continue
        if got is None:
            continue
        found = True
        if number(0, U64)(got):
            return f"{name} is not a count"
    return "" if found else "holds no value"


def _samples(value: Any) -> str:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return "not a (type, samples) pair"
    why = number(0, 64)(value[0])
    if why:
        return f"value type {why}"
    sample = struct(timeStamp=number(0, U64), sampleValue=_sample_value)
    return sequence(sample, 100_000)(value[1])


# nvmlValueType_t -> the nvmlValue_t member that holds a value of that type
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_values(value: Any) -> str:
    """``nvmlDeviceGetFieldValues``: pynvml gives a ctypes array of ``nvmlFieldValue_t``; each
    entry has its own ``nvmlReturn``, and an entry that succeeded holds a number of its type."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or not hasattr(value, "__getitem__"):
        return "not a list of field values"
    if len(value) > 4096:
        return "more than 4096 entries"
    for i in range(len(value)):
        entry = value[i]
        why = struct(nvmlReturn=number(0, 2**32))(entry)
        if why:
            return f"entry {why}"
        if entry.nvmlReturn != 0:
            continue
        why = struct(valueType=number(0, 6))(entry)
        if why:
            return f"entry {why}"
        member = _VALUE_MEMBERS[int(entry.valueType)]
        low, high = (-(2**63), 2**64) if member in ("sllVal", "siVal") else (0, U64)
        held: dict[str, Check] = {member: number(low, high, whole=member != "dVal")}
        why = struct((), value=struct((), **held))(entry)
        if why:
            return f"entry {why}"
    return ""


_BYTES = number(0, 64 * TiB)
_MHZ = number(0, 100_000)
_CELSIUS = number(0, 300)
_PERCENT = number(0, 100)
_MILLIWATTS = number(0, 10**7)  # 10 kW: no board draws that
_BIT = number(0, 1)

SHAPES: dict[str, Check] = {
    "nvmlSystemGetDriverVersion": text(80),
    "nvmlSystemGetCudaDriverVersion": number(0, 10**6),
    "nvmlSystemGetProcessName": text(4096),
    "nvmlDeviceGetCount": number(0, 1024),
    "nvmlDeviceGetHandleByIndex": handle,
    "nvmlDeviceGetMigDeviceHandleByIndex": handle,
    "nvmlDeviceGetName": text(96),
    "nvmlDeviceGetUUID": text(96),
    "nvmlDeviceGetPciInfo": struct(busId=text(32)),
    "nvmlDeviceGetCudaComputeCapability": pair(number(0, 100)),
    "nvmlDeviceGetEnforcedPowerLimit": _MILLIWATTS,
    "nvmlDeviceGetPowerUsage": _MILLIWATTS,
    "nvmlDeviceGetMaxClockInfo": _MHZ,
    "nvmlDeviceGetClockInfo": _MHZ,
    "nvmlDeviceGetMaxPcieLinkGeneration": number(0, 32),
    "nvmlDeviceGetCurrPcieLinkGeneration": number(0, 32),
    "nvmlDeviceGetMaxPcieLinkWidth": number(0, 64),
    "nvmlDeviceGetCurrPcieLinkWidth": number(0, 64),
    "nvmlDeviceGetTemperature": _CELSIUS,
    "nvmlDeviceGetTemperatureThreshold": _CELSIUS,
    "nvmlDeviceGetPersistenceMode": _BIT,
    "nvmlDeviceGetComputeMode": number(0, 3),
    "nvmlDeviceGetMigMode": pair(_BIT),
    "nvmlDeviceGetEccMode": pair(_BIT),
    "nvmlDeviceGetTotalEccErrors": number(0, U64),
    "nvmlDeviceGetMaxMigDeviceCount": number(0, 64),
    "nvmlDeviceGetMemoryInfo": struct(("reserved",), total=_BYTES, used=_BYTES, free=_BYTES, reserved=_BYTES),
    "nvmlDeviceGetUtilizationRates": struct(gpu=_PERCENT, memory=_PERCENT),
    "nvmlDeviceGetCurrentClocksEventReasons": number(0, U64),
    "nvmlDeviceGetPerformanceState": number(0, 32),
    "nvmlDeviceGetComputeRunningProcesses": sequence(
        struct(("usedGpuMemory",), pid=number(0, 2**32), usedGpuMemory=nullable(_BYTES)), 65_536),
    "nvmlDeviceGetSamples": _samples,
    # what a GPU spent and moved (readings/energy.py)
    "nvmlDeviceGetTotalEnergyConsumption": number(0, U64),  # mJ since the driver loaded
    "nvmlDeviceGetPcieThroughput": number(0, 10**10),  # KB/s: up to 10 TB/s
    # between GPUs (readings/links.py): static facts read by %gpucheck, NVLink counters by %%gpuprofile
    "nvmlDeviceGetFieldValues": _field_values,
    "nvmlDeviceGetNvLinkState": _BIT,
    "nvmlDeviceGetNvLinkVersion": number(0, 64),
    "nvmlDeviceGetNvLinkCapability": number(0, 2**32 - 1),
    "nvmlDeviceGetNvLinkRemoteDeviceType": number(0, 255),  # nvmlIntNvLinkDeviceType_t; 0xFF: unknown
    "nvmlDeviceGetNvLinkRemotePciInfo": struct(busId=text(32)),
    "nvmlDeviceGetP2PStatus": number(0, 255),  # nvmlGpuP2PStatus_t
    "nvmlDeviceGetTopologyCommonAncestor": number(0, 100),  # nvmlGpuTopologyLevel_t: 0, 10, ..., 50
}


def misfit(name: str, value: Any) -> str:
    """Why ``value`` cannot be what NVML function ``name`` returns; "" when it can (or
    when the function has no declared shape)."""
    check = SHAPES.get(name)
    if check is None:
        return ""
    try:
        why = check(value)
    except Exception as exc:  # a value that raises while being looked at is malformed too
        why = f"raised {type(exc).__name__} when read"
    return f"NVML returned a malformed value for {name} ({why}: {_preview(value)})" if why else ""
