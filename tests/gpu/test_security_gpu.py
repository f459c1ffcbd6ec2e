"""Issue 31 on a real GPU: a peak cache with a 400-digit integer and a planted 1e30 TFLOP/s
raised OverflowError at a profiled cell's end (also on the H200) and in the monitor; and the
--ops trace is written through torch's real CUDA profiler export into a private folder by
descriptor (/proc/self/fd/<fd>/<name>).

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_security_gpu.py -v
"""

from __future__ import annotations

import json
import os
import stat

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import gpunb  # noqa: E402
from gpunb.analysis.monitor.sampler import Sampler  # noqa: E402
from gpunb.readings import peak_cache  # noqa: E402
from gpunb.readings.nvml import default_session  # noqa: E402
from gpunb.views.monitor_layout import monitor_text  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402


def _train(steps: int = 6) -> None:
    model = torch.nn.Linear(2048, 2048).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 2048, device="cuda")
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


@pytest.mark.parametrize("planted", ["9" * 400, "1e30"])
def test_a_planted_peak_costs_a_profiled_cuda_cell_and_the_monitor_nothing(tmp_path, monkeypatch, planted):
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    path = tmp_path / peak_cache.FILE_NAME
    text = json.dumps({uuid: {"name": "x", "tflops": {"bf16": 1.5, "fp32": 1.5}, "copy_gbps": {"h2d": 1.5},
                              "pid": 1, "measured_at": "", "torch_version": ""}})
    path.write_text(text.replace("1.5", planted))
    os.chmod(path, 0o600)
    monkeypatch.setattr(peak_cache, "cache_file", lambda environ=None: path)
    peak_cache.forget_this_process()
    with gpunb.profile(record=False, show=False) as p:
        _train()
    result = p.result
    assert result is not None  # the cell's end read the cache and went on
    flops = result.flops
    source = flops.measured_source if flops is not None else ""
    assert flops is None or flops.measured_peak_tflops is None  # the planted figure was not believed
    assert flops is None or flops.count is None or "ignored" in source
    sampler = Sampler(default_session(), hz=2.0)  # the monitor's reader of the same cache (PCIe limit lines)
    for _ in range(3):
        sampler.tick()
    assert monitor_text(sampler.window(10.0))
    save_json(f"security_planted_peak_{'bigint' if len(planted) > 10 else 'huge'}.json",
              {"planted": planted[:12], "measured_source": source, "profiled": True})


def test_the_ops_trace_of_a_cuda_cell_is_private_and_in_place(tmp_path):
    folder = tmp_path / "shared-project"
    folder.mkdir()
    os.chmod(folder, 0o2770)  # group-shared, no sticky bit: the case of issue 31
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=folder) as p:
        _train(8)
    o = p.result.ops
    assert o.trace_path.startswith(str(folder)) and o.trace_bytes > 0
    st = os.lstat(o.trace_path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert [n for n in os.listdir(folder) if n.startswith(".gpunb-")] == []  # no staging folder left
    trace = json.loads(open(o.trace_path).read())  # noqa: SIM115
    assert any("cuda" in str(e.get("cat", "")).lower() or "kernel" in str(e.get("cat", "")).lower()
               for e in trace.get("traceEvents", []))
    save_json("security_ops_trace.json", {"trace_bytes": o.trace_bytes, "mode": oct(stat.S_IMODE(st.st_mode))})
