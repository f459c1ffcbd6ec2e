"""When to look, within a time budget, and what the looks add up to.

The profiled cell's step hook calls :meth:`LeakFinder.on_step` at every step end; it is one
comparison until a look is due. Looks (censuses of the notebook's variables,
``snapshot.look``) are taken on the kernel thread at step ends: at the end of the first step
after the warm-up, then 1, 2, 3, 5, 8, 12, 18, 27... steps later (each gap 1.5 times the one
before), and once more at the end of the cell. Each look is timed; a look that would take the
looks' total above :data:`BUDGET_SHARE` of the cell's elapsed time (the last look's time is
the estimate; before the first, a guess from the size of the notebook's collections) waits
for a later step; the end's look may take the total to :data:`END_BUDGET_SHARE` when the
looks are still too few to judge. So the finder stays inside the profile's budget of 1 %
on any loop, and a long cell gets more looks than a short one.

The look at the cell's end counts only when nothing it held fell since the last step-end
look: after the loop a cell often turns its list into one tensor (``torch.cat(preds)``).

Between looks, at the same steps of the schedule, the finder notes the length of each of the
notebook's lists, dicts, sets and deques (``len``: microseconds for a notebook). When the looks
are too few to judge (a short cell in a notebook whose looks are dear), a container whose length
rose steadily at those steps is judged by its length, and the looks say what it holds.
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpunb.analysis import reach
from gpunb.analysis.advice import Advice
from gpunb.analysis.leaks import growth
from gpunb.analysis.leaks.fixes import describe, hooks_filling
from gpunb.analysis.leaks.records import LeakFinding, LeakReport
from gpunb.analysis.leaks.snapshot import CENSUS_NODE_CAP, Snapshot, look
from gpunb.units import gib

BUDGET_SHARE = 0.005  # of the cell's elapsed time, for all looks together
# The look at the cell's end may take them near the profile's own budget (1 %) when the step-end
# looks are still too few to judge: in a 3.8 s cell of a notebook with 84 variables the looks
# took 5.7 ms each, three fitted in 0.5 %, and the leak went unreported. It runs after the last
# step, so no training step waits for it.
END_BUDGET_SHARE = 0.008  # under the profile's 1 %, with room for a look that costs more than its estimate
# The first look's cost before any was measured: a small notebook's census took 0.2-0.6 ms on the
# 2-core CI machine under load, plus ~3 µs for each element of the notebook's lists, dicts, tuples
# and sets (a dataset kept as a list of tensors). So the first look waits until the cell has run
# 0.2 s, longer in a notebook holding big collections.
FIRST_LOOK_GUESS_S = 0.001
PER_ELEMENT_GUESS_S = 3e-6
SPACING = 1.5  # each gap between looks this many times the one before
# The containers whose length is noted between looks: built-in types only (their len() is C code;
# a user's __len__ is never called).
SIZED = (list, dict, set, collections.deque, collections.defaultdict, collections.OrderedDict)


def schedule(first: int, limit: int = 10**9) -> list[int]:
    """0-based step indices of the step-end looks: first, first+1, +2, +3, +5, +8, +12..."""
    out, gap = [first], 1
    while out[-1] < limit and len(out) < 200:
        out.append(out[-1] + gap)
        gap = max(gap + 1, round(gap * SPACING))
    return out


def _after(plan: list[int], index: int) -> int:
    """The first step of ``plan`` after ``index``; the plan is extended when it runs out."""
    k = bisect.bisect_right(plan, index)
    if k >= len(plan):
        plan += schedule(plan[-1])[1:]
    return plan[k]


def first_guess(namespace: Mapping[str, Any]) -> float:
    """The first look's cost, guessed from the size of the notebook's top-level collections
    (exact built-in types only: a user's ``__len__`` is never called)."""
    elements = 0
    for value in list(namespace.values()):
        if type(value) in (list, dict, tuple, set):
            elements += len(value)
    return FIRST_LOOK_GUESS_S + PER_ELEMENT_GUESS_S * min(elements, CENSUS_NODE_CAP)


class LeakFinder:
    """Looks at the notebook's variables during one profiled cell; :meth:`report` judges them."""

    def __init__(self, torch: Any, namespace: Callable[[], Mapping[str, Any]], *, warmup_steps: int, t0: float,
                 clock: Callable[[], float] = time.perf_counter, budget_share: float | None = None) -> None:
        self.torch = torch
        self.namespace = namespace
        self.t0 = t0
        self.clock = clock
        self.budget_share = BUDGET_SHARE if budget_share is None else budget_share
        self.plan = schedule(warmup_steps)
        self.next_index = self.plan[0]
        self.looks: list[Snapshot] = []
        self.spent_s = 0.0
        try:  # the next look's cost, guessed from the last one
            self.expected_s = first_guess(namespace())
        except BaseException as exc:  # noqa: BLE001 (CancelledError too; a mapping unreadable now: the look says so)
            if reach.passes(exc):
                raise
            self.expected_s = FIRST_LOOK_GUESS_S
        self.skipped = 0
        self.errors: list[str] = []
        self.t_end: float | None = None
        self.sizes: list[tuple[int, dict[str, int]]] = []  # (step index, the containers' lengths)
        self.size_plan = schedule(warmup_steps)
        self.next_size = self.size_plan[0]
        self._due = min(self.next_index, self.next_size)

    def on_step(self, index: int) -> bool:
        """At the end of step ``index`` (0-based). Always True: the finder watches to the end."""
        if index < self._due:
            return True
        if index >= self.next_size:
            self._note_sizes(index)
            self.next_size = _after(self.size_plan, index)
        self._due = min(self.next_index, self.next_size)
        if index < self.next_index:
            return True
        t = self.clock()
        if self.spent_s + self.expected_s > self.budget_share * (t - self.t0):
            return True  # over budget now: try again at the next step
        self._look(index)
        passed = bisect.bisect_right(self.plan, index) - bisect.bisect_right(self.plan, self.next_index)
        self.skipped += max(passed, 0)  # scheduled steps the budget made this look skip
        self.next_index = _after(self.plan, index)
        self._due = min(self.next_index, self.next_size)
        return True

    def _note_sizes(self, index: int) -> None:
        if self.sizes and self.sizes[-1][0] == index:
            return  # noted already at this step (a look's step is often a scheduled one)
        try:
            sizes = {name: len(value) for name, value in list(self.namespace().items())
                     if type(value) in SIZED and not name.startswith("_")}
        except BaseException as exc:  # noqa: BLE001 (CancelledError too; a namespace unreadable now: the looks say so)
            if reach.passes(exc):
                raise
            return
        self.sizes.append((index, sizes))

    def _look(self, index: int) -> Snapshot | None:
        try:
            snap = look(self.namespace(), self.torch, index, clock=self.clock)
        except BaseException as exc:  # noqa: BLE001 (a gpunb bug or a hostile namespace, CancelledError too: no
            # leak report, never a failed cell; the user's own Ctrl-C goes on)
            if reach.passes(exc):
                raise
            self.errors.append(f"{type(exc).__name__}: {reach.safe_repr(exc, 120)}")
            self.spent_s += self.expected_s
            return None
        self.spent_s += snap.cost_s
        self.expected_s = snap.cost_s
        self.looks.append(snap)
        self._note_sizes(index)  # the length beside what the look counted, to scale one by the other
        return snap

    def finish(self, steps: int, t_end: float) -> None:
        """The look at the cell's end (``steps``: the cell's step count), budget allowing."""
        self.t_end = t_end
        if not self.looks or steps - 1 <= self.looks[-1].step:
            return
        share, expected = self.budget_share, self.expected_s
        if len(self.looks) < growth.MIN_LOOKS:  # one more look decides whether growth can be judged at all
            share = self.budget_share * END_BUDGET_SHARE / BUDGET_SHARE
            # a look's cost grows with what it counts, and a leak grows with the steps
            expected *= max(1.0, steps / (self.looks[-1].step + 1))
        if self.spent_s + expected <= share * (t_end - self.t0):
            noted = len(self.sizes)
            end = self._look(steps - 1)
            if end is not None and _fell(self.looks[-2], end):
                self.looks.pop()  # cleared after the loop: the step-end looks tell the growth
                del self.sizes[noted:]  # and so do the step-end lengths
        else:
            self.skipped += 1

    def report(self, timeline: Sequence[tuple[float, int, int | None]], step_t: Sequence[float],
               gpu_allocated: int | None, warmup_steps: int) -> LeakReport:
        """Judge the looks (and, on a GPU, the allocated bytes at step ends after the warm-up)."""
        looks = self.looks
        wall = max(looks[-1].t + looks[-1].cost_s if looks else self.t0, self.t_end or self.t0) - self.t0
        steps = tuple(s.step + 1 for s in looks)
        allocated = _allocated_rate(timeline, step_t, warmup_steps) if gpu_allocated is not None else None
        in_use = max(gpu_allocated or 0, looks[-1].tensor_bytes if looks else 0)
        findings, small = _findings(looks, self.namespace, self.torch, in_use)
        by_size = ""
        if not findings and len(looks) < growth.MIN_LOOKS:
            # too few looks to judge: the containers' lengths at every scheduled step tell the trend
            findings, by_size = _findings_by_length(self.sizes, looks, self.namespace, self.torch, in_use)
        if allocated is not None and not findings and growth.matters(allocated, in_use):
            # the allocated bytes rose steadily at every step end: the looks need only say who
            # holds it, even when they were too few to tell a trend on their own
            findings, _ = _findings(looks, self.namespace, self.torch, in_use, rise=growth.rose)
        if allocated is not None and not findings and (small or not growth.matters(allocated, in_use)):
            # what grew is explained by a holder too small to report (the allocator gives each
            # tensor at least 512 bytes: a detached scalar a step shows as 512 B a step), or small itself
            allocated = None
        if allocated is not None and not findings:
            findings = [LeakFinding("", "unnamed", "no variable of the notebook holds it (a closure, another "
                                    "module's global, or memory outside Python objects)",
                                    "look for state kept between steps outside the notebook's variables "
                                    "(`%gpumem` lists what they hold)", 0, 0.0, 0, allocated)]
        note = ""
        too_few = len(looks) < growth.MIN_LOOKS or (steps and steps[-1] - steps[0] < growth.MIN_STEPS)
        if by_size and findings:
            note = by_size
        elif too_few and not findings:  # a finding from too few looks had the allocated bytes' steady rise
            note = (f"{len(looks)} look{'s' if len(looks) != 1 else ''} over {steps[-1] - steps[0] if steps else 0} "
                    f"steps after the warm-up: too few to judge growth (it needs {growth.MIN_LOOKS} looks over "
                    f"{growth.MIN_STEPS} steps)")
        if self.errors:
            note = (note + "; " if note else "") + f"a look failed ({self.errors[0]})"
        skipped = next((s.skipped_note for s in reversed(looks) if s.skipped_note), "")
        if skipped:  # an object raising when read: that holder is not judged, the others are
            note = (note + "; " if note else "") + skipped
        return LeakReport(tuple(findings), len(looks), steps, self.skipped, self.spent_s, wall,
                          allocated if findings else None, note)


def _fell(before: Snapshot, after: Snapshot) -> bool:
    return any(after.holdings.get(k) is None or after.holdings[k].tensors < h.tensors
               for k, h in before.holdings.items())


def _findings_by_length(sizes: Sequence[tuple[int, dict[str, int]]], looks: Sequence[Snapshot],
                        namespace: Callable[[], Mapping[str, Any]], torch: Any, in_use: int
                        ) -> tuple[list[LeakFinding], str]:
    """The containers whose length rose steadily over the scheduled steps and whose last look
    found tensors in them: with autograd history always, detached ones when their bytes matter.
    The rates are the length's slope times what one element held at the last look."""
    if not looks or len(sizes) < growth.MIN_LOOKS:
        return [], ""
    last = looks[-1]
    at_look = next((lens for step, lens in sizes if step == last.step), None)
    out: list[LeakFinding] = []
    for name, held in last.holdings.items():
        if at_look is None or not at_look.get(name) or not held.tensors:
            continue
        xs = [float(step + 1) for step, lens in sizes if name in lens]
        ys = [float(lens[name]) for _, lens in sizes if name in lens]
        if not growth.steady_rise(xs, ys):
            continue
        per_element = held.tensors / at_look[name]
        tensors_rate = growth.theil_sen(xs, ys) * per_element
        bytes_rate = tensors_rate * held.nbytes / held.tensors
        pattern = "history" if held.with_history else "tensors"
        if pattern == "tensors" and not growth.matters(bytes_rate, in_use):
            continue  # detached scalars and other small change: silent on purpose
        filled_by = hooks_filling(namespace(), torch, name) if "<" not in name else None
        sentence, fix = describe(pattern, name, held.tensors, 0, 0.0, last, filled_by)
        out.append(LeakFinding(name, pattern, sentence, fix, held.tensors, tensors_rate, held.nbytes, bytes_rate))
    if not out:
        return [], ""
    steps = f"{sizes[0][0] + 1} to {sizes[-1][0] + 1}"
    names = ", ".join(f"`{f.holder}`" for f in out)
    return (sorted(out, key=lambda f: -f.bytes_per_step),
            f"judged by the length of {names} at {len(sizes)} step ends (steps {steps}): "
            f"{len(looks)} census{'es' if len(looks) != 1 else ''} fitted the time budget")


def _allocated_rate(timeline: Sequence[tuple[float, int, int | None]], step_t: Sequence[float],
                    warmup_steps: int) -> float | None:
    """Allocated bytes per step when they rose steadily at the step ends after the warm-up."""
    if not step_t:
        return None
    xs: list[float] = []
    ys: list[float] = []
    for t, allocated, _ in timeline:
        done = bisect.bisect_right(step_t, t)  # a point is taken inside the hook of step `done`
        if done > warmup_steps and t <= step_t[-1] + 1.0 and (not xs or done > xs[-1]):
            xs.append(float(done))
            ys.append(float(allocated))
    if not growth.steady_rise(xs, ys):
        return None
    return growth.theil_sen(xs, ys)


def _series(looks: Sequence[Snapshot], key: str, field: str, capped: bool = False) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in looks:
        if capped and s.graph_capped:
            continue  # a capped walk undercounts: the looks before the cap tell the trend
        h = s.holdings.get(key)
        xs.append(float(s.step + 1))
        ys.append(float(getattr(h, field)) if h is not None else 0.0)
    return xs, ys


def _findings(looks: Sequence[Snapshot], namespace: Callable[[], Mapping[str, Any]], torch: Any,
              in_use: int, rise: Callable[[Sequence[float], Sequence[float]], bool] = growth.steady_rise
              ) -> tuple[list[LeakFinding], bool]:
    """The holders that grew enough to report, and whether one grew too little to report
    (``rise``: what counts as growing; the looks alone need :func:`growth.steady_rise`)."""
    if len(looks) < (growth.MIN_LOOKS if rise is growth.steady_rise else 2):
        return [], False
    last = looks[-1]
    found: list[LeakFinding] = []
    small = False
    for key, held in last.holdings.items():
        xs, tensors = _series(looks, key, "tensors")
        _, history = _series(looks, key, "with_history")
        gx, nodes = _series(looks, key, "graph_nodes", capped=True)
        _, total = _series(looks, key, "nbytes")
        rate = max(growth.theil_sen(xs, total), 0.0)
        if rise(xs, history):
            pattern = "history"
        elif rise(xs, tensors):
            if not growth.matters(rate, in_use):
                small = True
                continue  # detached scalars and other small change: silent on purpose
            pattern = "tensors"
        elif held.with_history and rise(gx, nodes):
            pattern = "graph"
        elif rise(xs, total) and growth.matters(rate, in_use):
            pattern = "bytes"  # as many tensors, more bytes: `acc = torch.cat([acc, out])`, a buffer made larger
        else:
            continue
        node_rate = growth.theil_sen(gx, nodes) if len(gx) >= 2 else 0.0
        found.append(LeakFinding(key, pattern, "", "", held.tensors, growth.theil_sen(xs, tensors),
                                 held.nbytes, rate, held.graph_nodes, node_rate))
    found = _deepest(found)
    out = []
    ns = namespace()
    for f in found:
        filled_by = hooks_filling(ns, torch, f.holder) if f.pattern != "graph" and "<" not in f.holder else None
        sentence, fix = describe(f.pattern, f.holder, f.tensors, f.graph_nodes, f.graph_nodes_per_step, last,
                                 filled_by)
        out.append(LeakFinding(f.holder, f.pattern, sentence, fix, f.tensors, f.tensors_per_step, f.bytes_held,
                               f.bytes_per_step, f.graph_nodes, f.graph_nodes_per_step))
    return sorted(out, key=lambda f: -f.bytes_per_step), small


def _deepest(found: list[LeakFinding]) -> list[LeakFinding]:
    """Of nested containers that grow alike (``logs`` and ``logs['preds']``), the innermost."""
    keep: list[LeakFinding] = []
    for f in sorted(found, key=lambda f: -len(f.holder)):
        inner = [k for k in keep if k.holder.startswith(f.holder) and k.holder[len(f.holder):][:1] in ("[", ".")]
        if inner and (sum(k.tensors_per_step + k.graph_nodes_per_step for k in inner)
                      >= 0.9 * (f.tensors_per_step + f.graph_nodes_per_step)
                      and sum(k.bytes_per_step for k in inner) >= 0.9 * f.bytes_per_step):
            continue
        keep.append(f)
    return keep


def leak_advice(report: LeakReport | None) -> list[Advice]:
    """One advice item per finding, ranked with the profile's others (a leak ends in an OOM)."""
    if report is None:
        return []
    out = []
    for f in report.findings:
        rate = f"+{gib(f.bytes_per_step)} per step" if f.bytes_per_step >= 1 else ""
        title = "Stop memory from growing every step" if f.pattern != "graph" else "Stop keeping every step's graph"
        out.append(Advice(title, f"{f.sentence}" + (f" ({rate})" if rate and f.pattern != "unnamed" else ""),
                          f.fix, severity=2))
    return out
