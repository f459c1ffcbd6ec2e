"""Checks of what NVML says: the driver and GPUs, other processes, and GPU health."""

from __future__ import annotations

from typing import Any

from gpunb.analysis.checks.inputs import CheckInputs
from gpunb.analysis.checks.records import CheckResult, Status, worst
from gpunb.analysis.machine import state_of
from gpunb.readings import pci
from gpunb.readings.gpu import SLOWDOWN_BITS, clock_event_explanations, clock_event_names
from gpunb.readings.nvml import is_available
from gpunb.readings.visible_devices import VisibleDevices
from gpunb.units import gib, num, shown

NVIDIA_SMI_DOC = "https://docs.nvidia.com/deploy/nvidia-smi/index.html"
NVML_DOC = "https://docs.nvidia.com/deploy/nvml-api/"


def _no_nvml(check_id: str, title: str, inputs: CheckInputs) -> CheckResult | None:
    if inputs.snapshot.driver.nvml.ok and inputs.gpus:
        return None
    return CheckResult(check_id, title, "skip", "no GPU to check (see the driver check)")


def check_driver(inputs: CheckInputs) -> CheckResult:
    title = "NVIDIA driver sees the GPUs (the nvidia-smi step)"
    driver = inputs.snapshot.driver
    machine = state_of(driver.nvml, driver.gpu_count if driver.nvml.ok else None, inputs.torch,
                       pci.nvidia_gpu_on_bus(), driver.cuda_driver_version)
    said = {"machine": {"state": machine.state, "sentence": machine.sentence, "severity": machine.severity,
                        "fix": machine.fix}}
    if machine.state == "no_gpu" and not driver.nvml.ok:
        # a laptop's ordinary state: skipped, unless the caller said a GPU is required
        if inputs.require_gpu:
            return CheckResult("driver", title, "fail", "No NVIDIA GPU on this machine, and this run requires one.",
                               {"nvml_error_code": driver.nvml.code, **said},
                               "A GPU is required (require_gpu / --require-gpu) and this machine has none.",
                               "Run this on a machine with an NVIDIA GPU and its driver (`nvidia-smi` must work).",
                               NVIDIA_SMI_DOC)
        return CheckResult("driver", title, "skip", machine.sentence, {"nvml_error_code": driver.nvml.code, **said})
    if not driver.nvml.ok:
        return CheckResult("driver", title, "warn" if machine.severity == "warn" else "fail", machine.sentence,
                           {"nvml_error_code": driver.nvml.code, **said}, driver.nvml.cause, machine.fix,
                           NVIDIA_SMI_DOC)
    gpus = [
        {"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes, "uuid": g.uuid,
         "pci_bus_id": g.pci_bus_id, "compute_capability": g.compute_capability, "lost": g.lost}
        for g in inputs.snapshot.gpus
    ]
    measured = {"driver_version": driver.driver_version, "cuda_driver_version": driver.cuda_driver_version,
                "gpu_count": driver.gpu_count, "gpus": gpus, **said}
    if driver.gpu_count == 0:
        return CheckResult("driver", title, "fail", f"driver {driver.driver_version} loaded, but it sees no GPU",
                           measured, "The driver is running but reports no GPU (passthrough missing, or the GPU "
                           "is disabled).", "Run `nvidia-smi`; check `lspci | grep -i nvidia` and the VM/container "
                           "GPU assignment.", NVIDIA_SMI_DOC)
    lost = [g for g in inputs.snapshot.gpus if g.lost]
    listing = "; ".join(
        f"GPU{g.index} {g.name if not g.lost else '(lost)'} {gib(g.memory_total_bytes)} {g.uuid if not g.lost else ''} "
        f"{g.pci_bus_id if not g.lost else ''}".strip()
        for g in inputs.snapshot.gpus
    )
    summary = (f"driver {driver.driver_version} (CUDA {driver.cuda_driver_version}) · "
               f"{driver.gpu_count} GPU(s): {listing}")
    if lost:
        ids = ", ".join(f"GPU{g.index}" for g in lost)
        return CheckResult("driver", title, "fail", summary, measured,
                           f"{ids} fell off the bus (NVML: GPU is lost); nothing can run on it.",
                           "Look for Xid errors in `dmesg`; a GPU reset (`nvidia-smi -r`, admin) or a reboot is "
                           "needed. Meanwhile hide it with CUDA_VISIBLE_DEVICES.", NVIDIA_SMI_DOC)
    trouble = inputs.snapshot.nvml_trouble
    if trouble:  # readings skipped because NVML hung or answered slowly: they show as n/a below
        return CheckResult("driver", title, "warn", summary, measured,
                           "NVML answered slowly or not at all: " + "; ".join(trouble[:3]),
                           "Readings that timed out show as n/a. If `nvidia-smi` is slow or hangs too, the driver "
                           "is struggling: look for Xid errors in `dmesg`; a GPU reset or reboot (administrator) "
                           "may be needed.", NVIDIA_SMI_DOC)
    return CheckResult("driver", title, "ok", summary, measured, link=NVIDIA_SMI_DOC)


def check_other_processes(inputs: CheckInputs) -> CheckResult:
    title = "Other processes on the GPUs"
    skipped = _no_nvml("gpu_processes", title, inputs)
    if skipped:
        return skipped
    statuses: list[Status] = []
    parts, measured = [], {}
    for g in inputs.gpus:
        procs = inputs.processes(g.index)
        if not is_available(procs):  # nothing read: not "ok"
            statuses.append("skip")
            parts.append(f"GPU{g.index}: process list {procs}")
            continue
        others = list(inputs.ownership[g.index].others)  # not this kernel nor its children (devices.py)
        held = sum(p.used_bytes for p in others if isinstance(p.used_bytes, int))
        measured[f"gpu{g.index}"] = [{"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes} for p in others]
        sample = inputs.sample(g.index)
        used = sample.memory_used_bytes
        if not others:
            statuses.append("ok")
            note = ""
            # In a container NVML lists no processes of other PID namespaces, but memory shows.
            if isinstance(used, int) and used > 2 * 2**30 and not procs:
                note = f" (but {gib(used)} is in use: processes outside this container?)"
                statuses[-1] = "warn"
            parts.append(f"GPU{g.index}: none{note}")
            continue
        # a process whose name this container cannot read is said as its PID alone, never "?"
        names = ", ".join(f"{p.name} (pid {p.pid}, {gib(p.used_bytes)})" if p.name else
                          f"PID {p.pid} ({gib(p.used_bytes)}; its name is hidden from this container)"
                          for p in others[:4])
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        parts.append(f"GPU{g.index}: {len(others)} other process(es) hold {gib(held)}: {names}{more}")
        statuses.append("warn")  # memory and compute are shared with them
    status = worst(statuses)
    return CheckResult(
        "gpu_processes", title, status, "; ".join(parts), measured,
        "Another process holds GPU memory and compute: your runs get less memory and can OOM or slow down."
        if status == "warn" else "",
        "Ask the owner (`nvidia-smi` shows the PIDs), or move to a free GPU with "
        "CUDA_VISIBLE_DEVICES=<index or UUID>." if status == "warn" else "",
        NVIDIA_SMI_DOC,
    )


def check_temperature(inputs: CheckInputs) -> CheckResult:
    title = "Temperature below the slowdown threshold"
    skipped = _no_nvml("temperature", title, inputs)
    if skipped:
        return skipped
    statuses: list[Status] = []
    parts: list[str] = []
    measured: dict[str, Any] = {}
    for g in inputs.gpus:
        temp, limit = inputs.sample(g.index).temp_c, g.temp_slowdown_c
        measured[f"gpu{g.index}"] = {"temp_c": temp, "slowdown_c": limit, "shutdown_c": g.temp_shutdown_c}
        if not is_available(temp):
            statuses.append("skip")
            parts.append(f"GPU{g.index}: temperature {temp}")
            continue
        parts.append(f"GPU{g.index}: {temp} °C (slowdown at {num(limit, '°C')})")
        if is_available(limit) and temp >= limit:
            statuses.append("fail")
        elif is_available(limit) and temp >= limit - 5:
            statuses.append("warn")
        else:
            statuses.append("ok")
    status = worst(statuses)
    bad = status in ("warn", "fail")
    return CheckResult("temperature", title, status, "; ".join(parts), measured,
                       "The GPU is at or near its slowdown temperature: clocks drop and training slows." if bad else "",
                       "Check cooling (fans, airflow, data-centre inlet temperature); tell the administrator."
                       if bad else "",
                       NVML_DOC)


def check_power(inputs: CheckInputs) -> CheckResult:
    title = "Power draw and limit"
    skipped = _no_nvml("power", title, inputs)
    if skipped:
        return skipped
    parts: list[str] = []
    measured: dict[str, Any] = {}
    statuses: list[Status] = []
    at_limit = False
    for g in inputs.gpus:
        draw = inputs.sample(g.index).power_w
        at_limit |= is_available(draw) and is_available(g.power_limit_w) and draw >= 0.95 * g.power_limit_w
        measured[f"gpu{g.index}"] = {"power_w": draw, "limit_w": g.power_limit_w}
        parts.append(f"GPU{g.index}: {num(draw, 'W')} of {num(g.power_limit_w, 'W')} limit"
                     if is_available(draw) else f"GPU{g.index}: power {draw}")
        statuses.append("ok" if is_available(draw) else "skip")
    return CheckResult("power", title, worst(statuses), "; ".join(parts), measured, link=NVML_DOC,
                       tip="At its power limit under load, a GPU lowers clocks ('power cap' clock event): normal "
                           "for full-load training." if at_limit else "")


def check_clock_events(inputs: CheckInputs) -> CheckResult:
    title = "Clock slowdowns (throttle reasons)"
    skipped = _no_nvml("clock_events", title, inputs)
    if skipped:
        return skipped
    parts: list[str] = []
    measured: dict[str, Any] = {}
    statuses: list[Status] = []
    causes: list[str] = []
    for g in inputs.gpus:
        mask = inputs.sample(g.index).clock_event_reasons
        if not is_available(mask):
            parts.append(f"GPU{g.index}: {mask}")
            statuses.append("skip")
            continue
        names = clock_event_names(mask)
        measured[f"gpu{g.index}"] = {"mask": mask, "reasons": names}
        parts.append(f"GPU{g.index}: " + (", ".join(names) if names else "none"))
        if mask & SLOWDOWN_BITS:
            statuses.append("warn")
            causes.extend(clock_event_explanations(mask & SLOWDOWN_BITS))
        else:
            statuses.append("ok")
    status = worst(statuses)
    return CheckResult("clock_events", title, status, "; ".join(parts), measured,
                       "; ".join(causes) if causes else "",
                       "Thermal or power-brake slowdowns are a hardware/cooling matter: tell the administrator; "
                       "`nvidia-smi -q -d PERFORMANCE` shows the history." if causes else "",
                       "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html")


def check_ecc(inputs: CheckInputs) -> CheckResult:
    title = "Memory errors (ECC)"
    skipped = _no_nvml("ecc", title, inputs)
    if skipped:
        return skipped
    parts: list[str] = []
    measured: dict[str, Any] = {}
    statuses: list[Status] = []
    for g in inputs.gpus:
        errors = g.ecc_uncorrected_volatile
        measured[f"gpu{g.index}"] = {"ecc_enabled": g.ecc_enabled, "uncorrected_volatile": errors}
        if not is_available(g.ecc_enabled):
            parts.append(f"GPU{g.index}: ECC mode {g.ecc_enabled}")
            statuses.append("skip")
        elif g.ecc_enabled is not True:
            parts.append(f"GPU{g.index}: ECC off")
            statuses.append("ok")
        elif is_available(errors) and errors > 0:
            parts.append(f"GPU{g.index}: {errors} uncorrectable error(s) since the driver loaded")
            statuses.append("fail")
        elif is_available(errors):
            parts.append(f"GPU{g.index}: ECC on, 0 uncorrectable errors")
            statuses.append("ok")
        else:
            parts.append(f"GPU{g.index}: ECC on, error count {errors}")
            statuses.append("skip")
    status = worst(statuses)
    return CheckResult("ecc", title, status, "; ".join(parts), measured,
                       "Uncorrectable memory errors: results may be wrong and the GPU may need a reset."
                       if status == "fail" else "",
                       "Stop using this GPU and tell the administrator (GPU reset, row remapping, or RMA)."
                       if status == "fail" else "", NVIDIA_SMI_DOC)


def check_persistence(inputs: CheckInputs) -> CheckResult:
    title = "Persistence mode"
    skipped = _no_nvml("persistence_mode", title, inputs)
    if skipped:
        return skipped
    off = [g for g in inputs.gpus if g.persistence_mode is False]
    def mode(value: Any) -> Any:
        return "on" if value is True else "off" if value is False else value

    parts = [f"GPU{g.index}: {mode(g.persistence_mode)}" for g in inputs.gpus]
    read = [g for g in inputs.gpus if is_available(g.persistence_mode)]
    return CheckResult("persistence_mode", title, "warn" if off else "ok" if read else "skip", "; ".join(parts),
                       {f"gpu{g.index}": g.persistence_mode for g in inputs.gpus},
                       "Persistence mode is off: the driver tears the GPU down when idle, so every first CUDA "
                       "call pays the start-up again." if off else "",
                       "An administrator runs `sudo nvidia-smi -pm 1` (or enables nvidia-persistenced)." if off else "",
                       "https://docs.nvidia.com/deploy/driver-persistence/index.html")


def check_mig(inputs: CheckInputs) -> CheckResult:
    title = "MIG mode"
    skipped = _no_nvml("mig_mode", title, inputs)
    if skipped:
        return skipped
    parts = []
    for g in inputs.gpus:
        if g.mig_enabled is True:
            parts.append(f"GPU{g.index}: on, {len(g.mig_devices)} MIG device(s): "
                         + ", ".join(f"{m.uuid} ({gib(m.memory_total_bytes)})" for m in g.mig_devices))
        else:
            parts.append(f"GPU{g.index}: {'off' if g.mig_enabled is False else g.mig_enabled}")
    on = any(g.mig_enabled is True for g in inputs.gpus)
    read = any(is_available(g.mig_enabled) for g in inputs.gpus)
    return CheckResult("mig_mode", title, "ok" if read else "skip", "; ".join(parts),
                       {f"gpu{g.index}": {"enabled": g.mig_enabled, "devices": [m.uuid for m in g.mig_devices]}
                        for g in inputs.gpus},
                       link="https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",
                       tip="With MIG each process gets one slice with its share of memory and SMs; choose it with "
                           "CUDA_VISIBLE_DEVICES=MIG-<uuid>." if on else "")


def check_compute_mode(inputs: CheckInputs) -> CheckResult:
    title = "Compute mode"
    skipped = _no_nvml("compute_mode", title, inputs)
    if skipped:
        return skipped
    statuses: list[Status] = []
    parts: list[str] = []
    for g in inputs.gpus:
        parts.append(f"GPU{g.index}: {g.compute_mode}")
        if not is_available(g.compute_mode):
            statuses.append("skip")
            continue
        by_mode: dict[str, Status] = {"exclusive-process": "warn", "prohibited": "fail"}
        statuses.append(by_mode.get(g.compute_mode, "ok"))
    status = worst(statuses)
    cause = fix = ""
    if status == "warn":
        cause = ("Exclusive-process mode: only one process may use the GPU, so a second notebook (or a "
                 "DataLoader worker touching CUDA) fails with 'CUDA-capable device(s) is/are busy or unavailable'.")
        fix = "Use one kernel per GPU, or ask the administrator for `nvidia-smi -c DEFAULT`."
    elif status == "fail":
        cause, fix = "Compute is prohibited on this GPU.", "Ask the administrator for `nvidia-smi -c DEFAULT`."
    return CheckResult("compute_mode", title, status, "; ".join(parts),
                       {f"gpu{g.index}": g.compute_mode for g in inputs.gpus}, cause, fix, NVIDIA_SMI_DOC)


def check_visible_devices(inputs: CheckInputs) -> CheckResult:
    title = "CUDA_VISIBLE_DEVICES matches the GPUs"
    vis: VisibleDevices = inputs.visible
    raw = None if vis.raw is None else shown(vis.raw, 80)  # the value may be huge: shown cut short
    measured: dict[str, Any] = {"value": vis.raw if vis.raw is None or len(vis.raw) <= 200 else raw,
                "visible": list(vis.visible), "nvml_indices": list(vis.nvml_indices)}
    link = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables"
    if not inputs.snapshot.driver.nvml.ok:
        summary = "unset" if vis.raw is None else f"set to {raw}"
        return CheckResult("cuda_visible_devices", title, "skip", f"{summary}; no GPU to match it against", measured)
    if vis.problems:
        return CheckResult("cuda_visible_devices", title, "fail",
                           f"CUDA_VISIBLE_DEVICES={raw}: CUDA will see {len(vis.visible)} GPU(s)",
                           measured, " ".join(vis.problems),
                           "Fix the value (indices, GPU-<uuid> or MIG-<uuid>, comma-separated), or unset it: "
                           "`%env CUDA_VISIBLE_DEVICES=0` in a notebook must run before torch touches CUDA.", link)
    devices = inputs.devices
    pairs = ", ".join(f"cuda:{d.cuda_index} = GPU{d.nvml_index}{'' if d.certain else ' (uncertain)'}"
                      for d in devices.devices)
    unusable = [g for g in inputs.snapshot.gpus if not isinstance(g.uuid, str)]
    if vis.raw is None and unusable:  # a lost GPU: CUDA sees the others, not "all"
        return CheckResult("cuda_visible_devices", title, "warn", f"unset: CUDA sees {pairs or 'no GPU'}", measured,
                           " ".join(vis.notes), "See the driver check: a lost GPU needs a reset; until then "
                           "CUDA_VISIBLE_DEVICES=<the others> keeps programs off it.", link)
    if vis.raw is None:
        summary = f"unset: CUDA sees all {len(vis.visible)} GPU(s)" + (
            f" ({pairs})" if len(devices.devices) > 1 else "")
    else:
        summary = f"CUDA_VISIBLE_DEVICES={raw}: CUDA sees {pairs}"
    if devices.confirmed_by_torch:
        summary += "; confirmed by torch's device UUIDs"
    measured["cuda_to_nvml"] = {f"cuda:{d.cuda_index}": d.nvml_index for d in devices.devices}
    cause = " ".join(vis.notes) if vis.notes and not devices.confirmed_by_torch else devices.uncertain
    return CheckResult("cuda_visible_devices", title, "warn" if cause else "ok", summary, measured,
                       cause, "Select devices by UUID (GPU-... or MIG-...), which names the same device "
                       "for CUDA and NVML." if cause else "", link)
