"""1,000 load/unload cycles, each with a live monitor drawn in place: nothing may be left behind
(threads, event callbacks, configurables) and memory may not grow."""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc

from IPython.utils.capture import capture_output

from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario

# CI's repeat step (.ci/run) runs this 20 times with fewer cycles each, looking for races
CYCLES = int(os.environ.get("GPUNB_LIFECYCLE_CYCLES", "1000"))


def gpunb_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("gpunb")}


def callbacks(ip) -> int:
    return sum(len(cbs) for cbs in ip.events.callbacks.values())


def one_cycle(ip) -> None:
    import gpunb

    with capture_output():  # the outputs themselves are not what is measured
        ip.run_line_magic("load_ext", "gpunb")
        mon = gpunb.monitor(frontend="live")
        mon._ipython_display_()
        ip.run_line_magic("unload_ext", "gpunb")


def test_a_thousand_load_unload_cycles_with_a_monitor_leave_nothing(ip):
    nvml_module.set_default_session(NvmlSession(scenario("h200")))
    try:
        ip.run_line_magic("unload_ext", "gpunb")  # the fixture loaded it; start from a bare shell
        for _ in range(20):  # warm up: imports, caches, the first display
            one_cycle(ip)
        gc.collect()
        base_threads = gpunb_threads()
        base_callbacks = callbacks(ip)
        base_configurables = len(ip.configurables)
        tracemalloc.start()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.monotonic()
        for _ in range(CYCLES):
            one_cycle(ip)
        took = time.monotonic() - t0
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        # Threads other tests' sessions left idling (they end by themselves) are not ours to count.
        assert gpunb_threads() - base_threads == set()
        assert not [t for t in gpunb_threads() if t.name == "gpunb-sampler"]
        assert callbacks(ip) == base_callbacks
        assert len(ip.configurables) == base_configurables
        assert grown < 2**20, f"{grown / 1024:.0f} KiB more after {CYCLES} cycles ({took:.1f} s)"
    finally:
        ip.run_line_magic("load_ext", "gpunb")  # the fixture unloads it
        nvml_module.set_default_session(None)
