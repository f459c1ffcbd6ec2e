"""What torch is installed, read without importing it (or from the kernel's torch if the
user already imported it), and whether this kernel already holds a CUDA context.

Importing torch costs 3-4 s and is the user's decision; ``torch/version.py`` holds the
build facts as plain assignments, which we read as text.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunb.readings import torch_state


@dataclass(frozen=True)
class TorchBuild:
    installed: bool
    version: str | None = None
    cuda: str | None = None  # CUDA runtime torch was built with ("13.0"); None for CPU/ROCm builds
    hip: str | None = None
    location: str | None = None
    imported: bool = False  # torch is in sys.modules of this process


@dataclass(frozen=True)
class KernelTorchState:
    """Facts from the kernel's own torch; only read when the user already imported it."""

    arch_list: tuple[str, ...] | None  # None: not read before CUDA is up (the probe gives it)
    cudnn_version: int | None
    nccl_version: str | None
    matmul_precision: str
    cuda_initialized: bool
    context_error: str | None  # set when an earlier device-side error poisoned the context


def _version_file_assignments(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return values
    for node in tree.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and value is not None:
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                pass
    return values


def read_torch_build() -> TorchBuild:
    module = sys.modules.get("torch")
    if module is not None and hasattr(module, "version"):
        return TorchBuild(True, module.__version__, module.version.cuda, getattr(module.version, "hip", None),
                          str(Path(module.__file__ or "").parent), imported=True)
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return TorchBuild(False)
    root = Path(next(iter(spec.submodule_search_locations)))
    values = _version_file_assignments(root / "version.py")
    return TorchBuild(True, values.get("__version__"), values.get("cuda"), values.get("hip"), str(root))


def read_kernel_torch_state() -> KernelTorchState | None:
    """Read torch facts in this process without starting CUDA or poisoning fork; None if torch
    is not imported.

    Before CUDA is up only settings are read here. torch's C++ getters behind
    ``torch.cuda.get_arch_list()`` (``_cuda_getArchFlags``) and the CUDA-runtime device count
    call ``poison_fork()`` although they create no context (torch/csrc/cuda/Module.cpp), and
    ``torch.backends.cudnn.version()`` initialized CUDA on the H200 (torch 2.11): after any of
    them ``accelerate.notebook_launcher`` fails with "Cannot re-initialize CUDA in forked
    subprocess". So architectures and library versions come from the subprocess probe until
    the user's own code has started CUDA here."""
    torch = torch_state.imported_torch()
    if torch is None:
        return None
    initialized = torch_state.cuda_initialized(torch)
    arch = None
    cudnn = nccl = None
    context_error = None
    if initialized:
        try:
            flags = torch.cuda.get_arch_list()
            arch = tuple(flags) if flags else None
        except Exception:
            arch = None
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:
            cudnn = None
        try:
            nccl = torch.cuda.nccl.version()
            nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            nccl = None
        try:  # a sticky error (device-side assert, illegal address) makes every CUDA call raise
            torch.cuda.mem_get_info()
        except Exception as exc:
            context_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return KernelTorchState(arch, cudnn, nccl, torch_state.matmul_precision(torch), initialized, context_error)
