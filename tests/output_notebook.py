"""A notebook with every gpunb view, run for real by nbclient (the way CI, a colleague or a
workshop handout produces a notebook someone else opens untrusted).

The kernel reads the fake NVML (``GPUNB_FAKE_NVML``: real H200 readings replayed) and trains
with CPU torch. ``%gpufit`` needs a GPU, so its cell shows the result recorded on the H200
(``benchmarks/results/h200x2_batch_fit_zoo_run1.json``, the transformer) through the same
record and view; the OOM doctor reads the message recorded on the H200. Used by the browser tests and by
``scripts/screenshots.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE_SVG = "gpunb-probe-svg"  # an inline <svg> the sanitizer of an untrusted notebook removes

TRAINING_CELL = """%%gpuprofile --label "MLP, batch 128"
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
X = torch.randn(8000, 256); y = (X[:, :8].sum(1) > 0).long()
dl = DataLoader(TensorDataset(X, y), batch_size=128, shuffle=True)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
opt = torch.optim.AdamW(model.parameters(), 1e-3)
for epoch in range(4):
    for xb, yb in dl:
        opt.zero_grad(); nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
    print("epoch", epoch)"""

FIT_REPLAY = """# %gpufit needs a GPU: this is its result on the H200 (the transformer of the batch-fit zoo,
# benchmarks/results/h200x2_batch_fit_zoo_run1.json), shown by the same record and view
import dataclasses, json
from gpunb.analysis.fit.records import BatchFit, Line, Trial
zoo = json.load(open(RESULTS + "/h200x2_batch_fit_zoo_run1.json"))
run = next(m for m in zoo["models"] if m["model"] == "transformer")["finders"]["gpufit"]["fit"]
run.setdefault("verified", run.get("max_batch"))  # recorded before the field got its present name
known = lambda cls, d: {k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}}
line = lambda d: Line(d["intercept_bytes"], d["slope_bytes_per_sample"]) if d else None
fit = dataclasses.replace(BatchFit(**known(BatchFit, run)),
                          trials=tuple(Trial(**known(Trial, t)) for t in run["trials"]),
                          line_reserved=line(run["line_reserved"]), line_allocated=line(run["line_allocated"]))
fit"""

OOM_REPLAY = """# the out-of-memory message recorded on the H200, raised here so the doctor reads it
import gpunb.testing
raise torch.OutOfMemoryError(gpunb.testing.load_trace()["oom_message"])"""

TRACE_SETUP = """# %%gpumem --trace needs a GPU: the next cell's magic reads the allocation history recorded on
# an H200 (a 3-step MLP cell, In [3] of tests/data/alloc_history/) instead of this CPU torch's
import gpunb.readings.torch_state as torch_state
from tests.simulated_alloc_history import cache_cell_sources, recorded_torch
get_ipython().compile._filename_map.update(cache_cell_sources())
cpu_torch_state = torch_state.imported_torch
torch_state.imported_torch = recorded_torch"""

TRACE_CELL = """%%gpumem --trace
for step in range(3):
    print(f"step {step}: loss {0.9 - 0.2 * step:.1f}")"""

TRACE_RESTORE = "torch_state.imported_torch = cpu_torch_state"

OOM_SITES_REPLAY = """# the OOM doctor with the allocation history armed (%gpumem --trace on): the OOM recorded on
# the H200 (In [5] keeps 12 GiB, In [6] asks 10 GiB), diagnosed with the recorded history
from gpunb.analysis.memory.oom import diagnose
from gpunb.readings.alloc_history import HistoryRecording
from gpunb.shells.oom_hook import _add_sites
from tests.simulated_alloc_history import RECORDING, HistoryCuda, HistoryTorch, cache_cell_sources, oom_snapshot
get_ipython().compile._filename_map.update(cache_cell_sources())
armed = HistoryTorch(HistoryCuda(oom_snapshot(), baseline=12 * 2**30, peak=12 * 2**30))
doctor = diagnose(RuntimeError(RECORDING["oom_error"]))
_add_sites(get_ipython(), doctor, HistoryRecording(armed), armed)
doctor"""

LEAK_CELL = """%%gpuprofile --label "keeps every step's logits"
all_logits = []
for step in range(400):
    logits = model(X[:256])
    loss = nn.functional.cross_entropy(logits, y[:256])
    opt.zero_grad(); loss.backward(); opt.step()
    all_logits.append(logits)  # each step's graph stays alive: the leak finder names it"""

# (name, source, tags): the name is how tests and the screenshot script find a cell's output.
CELLS: list[tuple[str, str, tuple[str, ...]]] = [
    ("load", f"%load_ext gpunb\nRESULTS = {str(ROOT / 'benchmarks' / 'results')!r}", ()),
    ("check", "%gpucheck --quick", ()),
    ("monitor", "%gpumonitor --hz 4 --window 60", ()),
    ("profile", TRAINING_CELL, ()),
    ("one-line on", "%gpuprofile on", ()),
    ("one-line cell", "evaluation = model(X[:2000]).argmax(1).eq(y[:2000]).float().mean().item()", ()),
    ("one-line off", "%gpuprofile off", ()),
    ("history", "%gpuprofile history", ()),
    ("memory", "%gpumem", ()),
    ("fit", FIT_REPLAY, ()),
    ("oom", OOM_REPLAY, ("raises-exception",)),
    ("trace setup", TRACE_SETUP, ()),
    ("trace", TRACE_CELL, ()),
    ("trace restore", TRACE_RESTORE, ()),
    ("oom-sites", OOM_SITES_REPLAY, ()),
    ("leak", LEAK_CELL, ()),
    ("energy", "%gpuenergy --price 0.25/kWh --carbon 350g/kWh", ()),
    ("stop", "%gpumonitor --stop", ()),
    ("probe", f"from IPython.display import HTML\n"
              f"HTML('<svg class=\"{PROBE_SVG}\" width=\"8\" height=\"8\">"
              f"<rect width=\"8\" height=\"8\"/></svg>')", ()),
]
INDEX = {name: i for i, (name, _, _) in enumerate(CELLS)}


def build_and_run(path: Path, scenario: str = "two-gpus", timeout: int = 300,
                  cells: list[tuple[str, str, tuple[str, ...]]] | None = None) -> Path:
    """Write the notebook of ``cells`` (default :data:`CELLS`) to ``path`` after nbclient ran
    it in a kernel reading ``scenario`` (unsigned: whoever opens it sees it untrusted)."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook()
    for name, source, tags in cells if cells is not None else CELLS:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = list(tags)
        cell.metadata["gpunb"] = name
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    # The recording's GPU is idle for its first 6 s and holds 2 GiB from 6.2 to 14.4 s. %gpumem ran
    # 5.6-7.1 s into the notebook (CI missed its chart once): from 4 s on it reads 2 GiB with 3 s to spare.
    env = {"GPUNB_FAKE_NVML": scenario, "GPUNB_FAKE_NVML_FROM_S": "4",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nbformat.write(nb, path)
    return path
