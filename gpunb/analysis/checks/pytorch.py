"""Checks of the PyTorch side: build vs driver, architectures, libraries, the CUDA probe's
measurements, this kernel's CUDA state, precision settings and allocator configuration."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpunb.analysis.checks.inputs import CheckInputs
from gpunb.analysis.checks.records import CheckResult, Status, worst
from gpunb.analysis.gpu_specs import pcie_gbps, peak_for
from gpunb.analysis.machine import state_of
from gpunb.readings.devices import uuid_key
from gpunb.readings.gpu import GpuInfo
from gpunb.readings.nvml import is_available
from gpunb.units import num, shown

INSTALL_DOC = "https://pytorch.org/get-started/locally/"
COMPAT_DOC = "https://docs.nvidia.com/deploy/cuda-compatibility/"
NEEDS_PROBE = "needs the CUDA probe: run `%gpucheck` without --quick (or `import torch` in this kernel first)"


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:2])


def _facts(inputs: CheckInputs) -> dict[str, Any] | None:
    return inputs.probe.facts if inputs.probe is not None else None


def _probe_missing(check_id: str, title: str, inputs: CheckInputs) -> CheckResult | None:
    """A skip/fail result when the probe's per-device measurements cannot exist."""
    if not inputs.gpus:
        return CheckResult(check_id, title, "skip", "no GPU")
    if not inputs.torch.installed:
        return CheckResult(check_id, title, "skip", "torch is not installed")
    if inputs.probe is None:
        if inputs.quick:
            return CheckResult(check_id, title, "skip", "skipped with --quick (it runs CUDA in a subprocess)")
        return CheckResult(check_id, title, "skip", "CUDA sees no GPU here (see the CUDA_VISIBLE_DEVICES check)")
    if inputs.probe.error:
        return CheckResult(check_id, title, "fail", "the CUDA probe did not finish", {}, inputs.probe.error,
                           "Run `python -c \"import torch; print(torch.randn(1, device='cuda'))\"` in a terminal to "
                           "see the full error.", INSTALL_DOC)
    facts = _facts(inputs) or {}
    if not facts.get("cuda_available"):
        # The torch build check reports this failure with its cause; say it once.
        return CheckResult(check_id, title, "skip", "CUDA is not usable from torch (see the torch build check)")
    return None


def _cuda_ordinal(inputs: CheckInputs, gpu: GpuInfo) -> int | None:
    """Which ``cuda:N`` is this NVML GPU: by the UUID the probe's torch gave each device (as
    DESIGN asks), else by the device map (a MIG slice's UUID is not its parent's)."""
    for dev in (_facts(inputs) or {}).get("devices", []):
        if dev.get("uuid") and isinstance(gpu.uuid, str) and uuid_key(dev["uuid"]) == uuid_key(gpu.uuid):
            return int(dev["index"])
    found = inputs.devices.cuda_indices(gpu.index)
    return found[0] if found else None


def check_torch_build(inputs: CheckInputs) -> CheckResult:
    title = "torch is a CUDA build this driver supports"
    t = inputs.torch
    measured = {"torch_version": t.version, "torch_cuda": t.cuda, "location": t.location}
    driver_cuda = inputs.snapshot.driver.cuda_driver_version
    measured["driver_cuda"] = driver_cuda
    machine = state_of(inputs.snapshot.driver.nvml, len(inputs.snapshot.gpus), t, None, driver_cuda)
    if not t.installed:
        status: Status = "warn" if inputs.has_gpu else "skip"
        summary = machine.sentence if inputs.has_gpu else "torch is not installed"
        why = "Nothing here can train on the GPU without a framework." if inputs.has_gpu else ""
        return CheckResult("torch_cuda", title, status, summary, measured, why,
                           machine.fix if inputs.has_gpu else "", INSTALL_DOC)
    if t.hip:
        return CheckResult("torch_cuda", title, "skip", f"torch {t.version} is a ROCm (AMD) build", measured)
    if not t.cuda:
        if not inputs.has_gpu:
            return CheckResult("torch_cuda", title, "skip", f"torch {t.version} is a CPU build (no GPU here)", measured)
        return CheckResult("torch_cuda", title, "fail", machine.sentence, measured,
                           "This torch has no CUDA support, so nothing can run on the GPU.", machine.fix, INSTALL_DOC)
    summary = f"torch {t.version} built for CUDA {t.cuda}; driver supports CUDA {driver_cuda}"
    facts = _facts(inputs)
    if facts is not None and not facts.get("cuda_available") and inputs.has_gpu:
        return CheckResult("torch_cuda", title, "fail", summary + "; torch cannot use CUDA", measured,
                           facts.get("cuda_error") or "torch.cuda.is_available() is False",
                           "Update the driver or install a torch built for an older CUDA (" + INSTALL_DOC + ").",
                           COMPAT_DOC)
    if not is_available(driver_cuda):
        ran = inputs.probe and facts and facts.get("cuda_available")
        return CheckResult("torch_cuda", title, "ok" if ran else "skip",
                           f"torch {t.version} built for CUDA {t.cuda}; driver CUDA version unknown", measured)
    need, have = _version_tuple(t.cuda), _version_tuple(driver_cuda)
    if have[:1] < need[:1]:
        return CheckResult("torch_cuda", title, "fail", summary, measured,
                           f"The driver supports CUDA up to {driver_cuda}, older than torch's CUDA {t.cuda}: CUDA "
                           "calls fail with 'the NVIDIA driver on your system is too old'.",
                           f"Update the NVIDIA driver to one supporting CUDA {t.cuda}, or install torch built for "
                           f"CUDA {driver_cuda} or older ({INSTALL_DOC}).", COMPAT_DOC)
    if have < need:
        return CheckResult("torch_cuda", title, "warn", summary, measured,
                           f"Driver CUDA {driver_cuda} is older than torch's {t.cuda}; it works through CUDA minor "
                           "version compatibility, but PTX JIT and newer features are unavailable.",
                           "Update the driver when you can.", COMPAT_DOC)
    return CheckResult("torch_cuda", title, "ok", summary, measured, link=COMPAT_DOC)


def _arch_list(inputs: CheckInputs) -> list[str] | None:
    if inputs.kernel_torch is not None and inputs.kernel_torch.arch_list:
        return list(inputs.kernel_torch.arch_list)
    facts = _facts(inputs)
    return facts.get("arch_list") if facts and facts.get("cuda_available") else None


def _arch_support(arch_list: list[str], cc: tuple[int, int]) -> str:
    """'native' (a cubin runs on it), 'ptx' (JIT from PTX on first use) or 'none'."""
    native = ptx = False
    for entry in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", entry)
        if not m:
            continue
        digits, suffix = m.group(2), m.group(3)
        major, minor = int(digits[:-1]), int(digits[-1])
        if m.group(1) == "sm":
            # A cubin runs on the same major with an equal or higher minor; 'a'/'f' variants
            # only on exactly that architecture (CUDA Programming Guide, binary compatibility).
            if (suffix and (major, minor) == cc) or (not suffix and major == cc[0] and minor <= cc[1]):
                native = True
        elif (major, minor) <= cc:
            ptx = True
    return "native" if native else "ptx" if ptx else "none"


def check_torch_arch(inputs: CheckInputs) -> CheckResult:
    title = "torch has kernels for each GPU's architecture"
    if not inputs.gpus or not inputs.torch.installed or not inputs.torch.cuda:
        return CheckResult("torch_arch", title, "skip", "needs a GPU and a CUDA build of torch")
    arch = _arch_list(inputs)
    if arch is None:
        return CheckResult("torch_arch", title, "skip", NEEDS_PROBE)
    statuses: list[Status] = []
    parts: list[str] = []
    for g in inputs.gpus:
        cc = g.compute_capability
        if not is_available(cc):
            statuses.append("skip")
            continue
        support = _arch_support(arch, tuple(cc))
        parts.append(f"GPU{g.index} sm_{cc[0]}{cc[1]}: " + {"native": "native kernels", "ptx": "PTX only (JIT)",
                                                         "none": "NO kernels"}[support])
        verdicts: dict[str, Status] = {"native": "ok", "ptx": "warn", "none": "fail"}
        statuses.append(verdicts[support])
    status = worst(statuses)
    cause = fix = ""
    if status == "fail":
        cause = ("torch was not compiled for this GPU: operations fail with 'no kernel image is available for "
                 "execution on the device'.")
        fix = "Install a torch build that lists this architecture (newer GPUs need newer CUDA builds): " + INSTALL_DOC
    elif status == "warn":
        cause = "Only PTX covers this GPU: kernels are JIT-compiled at first use (slow start, larger memory)."
        fix = "Install a torch build with native kernels for it: " + INSTALL_DOC
    return CheckResult("torch_arch", title, status, "; ".join(parts) + f" (torch has {' '.join(arch)})",
                       {"arch_list": arch}, cause, fix, "https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
                       "index.html#binary-compatibility")


def _cudnn_text(v: int | None) -> str | None:
    if not v:
        return None
    if v >= 90000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def check_cudnn_nccl(inputs: CheckInputs) -> CheckResult:
    title = "cuDNN and NCCL present"
    if not inputs.torch.installed or not inputs.torch.cuda:
        return CheckResult("cudnn_nccl", title, "skip", "needs a CUDA build of torch")
    k, facts = inputs.kernel_torch, _facts(inputs)
    cudnn = (k.cudnn_version if k is not None else None) or (facts or {}).get("cudnn_version")
    nccl = (k.nccl_version if k is not None else None) or (facts or {}).get("nccl_version")
    if k is None and (facts is None or not facts.get("cuda_available")):
        return CheckResult("cudnn_nccl", title, "skip", NEEDS_PROBE)
    missing = [name for name, v in (("cuDNN", cudnn), ("NCCL", nccl)) if not v]
    summary = f"cuDNN {_cudnn_text(cudnn) or 'missing'} · NCCL {nccl or 'missing'}"
    return CheckResult("cudnn_nccl", title, "warn" if missing else "ok", summary,
                       {"cudnn_version": cudnn, "nccl_version": nccl},
                       (f"{' and '.join(missing)} not available in this torch: "
                        + ("convolutions fall back to slow kernels. " if "cuDNN" in missing else "")
                        + ("multi-GPU DistributedDataParallel with the nccl backend is impossible."
                           if "NCCL" in missing else ""))
                       if missing else "",
                       ("Install the official CUDA build of torch, which bundles both: " + INSTALL_DOC)
                       if missing else "",
                       "https://pytorch.org/docs/stable/distributed.html#backends")


# (status, measured part, cause, fix, tip) of one GPU's probe result
Judgement = tuple[Status, str, str, str, str]


def _per_device(check_id: str, title: str, inputs: CheckInputs, step: str,
                judge: Callable[[GpuInfo, dict[str, Any], CheckInputs], Judgement]) -> CheckResult:
    missing = _probe_missing(check_id, title, inputs)
    if missing or inputs.probe is None:  # (a missing probe is one of the reasons it gives)
        return missing or CheckResult(check_id, title, "skip", NEEDS_PROBE)
    probe = inputs.probe
    statuses: list[Status] = []
    parts: list[str] = []
    measured: dict[str, Any] = {}
    causes: list[str] = []
    fixes: list[str] = []
    tips: list[str] = []
    for g in inputs.gpus:
        ordinal = _cuda_ordinal(inputs, g)
        if ordinal is None:
            statuses.append("skip")
            parts.append(f"GPU{g.index}: not visible to CUDA")
            continue
        error = probe.step_error(step, ordinal)
        result = probe.result(step, ordinal)
        if error or result is None:
            statuses.append("fail")
            parts.append(f"GPU{g.index}: failed")
            causes.append(f"GPU{g.index}: {error or 'no result'}")
            fixes.append("A sticky CUDA error or a crash in the subprocess; rerun with CUDA_LAUNCH_BLOCKING=1 in a "
                         "terminal to locate it.")
            continue
        measured[f"gpu{g.index}"] = result
        status, part, cause, fix, tip = judge(g, result, inputs)
        statuses.append(status)
        parts.append(f"GPU{g.index}: {part}")
        causes += [cause] if cause else []
        fixes += [fix] if fix else []
        tips += [tip] if tip else []
    return CheckResult(check_id, title, worst(statuses), "; ".join(parts), measured, " ".join(causes),
                       " ".join(dict.fromkeys(fixes)), tip=" ".join(dict.fromkeys(tips)))


def _first_step_words(r: dict[str, Any]) -> str:
    """The first step's cost and, where the probe timed its parts, what it went to."""
    parts = [(label, r.get(key)) for label, key in (("forward", "first_forward_ms"), ("backward", "first_backward_ms"),
                                                    ("AdamW", "first_optimizer_step_ms"))]
    words = f"first step {num(r['first_step_ms'], 'ms')}"
    if all(v is not None for _, v in parts):
        words += " (" + ", ".join(f"{label} {num(v, 'ms')}" for label, v in parts) + \
                 ": cuBLAS set-up and CUDA loading each kernel on first use)"
    else:
        words += " (kernel loading)"
    return words


def _judge_smoke(g: GpuInfo, r: dict[str, Any], inputs: CheckInputs) -> Judgement:
    context = f"CUDA context {num(r['context_ms'], 'ms')}, " if "context_ms" in r else ""
    part = (f"forward+backward+AdamW step ok: {context}{_first_step_words(r)}, "
            f"then {num(r['step_ms_median'], 'ms', 2)}/step")
    tip = ""
    if r.get("optimizer_import_ms"):
        tip = (f"torch.optim's first optimizer imports torch._dynamo: "
               f"{num(r['optimizer_import_ms'] / 1000, 's', 1)} of Python, once per process (the probe "
               "overlapped it with the GPU measurements); in a notebook the first cell that creates an optimizer "
               "pays it.")
    if not r.get("params_on_gpu"):
        return "fail", part, "Model parameters did not land on the GPU.", "Check `.to('cuda')` support.", tip
    if not r.get("loss_finite"):
        return "fail", part, "The loss of a tiny model was not finite: arithmetic on this GPU is wrong.", \
            "Tell the administrator (hardware fault or broken driver).", tip
    return "ok", part, "", "", tip


def check_smoke(inputs: CheckInputs) -> CheckResult:
    return _per_device("cuda_smoke", "One small success: a training step on CUDA (subprocess)", inputs, "smoke",
                       _judge_smoke)


def _judge_matmul(g: GpuInfo, r: dict[str, Any], inputs: CheckInputs) -> Judgement:
    peak = peak_for(g.name if isinstance(g.name, str) else "")
    labels = (("bf16", "bf16_tflops", "bf16_tflops"), ("TF32", "tf32_tflops", "tf32_tflops"),
              ("fp32", "fp32_tflops", "fp32_tflops"))
    bits: list[str] = []
    status: Status = "ok"
    cause = ""
    for label, key, peak_key in labels:
        value = r.get(key)
        if value is None:
            bits.append(f"{label} n/a")
            continue
        ref = getattr(peak, peak_key) if peak else None
        if ref:
            bits.append(f"{label} {value:.0f} TFLOP/s ({value / ref:.0%} of {ref:.0f} peak)")
            # Large dense matmuls normally reach 60-85 % of datasheet peak; far below means
            # throttling, a shared GPU or a MIG slice.
            if label == "bf16" and value / ref < 0.35 and g.mig_enabled is not True:
                status = "warn"
                cause = (f"bf16 matmul reached only {value / ref:.0%} of this GPU's datasheet peak: the GPU is "
                         "throttled, shared with another job, or power-capped.")
        else:
            bits.append(f"{label} {value:.0f} TFLOP/s")
    tf32, fp32 = r.get("tf32_tflops"), r.get("fp32_tflops")
    tip = ""
    if tf32 and fp32 and tf32 > 1.5 * fp32:
        tip = (f"TF32 ran {tf32 / fp32:.1f}x faster than strict fp32 here: "
               "`torch.set_float32_matmul_precision('high')`, and bf16 autocast for more.")
    fix = "Check the clock-events and other-processes checks; `nvidia-smi -q -d PERFORMANCE`." if cause else ""
    reference = "" if peak else " (no datasheet figure for this GPU)"
    return status, ", ".join(bits) + reference, cause, fix, tip


def check_matmul(inputs: CheckInputs) -> CheckResult:
    return _per_device("matmul_throughput", "Matrix-multiply throughput (bf16, TF32, fp32)", inputs, "matmul",
                       _judge_matmul)


def _judge_copy(g: GpuInfo, r: dict[str, Any], inputs: CheckInputs) -> Judgement:
    pinned, pageable = r.get("pinned_gbps"), r.get("pageable_gbps")
    link_max = (pcie_gbps(g.pcie_gen_max, g.pcie_width_max)
                if is_available(g.pcie_gen_max) and is_available(g.pcie_width_max) else None)
    sample = inputs.sample(g.index)
    current = (f"PCIe gen{sample.pcie_gen} x{sample.pcie_width} now, gen{g.pcie_gen_max} x{g.pcie_width_max} max"
               if is_available(sample.pcie_gen) else "link n/a")
    part = f"pinned {num(pinned, 'GB/s', 1)}, pageable {num(pageable, 'GB/s', 1)} ({current}"
    part += f", {link_max:.0f} GB/s theoretical)" if link_max else ")"
    tip = ""
    if pinned and pageable and pinned > 1.3 * pageable:
        tip = (f"Pinned host memory copied {pinned / pageable:.1f}x faster than pageable: "
               "`DataLoader(..., pin_memory=True)` and `.to('cuda', non_blocking=True)`.")
    if link_max and pinned and pinned < 0.5 * link_max:
        cause = (f"Host-to-device copies reach {pinned / link_max:.0%} of the link's theoretical bandwidth: the "
                 "link trained below its maximum, or the GPU sits behind a slow switch/NUMA node.")
        fix = "Compare `nvidia-smi -q -d PCI` with the slot's rating; tell the administrator."
        return "warn", part, cause, fix, tip
    return "ok", part, "", "", tip


def check_copy(inputs: CheckInputs) -> CheckResult:
    return _per_device("h2d_bandwidth", "Host-to-device copy bandwidth (pinned vs pageable)", inputs, "copy",
                       _judge_copy)


def check_kernel_cuda_state(inputs: CheckInputs) -> CheckResult:
    title = "CUDA state of this kernel"
    link = "https://pytorch.org/docs/stable/notes/multiprocessing.html#cuda-in-multiprocessing"
    k = inputs.kernel_torch
    if not inputs.in_kernel and k is None:
        return CheckResult("kernel_cuda", title, "skip", "not running inside a notebook kernel")
    if k is None:
        return CheckResult("kernel_cuda", title, "ok", "torch not imported in this kernel yet: no CUDA context")
    if k.context_error:
        return CheckResult("kernel_cuda", title, "fail", "CUDA context is poisoned", {"error": k.context_error},
                           "An earlier device-side error (assert, illegal memory access) left this kernel's CUDA "
                           f"context unusable: every CUDA call now fails ({k.context_error}).",
                           "Restart the kernel. To find the failing operation, rerun with "
                           "`%env CUDA_LAUNCH_BLOCKING=1` set before torch touches CUDA.",
                           "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html")
    if k.cuda_initialized:
        return CheckResult("kernel_cuda", title, "warn", "CUDA is already initialized in this kernel",
                           {"cuda_initialized": True},
                           "Fork-based multi-GPU launchers (accelerate.notebook_launcher, "
                           "torch.multiprocessing with fork) fail with 'Cannot re-initialize CUDA in forked "
                           "subprocess'.",
                           "Launch multi-GPU training from a fresh kernel before any cell touches CUDA; single-GPU "
                           "work is unaffected.", link)
    return CheckResult("kernel_cuda", title, "ok", "torch imported, CUDA not initialized yet",
                       {"cuda_initialized": False})


def check_precision(inputs: CheckInputs) -> CheckResult:
    title = "TF32 / bf16 support and matmul precision"
    if not inputs.gpus:
        return CheckResult("precision", title, "skip", "no GPU")
    k, facts = inputs.kernel_torch, _facts(inputs)
    setting = k.matmul_precision if k is not None else (facts or {}).get("matmul_precision")
    parts, tips = [], []
    unread = [g for g in inputs.gpus if not is_available(g.compute_capability)]
    if len(unread) == len(inputs.gpus):  # nothing to judge: not "ok"
        return CheckResult("precision", title, "skip", "; ".join(
            f"GPU{g.index}: compute capability could not be read ({g.compute_capability.reason})" for g in unread))
    for g in inputs.gpus:
        cc = g.compute_capability
        if not is_available(cc):
            parts.append(f"GPU{g.index}: compute capability {cc}")
            continue
        parts.append(f"GPU{g.index}: " + ("TF32 and bf16 supported" if tuple(cc) >= (8, 0)
                                          else "no TF32/bf16 (before Ampere): use fp16 autocast with GradScaler"))
    amp = any(is_available(g.compute_capability) and tuple(g.compute_capability) >= (8, 0) for g in inputs.gpus)
    where = "this kernel" if k is not None else "a fresh process"
    if setting:
        parts.append(f"float32 matmul precision in {where}: {setting!r}")
    if amp and setting == "highest":
        tips.append("fp32 matmuls run without TF32: `torch.set_float32_matmul_precision('high')`; train in bf16 with "
                    "`torch.autocast('cuda', dtype=torch.bfloat16)` (no GradScaler needed).")
    return CheckResult("precision", title, "ok", "; ".join(parts), {"matmul_precision": setting},
                       link="https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices",
                       tip=" ".join(tips))


# Keys torch's caching allocator accepts (torch docs, "Optimizing memory usage with
# PYTORCH_CUDA_ALLOC_CONF", and c10's allocator config parser up to torch 2.13).
_ALLOC_KEYS = {
    "backend", "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
    "garbage_collection_threshold", "expandable_segments", "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb", "pinned_reserve_segment_size_mb",
    "large_segment_size_mb", "graph_capture_record_stream_reuse", "per_process_memory_fraction",
}


def parse_alloc_conf(value: str) -> tuple[dict[str, str], list[str]]:
    """Parse ``key:value,key:value`` (values may hold ``[...]`` lists with commas)."""
    settings, problems = {}, []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,]*)?", value):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition(":")
        key = key.strip()
        if not sep:
            problems.append(f"{shown(item)} has no ':' (expected key:value)")
            continue
        if key not in _ALLOC_KEYS:
            problems.append(f"unknown key {shown(key)}")
        settings[key] = val.strip()
    return settings, problems


def check_alloc_conf(inputs: CheckInputs) -> CheckResult:
    title = "PYTORCH_CUDA_ALLOC_CONF"
    link = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
    name = next((n for n in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if inputs.environ.get(n)), None)
    tip = ("If OOM messages show much 'reserved but unallocated' memory, "
           "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (set before torch starts CUDA) reduces fragmentation.")
    if name is None:
        return CheckResult("alloc_conf", title, "ok", "unset: torch's default caching allocator", {}, link=link,
                           tip=tip)
    raw = inputs.environ[name]
    settings, problems = parse_alloc_conf(raw)
    # Shown cut short: the value (and so its keys and problems) may be huge.
    parsed = ", ".join(f"{k if len(k) <= 40 else shown(k)}={v if len(v) <= 40 else shown(v)}"
                       for k, v in list(settings.items())[:10])
    summary = f"{name}={shown(raw, 80)} → " + (parsed or "nothing") + (
        f" and {len(settings) - 10} more" if len(settings) > 10 else "")
    listed = problems[:5] + ([f"{len(problems) - 5} more problems"] if len(problems) > 5 else [])
    if len(raw) > 4096 or len(settings) > 50:
        settings = {"(value too long to list)": shown(raw, 80)}
    if problems:
        return CheckResult("alloc_conf", title, "warn", summary, {"settings": settings, "problems": listed},
                           "; ".join(listed) + ": torch rejects unrecognized keys with an error at the first CUDA "
                           "allocation.", "Correct the value (keys: " + ", ".join(sorted(_ALLOC_KEYS)) + ").", link)
    if inputs.kernel_torch is not None and inputs.kernel_torch.cuda_initialized:
        tip = "This kernel's CUDA is already initialized: changes to the variable now apply only after a restart."
    return CheckResult("alloc_conf", title, "ok", summary, {"settings": settings}, link=link, tip=tip)

