"""The leak finder inside %%gpuprofile on real CPU training loops: each classic pattern is named
with its holder and fix; steady loops, the first steps and detached scalars stay silent."""

from __future__ import annotations

import itertools
import time

import pytest

torch = pytest.importorskip("torch")

import gpunb  # noqa: E402
from gpunb.analysis.leaks import finder, growth  # noqa: E402
from gpunb.analysis.leaks.snapshot import Snapshot, containers, look  # noqa: E402
from gpunb.analysis.memory.census import take_census  # noqa: E402

SETUP = """
import time
import torch
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
"""

STEP = """
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.003)
"""


@pytest.fixture
def quick_budget(monkeypatch):
    """Looks may take 5 % of these short cells (0.5 % by default) so a few hundred ms see enough
    of them on a loaded CI machine; the default budget has its own test."""
    monkeypatch.setattr(finder, "BUDGET_SHARE", 0.05)


def _profile(ip, body: str, steps: int = 120, flags: str = "", before: str = ""):
    ip.reset(new_session=False)  # the shell is shared: an earlier test's lists would make each look dearer
    ip.run_cell(SETUP + before)
    result = ip.run_cell(f"%%gpuprofile -o _gpunb_test {flags}\nfor i in range({steps}):{STEP}{body}")
    assert result.error_in_exec is None and result.error_before_exec is None
    return ip.user_ns["_gpunb_test"]


def test_outputs_appended_with_their_graph(ip, quick_budget, capsys):
    p = _profile(ip, "    all_preds.append(logits)\n", before="all_preds = []\n")
    leak = p.leak
    assert leak is not None and leak.looks >= growth.MIN_LOOKS, leak
    (f,) = leak.findings
    assert (f.holder, f.pattern) == ("all_preds", "history")
    assert "holds" in f.sentence and "autograd history" in f.sentence
    assert f.fix.startswith("append `logits.detach()`")
    assert f.bytes_per_step == pytest.approx(16 * 10 * 4, rel=0.05)  # one 16x10 float32 tensor a step
    assert p.advice[0].title == "Stop memory from growing every step" and p.advice[0].severity == 2
    text = str(p)
    assert text.splitlines()[2].lstrip().startswith("leak  ")  # under the verdict and its reason
    assert "memory grows 640 B per step: `all_preds` holds" in text
    html = p._repr_mimebundle_()["text/html"]
    assert "<code>all_preds</code>" in html and "<details" in html
    assert p.to_dict()["leak"]["findings"][0]["holder"] == "all_preds"


def test_total_loss_plus_equals_loss_keeps_every_graph(ip, quick_budget):
    p = _profile(ip, "    total_loss += loss\n", before="total_loss = 0.0\n")
    (f,) = p.leak.findings
    assert (f.holder, f.pattern) == ("total_loss", "graph")
    assert "keeps the autograd graph of every step" in f.sentence and f.graph_nodes_per_step >= 1
    assert f.fix == "add `loss.item()`, a Python number, instead of `loss`"


def test_dict_cache_of_batches(ip, quick_budget):
    p = _profile(ip, "    cache[i] = x.clone()\n", before="cache = {}\n")
    (f,) = p.leak.findings
    assert (f.holder, f.pattern) == ("cache", "tensors")
    assert f.bytes_per_step == pytest.approx(16 * 32 * 4, rel=0.05)
    assert "bounded" in f.fix


def test_forward_hook_in_a_closure(ip, quick_budget):
    hook = ("def keep(store):\n    def save(module, inputs, output):\n        store.append(output)\n"
            "    return save\nhandle = model[0].register_forward_hook(keep([]))\n")
    p = _profile(ip, "", before=hook)
    ip.run_cell("handle.remove()")
    (f,) = p.leak.findings
    assert f.holder == "model.0.<forward hook save>.store" and f.pattern == "history"
    assert f.sentence.startswith("`store` of the forward hook `save` on `model.0` holds")
    assert "output.detach()" in f.fix


def test_forward_hook_filling_a_notebook_list(ip, quick_budget):
    hook = "acts = []\ndef save(module, inputs, output):\n    acts.append(output)\n" \
           "handle = model[2].register_forward_hook(save)\n"
    p = _profile(ip, "", before=hook)
    ip.run_cell("handle.remove()")
    (f,) = p.leak.findings
    assert f.holder == "acts" and "filled by the forward hook `save` on `model.2`" in f.sentence


def test_steady_loop_and_detached_scalars_stay_silent(ip, quick_budget):
    body = ("    losses.append(loss.item())\n    detached.append(loss.detach())\n"
            "    history.append({'loss': loss.item(), 'step': i})\n")
    p = _profile(ip, body, before="losses, detached, history = [], [], []\n")
    assert p.leak.looks >= growth.MIN_LOOKS
    assert p.leak.findings == ()
    assert "leak" not in str(p)
    assert not any(a.title.startswith("Stop") for a in p.advice)


def test_the_first_steps_are_not_judged(ip, quick_budget):
    p = _profile(ip, "    all_preds.append(logits)\n", steps=4, before="all_preds = []\n")
    assert p.leak.findings == () and "too few to judge" in p.leak.note


def test_no_leak_flag_and_api_switch(ip, quick_budget):
    p = _profile(ip, "    all_preds.append(logits)\n", steps=5, flags="--no-leak", before="all_preds = []\n")
    assert p.leak is None
    with gpunb.profile(show=False, record=False, leak=False) as q:
        pass
    assert q.result.leak is None
    with pytest.raises(TypeError, match="leak must be True or False"):
        gpunb.profile(leak="yes")


def test_api_twin_sees_a_functions_locals(monkeypatch):
    monkeypatch.setattr(finder, "BUDGET_SHARE", 0.5)  # what is tested here is the namespace, not the budget
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    outputs = []
    with gpunb.profile(show=False, record=False) as p:
        for _ in range(80):
            out = model(x)
            out.sum().backward()
            opt.step()
            outputs.append(out)
            time.sleep(0.003)  # a step long enough for looks within the budget
    assert [f.holder for f in p.result.leak.findings] == ["outputs"], p.result.leak
    assert "append `out.detach()`" in p.result.leak.findings[0].fix


def test_the_finder_keeps_within_its_budget(ip):
    """At the default budget (0.5 % of the cell) the looks, their cost measured, stay far under
    the profile's 1 % even when the list they walk grows every step."""
    p = _profile(ip, "    all_preds.append(logits)\n", steps=300, before="all_preds = []\n")
    assert p.leak.cost_share <= 0.01, p.leak
    assert p.leak.looks >= 1


def _charged_looks(monkeypatch, look_s: float, real: bool = False) -> list[float]:
    """``finder.look`` charged ``look_s`` on a clock the test controls (returned: a one-item
    list, the time now); ``real``: the look still counts the namespace, else it is empty."""
    import dataclasses

    from gpunb.analysis.leaks import snapshot

    now = [0.0]

    def charged(namespace, torch_, step, clock):
        now[0] += look_s
        snap = snapshot.look(namespace, torch_, step) if real else Snapshot(step, 0.0, 0.0)
        return dataclasses.replace(snap, t=now[0] - look_s, cost_s=look_s)

    monkeypatch.setattr(finder, "look", charged)
    return now


def test_looks_wait_for_the_budget(monkeypatch):
    """With a clock the test controls (1 ms steps, 10 ms looks), the looks' total stays within
    0.5 % of the elapsed time (plus, for a moment, the one look whose cost was guessed low:
    the first, guessed at 1 ms) and they still come, ever further apart."""
    now = _charged_looks(monkeypatch, 0.010)
    f = finder.LeakFinder(torch, dict, warmup_steps=1, t0=0.0, clock=lambda: now[0])
    for i in range(20_000):
        now[0] += 0.001
        f.on_step(i)
        assert f.spent_s <= 0.005 * now[0] + 0.010
    assert f.spent_s <= 0.005 * now[0]
    steps = [s.step for s in f.looks]
    assert len(steps) >= 5 and steps[0] >= 1
    assert all(b - a >= 1 for a, b in itertools.pairwise(steps))


def test_the_ends_look_may_use_the_profiles_budget_when_the_looks_are_too_few(monkeypatch):
    """The 3.8 s cell of a notebook whose looks took 5.7 ms each: three step-end looks fit in
    0.5 %, the end's look (over 0.5 %, under 0.8 %) makes the fourth that lets growth be judged.
    With enough looks the end keeps to 0.5 %."""
    now = _charged_looks(monkeypatch, 0.0057)
    f = finder.LeakFinder(torch, dict, warmup_steps=1, t0=0.0, clock=lambda: now[0])
    for i in range(400):
        now[0] += 0.0095
        f.on_step(i)
    assert len(f.looks) == 3 and f.spent_s + 0.0057 > 0.005 * now[0]
    f.finish(400, now[0])
    assert len(f.looks) == 4 and f.looks[-1].step == 399 and f.spent_s <= 0.008 * now[0]
    # a longer cell: four looks already, the end's look waits for the 0.5 % as before
    g = finder.LeakFinder(torch, dict, warmup_steps=1, t0=0.0, clock=lambda: now[0])
    now[0] = 0.0
    for i in range(2000):
        now[0] += 0.0095
        g.on_step(i)
    looks = len(g.looks)
    assert looks >= growth.MIN_LOOKS
    g.spent_s = 0.005 * now[0] - 0.001  # the step-end looks used the budget up
    g.finish(2000, now[0])
    assert len(g.looks) == looks


def _dear_looks(monkeypatch, namespace, grow, steps=400, look_s=0.02, step_s=0.008, after=lambda: None):
    """The finder over ``steps`` steps (``grow(i)`` runs each one) whose real looks are charged
    ``look_s`` on a clock the test controls: a notebook whose looks are dear."""
    now = _charged_looks(monkeypatch, look_s, real=True)
    f = finder.LeakFinder(torch, lambda: namespace, warmup_steps=1, t0=0.0, clock=lambda: now[0])
    for i in range(steps):
        grow(i)
        now[0] += step_s
        f.on_step(i)
    after()  # what the cell does after its loop
    f.finish(steps, now[0])
    return f, f.report([], [], None, 1)


def test_too_few_looks_judge_a_list_by_its_length(monkeypatch):
    """Two looks fit the budget; the list's length, noted at every scheduled step, rose steadily:
    the leak is named, the note says how it was judged."""
    w = torch.randn(8, 4, requires_grad=True)
    ns = {"all_logits": [], "w": w}
    f, report = _dear_looks(monkeypatch, ns, lambda i: ns["all_logits"].append(torch.randn(2, 8) @ w))
    assert len(f.looks) < growth.MIN_LOOKS and len(f.sizes) >= 8
    (found,) = report.findings
    assert found.holder == "all_logits" and found.pattern == "history"
    assert found.tensors_per_step == pytest.approx(1.0) and found.bytes_per_step == pytest.approx(2 * 4 * 4)
    assert "judged by the length of `all_logits`" in report.note


def test_a_list_judged_by_its_length_and_emptied_after_the_loop_is_still_named(monkeypatch):
    """The cell ends with ``all_logits.clear()``: the end's look is dropped, and so is its length."""
    w = torch.randn(8, 4, requires_grad=True)
    ns = {"all_logits": [], "w": w}
    ended = []
    fell = finder._fell
    monkeypatch.setattr(finder, "_fell", lambda before, end: (ended.append(end.step), fell(before, end))[1])
    f, report = _dear_looks(monkeypatch, ns, lambda i: ns["all_logits"].append(torch.randn(2, 8) @ w),
                            look_s=0.006, after=ns["all_logits"].clear)
    assert ended == [399] and all(step != 399 for step, _ in f.sizes)  # the end's look was taken, then dropped
    (found,) = report.findings
    assert found.holder == "all_logits" and "judged by the length" in report.note


@pytest.mark.parametrize("name, grow", [
    ("losses", lambda ns, i: ns["losses"].append(torch.tensor(float(i)))),  # detached scalars: small
    ("floats", lambda ns, i: ns["floats"].append(float(i))),  # no tensors at all
    ("fixed", lambda ns, i: ns["fixed"].__setitem__(i % 3, torch.randn(64, 64))),  # bounded
])
def test_too_few_looks_stay_silent_on_what_is_no_leak(monkeypatch, name, grow):
    ns = {"losses": [], "floats": [], "fixed": {}, "w": torch.randn(256, 256)}
    _, report = _dear_looks(monkeypatch, ns, lambda i: grow(ns, i))
    assert report.findings == ()


def test_without_the_finder_nothing_is_reported(ip, quick_budget, monkeypatch):
    """The finder itself fails loudly: with its step hook cut, the same leak goes unseen."""
    from gpunb.analysis.profile import cell

    monkeypatch.setattr(cell.ProfileSession, "_watch_leaks", lambda self, torch: None)
    p = _profile(ip, "    all_preds.append(logits)\n", before="all_preds = []\n")
    assert p.leak is None and not any(a.title.startswith("Stop") for a in p.advice)


# -- the pieces -------------------------------------------------------------------------------

def test_growth_needs_a_steady_rise_over_enough_looks():
    xs = [2, 3, 4, 6, 9, 14, 21]
    assert growth.steady_rise(xs, [2 * x for x in xs])
    assert not growth.steady_rise(xs[:3], [2 * x for x in xs[:3]])  # too few looks
    assert not growth.steady_rise(xs, [5, 50, 50, 50, 50, 50, 50])  # filled once, then flat
    assert not growth.steady_rise(xs, [2, 3, 4, 6, 9, 9, 9])  # bounded: stopped rising
    assert not growth.steady_rise(xs, [2, 3, 4, 6, 1, 14, 21])  # cleared on the way
    assert growth.theil_sen([1, 2, 3, 4, 5], [0, 10, 20, 1000, 40]) == pytest.approx(10)
    assert not growth.matters(4, 10_000)  # a detached float32 scalar a step
    assert growth.matters(8192, 10**6)
    assert not growth.matters(2048, 10**10)  # 20 MB over 10,000 steps of a 10 GB model


def test_reserved_growth_of_the_caching_allocator_is_not_a_leak():
    step_t = [float(i) for i in range(1, 41)]
    flat = [(t + 0.01, 1000, 1000 + int(t) * 2**20) for t in step_t]  # reserved rises, allocated not
    assert finder._allocated_rate(flat, step_t, 1) is None
    rising = [(t + 0.01, 1000 + 4096 * int(t), None) for t in step_t]
    assert finder._allocated_rate(rising, step_t, 1) == pytest.approx(4096)


def test_a_notebook_holding_a_big_collection_delays_the_first_look():
    assert finder.first_guess({"x": 1}) == finder.FIRST_LOOK_GUESS_S
    big = finder.first_guess({"dataset": [0] * 50_000, "other": {"a": 1}})
    assert big == pytest.approx(finder.FIRST_LOOK_GUESS_S + 50_001 * finder.PER_ELEMENT_GUESS_S)
    # at 0.5 %, the first look of such a notebook waits until the cell has run ~30 s


def test_containers_of_a_path():
    assert containers("logs['preds'][3]") == ["logs", "logs['preds']", "logs['preds'][3]"]
    assert containers("cache['a[1]']") == ["cache", "cache['a[1]']"]
    assert containers("loss") == ["loss"]


def test_census_sees_into_hooks():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    store: list = []
    model[0].register_forward_hook(lambda m, i, o: store.append(o))
    model(torch.randn(2, 4))
    names = [e.name for e in take_census({"model": model}, torch=torch).entries]
    assert "model.0.<forward hook <lambda>>.store[0]" in names


def test_a_look_counts_per_container_with_history():
    w = torch.nn.Parameter(torch.randn(4, 4))
    kept = [(torch.randn(2, 4) @ w) for _ in range(3)]
    snap = look({"kept": kept, "w": w, "plain": [torch.zeros(3)]}, torch, 0)
    assert snap.holdings["kept"].tensors == 3 and snap.holdings["kept"].with_history == 3
    assert snap.holdings["plain"].with_history == 0
    assert "w" not in snap.holdings  # parameters are not what grows


def test_gpu_growth_seen_in_too_few_looks_names_the_hook_that_holds_it():
    """On the H200 a hook's list of activations made each look dearer, so only 3 fit the budget:
    the allocated bytes rose at every step end, and those 3 looks must still name the holder
    (it was reported as memory no variable holds)."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    acts = []

    def save(module, inputs, output):
        acts.append(output)

    model[0].register_forward_hook(save)
    x = torch.randn(16, 32)
    f = finder.LeakFinder(torch, lambda: {"model": model}, warmup_steps=2, t0=0.0)
    for i in range(40):
        model(x).sum().backward()
        if i in (5, 17, 33):
            f._look(i)
    step_t = [float(i) for i in range(1, 41)]
    timeline = [(t + 0.01, 10**6 + 4096 * int(t), None) for t in step_t]  # +4 KiB a step, every step
    report = f.report(timeline, step_t, 10**6 + 4096 * 40, 2)
    (found,) = report.findings
    assert found.pattern == "history" and "`save`" in found.sentence and "`model.0`" in found.sentence, report
    assert "output.detach()" in found.fix and report.note == ""


def test_too_few_looks_without_gpu_growth_stay_silent():
    """The same 3 looks without a steady rise of allocated bytes judge nothing."""
    model = torch.nn.Linear(8, 4)
    outs = []
    f = finder.LeakFinder(torch, lambda: {"outs": outs}, warmup_steps=2, t0=0.0)
    for i in range(40):
        outs.append(model(torch.randn(2, 8)))
        if i in (5, 17, 33):
            f._look(i)
    step_t = [float(i) for i in range(1, 41)]
    assert f.report([(t + 0.01, 10**6, None) for t in step_t], step_t, 10**6, 2).findings == ()


def test_the_graph_walk_counts_nodes_whose_wrappers_are_made_afresh():
    """A Python wrapper of an autograd node may be made at each ``next_functions`` read and
    freed after; a freed wrapper's id is soon another's, so a walk that kept only ids stopped
    early on ``total_loss``'s chain of additions. Here every read makes new wrappers."""
    from gpunb.analysis.leaks.snapshot import _GraphWalk

    class Node:  # one step's addition: the chain so far and the step's loss graph
        def __init__(self, depth: int, kind: str = "add") -> None:
            self.depth, self.kind = depth, kind

        @property
        def next_functions(self):
            if self.kind == "loss" or self.depth == 0:
                return ((None, 0),)
            return ((Node(self.depth - 1), 0), (Node(self.depth, "loss"), 0))

    assert _GraphWalk(20_000).walk(Node(300)) == 301 + 300  # 301 additions, 300 losses


def test_a_look_leaves_out_gpunbs_own_objects():
    """``p`` of ``with gpunb.profile() as p`` is in the block's variables while it runs; its
    timelines gain points every step, and walking them made each look cost milliseconds."""
    p = gpunb.profile(show=False, record=False)
    p.kept = [torch.ones(2) for _ in range(5)]  # stands for what the running profile holds
    snap = look({"p": p, "mine": [torch.ones(3)]}, torch, 0)
    assert set(snap.holdings) == {"mine", "mine[0]"}, snap.holdings


HOSTILE = """
import asyncio
class _Meta(type):
    @property
    def __module__(cls):
        raise asyncio.CancelledError
class Odd(metaclass=_Meta):
    pass
class Proxy:
    @property
    def __class__(self):
        raise asyncio.CancelledError
odd, proxy = Odd(), Proxy()
all_preds = []
"""


def test_objects_raising_cancelled_error_never_reach_the_cell(ip, quick_budget):
    """Issue 29: a metaclass whose ``__module__`` raises CancelledError stopped the loop at step 44;
    a raising ``__class__`` failed the cell and lost its profile. Now the loop runs to its end and
    the leak beside them is still found."""
    p = _profile(ip, "    all_preds.append(logits)\n", before=HOSTILE)
    assert ip.user_ns["i"] == 119  # every step ran
    (f,) = p.leak.findings
    assert f.holder == "all_preds" and f.pattern == "history"
    assert "skipped (could not be inspected: odd, proxy" in p.leak.note, p.leak.note


@pytest.mark.parametrize(("before", "body", "holder", "pattern"), [
    ("class Store:\n    items = []\nstore = Store()\n", "    store.items.append(x.clone())\n",
     "Store.items", "tensors"),
    ("class Store:\n    items = []\nstore = Store()\ndel Store\n", "    store.items.append(x.clone())\n",
     "type(store).items", "tensors"),
    ("model.history = []\n", "    model.history.append(x.clone())\n", "model.history", "tensors"),
    ("import collections\nkept = collections.deque()\n", "    kept.append(x.clone())\n", "kept", "tensors"),
    ("seen = set()\n", "    seen.add(x.clone())\n", "seen", "tensors"),
    ("acc = torch.zeros(0, 32)\n", "    acc = torch.cat([acc, x])\n", "acc", "bytes"),
])
def test_the_leaks_the_first_census_missed(ip, quick_budget, before, body, holder, pattern):
    """Issue 29's misses, as a user writes them: a class attribute through an instance, a list
    attribute of a module, a deque, a set, and one tensor grown by ``torch.cat`` (2 KiB a step)."""
    p = _profile(ip, body, before=before)
    assert [(f.holder, f.pattern) for f in p.leak.findings] == [(holder, pattern)], p.leak


def test_a_hook_closing_over_a_functions_list_is_named(quick_budget):
    """The H200 run of 2026-12-05: a hook defined in a function, appending to that function's list,
    was reported as the list alone; the hook and its module are named, as for a notebook's list."""
    torch = pytest.importorskip("torch")

    def train():
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        acts = []

        def save(module, inputs, output):
            acts.append(output)

        handle = model[0].register_forward_hook(save)
        try:
            with gpunb.profile(show=False, record=False) as p:
                deadline = time.perf_counter() + 1.5
                while time.perf_counter() < deadline:
                    model(torch.randn(32, 8)).square().mean().backward()
                    opt.step()
                    opt.zero_grad()
                    time.sleep(0.002)
        finally:
            handle.remove()
        return p

    p = train()
    (f,) = p.result.leak.findings
    assert f.pattern == "history" and "`save`" in f.sentence and "`model.0`" in f.sentence, f
