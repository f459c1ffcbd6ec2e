"""``gpunb.check()``: the GPU training setup checklist, executed.

Fast checks (NVML, host, files) come first and are shown at once; the CUDA probe then
runs in a subprocess (so this process gets no CUDA context) while progress is reported,
and the checks that need its measurements complete the report.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpunb.analysis.checks import gpu as checks_gpu
from gpunb.analysis.checks import host as checks_host
from gpunb.analysis.checks import multi_gpu as checks_multi_gpu
from gpunb.analysis.checks import pytorch as checks_torch
from gpunb.analysis.checks.inputs import CheckInputs
from gpunb.analysis.checks.records import CheckReport, CheckResult
from gpunb.readings import torch_state
from gpunb.readings.allreduce import SIZES_MIB as ALLREDUCE_SIZES_MIB
from gpunb.readings.allreduce import TIMEOUT_S as ALLREDUCE_TIMEOUT_S
from gpunb.readings.allreduce import AllReduceLaunch
from gpunb.readings.cuda_probe import run_probe
from gpunb.readings.devices import attribute_processes, kernel_pids, map_devices, torch_device_uuids, torch_reserved_on
from gpunb.readings.gpu import DriverInfo, GpuSnapshot, read_snapshot
from gpunb.readings.host import read_host_facts
from gpunb.readings.links import read_link_map
from gpunb.readings.nvml import NvmlSession, NvmlStatus, Unavailable, default_session
from gpunb.readings.peak_cache import remember as remember_matmul_peaks
from gpunb.readings.torch_build import read_kernel_torch_state, read_torch_build
from gpunb.readings.transaction import Transaction

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
    (checks_multi_gpu.check_gpu_links, False),
    (checks_multi_gpu.check_nccl, True),
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

STEP_WORDS = {  # the CUDA probe's steps in order, in words (the progress counts them)
    "import torch": "importing torch in a subprocess",
    "cuda init": "starting CUDA in a subprocess",
    "context": "creating the CUDA context",
    "smoke": "training-step smoke test",
    "matmul": "matrix-multiply throughput",
    "copy": "host-to-device copy bandwidth",
}

ProgressFn = Callable[[CheckReport], None]


class CheckOptionError(ValueError):
    """Options that cannot go together."""


class DeviceChoiceError(CheckOptionError):
    """``device=N`` names no GPU CUDA can see."""


# gloo between CPU processes (the fake NVML's stand-in) moves ~1 GB/s: small sizes suffice.
GLOO_SIZES_MIB = (1, 8)
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


def _allreduce_backend(inputs: CheckInputs, nvml: NvmlSession) -> str | None:
    """NCCL on real GPUs with a CUDA build of torch; gloo between CPU processes when the GPUs are
    the recorded fake (tests, CI notebooks: the subprocess path runs for real, the figures are
    not GPU figures and the report says so); None when it cannot run."""
    if len(inputs.devices.devices) < 2 or len(inputs.gpus) < 2 or not inputs.torch.installed:
        return None
    if any(g.mig_enabled is True for g in inputs.gpus):
        return None
    if nvml.fake:
        return "gloo"
    return "nccl" if inputs.torch.cuda else None
def _keep_matmul_peaks(inputs: CheckInputs, env: Mapping[str, str]) -> None:
    """The probe's matmul TFLOP/s per GPU, kept for %%gpuprofile's MFU, and its pinned copy GB/s, kept
    for the monitor's PCIe limit lines (readings/peak_cache.py)."""
    probe = inputs.probe
    facts = probe.facts if probe is not None else None
    if probe is None or facts is None:
        return
    for dev in facts.get("devices", []):
        result = probe.result("matmul", dev.get("index")) or {}
        copy = probe.result("copy", dev.get("index"))  # the monitor's PCIe limit lines
        if (result or copy) and dev.get("uuid"):
            remember_matmul_peaks(dev["uuid"], str(dev.get("name", "")), result,
                                  torch_version=str(facts.get("torch_version", "")), environ=env, copy=copy)


def check(
    quick: bool = False,
    device: int | None = None,
    *,
    deep: bool = False,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSession | None = None,
    progress: ProgressFn | None = None,
    in_kernel: bool = False,
    probe_timeout_s: float = 180.0,
    allreduce_timeout_s: float = ALLREDUCE_TIMEOUT_S,
    require_gpu: bool = False,
) -> CheckReport:
    """Run the setup checklist and return a :class:`CheckReport`.

    quick: skip the subprocess measurements (CUDA smoke test, matmul and copy speed).
    device: check only ``cuda:N`` (numbered as CUDA sees GPUs under CUDA_VISIBLE_DEVICES).
    deep: also the slow multi-GPU measurement: an NCCL all-reduce across every GPU, one
        subprocess per GPU, with a hard timeout (``allreduce_timeout_s``).
    progress: called with the partial report whenever a step starts or finishes.
    in_kernel: whether to report this process's CUDA state as a notebook kernel's (the
        shells layer says so inside IPython); it is reported anyway once this process has
        imported torch.
    require_gpu: a machine without an NVIDIA GPU fails (``report.ok`` False, exit 1) instead of
        skipping the GPU checks (a laptop's ordinary state).
    """
    if quick and deep:
        raise CheckOptionError("quick and deep exclude each other: --quick skips the measurements --deep adds to")
    t0 = time.monotonic()
    env = dict(os.environ if environ is None else environ)
    nvml = nvml or default_session()
    try:
        snapshot = read_snapshot(nvml)
    except Exception as exc:  # a reader bug must not take the rest of the checklist with it
        status = NvmlStatus(False, f"gpunb could not read NVML: {_describe(exc)}",
                            "This is a gpunb bug: please report it with this output. The other checks still ran.")
        gap = Unavailable(status.cause)
        snapshot = GpuSnapshot(DriverInfo(status, gap, gap, 0))
    torch = torch_state.imported_torch()
    devices = map_devices(snapshot.gpus, env, torch_device_uuids(torch))
    visible = devices.visible
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
    build = read_torch_build()

    # The slow parts start first, and run while the rest is read: the CUDA probe (a subprocess
    # importing torch, ~4 s of its time) and, for --deep, the all-reduce ranks (importing torch
    # too, then waiting until the probe has left the GPUs).
    probe_events: queue.Queue[tuple[str, int | None]] = queue.Queue()
    probe_box: dict[str, Any] = {}
    prober = None
    # the processes the check starts end with it (a Ctrl-C, the Cancel button, an error):
    # closing this kills each one's process group
    children = Transaction("gpucheck processes")

    inputs = CheckInputs(
        environ=env,
        snapshot=snapshot,
        host=read_host_facts(),
        torch=build,
        kernel_torch=read_kernel_torch_state(),
        in_kernel=in_kernel,
        devices=devices,
        selected=selected,
        quick=quick,
        deep=deep,
        require_gpu=require_gpu,
    )
    launch = None
    backend = _allreduce_backend(inputs, nvml) if deep else None
    if backend is not None:
        launch = AllReduceLaunch(len(devices.devices), backend=backend, environ=env, timeout_s=allreduce_timeout_s,
                                 sizes_mib=GLOO_SIZES_MIB if backend == "gloo" else ALLREDUCE_SIZES_MIB).start()
    try:
        if not quick and build.installed and visible.visible:
            def probe() -> None:
                probe_box["result"] = run_probe(environ=env, devices=[device] if device is not None else None,
                                                timeout_s=probe_timeout_s, owner=children,
                                                on_step=lambda step, dev: probe_events.put((step, dev)))

            prober = threading.Thread(target=probe, name="gpunb-check-probe", daemon=True)
            prober.start()
        me = kernel_pids()
        inputs.ownership = tuple(attribute_processes(g.index, procs, me, torch_reserved_on(torch, devices, g.index))
                                 for g, procs in zip(snapshot.gpus, snapshot.processes))
        if len(snapshot.gpus) > 1:
            try:
                inputs.links = read_link_map(nvml, snapshot.gpus)
            except Exception as exc:  # a reader bug must not take the rest of the checklist with it
                inputs.links_error = _describe(exc)

        # The fast checks do not depend on the probe: computed once, shown in every partial report.
        fast = {fn: _one(fn, inputs) for fn, needs_probe in CHECKS if not needs_probe}

        def show(message: str) -> None:
            if progress is not None:
                progress(CheckReport(tuple(fast.values()), time.monotonic() - t0, quick, device, message, deep))

        # JAX/TF answer from their own subprocesses while the CUDA probe runs (seconds each).
        frameworks: dict[str, Any] = {}
        asker = None
        if checks_host.frameworks_installed():
            asker = threading.Thread(target=lambda: frameworks.update(checks_host.probe_frameworks(quick)),
                                     name="gpunb-check-frameworks", daemon=True)
            asker.start()
        if prober is not None:
            show("the CUDA probe (a subprocess, so this kernel gets no CUDA context)")
            # progress is shown from this thread: output from another thread may land in another cell
            while prober.is_alive() or not probe_events.empty():
                try:
                    step, dev = probe_events.get(timeout=0.1)
                except queue.Empty:
                    continue
                where = f" on cuda:{dev}" if dev is not None else ""
                show(f"{STEP_WORDS.get(step, step)}{where}")  # the views say "running:" themselves
            prober.join()
            inputs.probe = probe_box.get("result")
            _keep_matmul_peaks(inputs, env)
        if launch is not None:
            show(f"an all-reduce across {launch.world_size} GPUs, one subprocess each "
                 f"(stopped after {allreduce_timeout_s:.0f} s)")
            launch.go()
            inputs.allreduce = launch.wait()
            launch = None
        if asker is not None:
            if asker.is_alive() and not quick:
                show("JAX/TensorFlow listing their devices (a subprocess)")
            asker.join()
        inputs.frameworks = frameworks
    finally:
        try:
            children.close()
        finally:
            if launch is not None:  # an error above: the waiting ranks must not outlive the check
                launch.cancel()
    results = tuple(fast[fn] if fn in fast else _one(fn, inputs) for fn, _ in CHECKS)
    return CheckReport(results, time.monotonic() - t0, quick, device, deep=deep)
