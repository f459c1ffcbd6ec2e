"""Several GPUs for real (issue 10): the multi-GPU check, the per-rank profile, tutorial 05.

- ``%gpucheck --deep`` on the real pair: the links gpunb reads from NVML agree with
  ``nvidia-smi topo -m``; the NCCL all-reduce (one subprocess per GPU) sums right and its bus
  bandwidth is measured against the link;
- ``%%gpuprofile`` on a cell that starts DDP training with torchrun (fresh interpreters) and
  with ``accelerate.notebook_launcher`` (forked from a kernel without CUDA): every rank reports
  CUDA-event step times, its peak VRAM from its allocator and from NVML, DDP's all-reduce time;
  one rank gets twice the batch, and the report must name it as the one the others wait for;
- tutorial 05 executed by nbclient, both launches inside it.

NVLink multicast stays off everywhere (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1). Run on a machine with >= 2 GPUs (accelerate, IPython, nbclient):
    python -m pytest -m gpu tests/gpu/test_multi_gpu.py -v
Figures and reports go to $GPUNB_RESULTS (multi_gpu_*.json/.txt, executed-05-multi-gpu.ipynb).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.gpu.results import RESULTS

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)  # for every process these tests start


def _gpu_count() -> int:
    """From NVML: deciding whether to run must not start CUDA here."""
    from gpunb.readings.nvml import NvmlSession

    return NvmlSession().device_count()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() < 2, reason="needs at least 2 GPUs")]


def _save(name: str, data) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        (RESULTS / name).write_text(data)
    else:
        (RESULTS / name).write_text(json.dumps(data, indent=2, default=str))


def _smi_link() -> str:
    """GPU0's cell for GPU1 in `nvidia-smi topo -m` (NV18, PIX, NODE, ...)."""
    out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)
    row = next(line for line in out.splitlines() if line.startswith("GPU0"))
    return row.split()[2]


def test_deep_check_on_the_real_pair():
    import gpunb

    report = gpunb.check(deep=True, in_kernel=False)
    _save("multi_gpu_check.json", report.to_dict())
    _save("multi_gpu_check.txt", str(report))
    links, nccl = report["gpu_links"], report["nccl_allreduce"]
    smi = _smi_link()
    pair = links.measured["gpu0-gpu1"]
    if smi.startswith("NV"):
        assert pair["nvlinks"] == int(smi[2:]), (smi, pair)  # gpunb's NVML reading = nvidia-smi's matrix
        assert links.status == "ok", links.to_dict()
    else:
        assert pair["nvlinks"] == 0 and pair["topology"] == smi, (smi, pair)
    assert nccl.status == "ok", nccl.to_dict()
    m = nccl.measured
    assert m["backend"] == "nccl" and m["world_size"] == _gpu_count()
    assert m["sizes"] and all(s["busbw_gbs"] > 0 and s["wrong"] == 0 for s in m["sizes"])
    assert m["expected_gbps"] and 0.05 < m["share_of_link"] < 1.5, m
    assert report["kernel_cuda"].status in ("ok", "skip")


DDP_TRAIN = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    x = torch.randn(512 * (2 if rank == 1 else 1), 4096, device="cuda")   # rank 1 gets twice the batch
    for _ in range(300):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    torch.cuda.synchronize()
    dist.destroy_process_group()
""")


def _check_ranks(ranks: dict, launcher: str) -> None:
    rows = ranks["ranks"]
    assert [r["rank"] for r in rows] == [0, 1], rows
    for r in rows:
        assert r["launcher"] == launcher and r["finished"], r
        assert r["source"] == "CUDA events" and r["steps"] >= 20 and r["median_ms"] > 0, r
        assert r["peak_allocated_bytes"] and r["peak_allocated_bytes"] > 2**20, r
        assert r["nvml_peak_bytes"] and r["nvml_peak_bytes"] >= r["peak_reserved_bytes"], r  # + context, NCCL
        assert r["ddp"] and r["ddp"]["backward_comm_ms"] is not None, r
    assert {r["nvml_index"] for r in rows} == {0, 1}
    assert ranks["link"], ranks


def test_per_rank_profile_of_a_torchrun_ddp_cell(tmp_path):
    from IPython.core.interactiveshell import InteractiveShell

    script = tmp_path / "train.py"
    script.write_text(DDP_TRAIN)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    try:
        ip.user_ns["script"] = str(script)
        ip.run_cell_magic("gpuprofile", "-o p", (
            "import os, subprocess, sys\n"
            "r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',"
            " script], env=dict(os.environ, OMP_NUM_THREADS='1'), capture_output=True, text=True, timeout=300)\n"))
        run, p = ip.user_ns["r"], ip.user_ns["p"]
    finally:
        ip.run_line_magic("unload_ext", "gpunb")
    assert run.returncode == 0, run.stderr[-3000:]
    data = p.to_dict()
    _save("multi_gpu_profile_torchrun.json", data)
    _save("multi_gpu_profile_torchrun.txt", str(p))
    _check_ranks(data["ranks"], "fresh interpreter")
    part = p.ranks
    if _smi_link().startswith("NV"):  # NVML's NVLink payload counters moved during the cell
        assert part.nvlink_traffic and all(b > 0 for b in part.nvlink_traffic.values()), part.nvlink_traffic
    assert part.slowest_by == "all-reduce wait" and not part.balanced
    assert part.ranks[part.slowest].rank == 1  # twice the batch: the others wait for it
    assert p.verdict.kind == "multi-gpu" and any("rank 1 is slower" in a.title for a in p.advice)


LAUNCH_SHELL = textwrap.dedent('''
    import json, os, sys
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    ip.run_cell("import gpunb; _kernel = gpunb.check(quick=True)['kernel_cuda'].status")

    def train(steps):
        import torch
        from accelerate import Accelerator
        acc = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        x = torch.randn(256, 2048, device=acc.device)
        for _ in range(steps):
            loss = model(x).pow(2).mean()
            opt.zero_grad(); acc.backward(loss); opt.step()
        torch.cuda.synchronize()

    ip.user_ns["train"] = train
    ip.run_cell_magic("gpuprofile", "-o p",
                      "from accelerate import notebook_launcher\\n"
                      "notebook_launcher(train, args=(40,), num_processes=2, use_port='29631')\\n")
    p = ip.user_ns.get("p")
    out = {"kernel_cuda": ip.user_ns.get("_kernel"), "cuda_initialized": torch.cuda.is_initialized(),
           "profile": p.to_dict() if p is not None else None, "text": str(p)}
    ip.run_line_magic("unload_ext", "gpunb")
    print("RESULT " + json.dumps(out, default=str), flush=True)
''')


def test_per_rank_profile_of_a_notebook_launcher_cell(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("IPython")
    script = tmp_path / "shell.py"
    script.write_text(LAUNCH_SHELL)
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, (proc.stdout + proc.stderr)[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    _save("multi_gpu_profile_notebook_launcher.json", out)
    assert out["kernel_cuda"] == "ok" and out["cuda_initialized"] is False  # gpunb left the kernel fork-safe
    _check_ranks(out["profile"]["ranks"], "fork")


def test_tutorial_05_on_two_gpus():
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("accelerate")
    from tests.test_notebooks import errors, execute, texts

    path = ROOT / "notebooks" / "05-multi-gpu.ipynb"
    nb = execute(path, timeout=600)
    RESULTS.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, RESULTS / "executed-05-multi-gpu.ipynb")
    assert errors(nb) == []
    out = texts(nb)
    for seen in ("2 ranks over NCCL", "every element of the sum correct", "weights identical on every rank: True",
                 "Launching training on 2 CUDAs", "kernel_cuda: warn"):
        assert seen in out, seen
    assert out.count("2 ranks reported") == 2  # the torchrun cell and the notebook_launcher cell
    assert "not launching" not in out and "Cannot re-initialize CUDA" not in out
