"""On the GPU: ``gpunb.fit_batch_size`` leaves two models mid-training exactly as it found them,
bit for bit (issue 22 measured the weights and BatchNorm statistics changed on the H200, and a
scheduler stepped inside the step left 18 epochs ahead).

- a BatchNorm conv net, SGD with momentum, a StepLR stepped inside the step, left in eval();
- an MLP trained with autocast (bfloat16), AdamW, a OneCycleLR stepped inside the step and a
  GradScaler;

each trained a few steps first, then fitted (real OOMs at the large batches); after a normal fit
and after a Ctrl-C in the middle of the trials. Compared: weights, buffers, gradients, optimizer
state and hyperparameters, scheduler and scaler state, the Python, NumPy, torch CPU and CUDA RNG
states and every module's mode.

Run on the GPU machine (about a minute on one H200):
    python -m pytest -m gpu tests/gpu/test_fit_restore_gpu.py -v
Results: $GPUNB_RESULTS/fit_restore_gpu.json.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit.search import fit_batch_size  # noqa: E402
from tests.fit_state import MODELS, differences, everything, interrupted_at  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402

RESULTS: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def write_results():
    yield
    save_json("fit_restore_gpu.json", {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "cases": RESULTS})
    fit_search._LAST.clear()


@pytest.mark.parametrize("kind", ["convnet", "mlp"])
@pytest.mark.parametrize("interrupt_at", [None, 30])
def test_the_fit_leaves_a_model_mid_training_bit_for_bit(kind, interrupt_at):
    t = MODELS[kind](gpu=True).mid_training()
    torch.cuda.synchronize()
    before = everything(t)
    step, calls = interrupted_at(t.step, interrupt_at)
    t0 = time.perf_counter()
    result = None
    if interrupt_at is None:
        result = fit_batch_size(step, steps=10, max_trials=5)
        assert result.ok, result.problem
    else:
        with pytest.raises(KeyboardInterrupt):
            fit_batch_size(step, steps=10, max_trials=5)
    torch.cuda.synchronize()
    diff = differences(before, everything(t))
    RESULTS[f"{kind}, {'Ctrl-C at step call ' + str(interrupt_at) if interrupt_at else 'normal fit'}"] = {
        "seconds": time.perf_counter() - t0, "step_calls": calls[0], "differences": diff,
        "recommended": result.recommended if result is not None else None,
        "notes": list(result.notes) if result is not None else [],
    }
    assert diff == []
