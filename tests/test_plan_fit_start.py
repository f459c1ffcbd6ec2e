"""``%gpufit`` starting at the plan's largest batch (``next_trial(planned=...)``): on generated
simulated GPUs and plans that err either way, the search's answer never trains less than without
a plan would allow to fit (it still trains: every answer is a batch that ran), and a plan close to
the limit saves trials."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunb.analysis.fit.search import PLANNED, search
from tests.test_batch_fit import GiB, MiB, simulated_gpu


@settings(max_examples=60, deadline=None)
@given(per_sample=st.integers(1, 400), fixed=st.integers(1, 8), error=st.floats(-0.5, 0.3))
def test_a_planned_start_gives_a_batch_that_trained_near_the_limit(per_sample, fixed, error):
    capacity = 20 * GiB
    run, limit = simulated_gpu(fixed * GiB, per_sample * MiB, capacity, 0.05)
    planned = max(1, int(limit * (1 + error)))
    fit = search(run, capacity=capacity, start=2, max_batch=None, planned=planned)
    assert fit.trials[0].batch == planned and fit.trials[0].purpose == PLANNED[0]
    assert fit.verified is not None and fit.verified <= limit  # what trained, under the true limit
    assert any(t.batch == fit.verified and t.fits for t in fit.trials)
    assert fit.recommended >= 0.85 * limit  # close to it as without a plan


@pytest.mark.parametrize("error", [-0.08, -0.03])
def test_a_plan_just_under_the_limit_saves_trials(error):
    capacity = 20 * GiB
    run, limit = simulated_gpu(2 * GiB, 40 * MiB, capacity, 0.05)
    plain = search(run, capacity=capacity, start=2, max_batch=None)
    planned = search(run, capacity=capacity, start=2, max_batch=None, planned=int(limit * (1 + error)))
    assert planned.trial_count < plain.trial_count
    assert planned.recommended >= plain.recommended * 0.97
