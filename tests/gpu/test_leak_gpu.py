"""The leak finder of %%gpuprofile on a real GPU: each classic pattern is named with its holder
and fix, the steady loop stays silent, and the finder's own time stays within its budget.

Run on the GPU machine:  python -m pytest -m gpu tests/gpu/test_leak_gpu.py -v   (~30 s)
What it measured goes to $GPUNB_RESULTS/leak_gpu.json.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import gpunb  # noqa: E402
from tests.gpu.results import save_json  # noqa: E402

CELL_S = 4.0  # each loop runs this long: long enough for several looks within 0.5 % of it
STEP_SLEEP_S = 0.008  # a host-side pause per step, as a data loader would take
RESULTS: dict[str, dict] = {}


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _batch():
    return torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")


def _record(name: str, p) -> dict:
    r = p.result.leak
    out = {"steps": p.result.steps.count, "wall_s": p.result.wall_s, "looks": r.looks, "look_steps": list(r.steps),
           "looks_skipped": r.looks_skipped, "finder_s": r.cost_s, "finder_share": r.cost_share,
           "allocated_per_step": r.allocated_per_step, "note": r.note,
           "findings": [f.to_dict() for f in r.findings],
           "end_allocated": p.result.gpu.end_allocated_bytes if p.result.gpu else None,
           "peak_reserved": p.result.gpu.peak_reserved_bytes if p.result.gpu else None,
           "first_advice": p.result.advice[0].title if p.result.advice else None,
           "text_head": str(p.result).splitlines()[:3]}
    RESULTS[name] = out
    save_json("leak_gpu.json", RESULTS)
    return out


def _until(deadline: float) -> bool:
    time.sleep(STEP_SLEEP_S)
    return time.perf_counter() < deadline


def _train_step(model, opt, x, y):
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return logits, loss


def test_steady_loop_stays_silent():
    model, opt = _model()
    x, y = _batch()
    # detached scalars: 4 bytes a step (512 B in the caching allocator), no history: silent on purpose
    losses, more = [], []
    with gpunb.profile(show=False, record=False) as p:
        deadline = time.perf_counter() + CELL_S
        while True:
            step = _train_step(model, opt, x, y)
            losses.append(step[1].detach())
            more.append(step[1].detach() * 2)  # two a step: 1 KiB of allocated bytes a step
            if not _until(deadline):
                break
    out = _record("steady", p)
    assert p.result.leak.looks >= 4, out
    assert p.result.leak.findings == (), out
    assert p.result.leak.cost_share <= 0.01, out


def test_outputs_appended_with_their_graph():
    model, opt = _model()
    x, y = _batch()
    all_preds = []
    with gpunb.profile(show=False, record=False) as p:
        deadline = time.perf_counter() + CELL_S
        while True:
            logits, _ = _train_step(model, opt, x, y)
            all_preds.append(logits)
            if not _until(deadline):
                break
    out = _record("append", p)
    f = p.result.leak.findings[0]
    assert f.holder == "all_preds" and f.pattern == "history", out
    assert "logits.detach()" in f.fix, out
    assert p.result.leak.allocated_per_step and p.result.leak.allocated_per_step >= 0.9 * 64 * 10 * 4, out  # the logits
    assert p.result.advice[0].title.startswith("Stop memory"), out
    assert p.result.leak.cost_share <= 0.01, out


def test_total_loss_keeps_every_graph():
    model, opt = _model()
    x, y = _batch()
    total_loss = 0.0
    with gpunb.profile(show=False, record=False) as p:
        deadline = time.perf_counter() + CELL_S
        while True:
            _, loss = _train_step(model, opt, x, y)
            total_loss += loss
            if not _until(deadline):
                break
    out = _record("total_loss", p)
    f = p.result.leak.findings[0]
    assert f.holder == "total_loss" and f.pattern == "graph", out
    assert "loss.item()" in f.fix, out
    assert p.result.leak.cost_share <= 0.01, out


def test_dict_cache_of_tensors():
    model, opt = _model()
    x, y = _batch()
    cache = {}
    with gpunb.profile(show=False, record=False) as p:
        deadline = time.perf_counter() + CELL_S
        i = 0
        while True:
            _train_step(model, opt, x, y)
            cache[i] = x * 1.0  # a detached copy of the batch: 64 KiB a step
            i += 1
            if not _until(deadline):
                break
    out = _record("cache", p)
    f = p.result.leak.findings[0]
    assert f.holder == "cache" and f.pattern == "tensors", out
    assert p.result.leak.allocated_per_step and abs(p.result.leak.allocated_per_step - 64 * 256 * 4) < 8192, out


def test_forward_hook_storing_activations():
    model, opt = _model()
    x, y = _batch()
    acts = []

    def save(module, inputs, output):
        acts.append(output)

    handle = model[0].register_forward_hook(save)
    try:
        with gpunb.profile(show=False, record=False) as p:
            deadline = time.perf_counter() + CELL_S
            while True:
                _train_step(model, opt, x, y)
                if not _until(deadline):
                    break
    finally:
        handle.remove()
    out = _record("hook", p)
    f = p.result.leak.findings[0]
    assert f.pattern == "history" and "`save`" in f.sentence and "`model.0`" in f.sentence, out
    assert "output.detach()" in f.fix, out


def test_caching_allocator_growth_is_not_a_leak():
    """Reserved bytes grow (each step allocates and frees a temporary 4 MiB larger than the one
    before: above the allocator's 2 MiB rounding of large blocks, so no cached block fits it and
    the caching allocator must reserve a new segment), allocated bytes at step ends do not."""
    model, opt = _model()
    x, y = _batch()
    base, grow, growing_steps = 16 * 2**20, 4 * 2**20, 100  # ~21 GB reserved in all, given back below
    try:
        with gpunb.profile(show=False, record=False) as p:
            deadline = time.perf_counter() + CELL_S
            i = 0
            while True:
                _train_step(model, opt, x, y)
                scratch = torch.empty((base + grow * min(i, growing_steps)) // 4, device="cuda")
                scratch.fill_(2.0)
                del scratch  # freed before the next step ends: the allocator keeps its segment
                i += 1
                if not _until(deadline):
                    break
        out = _record("caching_allocator", p)
        timeline = p.result.memory_timeline
        out["reserved_first_last"] = [timeline[1][2], timeline[-1][2]]
        out["allocated_first_last"] = [timeline[1][1], timeline[-1][1]]
        save_json("leak_gpu.json", RESULTS)
    finally:
        torch.cuda.empty_cache()  # the tests after this one start from the usual cache
    assert timeline[-1][2] > timeline[1][2] + 32 * 2**20, out  # reserved grew by more than 32 MiB
    assert p.result.leak.findings == (), out
