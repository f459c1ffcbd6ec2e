"""Fork safety on real GPUs: after every gpunb feature, ``accelerate.notebook_launcher`` still works.

Found on two H200s: ``notebook_launcher(fn, num_processes=2)`` failed with "Cannot re-initialize
CUDA in forked subprocess" after ``gpunb.check(quick=True)``. Here each feature runs in its own
fresh IPython shell (a subprocess: torch imported, ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, as in the
tutorial), then:

- a forked child reads ``torch._C._cuda_isInBadFork()`` (set in a child only when the parent
  poisoned fork) — it must be False;
- ``notebook_launcher`` forks 2 ranks, each does an NCCL all-reduce on its own GPU, checks the
  sum and says whether it started in a bad fork — it must work.

A control shell calls ``torch.cuda.get_arch_list()`` instead of a gpunb feature: it must come
out poisoned and the launch must fail, which proves the test can see the failure. NVLink
multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).

Run on a machine with >= 2 GPUs (accelerate and IPython installed):
    python -m pytest -m gpu tests/gpu/test_fork_safety_gpu.py -v
The per-feature results go to $GPUNB_RESULTS/fork_safety.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.gpu.results import RESULTS

pytest.importorskip("torch")
pytest.importorskip("IPython")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]


def _gpu_count() -> int:
    """From NVML: this pytest process must not start CUDA to decide whether to run."""
    from gpunb.readings.nvml import NvmlSession

    return NvmlSession().device_count()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() < 2, reason="needs at least 2 GPUs")]

ENV = {
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",  # torch.cuda.is_available()/device_count() ask NVML, as the tutorial sets
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# What each shell runs before the launch: a gpunb feature as a notebook user would use it.
FEATURES = {
    "load_ext": [],
    "gpucheck --quick": [("line", "gpucheck", "--quick")],
    "gpucheck (full)": [("line", "gpucheck", "")],
    "gpucheck --deep": [("line", "gpucheck", "--deep")],  # the NCCL all-reduce runs in subprocesses
    "gpumonitor": [("line", "gpumonitor", "--hz 10"), ("cell", "import time; time.sleep(1.0)")],
    "%%gpuprofile": [("cell_magic", "gpuprofile", "", (  # opens and closes the rank channel
        "model = torch.nn.Linear(64, 8)\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "for _ in range(20):\n"
        "    loss = model(torch.randn(32, 64)).pow(2).mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"))],
    "%gpuprofile on": [("line", "gpuprofile", "on"), ("cell", "y = torch.randn(256, 256) @ torch.randn(256, 256)")],
    "gpumem": [("line", "gpumem", "")],
    "OOM doctor": [("cell", "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 "
                            "has a total capacity of 139.80 GiB of which 12.88 GiB is free.')"),
                   ("line", "gpumem", "--release")],
}
CONTROL = "control: torch.cuda.get_arch_list()"

SHELL = textwrap.dedent('''
    import json, os, sys
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    steps, outdir, port = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    for step in steps:
        kind = step[0]
        if kind == "line":
            ip.run_line_magic(step[1], step[2])
        elif kind == "cell_magic":
            ip.run_cell_magic(step[1], step[2], step[3])
        elif kind == "cell":
            ip.run_cell(step[1])
        elif kind == "python":
            exec(step[1])

    def child_in_bad_fork():
        """torch's flag in a forked child: True only if this process poisoned fork."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, b"1" if torch._C._cuda_isInBadFork() else b"0")
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
        return {b"1": True, b"0": False}.get(got)

    def fn(outdir):
        import datetime
        import torch
        import torch.distributed as dist
        rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
        bad = bool(torch._C._cuda_isInBadFork())
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=90))
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        total = t[0].item()
        dist.destroy_process_group()
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "bad_fork": bad, "sum": total, "expected": world * (world + 1) / 2,
                       "gpu": torch.cuda.get_device_name(rank)}, f)

    result = {"cuda_initialized": torch.cuda.is_initialized(), "child_in_bad_fork": child_in_bad_fork()}
    ip.user_ns.update(fn=fn, _outdir=outdir, _port=port, _launch={})
    ip.run_cell(
        "from accelerate import notebook_launcher\\n"
        "try:\\n"
        "    notebook_launcher(fn, args=(_outdir,), num_processes=2, use_port=_port)\\n"
        "except Exception as e:\\n"
        "    _launch['error'] = f'{type(e).__name__}: {e}'[:4000]\\n")
    result["launch_error"] = ip.user_ns["_launch"].get("error")
    ranks = []
    for name in sorted(os.listdir(outdir)):
        with open(os.path.join(outdir, name)) as f:
            ranks.append(json.load(f))
    result["ranks"] = ranks
    ip.run_line_magic("gpumonitor", "--stop")
    ip.run_line_magic("unload_ext", "gpunb")
    print("RESULT " + json.dumps(result), flush=True)
''')


def _run(name: str, steps: list, port: int, script: Path) -> dict:
    outdir = tempfile.mkdtemp(prefix="gpunb-fork-")
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, str(script), json.dumps(steps), outdir, str(port)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired as exc:
        return {"feature": name, "error": f"timed out after {exc.timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        return {"feature": name, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return {"feature": name, **json.loads(lines[-1][len("RESULT "):])}


@pytest.fixture(scope="module")
def launches() -> dict:
    """Every feature's shell, a few at a time (each launch forks 2 ranks onto the 2 GPUs)."""
    script = Path(tempfile.mkdtemp(prefix="gpunb-fork-")) / "shell.py"
    script.write_text(SHELL)
    jobs = dict(FEATURES)
    jobs[CONTROL] = [("python", "torch.cuda.get_arch_list()")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, name, steps, 29600 + 7 * i, script)
                   for i, (name, steps) in enumerate(jobs.items())}
        done = {name: f.result() for name, f in futures.items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fork_safety.json").write_text(json.dumps(done, indent=2))
    return done


@pytest.mark.parametrize("feature", list(FEATURES))
def test_notebook_launcher_works_after(feature, launches):
    r = launches[feature]
    assert "error" not in r, r
    assert r["cuda_initialized"] is False, r
    assert r["child_in_bad_fork"] is False, r  # gpunb did not poison fork in the kernel
    assert r["launch_error"] is None, r
    assert len(r["ranks"]) == 2, r
    for rank in r["ranks"]:
        assert rank["bad_fork"] is False and rank["sum"] == rank["expected"] == 3.0, rank


def test_the_control_poisons_fork_and_the_launch_fails(launches):
    r = launches[CONTROL]
    assert "error" not in r, r
    assert r["cuda_initialized"] is False  # no CUDA context, and yet...
    assert r["child_in_bad_fork"] is True, r
    assert r["launch_error"] and "CUDA" in r["launch_error"], r
