"""``gpunb.check()``: the GPU training setup checklist, executed.

Fast checks (NVML, host, files) come first and are shown at once; the CUDA probe then
runs in a subprocess (so this process gets no CUDA context) while progress is reported,
and the checks that need its measurements complete the report.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpunb.analysis import checks_gpu, checks_host, checks_torch
from gpunb.analysis.check_inputs import CheckInputs
from gpunb.analysis.check_report import CheckReport, CheckResult
from gpunb.readings import torch_state
from gpunb.readings.cuda_probe import run_probe
from gpunb.readings.devices import attribute_processes, kernel_pids, map_devices, torch_device_uuids, torch_reserved_on
from gpunb.readings.gpu import DriverInfo, GpuSnapshot, read_snapshot
from gpunb.readings.host import read_host_facts
from gpunb.readings.nvml import NvmlSession, NvmlStatus, Unavailable, default_session
from gpunb.readings.peak_cache import remember as remember_matmul_peaks
from gpunb.readings.torch_build import read_kernel_torch_state, read_torch_build

# (check, needs the subprocess measurements) in the order of the training checklist:
# driver first, then versions, one small success, then health, precision, host, config.
CHECKS: tuple[tuple[Callable[[CheckInputs], CheckResult], bool], ...] = (
    (checks_gpu.check_driver, False),
    (checks_gpu.check_other_processes, False),
    (checks_torch.check_torch_build, True),
    (checks_torch.check_torch_arch, True),
    (checks_torch.check_cudnn_nccl, True),
    (checks_gpu.check_visible_devices, False),
    (checks_torch.check_smoke, True),
    (checks_torch.check_matmul, True),
    (checks_torch.check_copy, True),
    (checks_torch.check_kernel_cuda_state, False),
    (checks_gpu.check_temperature, False),
    (checks_gpu.check_power, False),
    (checks_gpu.check_clock_events, False),
    (checks_gpu.check_ecc, False),
    (checks_gpu.check_persistence, False),
    (checks_gpu.check_mig, False),
    (checks_gpu.check_compute_mode, False),
    (checks_torch.check_precision, True),
    (checks_host.check_cpu_ram, False),
    (checks_host.check_shm, False),
    (checks_host.check_disk, False),
    (checks_torch.check_alloc_conf, False),
    (checks_host.check_frameworks, True),
    (checks_host.check_nvml_package, False),
)

_STEP_WORDS = {
    "import torch": "importing torch in a subprocess",
    "cuda init": "starting CUDA in a subprocess",
    "smoke": "training-step smoke test",
    "matmul": "matrix-multiply throughput",
    "copy": "host-to-device copy bandwidth",
}

ProgressFn = Callable[[CheckReport], None]


class DeviceChoiceError(ValueError):
    """``device=N`` names no GPU CUDA can see."""


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    except Exception:
        return type(exc).__name__


def _one(fn: Callable[[CheckInputs], CheckResult], inputs: CheckInputs) -> CheckResult:
    try:
        return fn(inputs)
    except Exception as exc:  # a bug in one check must not hide the others
        name = fn.__name__.removeprefix("check_")
        return CheckResult(name, name.replace("_", " "), "fail", "the check itself crashed",
                           {"error": repr(exc)}, f"gpunb bug: {exc!r}", "Please report it with this output.")


def _keep_matmul_peaks(inputs: CheckInputs, env: Mapping[str, str]) -> None:
    """The probe's matmul TFLOP/s per GPU, kept for %%gpuprofile's MFU (readings/peak_cache.py)."""
    probe = inputs.probe
    facts = probe.facts if probe is not None else None
    if probe is None or facts is None:
        return
    for dev in facts.get("devices", []):
        result = probe.result("matmul", dev.get("index"))
        if result and dev.get("uuid"):
            remember_matmul_peaks(dev["uuid"], str(dev.get("name", "")), result,
                                  torch_version=str(facts.get("torch_version", "")), environ=env)


def check(
    quick: bool = False,
    device: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSession | None = None,
    progress: ProgressFn | None = None,
    in_kernel: bool = False,
    probe_timeout_s: float = 180.0,
) -> CheckReport:
    """Run the setup checklist and return a :class:`CheckReport`.

    quick: skip the subprocess measurements (CUDA smoke test, matmul and copy speed).
    device: check only ``cuda:N`` (numbered as CUDA sees GPUs under CUDA_VISIBLE_DEVICES).
    progress: called with the partial report whenever a step starts or finishes.
    in_kernel: whether to report this process's CUDA state as a notebook kernel's (the
        shells layer says so inside IPython); it is reported anyway once this process has
        imported torch.
    """
    t0 = time.monotonic()
    env = dict(os.environ if environ is None else environ)
    try:
        snapshot = read_snapshot(nvml or default_session())
    except Exception as exc:  # a reader bug must not take the rest of the checklist with it
        status = NvmlStatus(False, f"gpunb could not read NVML: {_describe(exc)}",
                            "This is a gpunb bug: please report it with this output. The other checks still ran.")
        gap = Unavailable(status.cause)
        snapshot = GpuSnapshot(DriverInfo(status, gap, gap, 0))
    torch = torch_state.imported_torch()
    devices = map_devices(snapshot.gpus, env, torch_device_uuids(torch))
    visible = devices.visible
    me = kernel_pids()
    ownership = tuple(attribute_processes(g.index, procs, me, torch_reserved_on(torch, devices, g.index))
                      for g, procs in zip(snapshot.gpus, snapshot.processes))
    if device is not None:
        if not isinstance(device, int) or isinstance(device, bool):
            raise DeviceChoiceError(f"device must be an integer CUDA ordinal, not {device!r}")
        chosen = devices.nvml_index(device)
        if chosen is None:
            count = len(devices.devices)
            unusable = [g for g in snapshot.gpus if not isinstance(g.uuid, str)]
            raise DeviceChoiceError(
                f"device {device} does not exist: CUDA sees {count} GPU(s)"
                + (f" (cuda:0..cuda:{count - 1})" if count else "")
                + "".join(f"; GPU{g.index} is {'lost (NVML: GPU is lost)' if g.lost else 'unreadable: ' + str(g.uuid)}"
                          ", so CUDA cannot use it until it is reset (see `gpunb check` without --device)"
                          for g in unusable))
        selected: tuple[int, ...] = (chosen,)
    else:
        selected = tuple(g.index for g in snapshot.gpus)
    inputs = CheckInputs(
        environ=env,
        snapshot=snapshot,
        host=read_host_facts(),
        torch=read_torch_build(),
        kernel_torch=read_kernel_torch_state(),
        in_kernel=in_kernel,
        devices=devices,
        ownership=ownership,
        selected=selected,
        quick=quick,
    )

    # The fast checks do not depend on the probe: computed once, shown in every partial report.
    fast = {fn: _one(fn, inputs) for fn, needs_probe in CHECKS if not needs_probe}

    def show(message: str) -> None:
        if progress is not None:
            progress(CheckReport(tuple(fast.values()), time.monotonic() - t0, quick, device, message))

    # JAX/TF answer from their own subprocesses while the CUDA probe runs (seconds each).
    frameworks: dict[str, Any] = {}
    asker = None
    if checks_host.frameworks_installed():
        asker = threading.Thread(target=lambda: frameworks.update(checks_host.probe_frameworks(quick)),
                                 name="gpunb-check-frameworks", daemon=True)
        asker.start()
    if not quick and inputs.torch.installed and visible.visible:
        show("starting the CUDA probe (a subprocess, so this kernel gets no CUDA context)")

        def on_step(step: str, dev: int | None) -> None:
            where = f" on cuda:{dev}" if dev is not None else ""
            show(f"running: {_STEP_WORDS.get(step, step)}{where}")

        inputs.probe = run_probe(environ=env, devices=[device] if device is not None else None,
                                 timeout_s=probe_timeout_s, on_step=on_step)
        _keep_matmul_peaks(inputs, env)
    if asker is not None:
        if asker.is_alive() and not quick:
            show("waiting for JAX/TensorFlow to list their devices (subprocess)")
        asker.join()
    inputs.frameworks = frameworks
    results = tuple(fast[fn] if fn in fast else _one(fn, inputs) for fn, _ in CHECKS)
    return CheckReport(results, time.monotonic() - t0, quick, device)
