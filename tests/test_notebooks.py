"""Every tutorial notebook runs top to bottom in a real kernel (nbclient) without an error, and
what it prints is true on the machine it runs on.

A student meets three states: no GPU at all (a laptop), a GPU beside a CPU-only torch (the first
day's usual mistake), and a GPU with a CUDA torch. The first two run here, on CPU torch, with the
fake NVML's ``no-driver`` and ``h200`` scenarios; the third runs on the GPU machine
(tests/gpu/test_notebooks_gpu.py). In each, the key sentences of the text around the outputs
are checked against the outputs (``TRUE_IN``, ``FALSE_IN``).
"""

import re
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.notebooks
# On the CPU, notebook 5 sees the two H200s of the lent 2-GPU machine as the fake NVML replays
# them (links, peer access): its multi-GPU check and per-rank profile then run their real
# subprocess paths, over gloo.
CPU_ENV = {"05-multi-gpu.ipynb": {"GPUNB_FAKE_NVML": "h200x2-nvlink"}}
CPU_SHOWS = {"05-multi-gpu.ipynb": ("NVLink 4.0 × 18 through NVSwitch", "2 ranks over gloo", "every element of the sum",
                                    "2 ranks reported", "weights identical on every rank: True", "kernel_cuda: ok")}

# The states of a student's machine: the fake NVML scenario each runs under (None: the real GPU;
# "laptop": no fake at all, the real NVML of a machine without a driver, as a student's laptop).
STATES = {"no-gpu": "no-driver", "cpu-torch-beside-a-gpu": "h200", "gpu": None, "laptop": ""}
ON_CPU_TORCH = ("no-gpu", "cpu-torch-beside-a-gpu")
# What tutorial 03 says in every state: the A/Bs it teaches, as `%gpuprofile history --vs` states them,
# and the CPU-noisy bf16 timing as a median with its range (one run said 1.2x, the next 5.9x).
AB_03 = ('"batch 128, workers, pinned" took ', '× the time per sample of "batch 16, 0 workers".',
         '"bf16" took ', '× the time per step of "fp32".', '"log every 100" took ',
         '× the time per step of "print every step".', "as fast as fp32 per sample")
AB_03_CPU = ("the median of 3 runs each; single runs said ",)
# notebook -> state -> sentences its outputs must hold there (each matches the text around it) ...
TRUE_IN: dict[str, dict[str, tuple[str, ...]]] = {
    "01-setup-checklist.ipynb": {
        "no-gpu": ("training on cpu: no NVIDIA GPU on this machine",
                   "we trained on the CPU, so this kernel never started CUDA"),
        "cpu-torch-beside-a-gpu": ("training on cpu: the driver sees a GPU, but torch", "fail  torch_cuda",
                                   "we trained on the CPU, so this kernel never started CUDA"),
        "gpu": ("training on cuda", "we trained on the GPU, so this kernel has started CUDA"),
    },
    "02-vram-discipline.ipynb": {
        state: ("went straight back to the operating system", "KiB per sample", "an 8 GiB GPU would hold about",
                "the error's frames held") for state in ON_CPU_TORCH
    } | {"gpu": ("after torch.cuda.empty_cache()", "recommended:", "torch.OutOfMemoryError")},
    "03-keep-the-gpu-busy.ipynb": {
        "no-gpu": ("no GPU columns: the monitor found no GPU", "no GPU energy counter here",
                   "the comparison is by time only", "%gpuenergy has nothing to measure", *AB_03, *AB_03_CPU),
        "laptop": ("no GPU columns: the monitor found no GPU", "the comparison is by time only", *AB_03, *AB_03_CPU),
        "cpu-torch-beside-a-gpu": ("GPU columns: the GPU was watched, but this kernel trained on the CPU",
                                   "on-cpu", "this kernel trained on the CPU", "the comparison is by time only",
                                   "This kernel's GPU spent", *AB_03, *AB_03_CPU),
        "gpu": ("mJ per sample", "energy per sample", "since %load_ext gpunb", *AB_03),
    },
    # On a laptop the ranks train over gloo on the CPU: the verdict says so, and each failing check is named.
    "05-multi-gpu.ipynb": {
        "laptop": ("multi-process — 2 ranks trained on the CPU", "DDP: 2 ranks, backend gloo",
                   "weights identical on every rank: True"),
    },
}
# ... and sentences that would contradict it there
FALSE_IN: dict[str, dict[str, tuple[str, ...]]] = {
    "01-setup-checklist.ipynb": {"cpu-torch-beside-a-gpu": ("no NVIDIA GPU on this machine",),
                                 "gpu": ("training on cpu", "never started CUDA")},
    "02-vram-discipline.ipynb": {state: ("needs a GPU",) for state in ON_CPU_TORCH},
    "03-keep-the-gpu-busy.ipynb": {state: ("mJ per sample", "no earlier run to compare with") for state in ON_CPU_TORCH}
    | {"cpu-torch-beside-a-gpu": ("no GPU columns", "mJ per sample", "no earlier run to compare with"),
       "gpu": ("no GPU columns", "the comparison is by time only", "nothing to measure",
               "no earlier run to compare with")},
    "05-multi-gpu.ipynb": {"laptop": ("multi-gpu — ",)},
}
# A slow input pipeline is never praised as compute-bound, on any machine (the review saw it on CPU torch).
SLOW_LOADER = ("03-keep-the-gpu-busy.ipynb", '--label "batch 16, 0 workers"')


def execute(path: Path, timeout: int = 600, nb: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` (or ``nb``, read from it: nbclient fills it in place, so a
    caller that passes its own keeps the outputs up to a failure)."""
    nb = nb if nb is not None else nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def unfinished_cell(nb) -> str:
    """The cell a run stopped in (started, no reply): its index and first line."""
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "shell.execute_reply" not in timing:
            return f"cell {i}: {cell.source.splitlines()[0] if cell.source else ''}"
    return "no cell was left unfinished"


def errors(nb) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for cell in nb.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def texts(nb) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for cell in nb.cells for o in cell.get("outputs", []))


def cell_text(nb, marker: str) -> str:
    """The outputs of the first code cell whose source holds ``marker``."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and marker in c.source)
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def untrue_sentences(nb, name: str, state: str) -> list[str]:
    """What the notebook ``name`` failed to say, or said wrongly, in ``state``; empty when its text holds."""
    out = texts(nb)
    wrong = [f"missing in {state}: {s!r}" for s in TRUE_IN.get(name, {}).get(state, ()) if s not in out]
    wrong += [f"untrue in {state}: {s!r}" for s in FALSE_IN.get(name, {}).get(state, ()) if s in out]
    if name == SLOW_LOADER[0]:
        verdict = cell_text(nb, SLOW_LOADER[1]).split("\n")
        if any("compute-bound" in line for line in verdict if line.startswith("gpuprofile In")):
            wrong.append(f"the slow input pipeline was called compute-bound in {state}")
    return wrong


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path, monkeypatch):
    # no GPU: what a laptop shows (notebook 5 gets its recorded two-GPU machine instead)
    for key, value in CPU_ENV.get(path.name, {"GPUNB_FAKE_NVML": STATES["no-gpu"]}).items():
        monkeypatch.setenv(key, value)  # the kernel nbclient starts inherits it
    nb = execute(path)
    assert errors(nb) == []
    out = texts(nb)
    assert "gpunb" in out or "GPU" in out
    for seen in CPU_SHOWS.get(path.name, ()):
        assert seen in out, seen
    if path.name not in CPU_ENV:
        assert untrue_sentences(nb, path.name, "no-gpu") == []


BESIDE_A_GPU = [p for p in NOTEBOOKS if p.name in TRUE_IN and "cpu-torch-beside-a-gpu" in TRUE_IN[p.name]]


def _a_failure_unexplained(nb) -> list[str]:
    """A summary line that counts a failure ("1 fail") must be followed by the failure named."""
    wrong = []
    for cell in nb.cells:
        out = "".join(o.get("text", "") for o in cell.get("outputs", []))
        counted = re.search(r"(\d+) fail\b", out)
        if counted and len(re.findall(r"^  fail \S+: ", out, re.M)) != int(counted.group(1)):
            wrong.append(f"{counted.group(0)} with no failure named: {cell.source.splitlines()[0]}")
    return wrong


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a laptop has no driver; this machine has one")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_true_on_a_plain_laptop(path, monkeypatch):
    """No fake NVML at all: the real library finds no driver, as on a student's laptop (CI's VM)."""
    monkeypatch.delenv("GPUNB_FAKE_NVML", raising=False)
    nb = execute(path)
    assert errors(nb) == []
    assert untrue_sentences(nb, path.name, "laptop") == []
    assert _a_failure_unexplained(nb) == []


@pytest.mark.parametrize("path", BESIDE_A_GPU, ids=[p.name for p in BESIDE_A_GPU])
def test_notebook_is_true_with_a_cpu_torch_beside_a_gpu(path, monkeypatch):
    monkeypatch.setenv("GPUNB_FAKE_NVML", STATES["cpu-torch-beside-a-gpu"])  # a recorded H200; torch is CPU-only
    nb = execute(path)
    assert errors(nb) == []
    assert untrue_sentences(nb, path.name, "cpu-torch-beside-a-gpu") == []


def test_every_tutorial_opens_with_an_install_line_that_works_from_a_checkout():
    """`pip install "gpunb[tutorials]"` fetched nothing of ours (gpunb is not on PyPI; a package of
    that name from someone else would come instead): from a checkout it is `.[tutorials]`, which
    brings JupyterLab to open them (tests/test_packaging.py checks the extra in the built wheel)."""
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=4).cells[0].source
        assert 'pip install ".[tutorials]"' in first and "jupyter lab notebooks" in first, path.name
        assert 'pip install "gpunb[tutorials]"' not in first, path.name


def test_there_are_tutorials():
    assert NOTEBOOKS, "notebooks/ holds the guided tutorials"


# import name -> the distribution the tutorials extra (or gpunb itself) must name for it
PROVIDED_BY = {"sklearn": "scikit-learn", "numpy": "scikit-learn", "psutil": "psutil", "matplotlib": "matplotlib",
               "IPython": "ipython"}
BRING_YOUR_OWN = {"torch", "gpunb"}  # the user's own torch (never installed by gpunb), and gpunb
# Needs torch, so not in the extra: 05's launcher cell tries the import and says `pip install accelerate`.
OPTIONAL = {"accelerate"}


def _imports(source: str) -> list[tuple[str, bool]]:
    """(top-level module, imported inside a try that handles ImportError) for a cell's code."""
    import ast

    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            handles = any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                          for h in node.handlers)
            for child in node.body:
                visit(child, guarded or handles)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], guarded) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module.split(".")[0], guarded))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(code), False)
    return found


def test_the_tutorials_extra_installs_what_the_notebooks_import_and_never_torch():
    import sys

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((NOTEBOOKS[0].parents[1] / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["tutorials"]
    names = {req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
             for req in [*extra, *project["dependencies"]]}
    assert not {"torch", "accelerate"} & {r.split(">")[0].split("=")[0].strip().lower() for r in extra}, (
        "the tutorials extra must not pull torch (it could replace the user's CUDA build)")
    missing = []
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            for module, guarded in _imports(cell.source):
                if guarded or module in BRING_YOUR_OWN | OPTIONAL or module in sys.stdlib_module_names:
                    continue  # an optional import says what is missing itself (accelerate in 05)
                if PROVIDED_BY.get(module, module).lower() not in names:
                    missing.append(f"{path.name}: {module}")
    assert not missing, f"imported by the tutorials, installed by neither gpunb nor gpunb[tutorials]: {missing}"
