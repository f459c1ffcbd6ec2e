"""A :class:`~gpunb.analysis.holders.gpus.HoldersReport` in Prometheus' text format.

Written with ``prometheus_client`` (a custom collector of ``GaugeMetricFamily``), so the
escaping of label values (notebook paths are the user's words) and the format itself are
the library's. GPU series carry the ``gpu`` (index) and ``UUID`` labels that NVIDIA's
dcgm-exporter uses, so a lab can join them with its existing DCGM series; per-kernel
series add ``kernel_id`` and ``path`` (the notebook). A reading NVML cannot give is left
out rather than exported as 0.

Label values are the user's words (notebook paths) and NVML's strings: control characters in
them (``\r``, ``\n``, escape sequences) are replaced by U+FFFD before they reach the text, so no
label can forge a line of the exposition or of a log that quotes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunb.analysis.holders.gpus import KERNEL, KERNEL_CHILD, HoldersReport
from gpunb.readings.gpu import CLOCK_EVENT_REASONS

GPU_LABELS = ("gpu", "UUID", "modelName")
KERNEL_LABELS = ("kernel_id", "path", "kernel_name")


def clean_label(value: object) -> str:
    """A label value without control characters (each becomes U+FFFD)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else "\ufffd" for ch in text)


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> Any:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, doc, labels=list(labels))  # exposed as <name>_total


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, doc, labels=list(labels))


class ReportCollector:
    """Yields the metric families of one report (a collector for one scrape)."""

    def __init__(self, report: HoldersReport) -> None:
        self.report = report

    def collect(self) -> Iterator[Any]:
        r = self.report
        up = _gauge("gpunb_nvml_up", "1 when NVML answered (the NVIDIA driver is reachable), else 0.", ())
        up.add_metric([], 1.0 if r.nvml_ok else 0.0)
        yield up
        fake = _gauge("gpunb_fake_backend", "1 when gpunb's test stand-ins (GPUNB_FAKE_*) answer instead of the "
                      "driver: every figure here is then a recording, not this machine.", ())
        fake.add_metric([], 1.0 if r.fake else 0.0)
        yield fake

        per_gpu = {
            "memory_total_bytes": ("gpunb_gpu_memory_total_bytes", "Total GPU memory (NVML).", 1),
            "memory_used_bytes": ("gpunb_gpu_memory_used_bytes", "GPU memory in use by all processes (NVML).", 1),
            "memory_free_bytes": ("gpunb_gpu_memory_free_bytes", "Free GPU memory (NVML).", 1),
            "util_gpu_pct": ("gpunb_gpu_utilization_ratio",
                             "Share of the last sample period in which a kernel ran on the GPU (0-1).", 0.01),
            "util_memory_pct": ("gpunb_gpu_memory_utilization_ratio",
                                "Share of the last sample period in which GPU memory was read or written (0-1).", 0.01),
            "power_w": ("gpunb_gpu_power_watts", "Power draw.", 1),
            "power_limit_w": ("gpunb_gpu_power_limit_watts", "Enforced power limit.", 1),
            "temp_c": ("gpunb_gpu_temperature_celsius", "GPU core temperature.", 1),
            "sm_clock_mhz": ("gpunb_gpu_sm_clock_hertz", "SM clock.", 1e6),
            "clock_event_reasons": ("gpunb_gpu_clock_event_reasons",
                                    "Active clock-event (throttle) reasons as NVML's bitmask.", 1),
        }
        families = {key: _gauge(name, doc, GPU_LABELS) for key, (name, doc, _) in per_gpu.items()}
        active = _gauge("gpunb_gpu_clock_event_active",
                        "1 while this clock-event (throttle) reason holds the clocks back, else 0.",
                        (*GPU_LABELS, "reason"))
        lost = _gauge("gpunb_gpu_lost", "1 when the GPU has fallen off the bus (NVML: GPU is lost).", GPU_LABELS)
        other = _gauge("gpunb_gpu_other_memory_bytes",
                       "GPU memory held by processes that are not kernels of this Jupyter server, by kind "
                       "(other-kernel, process, not-visible, pid-namespace).", (*GPU_LABELS, "kind"))
        kernel_mem = _gauge("gpunb_kernel_gpu_memory_bytes",
                            "GPU memory held by a kernel of this Jupyter server and its child processes.",
                            GPU_LABELS + KERNEL_LABELS)
        energy = _counter("gpunb_gpu_energy_joules",
                          "Energy the GPU used since the NVIDIA driver loaded (NVML's energy counter).", GPU_LABELS)
        kernel_energy = _counter("gpunb_kernel_gpu_energy_joules",
                                 "A kernel's share of the GPU's energy while it held the GPU, since this server "
                                 "first saw it: split equally among every process NVML listed on the GPU at both "
                                 "ends of each interval between two reports, other users' processes included, so "
                                 "another user's load on the same GPU moves it (the JSON API's "
                                 "energy_shared_with names them).", GPU_LABELS + KERNEL_LABELS)
        idle_energy = _gauge("gpunb_kernel_gpu_idle_energy_joules",
                             "A kernel's share of the GPU's energy in its current idle stretch (0 again once it "
                             "runs code).", GPU_LABELS + KERNEL_LABELS)
        kernels_by_id = {use.kernel.kernel_id: use.kernel for use in r.kernels}
        for d in r.devices:
            labels = [str(d.index), clean_label(d.uuid), clean_label(d.name)]
            lost.add_metric(labels, 1.0 if d.lost else 0.0)
            if d.energy_mj is not None:
                energy.add_metric(labels, d.energy_mj / 1000.0)
            for h in d.holders:
                k = kernels_by_id.get(h.kernel_id)
                if h.energy_j is not None and k is not None:
                    kernel_energy.add_metric([*labels, *_kernel_labels(k)], h.energy_j)
                    idle_energy.add_metric([*labels, *_kernel_labels(k)], h.idle_energy_j or 0.0)
            for key, (_, _, scale) in per_gpu.items():
                value = getattr(d, key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    families[key].add_metric(labels, float(value) * scale)
            if isinstance(d.clock_event_reasons, int):
                for bit, short, _ in CLOCK_EVENT_REASONS:
                    active.add_metric([*labels, short], 1.0 if d.clock_event_reasons & bit else 0.0)
            by_kind: dict[str, float] = {}
            by_kernel: dict[str, float] = {}
            for h in d.holders:
                if h.used_bytes is None:
                    continue
                if h.kind in (KERNEL, KERNEL_CHILD):
                    by_kernel[h.kernel_id] = by_kernel.get(h.kernel_id, 0.0) + h.used_bytes
                else:
                    by_kind[h.kind] = by_kind.get(h.kind, 0.0) + h.used_bytes
            for kind, value in sorted(by_kind.items()):
                other.add_metric([*labels, kind], value)
            for use in r.kernels:
                if use.kernel.kernel_id in by_kernel:
                    k = use.kernel
                    kernel_mem.add_metric([*labels, *_kernel_labels(k)], by_kernel[k.kernel_id])
        yield from families.values()
        yield from (active, lost, other, kernel_mem, energy, kernel_energy, idle_energy)

        busy = _gauge("gpunb_kernel_busy", "1 while the kernel runs code (execution state busy), else 0.",
                      KERNEL_LABELS)
        activity = _gauge("gpunb_kernel_last_activity_timestamp_seconds",
                          "Unix time of the kernel's last activity (as the Jupyter server records it).",
                          KERNEL_LABELS)
        cuda = _gauge("gpunb_kernel_cuda_context",
                      "1 when the kernel or a child holds a CUDA context (NVIDIA unified-memory device open).",
                      KERNEL_LABELS)
        for use in r.kernels:
            k = use.kernel
            labels = _kernel_labels(k)
            busy.add_metric(labels, 1.0 if k.execution_state == "busy" else 0.0)
            if k.last_activity_unix is not None:
                activity.add_metric(labels, k.last_activity_unix)
            if use.has_cuda_context is not None:
                cuda.add_metric(labels, 1.0 if use.has_cuda_context else 0.0)
        yield from (busy, activity, cuda)


def _kernel_labels(k: Any) -> list[str]:
    return [clean_label(k.kernel_id), clean_label(k.path), clean_label(k.spec_name)]


def metrics_text(report: HoldersReport) -> tuple[bytes, str]:
    """(body, content type) of one scrape."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(report))
    return generate_latest(registry), CONTENT_TYPE_LATEST
