"""%gpufit's search on synthetic probe readings (the policy is pure), and its CPU behaviour."""

from __future__ import annotations

import math
import random

import pytest

from gpunb.analysis.batch_fit import BatchFit, Line, Trial, fit_line, lines_from, next_trial, search
from tests.chart_html import images

GiB = 2**30
MiB = 2**20


def simulated_gpu(fixed, per_sample, capacity, frag_true, frag_measured, block=2 * MiB):
    """A step whose activations grow linearly on top of what it started with (weights, optimizer
    state: ``fixed``, reported as the step's base like fit_batch_size does); the allocator needs
    ``frag_true`` extra to run and reports ``frag_measured`` extra as reserved (2 MiB blocks)."""

    def run(batch, purpose, n):
        if fixed + per_sample * batch * (1 + frag_true) > capacity:
            return Trial(n, batch, False, purpose, error="CUDA out of memory")
        alloc = fixed + per_sample * batch
        reserved = fixed + math.ceil(per_sample * batch * (1 + frag_measured) / block) * block
        return Trial(n, batch, True, purpose, int(alloc), int(reserved), 512 * MiB, base_allocated_bytes=int(fixed))

    true_max = math.floor((capacity - fixed) / (per_sample * (1 + frag_true)))
    return run, true_max


def test_line_fit_recovers_slope_and_intercept():
    line = fit_line([(2, 10 * GiB + 2 * 3 * MiB), (16, 10 * GiB + 16 * 3 * MiB)])
    assert line.slope == pytest.approx(3 * MiB) and line.intercept == pytest.approx(10 * GiB)
    assert line.largest_batch(10 * GiB + 300 * MiB) == pytest.approx(100)
    assert fit_line([(4, 1.0)]) is None
    assert Line(5.0, 0.0).largest_batch(10) == math.inf


def test_first_moves_are_two_small_probes_then_a_prediction_just_under_the_line():
    run, true_max = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.01, 0.04)
    trials = []
    for _ in range(3):
        b, why = next_trial(trials, capacity=120 * GiB, start=2, max_batch=None)
        trials.append(run(b, why, len(trials) + 1))
    assert [(t.batch, t.purpose) for t in trials[:2]] == [(2, "probe"), (16, "probe")]
    assert trials[2].purpose == "prediction" and trials[2].ok
    assert 0.9 * true_max <= trials[2].batch <= true_max


@pytest.mark.parametrize("seed", range(5))
def test_within_5_percent_of_the_true_maximum_in_few_trials(seed):
    rng = random.Random(seed)
    counts = []
    for _ in range(60):
        fixed = rng.uniform(0.5, 60) * GiB
        per_sample = rng.uniform(0.2, 400) * MiB
        capacity = rng.uniform(fixed + 5 * GiB, 140 * GiB)
        ft = rng.uniform(0, 0.06)
        run, true_max = simulated_gpu(fixed, per_sample, capacity, ft, ft + rng.uniform(0, 0.04))
        fit = search(run, capacity=int(capacity), start=2, max_batch=None, margin=0.05)
        assert fit.ok and fit.max_batch <= true_max  # it only reports what ran
        assert fit.max_batch >= 0.95 * true_max, (fit.max_batch, true_max, fit.trials)
        assert fit.recommended == math.floor(fit.max_batch * 0.95)
        counts.append(fit.trial_count)
    assert max(counts) <= 6 and sum(c <= 4 for c in counts) >= 0.8 * len(counts)


def test_a_start_that_does_not_fit_is_halved_and_nothing_fitting_is_reported():
    run, true_max = simulated_gpu(10 * GiB, 1 * GiB, 20 * GiB, 0.0, 0.02)
    fit = search(run, capacity=20 * GiB, start=64, max_batch=None, margin=0.05)
    assert fit.trials[0].batch == 64 and not fit.trials[0].ok and fit.trials[1].purpose == "smaller start"
    assert fit.ok and true_max - 1 <= fit.max_batch <= true_max  # 10 here: one sample is 10 %
    run, _ = simulated_gpu(30 * GiB, 1 * GiB, 20 * GiB, 0.0, 0.0)
    fit = search(run, capacity=20 * GiB, start=4, max_batch=None, margin=0.05)
    assert not fit.ok and "even the smallest batch" in fit.problem
    assert [t.batch for t in fit.trials] == [4, 2, 1]


def test_max_batch_caps_the_search():
    run, _ = simulated_gpu(1 * GiB, 1 * MiB, 100 * GiB, 0.0, 0.0)
    fit = search(run, capacity=100 * GiB, start=2, max_batch=512, margin=0.05)
    assert fit.max_batch == 512 and any("max_batch=512" in n for n in fit.notes)


def test_memory_that_does_not_grow_is_flagged():
    def run(batch, purpose, n):
        return Trial(n, batch, True, purpose, GiB, GiB, 0)

    fit = search(run, capacity=10 * GiB, start=2, max_batch=None, margin=0.05, max_trials=4)
    assert fit.trial_count == 4 and any("does step_fn use" in n for n in fit.notes)


def test_nvml_memory_outside_torch_that_grows_counts_against_capacity():
    a = Trial(1, 2, True, "probe", 10 * GiB, 10 * GiB, 500 * MiB)
    b = Trial(2, 16, True, "probe", 11 * GiB, 11 * GiB, 500 * MiB + 14 * 64 * MiB)
    cons, opt = lines_from([a, b])
    assert cons.slope == pytest.approx((GiB + 14 * 64 * MiB) / 14)
    assert opt.slope == pytest.approx(GiB / 14)


def test_cpu_only_torch_says_it_needs_a_cuda_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from gpunb import fit_batch_size

    fit = fit_batch_size(lambda bs: None, progress=False)
    assert not fit.ok and "needs a CUDA GPU" in fit.problem
    assert "needs a CUDA GPU" in fit._repr_mimebundle_()["text/plain"]


@pytest.mark.parametrize("kwargs, words", [
    ({"start": 0}, "start must be"), ({"margin": 2}, "margin must be"), ({"max_batch": 1, "start": 8}, "max_batch"),
    ({"steps": "2"}, "steps must be"),
])
def test_bad_arguments_are_explained(kwargs, words):
    from gpunb import fit_batch_size

    fit = fit_batch_size(lambda bs: None, progress=False, **kwargs)
    assert not fit.ok and words in fit.problem
    assert not fit_batch_size(42, progress=False).ok


def test_result_renders_text_and_html_with_the_curve_inside():
    run, _ = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.01, 0.03)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None, margin=0.05)
    fit.device = "cuda:0"
    bundle = fit._repr_mimebundle_()
    assert f"largest batch that ran: {fit.max_batch}" in bundle["text/plain"]
    html = bundle["text/html"]
    assert set(bundle) == {"text/plain", "text/html"}  # no image output for the HTML to hide
    [curve] = images(html, "gpunb-chart")
    import base64

    png = base64.b64decode(curve["src"].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and html.index("<table") < html.index("<img")
    assert "log scale" in curve["alt"] and f"largest batch that ran {fit.max_batch}" in curve["alt"]


def test_the_curve_has_a_log_batch_axis_and_no_background():
    run, _ = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.01, 0.03)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None, margin=0.05)
    fig = fit.figure()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and fig.patch.get_alpha() == 0.0 and ax.get_ylim()[0] == 0
    left, right = ax.get_xlim()
    assert left <= min(t.batch for t in fit.trials) and right >= fit.max_batch  # probes and answer in view
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", transparent=True)
    corner = Image.open(io.BytesIO(buf.getvalue())).convert("RGBA").getpixel((1, 1))
    assert corner[3] == 0  # transparent: the page's own background shows, light or dark
    d = fit.to_dict()
    assert d["trial_count"] == len(d["trials"]) and d["max_batch"] == fit.max_batch
    assert isinstance(BatchFit(False, "x").to_dict(), dict)


def optimizer_bound_gpu(params_bytes, per_sample, capacity, with_hook, overhead=0.02):
    """A step whose peak at small batches is the optimizer's (grads + Adam temporaries, batch
    independent), and the forward/backward activations only above some batch: peak(b) =
    max(F1, F2 + s*b). ``with_hook``: the forward+backward peak is reported as well."""
    base = 4 * params_bytes  # weights + Adam state
    f1 = base + 3 * params_bytes  # grads + foreach temporaries in optimizer.step
    f2 = base + params_bytes  # grads during backward

    def run(batch, purpose, n):
        fb = f2 + per_sample * batch
        if max(f1, fb) * (1 + overhead) > capacity:
            return Trial(n, batch, False, purpose)
        peak = max(f1, fb)
        return Trial(n, batch, True, purpose, peak, peak, None, peak_before_step_bytes=fb if with_hook else None,
                     base_allocated_bytes=base)

    true_max = math.floor((capacity / (1 + overhead) - f2) / per_sample)
    return run, true_max


@pytest.mark.parametrize("with_hook, most_trials", [(True, 4), (False, 6)])
def test_a_peak_set_by_the_optimizer_at_small_batches_does_not_fool_the_fit(with_hook, most_trials):
    # the MLP of the GPU test: 134 M parameters (0.5 GB), 0.66 MB per sample, 35 GB
    run, true_max = optimizer_bound_gpu(537 * MiB, 0.66 * MiB, 35 * GiB, with_hook)
    fit = search(run, capacity=35 * GiB, start=2, max_batch=None, margin=0.05)
    assert 0.95 * true_max <= fit.max_batch <= true_max, fit.trials
    assert fit.trial_count <= most_trials, [(t.batch, t.ok, t.purpose) for t in fit.trials]


def h200_mlp_gpu(per_sample=660_000, overhead=0.035):
    """The MLP of the GPU test as the H200 measured it (run 2, oom_gpufit_mlp.json): AdamW's state
    and the weights at the step's start (base), the gradients (537 MB) allocated in backward, so the
    forward+backward peak is base + grads + 135 KB/sample at small batches (the measured probes:
    1.9 MB of growth from batch 2 to 16, under one 2 MiB segment) and base + 660 KB/sample once the
    activations take over; the optimizer step peaks at base + 2 x grads. Capacity: the 0.25 cap."""
    base, grads, capacity = 1_679_581_184, 537_142_272, 37_527_470_080

    def run(batch, purpose, n):
        fb = max(base + grads + 135_168 * batch, base + per_sample * batch)
        fb = -(-fb // 512) * 512  # the allocator's 512 B rounding
        peak = max(fb, base + 2 * grads)
        if peak * (1 + overhead) > capacity:
            return Trial(n, batch, False, purpose, error="CUDA out of memory")
        reserved = -(-peak // (2 * MiB)) * 2 * MiB
        return Trial(n, batch, True, purpose, peak, reserved, 778_043_392, peak_before_step_bytes=fb,
                     base_allocated_bytes=base)

    true_max = math.floor((capacity / (1 + overhead) - base) / per_sample)
    return run, capacity, true_max


def test_h200_mlp_shape_a_convex_peak_is_scouted_not_extrapolated():
    run, capacity, true_max = h200_mlp_gpu()
    assert 52_000 < true_max < 53_000  # brute force on the H200 found 52384
    fit = search(run, capacity=capacity, start=2, max_batch=None, margin=0.05)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert moves[:2] == [(2, True, "probe"), (16, True, "probe")]
    # 1.9 MB of growth in 14 samples says nothing about 35 GB: scout before predicting
    assert moves[2][1:] == (True, "scout") and moves[2][0] < true_max, moves
    assert 0.95 * true_max <= fit.max_batch <= true_max, moves
    assert fit.trial_count <= 4, moves
    assert fit.predicted < 1.1 * true_max  # the prediction came from the scout, not the 254704 of the probes


@pytest.mark.parametrize("per_sample, overhead", [(500_000, 0.0), (660_000, 0.06), (900_000, 0.02),
                                                  (2_000_000, 0.04), (660_000 * 6, 0.03)])
def test_convex_peaks_of_other_sizes_stay_within_5_percent(per_sample, overhead):
    run, capacity, true_max = h200_mlp_gpu(per_sample, overhead)
    fit = search(run, capacity=capacity, start=2, max_batch=None, margin=0.05)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert 0.95 * true_max <= fit.max_batch <= true_max, moves
    assert fit.trial_count <= 5, moves


@pytest.mark.parametrize("model, probes, true_max, move", [
    # (batch, peak allocated, peak reserved, peak before optimizer.step, allocated at the step's start)
    ("mlp", [(2, 2753871872, 2755657728, 2216993792, 1679581184),
             (16, 2753929216, 2776629248, 2218886144, 1679581184)], 52384, "scout"),
    ("transformer", [(2, 800075264, 853540864, 800075264, 297226240),
                     (16, 4290604544, 4548722688, 4290604544, 297226240)], 146, "prediction"),
])
def test_the_recorded_h200_probes_lead_to_a_batch_that_fits(model, probes, true_max, move):
    # the H200 readings of run 2 (oom_gpufit_*.json), capacity the 0.25 cap; true_max by brute force
    trials = [Trial(i + 1, b, True, "probe", a, r, 778043392, peak_before_step_bytes=f, base_allocated_bytes=s)
              for i, (b, a, r, f, s) in enumerate(probes)]
    batch, purpose = next_trial(trials, capacity=37527470080, start=2, max_batch=None)
    assert purpose == move
    low = 0.5 if move == "scout" else 0.95  # a scout only has to fit; a prediction has to be the answer
    assert low * true_max <= batch <= true_max, batch
