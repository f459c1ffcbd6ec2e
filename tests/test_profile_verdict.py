"""Verdict rules and GPU views on measured-shaped records (the GPU paths run for real in
tests/gpu/test_profile_gpu.py); NVML utilization windows from the recorded H200 trace."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpunb.analysis.profile.cell import CellProfile, GpuPart, StepStats, TimeShares
from gpunb.analysis.profile.verdict import judge, sync_gain
from gpunb.readings.gpu_activity import UtilWindow, now_us, read_util_since
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import scenario
from gpunb.views import chart
from gpunb.views.profile_view import VERDICT_COLOR, profile_html, profile_text
from gpunb.views.timeline_view import TIMELINE_H, timeline_html, timeline_svg
from tests.chart_html import SVG, images, svg_of

GIB = 2**30


def _gpu(**kw) -> GpuPart:
    base = dict(device=0, nvml_index=0, name="NVIDIA H200", total_bytes=int(139.8 * GIB),
                peak_allocated_bytes=8 * GIB, peak_reserved_bytes=9 * GIB, end_allocated_bytes=6 * GIB,
                end_reserved_bytes=9 * GIB, nvml_process_bytes=int(9.6 * GIB), nvml_device_peak_bytes=10 * GIB,
                other_processes_bytes=0,
                alloc_retries=0, ooms=0, util_mean_pct=97.0, util_idle_share=0.0, util_samples=30,
                compute_capability=(9, 0), peak_reset=True)
    base.update(kw)
    return GpuPart(**base)


def _profile(loop=10.0, data=0.0, sync_n=0, sync_s=0.0, output=0.0, gpu=None, steps=100, dtypes=("float32",),
             devices=("cuda",), precision="highest", visible="NVIDIA H200") -> CellProfile:
    shares = TimeShares(loop, data, steps if data else 0, sync_n, sync_n, sync_s, sync_s,
                        {"item": sync_n} if sync_n else {}, output, 50, 5000, 0, False)
    st = StepStats(steps, 1, 200.0, loop / steps * 1000, loop / steps * 1100, steps / loop, None, None, "CUDA events")
    p = CellProfile(label="", cell=3, started="", wall_s=loop, synced_wall_s=loop, gpu_time_s=loop, cpu_s=loop,
                    peak_rss_bytes=GIB, peak_rss_is_cell=True, steps=st, shares=shares,
                    gpu=_gpu() if gpu is None else gpu, gpu_absent="", gpu_visible=visible, torch_version="2.11.0",
                    torch_cuda="13.0", matmul_precision=precision, param_devices=devices, param_dtypes=dtypes,
                    param_count=10**6, optimizers=1, memory_timeline=((0.0, GIB, 2 * GIB), (loop, 2 * GIB, 3 * GIB)),
                    step_marks_s=tuple(i * loop / steps for i in range(1, steps + 1)))
    return p


def test_compute_bound_h200_fp32_gets_bf16_and_tf32_advice():
    verdict, advice = judge(_profile())
    assert verdict.kind == "compute-bound"
    titles = [a.title for a in advice]
    assert any("bf16" in t for t in titles) and any("TF32" in t for t in titles)
    assert any(t == "Try a larger batch" for t in titles)  # 9 of 140 GiB used
    bf16 = next(a for a in advice if "bf16" in a.title)
    assert "2x its TF32 peak" in bf16.reason  # 989.5 vs 494.5 TFLOP/s datasheet figures


def test_sync_gain_is_min_of_host_work_and_wait():
    p = _profile(loop=10.0, sync_n=100, sync_s=4.0)
    assert abs(sync_gain(p) - 0.4) < 1e-9  # host 6 s, wait 4 s
    verdict, advice = judge(p)
    assert verdict.kind == "sync-bound" and advice[0].title.startswith("Read values back")
    # waiting on a long GPU step with little host work: the GPU is the limit, not the sync
    verdict, _ = judge(_profile(loop=10.0, sync_n=100, sync_s=9.5))
    assert verdict.kind == "compute-bound"


def test_memory_ceiling_and_retries_are_memory_bound():
    verdict, advice = judge(_profile(gpu=_gpu(peak_reserved_bytes=int(136 * GIB))))
    assert verdict.kind == "memory-bound"
    verdict, advice = judge(_profile(gpu=_gpu(alloc_retries=7)))
    assert verdict.kind == "memory-bound" and "7 cudaMalloc retries" in verdict.reason
    assert any("expandable_segments" in a.how for a in advice)


def test_low_utilisation_without_waits_is_host_bound():
    verdict, advice = judge(_profile(gpu=_gpu(util_mean_pct=22.0), dtypes=("bfloat16",)))
    assert verdict.kind == "host-bound"
    assert any("torch.compile" in a.how for a in advice)


def test_params_on_cpu_with_cuda_build_is_on_cpu():
    verdict, advice = judge(_profile(devices=("cpu",)))
    assert verdict.kind == "on-cpu" and advice[0].severity == 2
    assert "Move the model" in advice[0].title and "NVIDIA H200" in advice[0].reason


def test_a_cpu_only_run_is_never_called_compute_bound():
    # tutorial 03's slow loader on CPU torch without a GPU: 19 % of the loop waited for batches
    # loaded in the kernel, the rest computed on the same cores. Calling that "compute-bound" (the
    # green verdict: the GPU is the limit) praised a loop that had no GPU and a slow input pipeline.
    p = dataclasses.replace(_profile(loop=10.0, data=1.9, devices=("cpu",), visible=""), gpu=None,
                            gpu_absent="torch 2.13.0+cpu is a CPU-only build")
    verdict, advice = judge(p)
    assert verdict.kind == "cpu-only" and verdict.headline == "trained on the CPU"
    assert "torch 2.13.0+cpu is a CPU-only build" in verdict.reason and "data wait took 19%" in verdict.reason
    assert "Load batches in worker processes" in {a.title for a in advice}  # the wait still gets its advice
    assert VERDICT_COLOR.get(verdict.kind, chart.AMBER) != chart.GREEN  # not the "all is well" badge
    # the same loop waiting more than a fifth of the time is input-bound, GPU or not
    verdict, _ = judge(dataclasses.replace(p, shares=dataclasses.replace(p.shares, data_wait_s=3.0)))
    assert verdict.kind == "input-bound"


def test_input_and_output_bound():
    verdict, advice = judge(_profile(data=6.0))
    assert verdict.kind == "input-bound"
    expected = {"Load batches in worker processes", "Pin host memory for faster copies to the GPU"}
    assert expected <= {a.title for a in advice}
    verdict, advice = judge(_profile(output=3.0))
    assert verdict.kind == "output-bound" and advice[0].title == "Print/log less often"


def test_gpu_views_reconcile_memory_and_escape():
    p = _profile(gpu=_gpu(name="<b>evil</b>"))
    text = profile_text(p)
    assert "torch peak 8.00 GiB allocated / 9.00 GiB reserved" in text
    assert "NVML this process 9.60 GiB at cell end (+614.4 MiB outside torch's cache" in text
    html = profile_html(p)
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt;" in html
    assert "<svg" not in html and "reserved: peak 3.00 GiB" in html
    [timeline] = images(html, "gpunb-chart")
    svg = svg_of(timeline)
    lines = {p.get("stroke"): p.get("points") for p in svg.iter(SVG + "polyline")}
    assert set(lines) == {chart.BLUE, chart.ORANGE}  # allocated and reserved
    assert "scale 0 to 3.00 GiB" in timeline["alt"]


def _first_line_and_time(p: CellProfile) -> tuple[str, str]:
    text = profile_text(p)
    return text.splitlines()[0], next(x for x in text.splitlines() if x.strip().startswith("time"))


def test_report_starts_with_the_verdict_and_explains_the_wall_time():
    shares = dataclasses.replace(_profile().shares, loop_s=5.55, loop_start_s=1.40)
    p = dataclasses.replace(_profile(), wall_s=7.01, shares=shares)
    verdict, advice = judge(p)
    p = dataclasses.replace(p, verdict=verdict, advice=tuple(advice))
    first, time_row = _first_line_and_time(p)
    assert first == "gpuprofile In [3]: compute-bound — the GPU is the limit"
    # set-up + loop + after = wall, in words
    assert "7.01 s wall = 1.40 s set-up before the loop + 5.55 s loop (cell start to last optimizer step" in time_row
    assert time_row.split("loop (")[1].count("+ 60.0 ms after it") == 1
    steps = next(x for x in profile_text(p).splitlines() if x.strip().startswith("steps"))
    assert "the first ended 200.0 ms into the cell (set-up included)" in steps and "then a median" in steps
    html = profile_html(p)
    assert html.index("the GPU is the limit") < html.index("<table")  # the verdict above the table


def test_cpu_build_advice_names_the_wheel_for_this_driver():
    p = dataclasses.replace(_profile(devices=("cpu",), gpu=None), torch_cuda=None, driver_cuda="13.0",
                            torch_version="2.13.0+cpu", gpu_absent="torch 2.13.0+cpu is a CPU-only build")
    p = dataclasses.replace(p, gpu=None)
    verdict, advice = judge(p)
    assert verdict.kind == "on-cpu"
    assert advice[0].how == "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu130"
    assert "<cu" not in profile_text(dataclasses.replace(p, verdict=verdict, advice=tuple(advice)))


def test_a_few_mib_do_not_look_like_a_climb():
    mib = 2**20
    flat = tuple((t / 10, 343 * mib + t * mib // 8, None) for t in range(100))  # 343 -> 355 MiB
    p = dataclasses.replace(_profile(gpu=None), gpu=None, memory_timeline=flat, wall_s=10.0)
    svg_text, top = timeline_svg(p)
    assert top >= 355 * mib
    ys = [float(pt.split(",")[1]) for pt in svg_of({"src": chart.data_uri(svg_text)}).find(SVG + "polyline")
          .get("points").split()]
    assert max(ys) - min(ys) < 0.06 * TIMELINE_H  # 12 MiB of 360: a few pixels, drawn from 0
    html = timeline_html(p)
    assert "start 343.0 MiB" in html and "peak 355.4 MiB" in html and "0 s" in html and "10.00 s" in html


def test_util_window_from_the_recorded_trace():
    t = [19.0]  # the last 2 s lie inside the recorded training phase (util 98-100 %)
    nvml = NvmlSession(scenario("h200", clock=lambda: t[0]))
    since = now_us() - 2_000_000
    window = read_util_since(nvml, 0, since)
    assert isinstance(window, UtilWindow) and len(window.samples_pct) >= 5
    assert window.mean_pct > 95 and window.idle_share == 0
    t[0] = 30.5  # idle after the run: every sample is 0 %
    idle = read_util_since(nvml, 0, now_us() - 1_000_000)
    assert idle.samples_pct and idle.idle_share == 1.0
    # no sample newer than "now": NVML says NOT_FOUND, which is an empty window, not an error
    assert read_util_since(nvml, 0, now_us() + 10_000_000) == UtilWindow(())
    lost = NvmlSession(scenario("gpu-lost"))
    assert not read_util_since(lost, 0, since)


# -- advice never recommends what the machine already runs ----------------------------------

@given(st.integers(0, 64), st.integers(1, 256))
def test_dataloader_advice_never_recommends_the_current_workers(workers, cores):
    from gpunb.analysis.profile.verdict import more_workers

    more = more_workers(workers, cores)
    if more is not None:
        assert workers < more <= max(1, cores - 1)  # more than now, and what fits this machine
    else:
        assert workers >= max(1, min(8, cores - 1))  # only when nothing more would fit
