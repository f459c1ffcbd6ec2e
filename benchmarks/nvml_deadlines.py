"""What NVML calls with deadlines cost: a call made directly on pynvml, the same call
through ``NvmlSession.query`` (one hop to the worker thread and back), a whole GPU sample
through ``NvmlSession.run`` (one hop for ~14 calls), the check's snapshot and a sampler
tick; then the same with a training-like Python loop holding the GIL in the main thread
(the case where thread hops cost most). Side by side in one run. Usage:
    python benchmarks/nvml_deadlines.py --out DIR [--calls 2000] [--fake]
``--fake`` uses the recorded fake NVML (no GPU needed; a smoke test of the script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path


def _per_call_us(fn, n: int) -> dict:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return {"median_us": round(statistics.median(times), 2), "p99_us": round(times[int(0.99 * (len(times) - 1))], 2)}


def measure(n: int, fake: bool) -> dict:
    from gpunb.analysis.monitor.sampler import Sampler
    from gpunb.readings.gpu import read_sample, read_snapshot, unread_sample
    from gpunb.readings.nvml import NvmlSession

    if fake:
        from gpunb.testing import scenario

        lib = scenario("h200")
    else:
        import pynvml as lib
    session = NvmlSession(lib)
    assert session.start().ok, session.start().cause
    lib.nvmlInit()  # the direct calls need their own init (NVML counts them)
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    sampler = Sampler(session, hz=2)
    cases = {
        "direct nvmlDeviceGetTemperature": lambda: lib.nvmlDeviceGetTemperature(handle, 0),
        "session.query nvmlDeviceGetTemperature (one hop)": lambda: session.device_query(
            0, "nvmlDeviceGetTemperature", 0),
        "direct read_sample (14 calls)": lambda: read_sample(_Direct(lib, handle), 0),
        "session.run read_sample (one hop)": lambda: session.run(
            read_sample, session, 0, fallback=lambda why: unread_sample(0, 0.0, why)),
        "read_snapshot (the check's NVML part)": lambda: read_snapshot(session),
        "sampler tick (NVML and host)": sampler.tick,
    }
    out = {}
    for name, fn in cases.items():
        fn()  # warm
        out[name] = _per_call_us(fn, n if "snapshot" not in name and "tick" not in name else max(50, n // 20))
    # The same with the main thread busy in Python (a launch-bound training loop holds the GIL).
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    busy = threading.Thread(target=spin, daemon=True)
    busy.start()
    try:
        for name in ("session.query nvmlDeviceGetTemperature (one hop)", "session.run read_sample (one hop)",
                     "sampler tick (NVML and host)"):
            out[name + ", GIL busy"] = _per_call_us(cases[name], max(50, n // 20))
    finally:
        stop.set()
        busy.join()
    out["trouble after the run"] = list(session.trouble())
    session.stop_worker()
    return out


class _Direct:
    """The session interface over pynvml without the worker (the pre-deadline way)."""

    def __init__(self, lib, handle) -> None:
        self.lib, self.h = lib, handle

    def device_query(self, index, name, *args):
        try:
            return getattr(self.lib, name)(self.h, *args)
        except Exception as exc:  # as the old query helper did: errors become values
            from gpunb.readings.nvml import Unavailable

            return Unavailable(str(exc), getattr(exc, "value", None))

    def constant(self, name, default=None):
        return getattr(self.lib, name, default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for nvml_deadlines.json")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--fake", action="store_true", help="use the recorded fake NVML (no GPU)")
    args = parser.parse_args()
    result = {"fake": args.fake, "when": time.strftime("%Y-%m-%d %H:%M"), "cases": measure(args.calls, args.fake)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nvml_deadlines.json").write_text(json.dumps(result, indent=2))
    for name, value in result["cases"].items():
        print(f"{name:60} {value}")


if __name__ == "__main__":
    main()
