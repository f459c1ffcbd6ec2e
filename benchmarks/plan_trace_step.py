"""One steady training step of a ``plan_zoo`` model on a GPU, every allocation and free with its
Python frames (torch's allocation history): to find what the plan misses where it is low.

    python benchmarks/plan_trace_step.py MODEL BATCH --out DIR   # writes DIR/trace_MODEL_BATCH.json

The JSON: ``peak`` (``max_memory_allocated`` of the step), ``events``: ``[action, address, size,
frames]`` (``a`` alloc, ``f`` free requested; frames innermost first, ``file:line:function``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import plan_zoo
    import torch

    model = plan_zoo.build(args.model, "cuda")
    model.step(args.batch)  # the first step: the optimizer's state, cuBLAS's workspaces
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all", max_entries=200000)
    model.step(args.batch)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [[e["action"][0], e["addr"], e["size"],
               [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in (e.get("frames") or [])][:12]]
              for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    path = Path(args.out) / f"trace_{args.model}_{args.batch}.json"
    path.write_text(json.dumps({"peak": torch.cuda.max_memory_allocated(), "events": events}))
    print(args.model, args.batch, torch.cuda.max_memory_allocated(), len(events), "events ->", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
