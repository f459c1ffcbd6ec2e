"""The shared walk (gpunb.analysis.reach) over generated notebook object graphs
(``tests/object_graphs.py``: random nestings of every holder, depths up to the walk's limit,
cycles, hostile siblings raising ``Exception``/``CancelledError``/odd ``BaseException``s, huge and
mutating containers). The class of failure closed: a reader of the user's objects that walks by
itself and misses a holder, or lets a user object's exception into the user's cell.

For every generated graph: the census names every planted tensor with a path that leads to it;
a planted per-step leak is found and named at its holder; its bounded twin stays silent; and a
``%gpufit`` on the simulated device leaves every planted state as it was.
"""

from __future__ import annotations

import collections
import copy
import functools
import random
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpunb.analysis import reach  # noqa: E402
from gpunb.analysis.fit import search as fit_search  # noqa: E402
from gpunb.analysis.fit.search import fit_with_memory  # noqa: E402
from gpunb.analysis.leaks import finder  # noqa: E402
from gpunb.analysis.memory.census import take_census  # noqa: E402
from gpunb.testing.fake_device_memory import BudgetMemory  # noqa: E402
from tests import object_graphs as og  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GiB = 2**30


def _chooser(data: st.DataObject) -> og.Choose:
    return lambda options: data.draw(st.sampled_from(list(options)))


@SETTINGS
@given(st.data())
def test_the_census_names_every_planted_tensor_by_a_path_that_reaches_it(data):
    choose = _chooser(data)
    planted = {f"t{i}": torch.zeros(16 + i) for i in range(choose([1, 2, 3]))}
    ns, kinds = og.namespace(choose, planted)
    census = take_census(ns, torch=torch)  # never raises, whatever the siblings do
    for name, tensor in planted.items():
        ptr = tensor.untyped_storage().data_ptr()
        entry = next((e for e in census.entries if e.address == ptr), None)
        assert entry is not None, (name, kinds[name], census.entries)
        assert og.reaches(ns, entry.name, tensor), (entry.name, kinds[name])


# -- leaks -----------------------------------------------------------------------------------------
ROW = 128 * 128  # a 64 KiB float32 tensor a step


def _leaky(kind: str) -> tuple[object, object]:
    """(the holder planted, a step(i) that makes it grow every step)."""
    if kind == "list":
        held: list[object] = []
        return held, lambda i: held.append(torch.randn(ROW))
    if kind == "deque":
        dq: collections.deque[object] = collections.deque()
        return dq, lambda i: dq.append(torch.randn(ROW))
    if kind == "set":
        s: set[object] = set()
        return s, lambda i: s.add(torch.randn(ROW))
    if kind == "dict":
        d: dict[int, object] = {}
        return d, lambda i: d.__setitem__(i, torch.randn(ROW))
    if kind == "cat":
        box = {"acc": torch.zeros(0)}
        return box, lambda i: box.__setitem__("acc", torch.cat([box["acc"], torch.randn(ROW)]))
    raise ValueError(kind)


def _bounded(kind: str) -> tuple[object, object]:
    """The bounded twin of each leak."""
    if kind == "list":  # cleared now and then
        held: list[object] = []
        return held, lambda i: held.clear() if i % 3 == 0 else held.append(torch.randn(ROW))
    if kind == "deque":
        dq: collections.deque[object] = collections.deque(maxlen=3)
        return dq, lambda i: dq.append(torch.randn(ROW))
    if kind == "set":  # one element replaced
        s: set[object] = set()
        return s, lambda i: (s.clear(), s.add(torch.randn(ROW)))
    if kind == "dict":  # a fixed cache
        d: dict[int, object] = {}
        return d, lambda i: d.__setitem__(i % 2, torch.randn(ROW))
    if kind == "cat":  # the last rows only
        box = {"acc": torch.zeros(0)}
        return box, lambda i: box.__setitem__("acc", torch.cat([box["acc"], torch.randn(ROW)])[-2 * ROW:])
    raise ValueError(kind)


LEAK_KINDS = ("list", "deque", "set", "dict", "cat")


def run_finder(ns: dict[str, object], step, steps: int = 40) -> object:
    """The finder over ``steps`` steps, a look every 4 steps after a warm-up of 2."""
    f = finder.LeakFinder(torch, lambda: ns, warmup_steps=2, t0=0.0)
    for i in range(steps):
        step(i)
        if i >= 2 and i % 4 == 3:
            f._look(i)
    return f.report([], [], None, 2)


def leak_found(ns: dict[str, object], holder: object, report: object) -> bool:
    """A finding whose holder path leads to the planted holder (or, for a growing tensor, to it)."""
    targets = [holder] + ([holder["acc"]] if isinstance(holder, dict) and "acc" in holder else [])
    return any(og.reaches(ns, f.holder, t) for f in report.findings for t in targets)


@SETTINGS
@given(st.data(), st.sampled_from(LEAK_KINDS))
def test_a_planted_leak_is_found_and_its_bounded_twin_stays_silent(data, kind):
    choose = _chooser(data)
    holder, step = _leaky(kind)
    ns, kinds = og.namespace(choose, {"grower": holder})
    report = run_finder(ns, step)
    assert leak_found(ns, holder, report), (kind, kinds, report)
    holder, step = _bounded(kind)
    ns, kinds = og.namespace(choose, {"grower": holder})
    report = run_finder(ns, step)
    assert report.findings == (), (kind, kinds, report)


# -- %gpufit ---------------------------------------------------------------------------------------
class World:
    """A model with BatchNorm, its optimizer and scheduler, bare tensors under their own SGD, and
    generator objects: everything a trial changes, each planted at the end of a random chain."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        self.model.eval()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.9)
        self.w = torch.randn(8, 2, requires_grad=True)
        self.b = torch.zeros(2, requires_grad=True)
        self.bare_opt = torch.optim.SGD([self.w, self.b], lr=0.1, momentum=0.9)
        self.gen = torch.Generator().manual_seed(3)
        self.np_gen = np.random.default_rng(4)
        self.np_state = np.random.RandomState(5)
        self.rand = random.Random(6)
        self.history: list[float] = []

    def planted(self) -> dict[str, object]:
        return dict(vars(self))


def train(batch: int, *, world: dict[str, object]) -> None:
    """The user's step: reaches everything through ``world`` (a dict of planted chains)."""
    objs = {name: _unwrap(chain) for name, chain in world.items()}
    model, opt, sched = objs["model"], objs["opt"], objs["sched"]
    memory = objs["memory"]
    memory.use(2**20 * batch)
    model.train()
    x = torch.randn(max(min(batch, 16), 2), 8, generator=objs["gen"])
    loss = model(x).square().mean() + (x @ objs["w"] + objs["b"]).square().mean()
    opt.zero_grad()
    objs["bare_opt"].zero_grad()
    loss.backward()
    opt.step()
    objs["bare_opt"].step()
    sched.step()
    objs["np_gen"].random()
    objs["np_state"].rand()
    objs["rand"].random()
    objs["history"].append(float(loss))


def _unwrap(chain: object) -> object:
    """The planted object at the end of a chain (``tests/object_graphs.py``'s links)."""
    return chain[1]


def digest(w: World) -> dict[str, object]:
    return {
        "state": {k: v.clone() for k, v in w.model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in w.model.parameters()],
        "bare": [w.w.detach().clone(), w.b.detach().clone(), None if w.w.grad is None else w.w.grad.clone()],
        "modes": [m.training for m in w.model.modules()],
        "opt": copy.deepcopy(w.opt.state_dict()),
        "bare_opt": copy.deepcopy(w.bare_opt.state_dict()),
        "sched": copy.deepcopy(w.sched.state_dict()),
        "gen": w.gen.get_state().clone(),
        "np_gen": copy.deepcopy(w.np_gen.bit_generator.state),
        "np_state": w.np_state.get_state(),
        "rand": w.rand.getstate(),
        "history": list(w.history),
        "globals": (random.getstate(), torch.get_rng_state(), np.random.get_state()),
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _step_fn(choose: og.Choose, world: dict[str, object]) -> object:
    """The step as a notebook hands it over: a partial, a closure, a bound method, a callable object."""
    how = choose(["partial", "closure", "method", "callable", "class attribute"])
    if how == "partial":
        return functools.partial(train, world=world)
    if how == "closure":
        def step(batch: int) -> None:
            train(batch, world=world)
        return step
    holder = og.Owner(world)
    if how == "method":
        return _BoundStep(holder).step
    if how == "callable":
        return _CallableStep(holder)
    _ClassHeld.world = world
    return _ClassHeld().step


class _BoundStep:
    def __init__(self, owner: og.Owner) -> None:
        self.owner = owner

    def step(self, batch: int) -> None:
        train(batch, world=self.owner.held)


class _CallableStep(_BoundStep):
    def __call__(self, batch: int) -> None:
        self.step(batch)


class _ClassHeld:
    world: ClassVar[dict[str, object]] = {}

    def step(self, batch: int) -> None:
        train(batch, world=type(self).world)


@pytest.fixture(autouse=True)
def _forget_last_fit():
    yield
    fit_search._LAST.clear()


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_gpufit_leaves_every_planted_state_as_it_was(data):
    choose = _chooser(data)
    w = World()
    memory = BudgetMemory(2 * GiB)
    memory.keep(32 * 2**20)
    world: ClassVar[dict[str, object]] = {}
    for name, obj in [*w.planted().items(), ("memory", memory)]:
        wrapped, _ = og.chain(choose, obj, max_depth=reach.MAX_DEPTH - 3)
        world[name] = (wrapped, obj)  # the step unwraps by the second item; the walk sees both
    for i in range(choose([0, 1, 2])):
        world[f"odd{i}"] = (og.hostile(choose(og.HOSTILE)), None)
    train(4, world=world)  # mid-training
    before = digest(w)
    result = fit_with_memory(_step_fn(choose, world), memory, capacity=2 * GiB, steps=3, max_trials=6)
    assert result.ok and any("out of memory" in t.verdict for t in result.trials)  # the OOM path ran too
    after = digest(w)
    assert _same(before, after), [k for k in before if not _same(before[k], after[k])]
    assert not [n for n in result.notes if "not restored" in n], result.notes


def test_gpufit_names_what_it_cannot_put_back(tmp_path):
    """A generator the step draws from and a file it writes: named in the notes, never silent."""
    w = World()
    memory = BudgetMemory(2 * GiB)
    batches = (torch.randn(4, 8) for _ in range(1000))
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 (the step writes to it)
    world = {name: (obj, obj) for name, obj in w.planted().items()}
    world["memory"] = (memory, memory)

    def step(batch: int) -> None:
        next(batches)
        log.write("step\n")
        train(batch, world=world)

    try:
        result = fit_with_memory(step, memory, capacity=2 * GiB, steps=3, max_trials=3)
    finally:
        log.close()
    notes = " ".join(result.notes)
    assert "`step.batches`, a generator" in notes and "`step.log`, a file" in notes, result.notes


def test_a_hostile_object_never_reaches_the_users_cell():
    """CancelledError and an odd BaseException from a user object: the walk skips the holder and
    says so; a KeyboardInterrupt or SystemExit an object raises is skipped the same way."""
    ns = {"a": og.hostile("raise cancelled"), "b": og.hostile("raise base"), "c": og.ClassRaises(),
          "t": torch.ones(3)}
    census = take_census(ns, torch=torch)
    assert census.find("t") is not None and census.skipped_count >= 2
    for exc in (KeyboardInterrupt(), SystemExit()):
        census = take_census({"k": og.Hostile(exc), "t": torch.ones(3)}, torch=torch)
        assert census.find("t") is not None and census.skipped_count >= 1


def test_user_modules_are_walked_and_installed_packages_are_not(tmp_path, monkeypatch):
    """A module imported from the user's own file is walked (``helpers.cache[0]``); torch's and
    NumPy's module globals (their caches are not the user's) and the standard library's are not."""
    (tmp_path / "helpers_29.py").write_text("import torch\ncache = [torch.ones(5)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import helpers_29

    census = take_census({"helpers": helpers_29, "torch": torch, "np": np, "collections": collections},
                         torch=torch)
    assert [e.name for e in census.entries] == ["helpers.cache[0]"]
    assert reach.is_user_module(helpers_29) and not reach.is_user_module(torch) and not reach.is_user_module(np)
    assert not reach.is_user_module(collections)


def test_the_walk_is_bounded_and_cycle_safe():
    """Node limit, per-container limit and cycles: the walk ends, says it was cut short, and
    visits each object once."""
    loop: list[object] = []
    loop.append(loop)
    d: dict[str, object] = {"self": None}
    d["self"] = d
    visited: list[str] = []
    walk = reach.Walk(max_nodes=50)
    walk.add([loop, d, [[torch.zeros(1)] for _ in range(100)]], "ns")
    walk.run(lambda obj, path, depth, tag: visited.append(path) or True)
    assert walk.truncated and walk.nodes == 50 and len(set(visited)) == len(visited) == 50
    walk = reach.Walk(max_items=10)
    walk.add(list(range(5)) + [object() for _ in range(20)], "big")
    walk.run(lambda *a: True)
    assert walk.truncated


def test_what_a_step_reaches_is_named_from_the_step():
    """partial arguments, a bound method's self, a closure, a class attribute, the globals it names."""
    w = World()
    step = functools.partial(train, world={"model": (w.model, w.model)})
    from gpunb.analysis.fit.reachable import find_reachable

    found = find_reachable(torch, step)
    assert found.modules == [w.model]
    method = _ClassHeld().step
    _ClassHeld.world = {"opt": (w.opt, w.opt)}
    assert find_reachable(torch, method).optimizers == [w.opt]
