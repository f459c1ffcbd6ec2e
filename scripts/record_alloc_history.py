"""Record torch's allocator history on a GPU for gpunb's tests (issue 24): real snapshots of a
known training cell and of an OOM, run as notebook cells in an IPython shell so the frames carry
the cell file names a notebook gives.

    python3 scripts/record_alloc_history.py OUTDIR

Writes OUTDIR/train_snapshot.pickle (history of cell 3: three Adam steps of an MLP; its biggest
single allocation is line 3, ``wide = torch.randn(8192, 8192)``, 256 MiB),
OUTDIR/oom_snapshot.pickle (history armed, then a cell whose line 2 asks for more than a 20 GiB
cap leaves), and OUTDIR/recording.json (the cells' sources, their IPython file names,
max_memory_allocated, torch and driver versions).
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

shell = InteractiveShell.instance()
CELLS = {
    "setup": """\
import torch, torch.nn as nn
torch.manual_seed(0)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1024, 8192)
        self.fc2 = nn.Linear(8192, 1024)
    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h))
model = MLP().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(4096, 1024, device="cuda")
y = torch.randn(4096, 1024, device="cuda")
torch.cuda.synchronize()
""",
    "arm": """\
torch.cuda.reset_peak_memory_stats()
base_allocated = torch.cuda.memory_allocated()
torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
""",
    "train": """\
for step in range(3):
    opt.zero_grad(set_to_none=True)
    wide = torch.randn(8192, 8192, device="cuda")  # 256 MiB, the cell's biggest single allocation
    h = model.fc1(x)
    out = model.fc2(torch.relu(h)) + wide[:4096, :1024]
    loss = ((out - y) ** 2).mean()
    loss.backward()
    opt.step()
    del wide, h, out
torch.cuda.synchronize()
""",
    "take": """\
peak_allocated = torch.cuda.max_memory_allocated()
train_snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
""",
    "oom_arm": """\
del opt, model
torch.cuda.empty_cache()
torch.cuda.set_per_process_memory_fraction(20 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
keep = torch.empty(12 * 2**30, dtype=torch.uint8, device="cuda")
""",
    "oom": """\
try:
    too_big = torch.empty(10 * 2**30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    oom_error = str(e)
oom_snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
""",
}
for name, src in CELLS.items():
    r = shell.run_cell(src, store_history=True)
    if not r.success:
        print("cell", name, "failed:", r.error_before_exec or r.error_in_exec)
        sys.exit(1)
ns = shell.user_ns
for key in ("train_snapshot", "oom_snapshot"):
    data = pickle.dumps(ns[key])
    (out / f"{key}.pickle").write_bytes(data)
    print(key, len(data), "bytes")
import torch  # noqa: E402


def cell_files(snapshot):
    seen = set()
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            for f in ev.get("frames", []):
                if "ipython-input" in f.get("filename", "") or "ipykernel" in f.get("filename", ""):
                    seen.add(f["filename"])
    return sorted(seen)

info = {
    "cells": CELLS,
    "cell_order": list(CELLS),
    "execution_counts": {name: i + 1 for i, name in enumerate(CELLS)},
    "cell_files_seen": cell_files(ns["train_snapshot"]) + cell_files(ns["oom_snapshot"]),
    "max_memory_allocated_train": ns["peak_allocated"],
    "base_allocated_before_train": ns["base_allocated"],
    "oom_error": ns.get("oom_error"),
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name(0),
    "trace_events": {k: [len(t) for t in ns[k]["device_traces"]] for k in ("train_snapshot", "oom_snapshot")},
    "snapshot_keys": {k: sorted(ns[k]) for k in ("train_snapshot", "oom_snapshot")},
}
(out / "recording.json").write_text(json.dumps(info, indent=1))
print(json.dumps({k: v for k, v in info.items() if k != "cells"}, indent=1))
