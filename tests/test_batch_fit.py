"""%gpufit's search on synthetic trial readings (the policy is pure), and its CPU behaviour.

A simulated trial reads like a sustained run of the real runner (gpunb.analysis.fit.trial),
which starts every trial as a fresh process would: peak allocated over its steps, and a need
for reserved memory that is the allocator's overhead above the tensors (split blocks,
segment rounding, the layout of a fresh process). A batch trains when that need fits the
capacity; its true maximum is found by brute force. Some steps reserve more than they need
(cuDNN workspaces, variable lengths): the allocator gives that cache back when asked, so it
shows in the peak reserved without deciding anything.
"""

from __future__ import annotations

import math
import random

import pytest

from gpunb.analysis.fit.search import SAFETY, BatchFit, Line, Trial, fit_line, lines_from, next_trial, search
from tests.chart_html import images

GiB = 2**30
MiB = 2**20


def simulated_gpu(fixed, per_sample, capacity, overhead, *, intercept=0, bend=None, greedy=0.0, elastic=0.0):
    """A step whose activations grow on top of what it started with (``fixed``: weights and
    optimizer state, reported as the step's base as the runner does); a fresh process needs
    ``overhead`` more than the tensors for them. ``bend=(c0, s)``: a convex peak, max(c0 + s*b,
    per_sample*b), as when gradients set the peak at small batches. ``greedy``: the step keeps
    that much more cached than it needs, up to the capacity, and gives it back when asked.
    ``elastic``: a workspace of that share of ``per_sample`` per sample, in the peak when it fits
    and dropped when it does not (cuDNN catches the out-of-memory error and runs a plan with a
    smaller one): it never decides whether the batch trains."""

    def need(batch):
        act = intercept + per_sample * batch
        if bend:
            act = max(act, bend[0] + bend[1] * batch)
        return fixed + act, fixed + math.ceil(act * (1 + overhead) / (2 * MiB)) * 2 * MiB + 20 * MiB

    def run(batch, purpose, n):
        allocated, needed = need(batch)
        if needed > capacity:
            return Trial(n, batch, False, purpose, error="CUDA out of memory", steps=50, steps_done=1,
                         capacity_bytes=capacity)
        want = elastic * per_sample * batch
        workspace = want if needed + want <= capacity else 0
        held = fixed + (needed + workspace - fixed) * (1 + greedy)
        released = int(held > capacity)
        return Trial(n, batch, True, purpose, int(allocated + workspace), int(min(held, capacity)), 512 * MiB,
                     base_allocated_bytes=int(fixed), steps=50, steps_done=50, cache_releases=released,
                     caught_ooms=int(workspace < want), capacity_bytes=capacity)

    lo, hi = 0, 10**9
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid)[1] <= capacity else (lo, mid)
    return run, lo


def test_line_fit_recovers_slope_and_intercept():
    line = fit_line([(2, 10 * GiB + 2 * 3 * MiB), (16, 10 * GiB + 16 * 3 * MiB)])
    assert line.slope == pytest.approx(3 * MiB) and line.intercept == pytest.approx(10 * GiB)
    assert line.largest_batch(10 * GiB + 300 * MiB) == pytest.approx(100)
    assert fit_line([(4, 1.0)]) is None
    assert Line(5.0, 0.0).largest_batch(10) == math.inf


def test_a_trial_fits_when_it_trains_every_step():
    kw = dict(steps=50, capacity_bytes=10 * GiB)
    assert Trial(1, 8, True, "probe", GiB, 2 * GiB, steps_done=50, **kw).fits
    edge = Trial(1, 8, True, "probe", GiB, 10 * GiB, steps_done=50, cache_releases=3, caught_ooms=2, **kw)
    assert edge.fits and edge.at_edge  # a fresh process gives its cache back too: recorded, not held against it
    assert "gave its cache back 3×" in edge.verdict and "cuDNN caught 2" in edge.verdict
    assert not Trial(1, 8, False, "probe", steps_done=7, **kw).fits
    assert Trial(1, 8, False, "x", steps=50, steps_done=7).verdict == "out of memory at step 8"
    assert Trial(1, 8, True, "probe", GiB, 2 * GiB, steps_done=50, **kw).to_dict()["fits"] is True


def test_first_moves_are_two_probes_a_scout_then_candidates_that_bracket_the_limit():
    run, true_max = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.06)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None)
    moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
    assert moves[:2] == [(2, "probe", True), (16, "probe", True)]
    assert fit.trials[2].purpose == "scout" and fit.trials[2].fits
    # the scout fills about a third: there the overhead of large blocks shows in peak reserved
    assert 0.2 * true_max < fit.trials[2].batch < 0.5 * true_max, moves
    assert fit.trials[3].purpose == "candidate"
    assert fit.verified <= true_max and fit.recommended == math.floor(fit.verified * (1 - SAFETY))
    assert 0.93 * true_max <= fit.recommended, moves


@pytest.mark.parametrize("seed", range(4))
def test_the_recommendation_never_exceeds_the_largest_batch_that_trains_and_is_within_10_percent(seed):
    rng = random.Random(seed)
    ratios, counts = [], []
    for _ in range(80):
        fixed = rng.uniform(0.5, 60) * GiB
        per_sample = rng.uniform(0.2, 400) * MiB
        capacity = int(rng.uniform(fixed + 5 * GiB, 140 * GiB))
        intercept = rng.uniform(0, 0.1) * (capacity - fixed) if rng.random() < 0.3 else 0
        greedy = rng.choice([0.0, 0.0, 0.3, 0.8])
        run, true_max = simulated_gpu(fixed, per_sample, capacity, rng.uniform(0, 0.15), intercept=intercept,
                                      greedy=greedy)
        fit = search(run, capacity=capacity, start=2, max_batch=None)
        moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
        assert fit.ok and fit.recommended <= true_max, moves  # below what trained, with the safety
        assert any(t.fits for t in fit.trials if t.batch == fit.verified)
        ratios.append(fit.recommended / true_max)
        counts.append(fit.trial_count)
    assert min(ratios) >= 0.9, min(ratios)
    assert sum(r >= 0.93 for r in ratios) >= 0.8 * len(ratios)
    assert max(counts) <= 6, counts


@pytest.mark.parametrize("greedy", [0.5, 1.5])
def test_a_step_that_reserves_more_than_it_needs_is_not_fit_by_its_reserve(greedy):
    # cuDNN's workspaces and variable lengths fill the cache (on the H200: 5.45 GiB reserved for
    # 3.31 GiB allocated); what decides is whether it trains, and the fit goes to the limit
    run, true_max = simulated_gpu(0.2 * GiB, 75 * MiB, 6 * GiB, 0.08, greedy=greedy)
    fit = search(run, capacity=6 * GiB, start=2, max_batch=None)
    moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
    assert 0.9 * true_max <= fit.recommended <= true_max, (true_max, moves)
    assert fit.trial_count <= 6


def test_a_first_candidate_that_does_not_train_is_backed_off_then_bisected():
    # the fresh layout needs 25 % more than the tensors near the limit, but only 2 % at the scout
    def run(batch, purpose, n):
        act = 30 * MiB * batch
        overhead = 0.02 if batch < 1500 else 0.25
        need = 4 * GiB + act * (1 + overhead)
        if need > 100 * GiB:
            return Trial(n, batch, False, purpose, steps=50, steps_done=1, capacity_bytes=100 * GiB)
        return Trial(n, batch, True, purpose, 4 * GiB + act, int(need), base_allocated_bytes=4 * GiB,
                     steps=50, steps_done=50, capacity_bytes=100 * GiB)

    true_max = math.floor(96 * GiB / 1.25 / (30 * MiB))
    fit = search(run, capacity=100 * GiB, start=2, max_batch=None)
    moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
    assert ("back off" in [m[1] for m in moves]) and not fit.trials[3].fits, moves
    assert fit.recommended <= true_max and fit.verified < min(t.batch for t in fit.trials if not t.fits)
    assert fit.recommended >= 0.85 * true_max, moves


def test_issue_24_a_scout_whose_cache_overstates_the_overhead_costs_no_more_than_one_step():
    # The H200's bn_convnet under 20 GiB (benchmarks/results/h200_s4_fit_margin_diagnosis.md):
    # 24.18 MiB per sample, the scout reserved 1.81x what it allocated (cached blocks the
    # allocator gives back near the limit), the limit at 0.86 of the allocated line's end. With
    # the limit 1-2 % lower the first candidate (held up at 85 % of the line) misses, and the
    # back-off went down to the overhead-scaled line (63 % of the limit): 85.6-87 %, the issue's 88 %.
    for overhead in (0.18, 0.2, 0.24):
        run, true_max = simulated_gpu(0.064 * GiB, 24.18 * MiB, 20 * GiB, overhead, greedy=0.55)
        fit = search(run, capacity=20 * GiB, start=2, max_batch=None)
        moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
        assert not fit.trials[3].fits and fit.trials[3].purpose == "candidate", moves  # the case of the issue
        assert fit.trials[4].batch >= 0.85 * fit.trials[3].batch, moves  # not down to the overhead line
        assert 0.9 * true_max <= fit.recommended <= true_max, (true_max, moves)
        assert fit.trial_count <= 6


@pytest.mark.parametrize("elastic", [0.05, 0.08, 0.12])
def test_a_peak_that_gives_way_near_the_limit_is_followed_beyond_the_line(elastic):
    # cuDNN's workspace is in every peak below the line's end and gives way above it: the line
    # ends before the limit, and a search that stops there recommends 86-91 %
    run, true_max = simulated_gpu(0.05 * GiB, 24.2 * MiB, 20 * GiB, 0.005, elastic=elastic)
    fit = search(run, capacity=20 * GiB, start=2, max_batch=None)
    moves = [(t.batch, t.purpose, t.fits) for t in fit.trials]
    beyond = [t for t in fit.trials if t.purpose == "beyond"]
    assert beyond and fit.line_allocated is not None, moves
    assert beyond[0].batch > fit.trials[beyond[0].index - 2].batch  # above the batch that trained
    assert fit.verified > fit.predicted and any("gives way near the limit" in n for n in fit.notes), fit.notes
    assert 0.9 * true_max <= fit.recommended <= true_max, (true_max, moves)
    assert fit.trial_count <= 6


@pytest.mark.parametrize("seed", range(2))
def test_with_large_overheads_greedy_caches_and_elastic_workspaces_90_percent_is_the_rule(seed):
    rng = random.Random(100 + seed)
    ratios = []
    for _ in range(120):
        fixed = rng.uniform(0.5, 60) * GiB
        capacity = int(rng.uniform(fixed + 5 * GiB, 140 * GiB))
        intercept = rng.uniform(0, 0.1) * (capacity - fixed) if rng.random() < 0.3 else 0
        run, true_max = simulated_gpu(fixed, rng.uniform(0.2, 400) * MiB, capacity, rng.uniform(0, 0.3),
                                      intercept=intercept, greedy=rng.choice([0.0, 0.3, 0.8, 1.2]),
                                      elastic=rng.choice([0.0, 0.0, rng.uniform(0, 0.1)]))
        if true_max < 4:
            continue
        fit = search(run, capacity=capacity, start=2, max_batch=None)
        assert fit.ok and fit.recommended <= true_max and fit.trial_count <= 6
        ratios.append(fit.recommended / true_max)
    assert sum(r >= 0.9 for r in ratios) >= 0.95 * len(ratios), sorted(ratios)[:10]
    assert min(ratios) >= 0.8, sorted(ratios)[:10]


def test_a_trial_over_the_capacity_it_may_use_does_not_count_as_fitting():
    t = Trial(1, 8, True, "beyond", 5 * GiB, 5 * GiB, steps=50, steps_done=50, capacity_bytes=4 * GiB)
    assert t.over_capacity and not t.fits and t.verdict == "over the 4.00 GiB it may use"
    assert Trial(1, 8, True, "beyond", 4 * GiB, 5 * GiB, steps=50, steps_done=50, capacity_bytes=4 * GiB).fits


def test_the_safety_is_taken_only_at_the_limit():
    run, _true_max = simulated_gpu(1 * GiB, 1 * MiB, 100 * GiB, 0.0)
    fit = search(run, capacity=100 * GiB, start=2, max_batch=512)
    assert fit.recommended == fit.verified == 512 and fit.safety == 0  # the cap, far below the limit
    assert any("max_batch=512" in n for n in fit.notes)
    fit = search(run, capacity=100 * GiB, start=2, max_batch=None)
    assert fit.safety == SAFETY and fit.recommended == math.floor(fit.verified * (1 - SAFETY))


def test_a_start_that_does_not_fit_is_halved_and_nothing_fitting_is_reported():
    run, true_max = simulated_gpu(10 * GiB, 1 * GiB, 20 * GiB, 0.0)
    fit = search(run, capacity=20 * GiB, start=64, max_batch=None)
    assert fit.trials[0].batch == 64 and not fit.trials[0].fits and fit.trials[1].purpose == "smaller start"
    assert fit.ok and true_max - 2 <= fit.recommended <= true_max  # 9 here: one sample is 10 %
    run, _ = simulated_gpu(30 * GiB, 1 * GiB, 20 * GiB, 0.0)
    fit = search(run, capacity=20 * GiB, start=4, max_batch=None)
    assert not fit.ok and "even the smallest batch" in fit.problem
    assert [t.batch for t in fit.trials] == [4, 2, 1]


def test_memory_that_does_not_grow_is_flagged():
    def run(batch, purpose, n):
        return Trial(n, batch, True, purpose, GiB, GiB, 0, steps=1, steps_done=1)

    fit = search(run, capacity=10 * GiB, start=2, max_batch=None, max_trials=4)
    assert fit.trial_count == 4 and any("does step_fn use" in n for n in fit.notes)
    assert fit.safety == 0  # nothing suggests a limit near it


def test_nvml_memory_outside_torch_that_grows_counts_against_capacity():
    kw = dict(steps=1, steps_done=1)
    a = Trial(1, 2, True, "probe", 10 * GiB, 10 * GiB, 500 * MiB, **kw)
    b = Trial(2, 16, True, "probe", 11 * GiB, 11 * GiB, 500 * MiB + 14 * 64 * MiB, **kw)
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
    ({"steps": "2"}, "steps must be"), ({"margin": True}, "margin must be"),
])
def test_bad_arguments_are_explained(kwargs, words):
    from gpunb import fit_batch_size

    fit = fit_batch_size(lambda bs: None, progress=False, **kwargs)
    assert not fit.ok and words in fit.problem
    assert not fit_batch_size(42, progress=False).ok


def test_result_renders_text_and_html_with_the_curve_inside():
    run, _ = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.03)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None)
    fit.device = "cuda:0"
    bundle = fit._repr_mimebundle_()
    text = bundle["text/plain"]
    assert f"recommended batch: {fit.recommended}" in text and "50 steps" in text
    assert f"{fit.verified} trained" in text and "3 % below" in text
    assert f"{fit.trial_count} trials in" in text and "free" in text  # the measured headroom
    html = bundle["text/html"]
    assert "<table" in html and str(fit.recommended) in html
    assert set(bundle) == {"text/plain", "text/html"}  # no image output for the HTML to hide
    [curve] = images(html, "gpunb-chart")
    import base64

    png = base64.b64decode(curve["src"].split(",", 1)[1])
    # the answer, then the curve; the trials' table one click away
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and html.index("<img") < html.index("<details") < html.index("<table")
    assert html.index(f"recommended batch: {fit.recommended}") < html.index("<img")
    assert "log scale" in curve["alt"] and f"recommended {fit.recommended}" in curve["alt"]
    d = fit.to_dict()
    assert d["trial_count"] == len(d["trials"]) and d["recommended"] == fit.recommended
    assert d["headroom_bytes"] == 120 * GiB - fit.verified_trial.peak_reserved_bytes > 0
    assert isinstance(BatchFit(False, "x").to_dict(), dict)


def test_the_curve_has_a_log_batch_axis_and_no_background():
    run, _ = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.03)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None)
    fig = fit.figure()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and fig.patch.get_alpha() == 0.0 and ax.get_ylim()[0] == 0
    left, right = ax.get_xlim()
    assert left <= min(t.batch for t in fit.trials) and right >= fit.recommended  # probes and answer in view
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", transparent=True)
    corner = Image.open(io.BytesIO(buf.getvalue())).convert("RGBA").getpixel((1, 1))
    assert corner[3] == 0  # transparent: the page's own background shows, light or dark
    # a batch axis people read: plain numbers, not 10¹/10²
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(label.replace(",", "").isdigit() for label in labels), labels
    # each legend entry in its series' colour (a grey one vanished on the dark theme)
    from matplotlib.colors import to_hex

    colors = {t.get_text(): to_hex(t.get_color()) for t in ax.get_legend().get_texts()}
    assert colors["peak allocated"] == "#3b7dd8" and colors["peak reserved"] == "#e06c00"
    assert "#7d8590" not in colors.values()


def optimizer_bound_gpu(params_bytes, per_sample, capacity, with_hook, overhead=0.02):
    """A step whose peak at small batches is the optimizer's (grads + Adam temporaries, batch
    independent), and the forward/backward activations only above some batch: peak(b) =
    max(F1, F2 + s*b). ``with_hook``: the forward+backward peak is reported as well."""
    base = 4 * params_bytes  # weights + Adam state
    f1 = base + 3 * params_bytes  # grads + foreach temporaries in optimizer.step
    f2 = base + params_bytes  # grads during backward

    def run(batch, purpose, n):
        fb = f2 + per_sample * batch
        peak = max(f1, fb)
        reserved = base + (peak - base) * (1 + overhead)
        if reserved > capacity:
            return Trial(n, batch, False, purpose, steps=50, steps_done=1, capacity_bytes=capacity)
        return Trial(n, batch, True, purpose, peak, int(reserved), None,
                     peak_before_step_bytes=fb if with_hook else None, base_allocated_bytes=base, steps=50,
                     steps_done=50, capacity_bytes=capacity)

    true_max = math.floor(((capacity - base) / (1 + overhead) + base - f2) / per_sample)
    return run, true_max


@pytest.mark.parametrize("with_hook", [True, False])
def test_a_peak_set_by_the_optimizer_at_small_batches_does_not_fool_the_fit(with_hook):
    # the MLP of the GPU test: 134 M parameters (0.5 GB), 0.66 MB per sample, 35 GB
    run, true_max = optimizer_bound_gpu(537 * MiB, 0.66 * MiB, 35 * GiB, with_hook)
    fit = search(run, capacity=35 * GiB, start=2, max_batch=None)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert 0.9 * true_max <= fit.recommended <= true_max, moves
    assert fit.trial_count <= 6, moves


def h200_mlp_gpu(per_sample=660_000, overhead=0.035):
    """The MLP of the GPU test as the H200 measured it (run 2, oom_gpufit_mlp.json): AdamW's state
    and the weights at the step's start (base), the gradients (537 MB) allocated in backward, so the
    forward+backward peak is base + grads + 135 KB/sample at small batches (the measured probes:
    1.9 MB of growth from batch 2 to 16, under one 2 MiB segment) and base + 660 KB/sample once the
    activations take over; the optimizer step peaks at base + 2 x grads. Capacity: the 0.25 cap."""
    base, grads, capacity = 1_679_581_184, 537_142_272, 37_527_470_080

    def need(batch):
        fb = max(base + grads + 135_168 * batch, base + per_sample * batch)
        fb = -(-fb // 512) * 512  # the allocator's 512 B rounding
        peak = max(fb, base + 2 * grads)
        return fb, peak, -(-int(base + (peak - base) * (1 + overhead)) // (2 * MiB)) * 2 * MiB

    def run(batch, purpose, n):
        fb, peak, reserved = need(batch)
        if reserved > capacity:
            return Trial(n, batch, False, purpose, error="CUDA out of memory", steps=50, steps_done=1,
                         capacity_bytes=capacity)
        return Trial(n, batch, True, purpose, peak, reserved, 778_043_392, peak_before_step_bytes=fb,
                     base_allocated_bytes=base, steps=50, steps_done=50, capacity_bytes=capacity)

    lo, hi = 1, 10**7
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid)[2] <= capacity else (lo, mid)
    return run, capacity, lo


def test_h200_mlp_shape_a_convex_peak_is_scouted_not_extrapolated():
    run, capacity, true_max = h200_mlp_gpu()
    assert 52_000 < true_max < 53_000  # brute force on the H200 found 52384 (2 steps, same process)
    fit = search(run, capacity=capacity, start=2, max_batch=None)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert moves[:2] == [(2, True, "probe"), (16, True, "probe")]
    # 1.9 MB of growth in 14 samples says nothing about 35 GB: scout before predicting
    assert moves[2][1:] == (True, "scout") and moves[2][0] < true_max, moves
    assert 0.93 * true_max <= fit.recommended <= true_max, moves
    assert fit.trial_count <= 6, moves
    assert fit.predicted < 1.1 * true_max  # the prediction came from the scouts, not the 254704 of the probes


@pytest.mark.parametrize("per_sample, overhead", [(500_000, 0.0), (660_000, 0.06), (900_000, 0.02),
                                                  (2_000_000, 0.04), (660_000 * 6, 0.03), (660_000, 0.15)])
def test_convex_peaks_of_other_sizes_stay_within_10_percent(per_sample, overhead):
    run, capacity, true_max = h200_mlp_gpu(per_sample, overhead)
    fit = search(run, capacity=capacity, start=2, max_batch=None)
    moves = [(t.batch, t.ok, t.purpose) for t in fit.trials]
    assert 0.9 * true_max <= fit.recommended <= true_max, moves
    assert fit.trial_count <= 6, moves


@pytest.mark.parametrize("model, probes, true_max", [
    # (batch, peak allocated, peak reserved, peak before optimizer.step, allocated at the step's start)
    ("mlp", [(2, 2753871872, 2755657728, 2216993792, 1679581184),
             (16, 2753929216, 2776629248, 2218886144, 1679581184)], 52384),
    ("transformer", [(2, 800075264, 853540864, 800075264, 297226240),
                     (16, 4290604544, 4548722688, 4290604544, 297226240)], 146),
])
def test_the_recorded_h200_probes_lead_to_a_scout_that_fits(model, probes, true_max):
    # the H200 readings of run 2 (oom_gpufit_*.json), capacity the 0.25 cap; true_max by brute force
    trials = [Trial(i + 1, b, True, "probe", a, r, 778043392, peak_before_step_bytes=f, base_allocated_bytes=s,
                    steps=50, steps_done=50) for i, (b, a, r, f, s) in enumerate(probes)]
    batch, purpose = next_trial(trials, capacity=37527470080, start=2, max_batch=None)
    assert purpose == "scout"
    assert 16 < batch <= 0.7 * true_max, batch  # a scout has to fit with room, and be larger than the probes
