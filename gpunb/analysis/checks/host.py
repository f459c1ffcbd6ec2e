"""Checks of the host around the GPU: CPU and RAM, /dev/shm, disk, other frameworks, packages."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from typing import Any

from gpunb.analysis.checks.inputs import CheckInputs
from gpunb.analysis.checks.records import CheckResult, Status
from gpunb.units import gib

DATALOADER_DOC = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"


def check_cpu_ram(inputs: CheckInputs) -> CheckResult:
    h = inputs.host
    cores = h.cpu_affinity or h.cpu_logical
    summary = (f"{cores} CPU core(s) usable ({h.cpu_logical} logical, {h.cpu_physical} physical) · "
               f"RAM {gib(h.ram_available_bytes)} free of {gib(h.ram_total_bytes)}")
    measured = {"cpu_usable": cores, "cpu_logical": h.cpu_logical, "cpu_physical": h.cpu_physical,
                "ram_total_bytes": h.ram_total_bytes, "ram_available_bytes": h.ram_available_bytes}
    low = h.ram_available_bytes < min(2 * 2**30, 0.1 * h.ram_total_bytes)
    tip = (f"DataLoader workers: start with num_workers={max(1, min(8, (cores or 2) - 1))} "
           "(one core stays for the training loop).")
    return CheckResult("host_cpu_ram", "Host CPU cores and RAM", "warn" if low else "ok", summary, measured,
                       "Little free RAM: DataLoader workers and pinned buffers may be killed by the OOM killer."
                       if low else "", "Free memory (other kernels, `%reset`), or use fewer DataLoader workers."
                       if low else "", DATALOADER_DOC, tip)


def check_shm(inputs: CheckInputs) -> CheckResult:
    title = "/dev/shm large enough for DataLoader workers"
    h = inputs.host
    if h.shm_total_bytes is None:
        return CheckResult("shm", title, "skip", "no /dev/shm on this system")
    summary = f"/dev/shm {gib(h.shm_total_bytes)} ({gib(h.shm_free_bytes)} free)"
    measured = {"shm_total_bytes": h.shm_total_bytes, "shm_free_bytes": h.shm_free_bytes}
    if h.shm_total_bytes < 2**30:
        return CheckResult("shm", title, "warn", summary, measured,
                           "DataLoader workers hand batches to the main process through /dev/shm; this small it "
                           "crashes them ('bus error', 'DataLoader worker killed').",
                           "Start the container with `--shm-size=16g` or `--ipc=host`; or set num_workers=0.",
                           DATALOADER_DOC)
    return CheckResult("shm", title, "ok", summary, measured, link=DATALOADER_DOC)


def check_disk(inputs: CheckInputs) -> CheckResult:
    h = inputs.host
    title = "Free disk space for checkpoints"
    if h.cwd_deleted:
        return CheckResult("disk", title, "warn", "the current directory was deleted: its disk space cannot be read",
                           {"path": None}, "The directory this process runs in no longer exists: saving a checkpoint "
                           "or reading data by a relative path fails with FileNotFoundError.",
                           "Change to an existing directory (`%cd ~` in a notebook, `cd ~` in a shell), then "
                           "run the check again.")
    if h.disk_free_bytes is None:
        return CheckResult("disk", title, "skip", f"cannot read disk usage of {h.disk_path}")
    summary = f"{gib(h.disk_free_bytes)} free of {gib(h.disk_total_bytes)} at {h.disk_path}"
    measured = {"path": h.disk_path, "free_bytes": h.disk_free_bytes, "total_bytes": h.disk_total_bytes}
    if h.disk_free_bytes < 10 * 2**30:
        return CheckResult("disk", title, "fail" if h.disk_free_bytes < 2**30 else "warn", summary, measured,
                           "Little disk space: checkpoints and datasets may fail to save mid-training.",
                           "Free space or save checkpoints to another volume.")
    return CheckResult("disk", title, "ok", summary, measured)


_FRAMEWORK_PROBES = {
    "jax": "import jax, json; print(json.dumps([d.platform + ':' + str(d.id) for d in jax.devices()]))",
    "tensorflow": "import tensorflow as tf, json; "
                  "print(json.dumps([d.name for d in tf.config.list_physical_devices('GPU')]))",
}


def frameworks_installed() -> list[str]:
    return [name for name in _FRAMEWORK_PROBES if importlib.util.find_spec(name) is not None]


def probe_frameworks(quick: bool, timeout_s: float = 90.0) -> dict[str, Any]:
    """JAX/TensorFlow: installed version, and (unless quick) the devices each sees, in a subprocess."""
    found = {}
    for name in frameworks_installed():
        code = _FRAMEWORK_PROBES[name]
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        entry: dict[str, Any] = {"version": version}
        if not quick:
            try:
                done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
                lines = done.stdout.strip().splitlines()
                entry["devices"] = lines[-1] if done.returncode == 0 and lines else None
                if done.returncode != 0:
                    entry["error"] = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            except subprocess.TimeoutExpired:
                entry["error"] = f"no answer within {timeout_s:.0f} s"
        found[name] = entry
    return found


def check_frameworks(inputs: CheckInputs) -> CheckResult:
    title = "JAX / TensorFlow see the GPU (report only)"
    if not inputs.frameworks:
        return CheckResult("frameworks", title, "skip", "neither JAX nor TensorFlow is installed")
    parts = []
    for name, e in inputs.frameworks.items():
        if "devices" in e and e["devices"] is not None:
            parts.append(f"{name} {e['version']}: devices {e['devices']}")
        elif "error" in e:
            parts.append(f"{name} {e['version']}: could not list devices ({e['error']})")
        else:
            parts.append(f"{name} {e['version']} installed (devices not probed with --quick)")
    return CheckResult("frameworks", title, "ok", "; ".join(parts), dict(inputs.frameworks),
                       tip="Several frameworks in one process each reserve GPU memory (JAX preallocates 75 %: "
                           "XLA_PYTHON_CLIENT_PREALLOCATE=false).")


def check_nvml_package(inputs: CheckInputs) -> CheckResult:
    title = "NVML Python bindings"
    try:
        version = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        importlib.metadata.version("pynvml")
        deprecated = True
    except importlib.metadata.PackageNotFoundError:
        deprecated = False
    summary = f"nvidia-ml-py {version or 'missing'}" + (
        " · deprecated `pynvml` package also installed" if deprecated else "")
    status: Status = "warn" if deprecated or version is None else "ok"
    return CheckResult("nvml_package", title, status, summary, {"nvidia_ml_py": version, "pynvml_dist": deprecated},
                       "The deprecated `pynvml` distribution prints FutureWarnings at `import torch` and can shadow "
                       "NVIDIA's module." if deprecated else ("nvidia-ml-py is missing." if version is None else ""),
                       "`pip uninstall pynvml` (nvidia-ml-py provides `import pynvml`)." if deprecated
                       else ("`pip install nvidia-ml-py`." if version is None else ""),
                       "https://pypi.org/project/nvidia-ml-py/")
