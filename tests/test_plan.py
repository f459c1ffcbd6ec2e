"""``gpunb.plan`` / ``%gpuplan`` on the CPU: roles and lines, a step that cannot run, the user's state
left as it was (generated models and optimizers; an interrupt at every operation of the step),
the largest batch, the GPU table and the magic's arguments."""

from __future__ import annotations

import random
import sys

import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpunb.analysis.plan import calibration  # noqa: E402
from gpunb.analysis.plan.gpus import gpu_named, with_cap  # noqa: E402
from gpunb.analysis.plan.planner import plan  # noqa: E402
from gpunb.analysis.plan.replay import fits_under  # noqa: E402

nn = torch.nn
MiB = 2**20


class Mlp(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, width)
        self.norm = nn.BatchNorm1d(width)
        self.fc2 = nn.Linear(width, 8)

    def forward(self, x):
        h = torch.relu(self.norm(self.fc1(x)))  # the line of the hidden activations
        return self.fc2(h)


def make(opt_name: str = "adamw", width: int = 256, **opt_kw):
    torch.manual_seed(0)
    model = Mlp(width)
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[opt_name]
    opt = cls(model.parameters(), lr=1e-3, **opt_kw)

    def step(bs: int) -> None:
        x = torch.randn(bs, 64)
        loss = model(x).logsumexp(1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


# -- what the plan says -------------------------------------------------------------------------

def test_roles_lines_and_the_first_step():
    model, _opt, step = make()
    p = plan(step, 512, gpu_list=[with_cap("cap", 256 * MiB)])
    assert p.ok, p.problem
    params = sum(t.numel() * 4 for t in model.parameters())
    assert p.before_bytes >= params  # the weights (and buffers) are there before the step
    roles = p.peak_by_role
    assert roles["parameters"] >= params and roles["optimizer state"] >= 2 * params - 4096  # AdamW: two moments
    assert roles["gradients"] > 0
    # cuBLAS's two workspaces are in the peak
    assert roles["other"] == sum(map(sum, calibration.WORKSPACES))
    assert p.first_step_peak_bytes < p.steady_peak_bytes  # later steps start with the optimizer state
    labels = [s.label for s in p.trace.sites_at_peak]
    assert any("h = torch.relu(self.norm(self.fc1(x)))" in label for label in labels), labels
    assert any(label.startswith("the backward pass of ") for label in labels) or p.peak_where
    assert "test_plan.py line" in p.peak_where


def test_activations_grow_with_the_batch_and_are_freed_by_the_backward():
    _, _, step = make("sgd")
    small, large = plan(step, 256, gpus=[1]), plan(step, 4096, gpus=[1])
    assert large.peak_bytes > small.peak_bytes
    per_sample = (large.peak_bytes - small.peak_bytes) / (4096 - 256)
    # the batch (64), fc1 and BatchNorm outputs, relu (256 each) and the logits: at least that much is saved
    assert per_sample >= 4 * (64 + 3 * 256)


def test_the_plan_matches_a_recorded_h200_cell():
    """benchmarks/results/h200_s4_run0_alloc_history_recording.json: this MLP cell's
    torch.cuda.max_memory_allocated() on the H200 was 1158792192 bytes."""
    torch.manual_seed(0)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(1024, 8192)
            self.fc2 = nn.Linear(8192, 1024)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(4096, 1024), torch.randn(4096, 1024)

    def step(bs):
        opt.zero_grad(set_to_none=True)
        wide = torch.randn(8192, 8192)
        h = model.fc1(x)
        out = model.fc2(torch.relu(h)) + wide[:4096, :1024]
        loss = ((out - y) ** 2).mean()
        loss.backward()
        opt.step()

    p = plan(step, 4096, gpus=[140])
    assert abs(p.steady_peak_bytes - 1158792192) < 4096


def test_a_step_whose_shapes_change_is_planned_until_they_come_round():
    model, opt, _ = make("sgd")
    calls = [0]

    def step(bs):
        n = (1, 4, 2)[calls[0] % 3] * bs
        calls[0] += 1
        model(torch.randn(n, 64)).sum().backward()
        opt.step()
        opt.zero_grad()

    p = plan(step, 64, gpus=[1])
    assert p.ok and any("change from call to call" in n for n in p.notes)
    _, _, fixed = make("sgd")
    q = plan(fixed, 4 * 64, gpus=[1])
    assert p.steady_peak_bytes >= q.steady_peak_bytes - 4096  # the longest call is in the peak


# -- steps that cannot be planned: one sentence ------------------------------------------------------

def _problem(step, **kw):
    p = plan(step, 8, gpus=[1], **kw)
    assert not p.ok and "\n" not in p.problem and "Traceback" not in p.problem
    assert str(p).startswith("gpunb plan of")  # the view shows it
    return p.problem


def test_a_data_dependent_shape_is_said():
    model, _opt, _ = make()

    def step(bs):
        x = torch.randn(bs, 64)
        model(x[x[:, 0] > 0]).sum().backward()

    assert "depends on the values" in _problem(step)


def test_an_operator_without_a_shape_function_is_said():
    lib = torch.library.Library("gpunb_plan_test", "FRAGMENT")
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x * 2, "CPU")
    model, _opt, _ = make()

    def step(bs):
        h = torch.ops.gpunb_plan_test.opaque(torch.randn(bs, 64))
        model(h).sum().backward()

    assert "no shape function" in _problem(step)


def test_an_error_of_the_step_is_said_with_its_line():
    model, _, _ = make()

    def step(bs):
        model(torch.randn(bs, 65)).sum().backward()  # a wrong width

    problem = _problem(step)
    assert problem.startswith("the step raised RuntimeError at line") and "self.fc1(x)" in problem  # innermost
    assert "reduction dim" in problem


def test_no_model_found_is_said():
    assert "no model" in _problem(lambda bs: torch.randn(bs, 3).sum())


def test_a_tensor_outside_the_model_that_requires_grad_stops_the_plan():
    model, _opt, _ = make()
    extra = torch.zeros(8, requires_grad=True)

    def step(bs):
        (model(torch.randn(bs, 64)) + extra).sum().backward()

    assert "requires grad" in _problem(step, model=model)
    assert extra.grad is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only torch cannot name CUDA")
def test_cuda_asked_for_by_name_on_a_cpu_torch_is_said():
    model, _, _ = make()

    def step(bs):
        model(torch.randn(bs, 64).cuda()).sum().backward()

    assert "asks for CUDA by name" in _problem(step)


# -- the user's state, untouched --------------------------------------------------------------------

def _state(model, opt):
    np = sys.modules.get("numpy")
    return {
        "params": [(p, p.detach().clone(), p.requires_grad, None if p.grad is None else p.grad.clone())
                   for p in model.parameters()],
        "buffers": [(b, b.clone()) for b in model.buffers()],
        "modules": [(m, m.training) for m in model.modules()],
        "opt_state": (opt.state, {p: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                                  for p, s in opt.state.items()}),
        "groups": [(g, list(g["params"]), {k: v for k, v in g.items() if k != "params"}) for g in opt.param_groups],
        "rng": (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy() if np else None),
    }


def _assert_same(model, opt, before):
    for p, value, req, grad in before["params"]:
        assert type(p) is nn.Parameter and torch.equal(p, value) and p.requires_grad == req
        assert (p.grad is None and grad is None) or torch.equal(p.grad, grad)
    assert [p for p, *_ in before["params"]] == list(model.parameters())  # the very same objects
    for b, value in before["buffers"]:
        assert torch.equal(b, value)
    assert [b for b, _ in before["buffers"]] == list(model.buffers())
    assert all(m.training == t for m, t in before["modules"])
    state, saved = before["opt_state"]
    assert opt.state is state and set(state) == set(saved)
    for p, s in saved.items():
        for k, v in s.items():
            assert torch.equal(state[p][k], v) if torch.is_tensor(v) else state[p][k] == v
    for group, params, rest in before["groups"]:
        assert group["params"] == params and all(a is b for a, b in zip(group["params"], params, strict=True))
        assert {k: v for k, v in group.items() if k != "params"} == rest
    rng = before["rng"]
    np = sys.modules.get("numpy")
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]
    if np is not None:
        assert (np.random.get_state()[1] == rng[2]).all()
    assert not torch.cuda.is_initialized()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(opt_name=st.sampled_from(["adamw", "adam", "sgd"]), width=st.sampled_from([16, 96]),
       trained=st.integers(0, 2), grads=st.booleans(), training=st.booleans(), batch=st.integers(2, 64))
def test_the_model_optimizer_and_rngs_come_back_as_they_were(opt_name, width, trained, grads, training, batch):
    kw = {"momentum": 0.9} if opt_name == "sgd" else {}
    model, opt, step = make(opt_name, width, **kw)
    for _ in range(trained):  # real steps before: the optimizer has state
        step(8)
    if grads:
        model(torch.randn(4, 64)).sum().backward()
    model.train(training)
    before = _state(model, opt)
    p = plan(step, batch, gpus=[1])
    assert p.ok, p.problem
    _assert_same(model, opt, before)


@pytest.mark.parametrize("at", range(0, 40, 3))
def test_an_interrupt_at_any_operation_leaves_everything_as_it_was(at):
    """KeyboardInterrupt from the step's k-th torch call, for k along the whole step."""
    model, opt, _ = make("adamw")
    calls = [0]

    class Interrupt(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[0] += 1
            if calls[0] == at:
                raise KeyboardInterrupt
            return func(*args, **(kwargs or {}))

    def step(bs):
        with Interrupt():
            x = torch.randn(bs, 64)
            model(x).logsumexp(1).mean().backward()
            opt.step()
            opt.zero_grad()

    before = _state(model, opt)
    p = plan(step, 16, gpus=[1])
    assert p.ok or "interrupted" in p.problem
    _assert_same(model, opt, before)


def test_the_largest_batch_fits_and_a_little_more_does_not():
    """Planned under the capacity shrunk by the calibration's worst under-estimate: it fits there,
    and the search closed in (the line's 2 % aim and a 5 % stop leave it at most ~10 % low)."""
    _model, _opt, step = make("adamw", 512)
    cap = 512 * MiB
    p = plan(step, 64, gpu_list=[with_cap("cap", cap)])
    best = p.gpus[0].largest_batch
    assert best and best > 64
    from gpunb.analysis.fit.user_state import find_reachable
    from gpunb.analysis.plan.dry_run import dry_run

    shrunk = int(cap / (1 + calibration.UNDER + calibration.SAFETY))
    reach = find_reachable(torch, step)
    assert fits_under(dry_run(torch, step, best, reach), calibration.WORKSPACES, shrunk)
    assert not fits_under(dry_run(torch, step, int(best * 1.10) + 2, reach), calibration.WORKSPACES, shrunk)


def test_a_batch_that_does_not_fit_says_so():
    _, _, step = make("adamw", 512)
    p = plan(step, 100_000, gpu_list=[with_cap("small", 256 * MiB)])
    g = p.gpus[0]
    assert not g.fits and g.spare_bytes < 0 and 0 < g.largest_batch < 100_000
    assert "does not fit" in p.headline


# -- GPUs by name or size --------------------------------------------------------------------------

@pytest.mark.parametrize("spec,name", [("T4", "T4"), ("tesla t4", "T4"), ("A100-80GB", "A100 80 GB"),
                                        ("h100", "H100 80 GB"), (24, "24 GiB GPU"), ("24GB", "24 GiB GPU"),
                                        ("7.5 GiB", "7.5 GiB GPU")])
def test_gpus_by_name_or_size(spec, name):
    g = gpu_named(spec)
    assert g.name == name and 0 < g.usable_bytes < g.total_bytes


@pytest.mark.parametrize("spec", ["X99", "", "-3", 0, 10**6])
def test_an_unknown_gpu_names_the_known_ones(spec):
    with pytest.raises(ValueError, match=r"T4|between"):
        gpu_named(spec)


# -- the magic -----------------------------------------------------------------------------------

@pytest.fixture
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpunb")
    yield shell
    shell.run_line_magic("unload_ext", "gpunb")


def test_the_magic_plans_and_keeps_the_result(ip, capsys):
    _model, _opt, step = make()
    ip.user_ns.update(step=step)
    ip.run_line_magic("gpuplan", "step --batch 32 --gpu T4 --gpu 24 -o p")
    p = ip.user_ns["p"]
    assert p.ok and [g.name for g in p.gpus] == ["T4", "24 GiB GPU"]
    out = capsys.readouterr().out
    assert out.startswith("gpunb plan of step(32): batch 32 needs") and "largest batch on a T4 is ≈" in out


@pytest.mark.parametrize("line,words", [("step", "missing --batch"), ("step --batch 0", "--batch"),
                                        ("nothing --batch 4", "not defined"), ("step --batch 4 --gpu X9",
                                                                               "unknown GPU"),
                                        ("not_a_function --batch 4", "not a function")])
def test_bad_arguments_are_usage_errors(ip, line, words):
    from IPython.core.error import UsageError

    _, _, step = make()
    ip.user_ns.update(step=step, not_a_function=3)
    with pytest.raises(UsageError, match=words):
        ip.run_line_magic("gpuplan", line)


def test_the_html_escapes_and_renders():
    _, _, step = make()
    p = plan(step, 16, gpus=["T4"])
    html = p._repr_mimebundle_()["text/html"]
    assert "gpunb plan" in html and "<table" in html and "Lines alive at the peak" in html
    d = p.to_dict()
    assert d["headline"] == p.headline and d["gpus"][0]["name"] == "T4"


def test_the_oom_doctor_quotes_the_plan_for_how_much_of_the_batch_fits():
    from gpunb.analysis.memory.oom import diagnose

    _, _, step = make("adamw", 512)
    p = plan(step, 256, gpus=["T4"])
    # a T4: 14.75 GiB, this process 13.50 GiB of which torch 12.80 GiB (0.70 GiB not torch's)
    message = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 14.75 GiB of which "
               "1.20 GiB is free. Including non-PyTorch memory, this process has 13.50 GiB memory in use. Of the "
               "allocated memory 12.70 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
               "unallocated.")
    batch = 10 * p.gpus[0].largest_batch
    d = diagnose(message=message, batch_size=("bs", batch), last_plan=p, allocator_conf="")
    small = next(f for f in d.fixes if f.title == "Use a smaller batch")
    expected = p.largest_batch_for(int(14.75 * 2**30), int(13.50 * 2**30) - int(12.70 * 2**30) - 100 * 2**20)
    assert f"bs = {batch} → at most ≈{expected}, planned by gpunb.plan(step)" in small.reason
    assert 0.8 * p.gpus[0].largest_batch <= expected <= 1.25 * p.gpus[0].largest_batch  # the line, near the plan
    without = diagnose(message=message, batch_size=("bs", batch), allocator_conf="")
    assert "planned by" not in next(f for f in without.fixes if f.title == "Use a smaller batch").reason


@pytest.mark.parametrize("loss_kind", ["cross_entropy", "mse", "sum"])
def test_every_allocation_of_the_step_has_a_line_of_the_users(loss_kind):
    """Forward, backward (also of nodes made inside a composite op like cross_entropy) and the
    optimizer step: each allocation names a line of the step's code, none 'no Python stack'."""
    from gpunb.analysis.fit.user_state import find_reachable
    from gpunb.analysis.plan.dry_run import dry_run
    from gpunb.analysis.plan.recorder import BEFORE

    model, opt, _ = make("adamw")

    def step(bs):
        out = model(torch.randn(bs, 64))
        if loss_kind == "cross_entropy":
            loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 8, (bs,)))
        elif loss_kind == "mse":
            loss = torch.nn.functional.mse_loss(out, torch.zeros_like(out))
        else:
            loss = out.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    rec = dry_run(torch, step, 16, find_reachable(torch, step))
    made = [a for is_alloc, a in rec.events if is_alloc and a.phase != BEFORE]
    assert made and all(a.site >= 0 for a in made), [(a.phase, a.nbytes) for a in made if a.site < 0]
    files = {rec.sites[a.site][0]["filename"] for a in made}
    assert files == {__file__}


@pytest.mark.parametrize("step,batch,words", [(None, 8, "must be a function"), ("make", 0, "whole number"),
                                              ("make", 2.5, "whole number"), ("make", True, "whole number")])
def test_bad_arguments_get_a_sentence(step, batch, words):
    if step == "make":
        step = make()[2]
    p = plan(step, batch, gpus=[1])
    assert not p.ok and words in p.problem
