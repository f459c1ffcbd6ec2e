"""The one module that talks to NVML (package ``nvidia-ml-py``, module ``pynvml``).

Every NVML call goes through :meth:`NvmlSession.query`, which turns NVML errors into
:class:`Unavailable` values (``not supported``, ``GPU is lost``, ``no permission``...),
so a missing sensor or a dead GPU never becomes a crash in a notebook.

The library is passed in (``lib``): the real ``pynvml`` module by default, or
``gpunb.testing.FakePynvml`` in tests, which implements the same functions from
recorded H200 readings.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

# NVML return codes (nvml.h ``nvmlReturn_t``); duplicated here so that reading them
# does not require the library to be importable.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18

_REASONS = {
    NOT_SUPPORTED: "not supported on this GPU/driver",
    NO_PERMISSION: "no permission",
    DRIVER_NOT_LOADED: "driver not loaded",
    LIBRARY_NOT_FOUND: "NVML library not found",
    FUNCTION_NOT_FOUND: "function not in this driver",
    GPU_IS_LOST: "GPU is lost",
    LIB_RM_VERSION_MISMATCH: "driver/library version mismatch",
}


@dataclass(frozen=True)
class Unavailable:
    """A reading NVML could not give, with the reason in words. Falsy."""

    reason: str
    code: int | None = None

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"n/a ({self.reason})"


def is_available(value: Any) -> bool:
    return not isinstance(value, Unavailable)


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML could be started, and if not: why and what to do."""

    ok: bool
    cause: str = ""
    fix: str = ""
    code: int | None = None


def _error_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _status_for_init_error(code: int | None, message: str) -> NvmlStatus:
    if code == LIBRARY_NOT_FOUND:
        return NvmlStatus(
            False,
            "The NVIDIA driver's NVML library (libnvidia-ml.so.1) was not found: no NVIDIA "
            "driver is installed here, or this container was started without GPU access.",
            "Install the NVIDIA driver (`nvidia-smi` must work), or start the container with "
            "`--gpus all` (Docker) / the NVIDIA container toolkit. On a CPU-only machine this is expected.",
            code,
        )
    if code == DRIVER_NOT_LOADED:
        return NvmlStatus(
            False,
            "The NVIDIA kernel driver is not loaded.",
            "Check `nvidia-smi` and `dmesg | grep -i nvidia`; load the module (`sudo modprobe nvidia`) "
            "or reboot after a driver install.",
            code,
        )
    if code == LIB_RM_VERSION_MISMATCH:
        return NvmlStatus(
            False,
            "The driver was upgraded but the old kernel module is still loaded (library/kernel version mismatch).",
            "Reboot the machine (or reload the nvidia kernel modules).",
            code,
        )
    if code == NO_PERMISSION:
        return NvmlStatus(
            False,
            "No permission to open the NVIDIA device files.",
            "Ask the administrator to add you to the group that owns /dev/nvidia* (often `video`).",
            code,
        )
    return NvmlStatus(False, f"NVML could not start: {message}", "Run `nvidia-smi` to see what the driver says.", code)


class NvmlSession:
    """A started NVML library. Thread-safe: NVML itself is, and init is guarded here."""

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self._status: NvmlStatus | None = None
        self._handles: dict[int, Any] = {}

    # -- life cycle -------------------------------------------------------------
    def start(self) -> NvmlStatus:
        """Load and initialise NVML once; later calls return the same status."""
        with self._lock:
            if self._status is not None:
                return self._status
            if self._lib is None:
                try:
                    import pynvml  # the only import of pynvml in gpunb
                except ImportError:
                    self._status = NvmlStatus(
                        False,
                        "The Python package nvidia-ml-py (module `pynvml`) is not installed.",
                        "`pip install nvidia-ml-py` (not the deprecated `pynvml` package).",
                    )
                    return self._status
                self._lib = pynvml
            try:
                self._lib.nvmlInit()
            except Exception as exc:  # NVMLError and OSError from ctypes
                self._status = _status_for_init_error(_error_code(exc), str(exc))
            else:
                self._status = NvmlStatus(True)
            return self._status

    @property
    def lib(self) -> Any:
        return self._lib

    @property
    def fake(self) -> bool:
        """True when the library is gpunb's recorded fake (tests, ``GPUNB_FAKE_NVML``), not a driver."""
        return bool(getattr(self._lib, "FAKE", False))

    # -- queries ----------------------------------------------------------------
    def query(self, name: str, *args: Any) -> Any:
        """Call ``pynvml.<name>(*args)``; NVML errors come back as :class:`Unavailable`."""
        status = self.start()
        if not status.ok:
            return Unavailable(status.cause, status.code)
        fn: Callable[..., Any] | None = getattr(self._lib, name, None)
        if fn is None:
            return Unavailable(f"{name} missing from nvidia-ml-py (upgrade it)", FUNCTION_NOT_FOUND)
        try:
            value = fn(*args)
        except Exception as exc:
            code = _error_code(exc)
            return Unavailable(_REASONS.get(code, str(exc) or type(exc).__name__), code)
        if isinstance(value, bytes):  # older bindings return bytes for strings
            value = value.decode(errors="replace")
        return value

    def handle(self, index: int) -> Any:
        """The NVML handle of GPU ``index`` (cached), or :class:`Unavailable`."""
        cached = self._handles.get(index)
        if cached is not None:
            return cached
        h = self.query("nvmlDeviceGetHandleByIndex", index)
        if is_available(h):
            self._handles[index] = h
        return h

    def device_query(self, index: int, name: str, *args: Any) -> Any:
        h = self.handle(index)
        if not is_available(h):
            return h
        return self.query(name, h, *args)

    def device_count(self) -> int:
        n = self.query("nvmlDeviceGetCount")
        return n if is_available(n) else 0

    def constant(self, name: str, default: Any = None) -> Any:
        return getattr(self._lib, name, default)


_default_lock = threading.Lock()
_default_session: NvmlSession | None = None


def default_session() -> NvmlSession:
    """The process-wide session. ``GPUNB_FAKE_NVML=<scenario>`` swaps in the recorded
    fake (tests and CI notebooks only; see ``gpunb.testing``)."""
    global _default_session
    with _default_lock:
        if _default_session is None:
            scenario = os.environ.get("GPUNB_FAKE_NVML")
            if scenario:
                from gpunb.testing.fake_nvml import scenario as make_scenario

                _default_session = NvmlSession(make_scenario(scenario))
            else:
                _default_session = NvmlSession()
        return _default_session


def set_default_session(session: NvmlSession | None) -> None:
    """Replace the process-wide session (tests); ``None`` resets to the real library."""
    global _default_session
    with _default_lock:
        _default_session = session
