"""How long ``gpunb.memory()`` and ``gpunb.check(quick=True).to_json()`` take when NVML lists a huge number
of GPU processes (issue 22: with 60,000 they took 5.4 s and 7.5 s; the goal is under 1 s each).

The recorded fake NVML (``GPUNB_FAKE_NVML=h200``) gets its process list from a file
(``GPUNB_FAKE_NVML_PROCESSES``): this script writes one with N processes of other users and times each entry point a
few times in one process, after one warm-up call; once with no process listed and once with N,
each in its own process, side by side. Usage:

    python benchmarks/many_processes.py [--processes 60000] [--repeat 3] [--out DIR]

Prints one line per entry point (median and worst seconds); ``--out`` also writes
``many_processes.json``. No GPU needed: the cost measured is gpunb's own handling of the list.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def process_file(n: int, directory: Path) -> Path:
    """N rows of other processes. The fake, like a driver, drops PIDs that do not run, so the
    rows cycle through the PIDs running here (other than this one)."""
    running = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != os.getpid()]
    rows = [{"gpu": 0, "pid": running[i % len(running)], "used_gpu_memory": (i % 64 + 1) * 2**20,
             "name": f"python{i % 7}"} for i in range(n)]
    path = directory / f"processes-{n}.json"
    path.write_text(json.dumps(rows))
    return path


def timed(fn, repeat: int) -> dict[str, float]:
    fn()  # warm-up: imports, the NVML session
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(times), 3), "worst_s": round(max(times), 3)}


def measure(n: int, repeat: int) -> dict[str, object]:
    """In this process (the fake NVML is chosen at the first NVML read): N processes listed."""
    os.environ["GPUNB_FAKE_NVML"] = "h200"
    os.environ["GPUNB_FAKE_NVML_PROCESSES"] = str(process_file(n, Path(tempfile.mkdtemp(prefix="gpunb-many-"))))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch  # noqa: F401  (a training notebook has it imported: the census and ownership run)

    import gpunb

    return {
        "processes": n,
        "gpunb.memory()": timed(lambda: gpunb.memory(namespace={}), repeat),
        # quick: without the subprocess measurements (CUDA smoke test, matmul speed), which take
        # seconds whatever NVML lists and are timed by benchmarks/check_timing.py
        "gpunb.check(quick=True).to_json()": timed(lambda: gpunb.check(quick=True).to_json(), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: one size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.repeat)))
        return
    results = []
    for n in (0, args.processes):  # side by side: the difference is what the process list costs
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--repeat", str(args.repeat)],
                             capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        for name, value in r.items():
            if isinstance(value, dict):
                print(f"{name:34s} {r['processes']:>7,} GPU processes: median {value['median_s']:.3f} s, "
                      f"worst {value['worst_s']:.3f} s")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "many_processes.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
