"""FLOPs of one counted step, TFLOP/s and MFU, and ``--ops`` (torch.profiler), on real CPU
training loops. Counts are checked against hand-computed formulas, exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gpunb  # noqa: E402
from gpunb.analysis.profile.throughput import assess, throughput_advice  # noqa: E402
from gpunb.analysis.steps.op_trace import kernel_category, op_category  # noqa: E402
from gpunb.analysis.steps.records import FlopCount, OpRow, OpsReport  # noqa: E402
from gpunb.readings import peak_cache  # noqa: E402
from gpunb.views.profile_view import profile_html, profile_text  # noqa: E402


def matmul(m: int, n: int, k: int) -> int:
    """An (m x k) @ (k x n) product: m*n dot products of length k, a multiply and an add each."""
    return 2 * m * n * k


def conv(n: int, c_in: int, c_out: int, h_out: int, w_out: int, kh: int, kw: int) -> int:
    return 2 * c_out * h_out * w_out * c_in * kh * kw * n


def _train(model, x, steps: int, opt=None, autocast=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        if autocast:
            with torch.autocast("cpu", dtype=autocast):
                out = model(x)
        else:
            out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return opt


def _mlp(b=64, d0=512, d1=1024, d2=10):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.ReLU(), torch.nn.Linear(d1, d2))
    return model, torch.randn(b, d0)


def test_mlp_flops_equal_the_hand_count_exactly():
    b, d0, d1, d2 = 64, 512, 1024, 10
    model, x = _mlp(b, d0, d1, d2)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=6)
    forward = matmul(b, d1, d0) + matmul(b, d2, d1)
    # backward: weight and input gradients of layer 2; layer 1 only its weight gradient,
    # because the input x needs no gradient
    backward = matmul(d2, d1, b) + matmul(b, d1, d2) + matmul(d1, d0, b)
    count = p.result.flops.count
    assert count.flops == forward + backward == 138_149_888  # turn2-notes.md: FlopCounterMode's figure
    assert count.step == 1 and count.by_precision == {"fp32": count.flops}
    assert set(count.by_op) == {"aten.addmm", "aten.mm"} and not count.uncounted
    assert count.bytes_moved > (d0 * d1 + d1 * d2) * 4 * 3  # at least weights read, gradients written, updated


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_steps_are_counted_without_a_gap(foreach):
    """AdamW's per-parameter updates pass Python numbers where the schema says Tensor."""
    model, x = _mlp(8, 32, 32, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=3, opt=opt)
    count = p.result.flops.count
    assert not count.uncounted and count.flops == 2 * matmul(8, 32, 32) + 3 * matmul(8, 4, 32)
    params = sum(q.numel() for q in model.parameters()) * 4
    assert count.bytes_moved > 6 * params  # AdamW reads and writes weights, gradients and two moments


def test_conv_net_flops_equal_the_hand_count_and_torchs_flop_counter():
    n, c_in, c_mid, h, w, k = 4, 3, 8, 16, 16, 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(c_in, c_mid, k, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(c_mid, c_mid, k, padding=1))
    x = torch.randn(n, c_in, h, w)
    with gpunb.profile(record=False, show=False) as p:
        opt = _train(model, x, steps=3)
    first, second = conv(n, c_in, c_mid, h, w, k, k), conv(n, c_mid, c_mid, h, w, k, k)
    # backward = 2x forward (input and weight gradients), except the first layer's input gradient
    assert p.result.flops.count.flops == first + second + (first + 2 * second) == 4_423_680
    from torch.utils.flop_counter import FlopCounterMode

    reference = FlopCounterMode(display=False)
    with reference:
        _train(model, x, steps=1, opt=opt)
    assert reference.get_total_flops() == p.result.flops.count.flops


class _Mixed(torch.nn.Module):
    """Every kind of operator torch has a FLOP formula for, in one model: attention (SDPA),
    bmm/baddbmm, 1-d and transposed convolutions, grouped convolution, linear with and
    without bias, per operator compared with FlopCounterMode below."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.conv1d = torch.nn.Conv1d(32, 16, 5, padding=2, groups=2)
        self.up = torch.nn.ConvTranspose2d(16, 8, 3, stride=2)
        self.head = torch.nn.Linear(8, 3, bias=False)

    def forward(self, x):
        h = self.encoder(x)                                                     # (B, T, 32)
        h = torch.baddbmm(h, h, torch.ones(h.shape[0], 32, 32) / 32)          # baddbmm
        h = self.conv1d(h.transpose(1, 2))                                      # (B, 16, T)
        h = self.up(h.unsqueeze(-1))                                            # (B, 8, 2T+1, 3)
        return self.head(h.flatten(2).transpose(1, 2))


def test_every_formula_counts_what_torchs_flop_counter_counts_per_operator():
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model, x = _Mixed(), torch.randn(3, 10, 32)
    with gpunb.profile(record=False, show=False) as p:
        opt = _train(model, x, steps=3)
    reference = FlopCounterMode(display=False)
    with reference:
        _train(model, x, steps=1, opt=opt)
    theirs = {str(op): n for op, n in reference.get_flop_counts()["Global"].items()}
    ours = p.result.flops.count.by_op
    assert ours == theirs and len(ours) >= 5, (ours, theirs)


class _SameWeightsManyShapes(torch.nn.Module):
    """One convolution's weights applied with two strides and two dilations, one linear layer
    on two sequence lengths: the same operators with the same weight shapes but different
    answers, which a per-operator answer cache must keep apart."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.lin = torch.nn.Linear(8, 5)

    def forward(self, x):
        f = torch.nn.functional
        parts = [f.conv2d(x, self.conv.weight, self.conv.bias, stride=s, dilation=d) for s in (1, 2) for d in (1, 2)]
        pooled = [q.mean(dim=(2, 3)) for q in parts]
        seqs = [self.lin(torch.stack(pooled[:n], dim=1)) for n in (2, 4)]
        return sum(q.sum() for q in seqs)


def test_answers_kept_per_shape_and_option_match_torchs_count_every_time():
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model, x = _SameWeightsManyShapes(), torch.randn(2, 3, 17, 19)
    counts = []
    for _ in range(2):  # the second count answers from what the first kept
        with gpunb.profile(record=False, show=False) as p:
            opt = _train(model, x, steps=3)
        counts.append(p.result.flops.count.by_op)
    reference = FlopCounterMode(display=False)
    with reference:
        _train(model, x, steps=1, opt=opt)
    theirs = {str(op): n for op, n in reference.get_flop_counts()["Global"].items()}
    assert counts[0] == counts[1] == theirs, (counts, theirs)


def test_autocast_flops_are_filed_as_bf16():
    model, x = _mlp(16, 64, 128, 4)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=3, autocast=torch.bfloat16)
    count = p.result.flops.count
    assert count.by_precision == {"bf16": count.flops} and count.flops > 0


def test_counting_changes_no_result_and_the_counted_step_is_left_out_of_the_timing():
    def run(profiled: bool):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.3), torch.nn.Linear(64, 1))
        x = torch.randn(16, 32)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if profiled:
            with gpunb.profile(record=False, show=False) as p:
                _train(model, x, steps=5, opt=opt)
            return model, p.result
        _train(model, x, steps=5, opt=opt)
        return model, None

    plain, _ = run(False)
    counted, result = run(True)
    for a, b in zip(plain.parameters(), counted.parameters()):
        assert torch.equal(a, b)  # bit for bit: same operations, same random numbers
    assert result.flops.count.step == 1
    assert result.steps.excluded == (1,) and len(result.steps.step_ms) == 5
    steady = sorted(result.steps.step_ms[2:])
    assert result.steps.median_ms == steady[len(steady) // 2]  # steps 3-5 only: warm-up and counted left out
    assert torch._C._len_torch_dispatch_stack() == 0


def test_an_error_inside_the_counted_step_is_the_users_and_the_mode_is_gone():
    model, x = _mlp(8, 16, 16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as caught, \
            gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=1, opt=opt)
        model(torch.randn(8, 5))  # inside step 2, while counting
    assert "gpunb" not in type(caught.value).__module__
    assert torch._C._len_torch_dispatch_stack() == 0
    assert p.result.flops.count is None and "ended before step 2 finished" in p.result.flops.why_not
    assert p.result.steps.excluded == ()


def test_a_failing_flop_formula_never_breaks_the_step(monkeypatch):
    from torch.utils import flop_counter

    def broken(*args, **kwargs):
        raise ValueError("formula bug")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm, broken)
    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=3)
    count = p.result.flops.count
    assert count.by_op == {"aten.addmm": count.flops}  # the mm's of the backward failed, the rest counted
    assert "could not be counted" in count.uncounted and "formula bug" in count.uncounted


def test_one_step_is_not_enough_and_flops_can_be_turned_off():
    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=1)
    assert p.result.flops.count is None and "counted on the second optimizer step" in p.result.flops.why_not
    with gpunb.profile(record=False, show=False, flops=False) as p:
        _train(model, x, steps=4)
    assert p.result.flops is None and p.result.steps.excluded == ()
    with gpunb.profile(record=False, show=False) as p:
        sum(range(10))  # no training loop: nothing said about FLOPs
    assert p.result.flops is None
    with pytest.raises(TypeError, match="flops must be True or False"):
        gpunb.profile(flops="yes")


def test_compiled_code_is_counted_without_recompiling():
    from torch._dynamo.utils import counters

    model, x = _mlp(8, 32, 32, 4)
    compiled = torch.compile(model, backend="aot_eager")
    _train(compiled, x, steps=2)
    graphs = dict(counters["stats"])
    with gpunb.profile(record=False, show=False) as p:
        _train(compiled, x, steps=3)
    assert dict(counters["stats"]) == graphs  # the counting mode made Dynamo neither recompile nor fall back
    assert p.result.flops.count.flops == matmul(8, 32, 32) * 2 + matmul(8, 4, 32) * 3


def test_cpu_report_shows_flops_and_tflops():
    model, x = _mlp()
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=8)
    t = p.result.flops
    assert t.achieved_tflops == pytest.approx(t.count.flops / (p.result.steps.median_ms / 1000) / 1e12)
    assert t.mfu is None and t.gpu_model == ""  # no peak figure for a CPU
    text = profile_text(p.result)
    assert "138.1 MFLOP per step, counted on step 2 (fp32 100%)" in text
    assert "FLOP/s over the" in text and "left out: FLOP count" in text
    assert "MFLOP per step" in profile_html(p.result)
    json.dumps(p.result.to_dict())


# -- rates against peaks (records shaped like an H200 run) -------------------------------------

def _count(flops: int, mix: dict, bytes_moved: int = 0) -> FlopCount:
    return FlopCount(1, flops, {k: int(v * flops) for k, v in mix.items()}, {"aten.mm": flops}, bytes_moved, 100, 50.0)


def test_mfu_against_the_datasheet_and_the_measured_peak():
    flops = 23 * matmul(8192, 8192, 8192)  # 8 bf16 layers: 3 matmuls each, less the first input gradient
    measured = peak_cache.MeasuredPeaks("GPU-1", "NVIDIA H200", {"bf16": 790.0, "tf32": 405.0, "fp32": 51.0},
                                        "2026-11-30 14:02", -1)
    t = assess(_count(flops, {"bf16": 1.0}, bytes_moved=3 * 10**9), "", 40.0, "NVIDIA H200", measured)
    assert t.achieved_tflops == pytest.approx(flops / 0.040 / 1e12)
    assert t.peak_tflops == pytest.approx(989.5) and t.mfu == pytest.approx(t.achieved_tflops / 989.5)
    assert t.measured_peak_tflops == pytest.approx(790.0) and t.mfu_measured == pytest.approx(t.achieved_tflops / 790)
    assert t.measured_source == "%gpucheck on 2026-11-30 14:02 (cached)" and t.memory_bound is False
    # a mix: the peak is the mix's (time at each precision's peak, summed)
    t = assess(_count(10**12, {"bf16": 0.5, "fp32": 0.5}), "", 100.0, "NVIDIA H200", None)
    assert t.peak_tflops == pytest.approx(1 / (0.5 / 989.5 + 0.5 / 67.0))
    assert "run %gpucheck" in t.measured_source and t.mfu_measured is None
    # fp16 was not measured by %gpucheck: only the datasheet MFU
    t = assess(_count(10**12, {"fp16": 1.0}), "", 10.0, "NVIDIA H200", measured)
    assert t.mfu is not None and t.mfu_measured is None and "no fp16 peak" in t.measured_source
    # fp64 has no datasheet figure here: no MFU rather than a wrong one
    assert assess(_count(10**12, {"fp64": 1.0}), "", 10.0, "NVIDIA H200").mfu is None


def test_memory_bound_steps_get_bandwidth_and_advice():
    t = assess(_count(10**9, {"bf16": 1.0}, bytes_moved=24 * 10**9), "", 10.0, "NVIDIA H200")
    assert t.memory_bound and t.bandwidth_gbps == pytest.approx(2400.0) and t.peak_bandwidth_gbps == 4800.0
    advice = throughput_advice(t, None, "compute-bound")
    assert advice[0].title == "Fuse the memory-bound work" and "2400 GB/s of 4800" in advice[0].reason


def test_ops_shares_lead_to_advice():
    rows = (OpRow("aten::add", "elementwise", 3, 4.0, 0.4),)
    ops = OpsReport(True, (3, 4, 5), 10.0, {"elementwise": 0.42, "matmul": 0.2, "idle": 0.35, "copies": 0.03},
                    rows, rows, "/tmp/x.json", 1000, 0.1)
    titles = {a.title: a for a in throughput_advice(None, ops, "compute-bound")}
    assert "42% of GPU time in steps 4-6" in titles["Fuse elementwise kernels: try torch.compile"].reason
    assert "idled 35%" in titles["Keep the GPU fed between kernels"].reason
    assert "Copy less between host and GPU" not in titles  # 3 % is below the threshold
    assert "Keep the GPU fed between kernels" not in {a.title for a in throughput_advice(None, ops, "input-bound")}


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "matmul"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)", "matmul"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, ...)", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", "elementwise"),
    ("triton_poi_fused_add_relu_0", "elementwise"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("Memcpy HtoD (Pageable -> Device)", "copies"),
    ("Memset (Device)", "copies"),
    ("some_custom_kernel", "other"),
])
def test_kernel_categories(name, category):
    assert kernel_category(name) == category


def test_op_categories():
    assert [op_category(n) for n in ("aten::mm", "aten::convolution_backward", "aten::relu", "aten::copy_",
                                     "aten::_scaled_dot_product_flash_attention", "c10d::allreduce_",
                                     "Optimizer.step#SGD.step")] == \
        ["matmul", "matmul", "elementwise", "copies", "attention", "communication", "other"]


# -- --ops on a CPU ------------------------------------------------------------------------------

def test_ops_on_cpu_writes_a_json_trace_and_names_the_top_ops(tmp_path):
    model, x = _mlp(64, 256, 512, 10)
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=tmp_path) as p:
        _train(model, x, steps=9)
    r = p.result
    o = r.ops
    assert o.steps == (3, 4, 5) and not o.device_time and o.top_kernels == ()
    trace = json.loads(Path(o.trace_path).read_text())  # valid JSON, Chrome trace format
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])
    assert o.trace_path.startswith(str(tmp_path)) and o.trace_bytes > 0
    assert "gpuprofile-" in o.trace_path and o.trace_path.endswith(".pt.trace.json")
    names = [row.name for row in o.top_ops]
    assert "aten::mm" in names and "aten::addmm" in names
    assert all(row.calls >= 1 and row.ms_per_step > 0 for row in o.top_ops)
    assert sum(o.shares.values()) == pytest.approx(1.0, abs=0.02)  # CPU: operators plus time outside them
    assert r.steps.excluded == (1, 2, 3, 4, 5, 6)  # counted step 2, profiler steps 3-7
    text = profile_text(r)
    assert "torch.profiler over steps 4-6: CPU time" in text and "aten::mm" in text and o.trace_path in text


def test_ops_needs_enough_steps(tmp_path):
    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=tmp_path) as p:
        _train(model, x, steps=3)
    assert p.result.ops.shares == {} and "ended before step 4" in p.result.ops.note
    assert list(tmp_path.iterdir()) == []
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=tmp_path) as p:
        sum(range(10))
    assert "no optimizer step" in p.result.ops.note
    assert "no trace: no optimizer step" in profile_text(p.result)


def test_ops_trace_falls_back_to_the_temp_directory(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the trace directory should be")
    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=blocked) as p:
        _train(model, x, steps=7)
    o = p.result.ops
    assert o.trace_path and not o.trace_path.startswith(str(blocked)) and "temp directory" in o.note
    json.loads(Path(o.trace_path).read_text())


# -- the magic, the history, the measured peaks --------------------------------------------------

def test_magic_ops_writes_the_trace_next_to_the_notebook(ip, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # Jupyter starts a kernel in the notebook's directory
    ip.run_cell("import torch\nmodel = torch.nn.Linear(32, 8)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                "x = torch.randn(16, 32)")
    r = ip.run_cell("%%gpuprofile --ops -o _gpunb_test\n"
                    "for _ in range(8):\n"
                    "    loss = model(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n")
    assert r.success
    prof = ip.user_ns["_gpunb_test"]
    files = list(tmp_path.glob("gpuprofile-cell*.pt.trace.json"))
    assert len(files) == 1 and str(files[0]) == prof.ops.trace_path
    assert f"cell{prof.cell}-" in files[0].name
    assert prof.flops.count.flops == matmul(16, 8, 32) * 2  # forward and weight gradient
    out = capsys.readouterr().out
    assert "FLOPs" in out and "top ops" in out and files[0].name in out
    r = ip.run_cell("%%gpuprofile --no-flops -o _gpunb_test\nloss = model(x).sum(); loss.backward(); opt.step()\n"
                    "loss = model(x).sum(); loss.backward(); opt.step()\n")
    assert r.success and ip.user_ns["_gpunb_test"].flops is None
    r = ip.run_cell("%gpuprofile on --ops")
    assert not r.success and "(got --ops)" in str(r.error_in_exec)


def test_history_names_the_mfu_change():
    from gpunb.analysis.profile.history import compare

    earlier = gpunb_result(mfu=0.21)
    later = gpunb_result(mfu=0.48)
    assert compare(earlier, later).words().endswith("MFU from 21% to 48%")


def gpunb_result(mfu: float):
    """A measured-shaped record: a real CPU profile with an H200-like throughput attached."""
    import dataclasses

    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=4)
    t = dataclasses.replace(p.result.flops, gpu_model="H200", mfu=mfu, peak_tflops=989.5)
    return dataclasses.replace(p.result, flops=t)


def test_the_check_keeps_its_matmul_peaks_for_the_profile(private_peak_cache):
    assert peak_cache.lookup("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff") is None
    peak_cache.remember("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff", "NVIDIA H200",
                        {"n": 8192, "bf16_tflops": 784.87, "tf32_tflops": 387.79, "fp32_tflops": 50.77})
    got = peak_cache.lookup("12BEBAE7-3cb1-fcf7-294c-65779ece26ff")  # torch's spelling, any case
    assert got.tflops == {"bf16": 784.87, "tf32": 387.79, "fp32": 50.77} and got.this_process
    assert got.source().startswith("%gpucheck in this kernel, ")
    saved = json.loads(private_peak_cache.read_text())
    assert saved["GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff"]["tflops"]["bf16"] == 784.87
    # another kernel's check, read back from the file
    peak_cache.forget_this_process()
    saved["GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff"]["pid"] = -5
    private_peak_cache.write_text(json.dumps(saved))
    got = peak_cache.lookup("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff")
    assert not got.this_process and got.source().startswith("%gpucheck on ") and got.source().endswith("(cached)")
    private_peak_cache.write_text("{not json")
    assert peak_cache.lookup("GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff") is None  # a broken file is no error


def test_history_says_which_precision_each_mfu_is_against():
    import dataclasses

    from gpunb.analysis.profile.history import compare

    fp32 = gpunb_result(mfu=0.65)
    bf16 = gpunb_result(mfu=0.40)
    count = dataclasses.replace(bf16.flops.count, by_precision={"bf16": bf16.flops.count.flops})
    bf16 = dataclasses.replace(bf16, flops=dataclasses.replace(bf16.flops, count=count))
    assert compare(fp32, bf16).words().endswith("MFU from 65% (fp32) to 40% (bf16)")


def test_the_users_own_flop_counter_is_left_alone():
    from torch.utils.flop_counter import FlopCounterMode

    model, x = _mlp(8, 16, 16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    theirs = []
    with gpunb.profile(record=False, show=False) as p:  # their counter around each step, step 1's end inside it
        for _ in range(3):
            with FlopCounterMode(display=False) as counter:
                _train(model, x, steps=1, opt=opt)
            theirs.append(counter.get_total_flops())
    assert theirs == [matmul(8, 16, 16) * 2 + matmul(8, 2, 16) * 3] * 3
    assert p.result.flops.count is None and "another dispatch mode" in p.result.flops.why_not
    assert torch._C._len_torch_dispatch_stack() == 0
    # theirs opened inside the counted step and closed after it: ours is switched off, then removed
    with gpunb.profile(record=False, show=False) as p:
        _train(model, x, steps=1, opt=opt)
        counter = FlopCounterMode(display=False)
        counter.__enter__()
        _train(model, x, steps=2, opt=opt)
        counter.__exit__(None, None, None)
    assert counter.get_total_flops() == 2 * (matmul(8, 16, 16) * 2 + matmul(8, 2, 16) * 3)
    assert p.result.flops.count is None and "another dispatch mode" in p.result.flops.why_not
    assert torch._C._len_torch_dispatch_stack() == 0


def _event(name, start, end, device="cpu", id=0, linked=0, annotation=None):
    from types import SimpleNamespace

    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    event = SimpleNamespace(name=name, time_range=span, device_type=device, id=id, linked_correlation_id=linked)
    if annotation is not None:
        event.is_user_annotation = annotation
    return event


@pytest.mark.parametrize("flagged", [True, None], ids=["flag", "names"])
def test_gpu_user_annotations_are_not_kernels(flagged):
    # as on the H200: the profiler mirrors ProfilerStep and torch.optim's range onto the GPU
    # timeline; they must not be the top "kernel" nor add to the shares
    from gpunb.analysis.steps.op_trace import device_summary

    steps = [_event("ProfilerStep#4", 0, 40)]
    ops = [_event("aten::mm", 1, 2, id=7)]
    events = steps + ops + [
        _event("ProfilerStep#4", 0, 40, device="cuda", annotation=flagged),
        _event("Optimizer.step#SGD.step", 30, 38, device="cuda", annotation=flagged),
        _event("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 2, 32, device="cuda", linked=7,
               annotation=False if flagged else None)]
    window, shares, by_name = device_summary(events, steps, "cpu")
    assert set(by_name) == {"nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"}
    assert shares["matmul"] == pytest.approx(30 / window) and sum(shares.values()) == pytest.approx(1.0)


def test_gpu_window_holds_only_the_recorded_steps_kernels():
    from gpunb.analysis.steps.op_trace import device_summary

    steps = [_event("ProfilerStep#3", 0, 10), _event("ProfilerStep#4", 10, 20), _event("ProfilerStep#5", 20, 30)]
    ops = [_event("aten::mm", 1, 2, id=7), _event("aten::add", 3, 4, id=8)]
    # GPU-bound: the host recorded its three steps by t=30, the GPU was still busy with older
    # steps (unlinked kernels) until t=100, then ran ours back to back
    gpu_bound = steps + ops + [
        _event("sm90_xmma_gemm_old", 40, 100, device="cuda"),
        _event("sm90_xmma_gemm_bf16", 100, 190, device="cuda", linked=7),
        _event("vectorized_elementwise_kernel", 190, 200, device="cuda", linked=8)]
    window, shares, by_name = device_summary(gpu_bound, steps, "cpu")
    assert window == 100 and shares == {"matmul": 0.9, "elementwise": 0.1, "idle": 0.0}
    assert "sm90_xmma_gemm_old" not in by_name
    # host-bound: the GPU waits for the host; the gaps between kernels are idle time
    host_bound = steps + ops + [
        _event("sm90_xmma_gemm_bf16", 2, 5, device="cuda", linked=7),
        _event("vectorized_elementwise_kernel", 12, 14, device="cuda", linked=8)]
    window, shares, _ = device_summary(host_bound, steps, "cpu")
    assert window == 30 and shares["matmul"] == pytest.approx(0.1) and shares["idle"] == pytest.approx(25 / 30)


def test_ops_without_torch_says_why(monkeypatch):
    from gpunb.readings import torch_state

    monkeypatch.setattr(torch_state, "imported_torch", lambda: None)
    with gpunb.profile(record=False, show=False, ops=True) as p:
        sum(range(10))
    assert p.result.flops is None and "nothing to trace" in p.result.ops.note
    assert "no trace: torch was not imported" in profile_text(p.result)


def test_ops_keeps_the_profilers_log_lines_out_of_the_cell_output(tmp_path, capfd):
    """torch.profiler writes `USDT … profiler_start/stop` to descriptor 2 (a red stderr box in a
    notebook); --ops drops those two lines and writes anything else said meanwhile back."""
    import os

    from gpunb.analysis.steps.profiler_log import quiet_profiler_log

    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=tmp_path) as p:
        _train(model, x, steps=9)
    assert p.result.ops.steps == (3, 4, 5)  # the trace really started and stopped
    assert "USDT" not in capfd.readouterr().err
    with quiet_profiler_log():
        os.write(2, b"USDT:2026-12-01 21:15:21 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"a real warning\n")
    assert capfd.readouterr().err == "a real warning\n"


def test_profile_rows_are_short_sentences_with_the_asides_one_click_away(tmp_path):
    model, x = _mlp(8, 16, 16, 2)
    with gpunb.profile(record=False, show=False, ops=True, trace_dir=tmp_path) as p:
        _train(model, x, steps=9)
    html = profile_html(p.result)
    rows = html[html.index("<table"):html.index("</table>")]
    assert " (" not in rows and "steps 2-7 left out" not in rows  # no walls of qualifiers
    assert re.search(r"= \d+% \w+", rows)  # shares stay, said without parentheses
    full = html[html.index("<details"):]
    assert "every row in full" in full and "steps 2-7 left out: FLOP count, torch.profiler" in full
