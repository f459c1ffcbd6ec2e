"""Naming live tensors by the notebook references that keep them alive (CPU tensors)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def ip(ip):
    ip.reset(new_session=False)  # the shell is a process-wide singleton: start from an empty namespace
    return ip

from gpunb.analysis.memory.census import EXCEPTION, NAMESPACE, OUTPUT_HISTORY, take_census  # noqa: E402


def _trained():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    return model, opt


def test_parameters_gradients_and_optimizer_state_get_model_names():
    model, opt = _trained()
    c = take_census({"opt": opt, "model": model}, torch=torch)  # optimizer first in the dict on purpose
    w = c.find("model.0.weight")
    assert w.role == "parameter" and w.nbytes == 32 * 64 * 4 and w.shape == (64, 32) and w.device == "cpu"
    assert c.find("model.0.weight.grad").role == "gradient"
    assert c.find("opt.state[model.0.weight].exp_avg").role == "optimizer state"
    assert c.find("opt.state[model.2.bias].exp_avg_sq").nbytes == 4 * 4
    assert c.find("model.1.running_mean").role == "parameter"  # buffers are model state
    by = c.by_role()
    params = sum(p.numel() * 4 for p in model.parameters())
    assert by["gradient"] == params
    assert by["optimizer state"] >= 2 * params  # exp_avg + exp_avg_sq (+ step counters)


def test_containers_attributes_views_and_depth_bound():
    base = torch.zeros(1000)

    class Holder:
        def __init__(self):
            self.cache = {"batch": [torch.ones(10, 10)]}

    ns = {"h": Holder(), "view": base[10:20], "base": base, "deep": [[[[[torch.ones(3)]]]]]}
    c = take_census(ns, torch=torch)
    assert c.find("h.cache['batch'][0]").nbytes == 400
    # a view and its base share one storage: counted once, under the first name found
    names = [e.name for e in c.entries if e.nbytes == 4000]
    assert names == ["view"]
    assert c.total_bytes() == 400 + 4000 + 12  # five lists deep: within the walk's depth bound (8)
    assert take_census(ns, torch=torch, max_depth=4).total_bytes() == 400 + 4000  # beyond a bound of 4


def test_ipython_names_are_skipped_and_output_history_is_a_leftover():
    t = torch.ones(100)
    kept = torch.ones(50)
    ns = {"_": t, "_3": t, "Out": {3: t}, "In": ["x"], "kept": kept}
    c = take_census(ns, torch=torch, output_history={3: t})
    assert c.find("Out[3]").source == OUTPUT_HISTORY and c.find("Out[3]").leftover
    assert c.find("kept").source == NAMESPACE and not c.find("kept").leftover
    assert {e.name for e in c.leftovers} == {"Out[3]"}


def test_tensors_held_only_by_an_exception_frame_are_found():
    def failing():
        activations = torch.zeros(256, 256)  # noqa: F841
        raise RuntimeError("CUDA out of memory.")

    try:
        failing()
    except RuntimeError as exc:
        err = exc
    c = take_census({}, torch=torch, exceptions=[(EXCEPTION, err)])
    e = c.find("failing() local activations")
    assert e is not None and e.source == EXCEPTION and e.nbytes == 256 * 256 * 4


def test_device_filter_keeps_only_requested_devices():
    c = take_census({"x": torch.ones(10)}, torch=torch, devices={"cuda"})
    assert c.entries == ()
    assert take_census({"x": torch.ones(10)}, torch=torch, devices={"cpu"}).total_bytes() == 40


def test_without_torch_the_census_is_empty(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    assert take_census({"x": 1}).entries == ()


def test_node_bound_marks_truncation():
    c = take_census({"many": [torch.ones(1) for _ in range(50)]}, torch=torch, max_nodes=10)
    assert c.truncated and len(c.entries) < 50


def test_the_shortest_reference_names_a_tensor_and_the_shell_is_not_walked(ip):
    ip.run_cell("import torch\nholder = {'inner': {'deep': None}}\nx = torch.ones(7)\n"
                "holder['inner']['deep'] = x\nshell = get_ipython()")
    c = take_census(ip.user_ns, torch=torch)
    assert c.find("x") is not None  # not holder['inner']['deep'], which the walk meets first
    assert not any(e.name.startswith("shell") for e in c.entries)
