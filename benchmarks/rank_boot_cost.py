"""What gpunb's rank boot costs a child process that has nothing to do with training (target:
under 5 ms), side by side with the same child without it.

While a ``%%gpuprofile`` cell runs, every process it starts has gpunb's ``sitecustomize`` first
on ``PYTHONPATH`` (``gpunb/analysis/ranks/boot``) and the cell's channel in its environment:
the ranks, and also ``python -c pass`` or any tool the cell calls. Three ways to start
``python -c pass`` are timed, interleaved round by round so machine load hits each alike:

- ``plain``: no gpunb in the environment;
- ``boot``: the boot directory first on ``PYTHONPATH``, a valid channel (as inside the cell);
- ``boot, no torch watch``: the same without a channel (a child that outlived its cell).

The boot file is run from a copy with its bytecode compiled, as an installed package has it
(``pip`` compiles at install; this repository's checkout may run with
``PYTHONDONTWRITEBYTECODE``). ``--source`` times the uncompiled file as well.

    python benchmarks/rank_boot_cost.py [--rounds 40] [--out DIR]

Prints medians and the difference to ``plain``; ``--out`` writes DIR/rank_boot_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "gpunb" / "analysis" / "ranks" / "boot" / "sitecustomize.py"


def _time(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - t0) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--source", action="store_true", help="also time the boot file without its bytecode")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        compiled = Path(work, "compiled")
        compiled.mkdir()
        shutil.copy(BOOT, compiled / "sitecustomize.py")
        py_compile.compile(str(compiled / "sitecustomize.py"), cfile=str(
            compiled / "__pycache__" / f"sitecustomize.{sys.implementation.cache_tag}.pyc"))
        channel = Path(work, "channel")
        channel.mkdir(mode=0o700)
        st = channel.stat()
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUNB_RANK")}
        path = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
        with_channel = {"GPUNB_RANK_CHANNEL": str(channel), "GPUNB_RANK_CHANNEL_ID": f"{st.st_dev}:{st.st_ino}"}
        cases = {
            "plain": dict(base, PYTHONPATH=path),
            "boot": dict(base, PYTHONPATH=str(compiled) + os.pathsep + path, **with_channel),
            "boot, no torch watch": dict(base, PYTHONPATH=str(compiled) + os.pathsep + path),
        }
        if args.source:
            cases["boot, uncompiled"] = dict(base, PYTHONPATH=str(BOOT.parent) + os.pathsep + path,
                                             PYTHONDONTWRITEBYTECODE="1", **with_channel)
        for env in cases.values():  # warm the page cache
            _time(env)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for name, env in cases.items():
                times[name].append(_time(env))
    plain = statistics.median(times["plain"])
    result = {"python": sys.version.split()[0], "rounds": args.rounds, "cases": {}}
    print(f"python -c pass, median of {args.rounds} interleaved runs")
    for name, values in times.items():
        median = statistics.median(values)
        result["cases"][name] = {"median_ms": median, "extra_ms": median - plain,
                                 "p25_ms": statistics.quantiles(values, n=4)[0],
                                 "p75_ms": statistics.quantiles(values, n=4)[2]}
        print(f"  {name:24s} {median:7.1f} ms   {median - plain:+6.1f} ms")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rank_boot_cost.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
