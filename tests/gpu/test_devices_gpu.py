"""GPU identity and ownership (readings/devices.py) against real NVML and real CUDA.

Each case runs in a fresh interpreter with its own CUDA_VISIBLE_DEVICES: the map built from
NVML and the environment before CUDA starts must equal the one torch's device UUIDs confirm
after, and NVML must list this process (and a child process holding a CUDA tensor) as this
kernel's, with at least torch's reserve.

    python -m pytest -m gpu tests/gpu/test_devices_gpu.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _gpus() -> list[str]:
    """NVML's GPU UUIDs, read without starting CUDA in this pytest process."""
    from gpunb.readings.devices import read_identities
    from gpunb.readings.nvml import NvmlSession

    return [str(g.uuid) for g in read_identities(NvmlSession())]


GPUS = _gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="needs an NVIDIA GPU")]

CASE = textwrap.dedent('''
    import json, os, subprocess, sys
    import torch
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.nvml import default_session

    nvml = default_session()
    before = read_device_map(nvml)                       # NVML + environment only
    assert not torch.cuda.is_initialized()
    x = torch.ones(1 << 26, device="cuda:0")             # 256 MiB: CUDA is up now
    after = read_device_map(nvml)                        # confirmed by torch's UUIDs
    child = subprocess.Popen([sys.executable, "-c",
        "import torch, sys, time; y = torch.ones(1 << 27, device='cuda:0'); torch.cuda.synchronize(); "
        "print('ready', flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    own = read_ownership(nvml, after.nvml_index(0))
    child.stdin.close(); child.wait()
    print("RESULT " + json.dumps({
        "before": [d.nvml_index for d in before.devices], "after": [d.nvml_index for d in after.devices],
        "before_certain": [d.certain for d in before.devices], "confirmed": after.confirmed_by_torch,
        "uncertain": after.uncertain, "how": own.how, "self": own.self_bytes, "children": own.children_bytes,
        "reserved": torch.cuda.memory_reserved(0), "note": own.note}))
''')


def _run(visible: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    proc = subprocess.run([sys.executable, "-c", CASE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


CASES = [("unset", None, None), ("index 0", "0", 0)]
if len(GPUS) >= 2:
    CASES += [("1,0", "1,0", 1), ("uuid", GPUS[1], 1), ("uuid prefix", GPUS[1][:12], 1)]


@pytest.mark.parametrize("name,visible,first", CASES, ids=[c[0] for c in CASES])
def test_map_from_the_environment_matches_torch_and_this_kernel_is_found(name, visible, first):
    r = _run(visible)
    assert r["confirmed"] and r["uncertain"] == "", r
    assert r["before"] == r["after"], r  # NVML + environment got it right without touching CUDA
    if first is not None:
        assert r["after"][0] == first, r
    if r["how"] == "container: by torch's reserve":  # NVML speaks host PIDs here: children are invisible
        assert r["self"] >= r["reserved"], r
        return
    assert r["how"] == "pid and child pid", r
    assert r["self"] >= r["reserved"] and r["children"] >= 2**29, r  # the child's 512 MiB tensor
