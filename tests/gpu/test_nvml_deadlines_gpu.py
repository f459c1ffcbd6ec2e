"""NVML with deadlines against the real driver: every reading gpunb takes passes its
shape check (no real value is called malformed), no healthy call is slow enough to be
skipped, a real call made to hang costs a bounded wait, and a forked child still reads
NVML. Writes what it measured to ``$GPUNB_RESULTS/nvml_deadlines_gpu.json``.

Needs an NVIDIA GPU (skips cleanly without one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

pynvml = pytest.importorskip("pynvml")
try:
    pynvml.nvmlInit()
except Exception:  # no driver here
    pytest.skip("no NVIDIA driver here (this test runs on the GPU test machine)", allow_module_level=True)

from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.readings.gpu import read_snapshot  # noqa: E402
from gpunb.readings.nvml import NvmlSession, Unavailable  # noqa: E402

RESULTS: dict = {}


def _results_dir() -> Path:
    path = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    (_results_dir() / "nvml_deadlines_gpu.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def _unavailable_fields(record) -> dict[str, str]:
    return {f.name: getattr(record, f.name).reason for f in dataclasses.fields(record)
            if isinstance(getattr(record, f.name), Unavailable)}


def test_real_readings_pass_their_shape_checks_and_none_is_slow():
    session = NvmlSession()
    try:
        t0 = time.perf_counter()
        snap = read_snapshot(session)
        took = time.perf_counter() - t0
        missing = {f"gpu{g.index} {name}": why for g in snap.gpus for name, why in _unavailable_fields(g).items()}
        missing |= {f"gpu{s.index} {name}": why for s in snap.samples for name, why in _unavailable_fields(s).items()}
        RESULTS["snapshot_s"] = round(took, 4)
        RESULTS["gpus"] = len(snap.gpus)
        RESULTS["unavailable"] = missing
        assert snap.driver.nvml.ok and snap.gpus
        assert not [why for why in missing.values() if "malformed" in why], missing
        assert not [why for why in missing.values() if "answer" in why or "budget" in why], missing
        assert session.trouble() == ()
        assert took < 1.0
    finally:
        session.stop_worker()


def test_the_sampler_on_real_nvml_for_five_seconds_notes_no_timeout():
    session = NvmlSession()
    sampler = Sampler(session, hz=10)
    try:
        sampler.start()
        time.sleep(5.0)
    finally:
        sampler.stop()
        session.stop_worker()
    notes = list(sampler.notes)
    RESULTS["sampler_ticks_5s_at_10hz"] = sampler.ticks
    RESULTS["sampler_notes"] = notes
    RESULTS["sampler_thread_cpu_pct"] = round(100 * sampler.thread_cpu_s / max(sampler.thread_wall_s, 1e-9), 3)
    assert sampler.ticks >= 45
    assert not [n for n in notes if "malformed" in n or "answer" in n or "slowly" in n], notes
    assert session.trouble() == ()


class _OneCallHangs:
    """The real pynvml, except one function that first sleeps (a stuck driver call)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    def __getattr__(self, attr: str):
        real = getattr(pynvml, attr)
        if attr != self.name:
            return real

        def slow(*args):
            time.sleep(self.seconds)
            return real(*args)

        return slow


def test_a_hanging_real_call_costs_a_bounded_wait():
    import gpunb
    from gpunb.readings import nvml as nvml_module

    session = NvmlSession(_OneCallHangs("nvmlDeviceGetPowerUsage", 5.0))
    nvml_module.set_default_session(session)
    try:
        t0 = time.perf_counter()
        report = gpunb.check(quick=True)
        took = time.perf_counter() - t0
    finally:
        nvml_module.set_default_session(None)
    RESULTS["check_quick_with_power_hanging_s"] = round(took, 3)
    RESULTS["power_summary"] = report["power"].summary
    assert took < 2.0
    assert report["power"].status == "skip" and "nvmlDeviceGetPowerUsage" in report["power"].summary
    assert report["temperature"].status in ("ok", "warn", "fail")  # the rest was read


def test_a_forked_child_reads_nvml():
    session = NvmlSession()
    assert session.device_count() >= 1  # the parent's worker thread now runs
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread does not exist here
        try:
            count = session.device_count()
            os.write(write, str(count).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    session.stop_worker()
    assert status == 0 and child and int(child) == session.device_count()
