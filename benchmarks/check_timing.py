"""How long `%load_ext gpunb`, `%gpucheck --quick` and the full `%gpucheck` take.

Each figure is measured in fresh interpreters (what a user pays in a new kernel), side by
side with `import torch` as the yardstick, in one run. Usage:
    python benchmarks/check_timing.py --out DIR [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

SNIPPETS = {
    "load_ext": """
        import time
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        t = time.perf_counter(); ip.run_line_magic("load_ext", "gpunb"); dt = time.perf_counter() - t
        import sys; assert "torch" not in sys.modules
    """,
    "gpucheck_quick": """
        import time
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance(); ip.run_line_magic("load_ext", "gpunb")
        t = time.perf_counter()
        with capture_output():
            ip.run_line_magic("gpucheck", "--quick")
        dt = time.perf_counter() - t
    """,
    "gpucheck_full": """
        import time
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance(); ip.run_line_magic("load_ext", "gpunb")
        t = time.perf_counter()
        with capture_output():
            ip.run_line_magic("gpucheck", "")
        dt = time.perf_counter() - t
    """,
    "import_torch": """
        import time
        t = time.perf_counter(); import torch; dt = time.perf_counter() - t
    """,
}


def measure(name: str) -> float:
    code = textwrap.dedent(SNIPPETS[name]) + "\nprint(dt)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in SNIPPETS}
    for _ in range(args.repeat):  # interleaved, so drift hits every variant alike
        for name in SNIPPETS:
            if name == "gpucheck_full" and len(runs[name]) >= 2:
                continue  # ~15 s each; two runs are enough
            runs[name].append(measure(name))
    table = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "n": len(v)}
             for name, v in runs.items()}
    base = table["import_torch"]["median_s"]
    print(f"{'what':16} {'median s':>9} {'min s':>7} {'max s':>7} {'/ import torch':>15}")
    for name, row in table.items():
        print(f"{name:16} {row['median_s']:9.3f} {row['min_s']:7.3f} {row['max_s']:7.3f} "
              f"{row['median_s'] / base:15.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_timing.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
