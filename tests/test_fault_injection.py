"""Fault injection: a seeded random fake NVML (random error codes, calls that hang, garbage
values), hostile objects in the namespace, huge messages and environment values, against
every entry point of gpunb.

For every fault: no exception of gpunb's reaches the user's cell, every output stays valid
(text, HTML, JSON), the monitor keeps drawing (at most one missing tick per fault) and memory
stays bounded. ``GPUNB_RESULTS=DIR`` writes what was tried to ``DIR/fault_injection.json``
(the table in docs/robustness.md comes from it).
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import time
import tracemalloc
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

from gpunb.analysis.monitor.sampler import Sampler
from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from gpunb.testing.fake_nvml import RandomFaults
from tests.hostile_objects import UNBOUND_PROXY

torch = pytest.importorskip("torch")

SEEDS = range(6)
TRIED: Counter[str] = Counter()  # what was injected, for the report
HELD: Counter[str] = Counter()  # assertions that held
INJECTED_MARKERS = ("<script>alert('nvml')</script>", "<b>H200</b>", "<img src=x onerror=alert(1)>")


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    out = os.environ.get("GPUNB_RESULTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "fault_injection.json").write_text(json.dumps({"tried": TRIED, "held": HELD}, indent=2))


# -- validity of what gpunb shows ------------------------------------------------------------

_VOID = {"br", "img", "hr", "input", "meta", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


class _HtmlChecker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "script" or any(name.startswith("on") for name, _ in attrs):
            self.problems.append(f"active content: <{tag} {attrs}>")
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        if tag == "script" or any(name.startswith("on") for name, _ in attrs):
            self.problems.append(f"active content: <{tag} {attrs}>")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()


def valid_html(markup: str) -> None:
    assert isinstance(markup, str) and len(markup) < 2_000_000
    checker = _HtmlChecker()
    checker.feed(markup)
    checker.close()
    assert not checker.problems, checker.problems[:3]
    assert not checker.stack, f"unclosed: {checker.stack[-3:]}"
    for marker in INJECTED_MARKERS:
        assert marker not in markup  # escaped, never live markup
    HELD["HTML outputs valid and escaped"] += 1


def _no_constant(name: str):
    raise ValueError(f"JSON with {name}")


def valid_json(text: str) -> object:
    value = json.loads(text, parse_constant=_no_constant)  # NaN/Infinity are not JSON
    HELD["JSON outputs valid"] += 1
    return value


def valid_data(data: object) -> None:
    valid_json(json.dumps(data, allow_nan=False))


def valid_text(text: str) -> None:
    assert isinstance(text, str) and len(text) < 2_000_000
    assert "Traceback (most recent call last)" not in text
    HELD["text outputs valid"] += 1


def run(ip, code: str, *, user_error: bool = False) -> tuple[object, str]:
    """Run a cell; check that gpunb put no exception into it and that every output is valid."""
    with capture_output() as out:
        result = ip.run_cell(code)
    if user_error:
        assert result.error_in_exec is not None  # the user's own exception, as raised
    else:
        assert result.success, (code, repr(result.error_in_before_exec or result.error_in_exec), out.stdout[-2000:])
    assert "Error in callback" not in out.stderr + out.stdout, out.stderr[-2000:]
    for o in out.outputs:
        if "text/html" in o.data:
            valid_html(o.data["text/html"])
        if "text/plain" in o.data:
            valid_text(o.data["text/plain"])
    if not user_error:
        valid_text(out.stdout)
    HELD["cells without an exception from gpunb"] += 1
    return result, out.stdout + "\n".join(o.data.get("text/plain", "") for o in out.outputs)


@pytest.fixture
def shell(ip):
    ip.reset(new_session=False)
    ip.user_ns["_gpunb_test"] = {"msg": load_trace()["oom_message"]}
    run(ip, "import torch, gpunb")
    yield ip
    run(ip, "%gpumonitor --stop")
    run(ip, "%gpuprofile off")
    nvml_module.set_default_session(None)


def random_nvml(seed: int, **rates) -> object:
    fake = scenario("two-gpus")
    fake.gpus[1].garbage["nvmlDeviceGetName"] = "<b>H200</b>"
    rates = {"error_rate": 0.12, "hang_rate": 0.01, "garbage_rate": 0.12, "hang_s": 0.4, **rates}
    fake.random_faults = RandomFaults(seed, spare=("nvmlInit",), **rates)
    nvml_module.set_default_session(NvmlSession(fake))
    return fake


OOM_CELL = """
def step(bs):
    acts = torch.zeros(bs, 32)
    raise torch.OutOfMemoryError(_gpunb_test["msg"])
step(64)
"""


# -- a lying, failing, hanging NVML behind every entry point -------------------------------

@pytest.mark.parametrize("seed, hang_rate", [(seed, 0.01) for seed in SEEDS] + [(100 + seed, 0.0) for seed in SEEDS])
def test_random_nvml_faults_behind_every_entry_point(shell, seed, hang_rate):
    fake = random_nvml(seed, hang_rate=hang_rate)  # without hangs, NVML is never paused: every call meets a fault
    try:
        t0 = time.monotonic()
        run(shell, "%gpucheck --quick")
        _, printed = run(shell, "%gpucheck --quick --json")
        report = valid_json(printed)
        assert [c["id"] for c in report["checks"]][:2] == ["driver", "gpu_processes"]
        run(shell, "%gpumem")
        run(shell, "%gpumem -o mem")
        valid_data(shell.user_ns["mem"].to_dict())
        run(shell, "%gpumonitor -o mon")
        mon = shell.user_ns["mon"]
        for _ in range(20):
            mon.sampler.tick()
            valid_html(mon.html())
            valid_text(mon.text())
        valid_data(mon.to_dict())
        assert len({len(v) for v in mon.samples().values()}) == 1  # columns stay aligned
        live = shell.user_ns["gpunb"].monitor(frontend="live")
        with capture_output():
            live._ipython_display_()
        for _ in range(5):
            live.sampler.tick()
            frame = live._live_bundle()
            valid_html(frame["text/html"])
            valid_text(frame["text/plain"])
        live.stop()
        run(shell, "%gpumonitor --stop")
        run(shell, "%%gpuprofile\nx = torch.ones(64, 64)\nfor _ in range(3):\n    x = x @ x / 64")
        run(shell, "%gpuprofile on")
        run(shell, "y = torch.ones(8).sum()")
        run(shell, "%gpuprofile off")
        _, out = run(shell, OOM_CELL, user_error=True)
        assert "gpunb OOM doctor" in out
        run(shell, "%gpumem --release")
        took = time.monotonic() - t0
        assert took < 60
    finally:
        fake.release_hangs()
    for kind, n in fake.random_faults.counts.items():
        TRIED[f"random NVML {kind}"] += n
    TRIED["random NVML calls"] += sum(fake.calls.values())
    HELD["entry points under random NVML faults"] += 1


def test_the_monitor_keeps_drawing_through_random_faults():
    fake = scenario("two-gpus")
    faults = fake.random_faults = RandomFaults(101, error_rate=0.1, hang_rate=0.02, garbage_rate=0.1, hang_s=0.5,
                                               spare=("nvmlInit",))
    session = NvmlSession(fake)
    hz = 5.0
    sampler = Sampler(session, hz=hz)
    draws: list[float] = []
    sampler.add_listener(lambda s: draws.append(time.monotonic()))
    try:
        sampler.start()
        time.sleep(6.0)
    finally:
        sampler.stop()
        fake.release_hangs()
        session.stop_worker()
    t = [v for v in sampler.samples()["t_s"] if v is not None]
    period = 1 / hz
    missing = sum(max(0, round((b - a) / period) - 1) for a, b in itertools.pairwise(t))
    hangs = faults.counts["hang"]
    assert len(draws) == sampler.ticks  # every tick reached the view
    assert missing <= hangs + 1, f"{missing} ticks missing for {hangs} hangs in {len(t)} ticks"
    TRIED["monitor ticks under random faults"] += len(t)
    TRIED["monitor hangs"] += hangs
    TRIED["monitor ticks missing"] += missing
    HELD["monitor ticks missing (at most one per hang)"] += 1


def test_memory_stays_bounded_under_faults():
    fake = scenario("two-gpus")
    fake.random_faults = RandomFaults(7, error_rate=0.2, hang_rate=0.0, garbage_rate=0.2, spare=("nvmlInit",))
    session = NvmlSession(fake)
    sampler = Sampler(session, capacity=300)
    try:
        for _ in range(600):  # fill the ring buffer, notes and fault books
            sampler.tick()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2000):
            sampler.tick()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    finally:
        session.stop_worker()
    assert grown < 256 * 1024, f"{grown / 1024:.0f} KiB more after 2,000 faulty ticks"
    assert len(sampler.samples()["t_s"]) == 300
    TRIED["faulty ticks for the memory bound"] += 2600
    TRIED["KiB grown over the last 2,000 faulty ticks"] += round(grown / 1024)
    HELD["memory bounded under faults"] += 1


# -- hostile objects in the namespace ----------------------------------------------------------

HOSTILE = UNBOUND_PROXY + '''
class Explodes:
    """Every attribute access raises, __class__ included."""
    def __getattribute__(self, name):
        raise RuntimeError(f"no {name} for you")

class RaisingProps:
    @property
    def __dict__(self):
        raise ValueError("no __dict__")
    @property
    def weights(self):
        raise ValueError("lazy property failed")

class ItemsRaise(dict):
    def items(self):
        raise RuntimeError("items() refuses")
    def values(self):
        raise RuntimeError("values() refuses")

class IterRaise(list):
    def __iter__(self):
        raise RuntimeError("__iter__ refuses")
    def __len__(self):
        raise RuntimeError("__len__ refuses")

class BadRepr:
    def __repr__(self):
        raise RuntimeError("repr refuses")
    def __hash__(self):
        return 1

class Bottomless:
    def __getattr__(self, name):
        return Bottomless()

class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str refuses")

u = UnboundProxy(ContextVar("u"))
boom = Explodes()
props = RaisingProps()
d = ItemsRaise(a=torch.zeros(4))
l = IterRaise([torch.zeros(4)])
keyed = {BadRepr(): torch.zeros(8), "x" * 100_000: torch.zeros(2)}
bottomless = Bottomless()
cycle = []
cycle.append(cycle)
deep = []
node = deep
for _ in range(10_000):
    node.append([])
    node = node[0]
wide = {i: i for i in range(200_000)}
bad_error = BadStr()
kept = torch.zeros(16, 16)
'''


def test_hostile_namespace_against_every_entry_point(shell):
    fake = random_nvml(11, hang_rate=0.0)
    run(shell, HOSTILE)
    names = ("u", "boom", "props", "d", "l", "keyed", "bottomless", "bad_error")
    TRIED["hostile namespace objects"] += len(names)
    _, out = run(shell, OOM_CELL, user_error=True)
    assert "gpunb OOM doctor" in out and "could not diagnose" not in out
    assert "names skipped" in out and "step() local acts" in out
    _, out = run(shell, "%gpumem --all-devices")
    assert "kept" in out and "names skipped" in out
    run(shell, "%gpumem --free kept")
    run(shell, "%gpumem --release")
    run(shell, "%%gpuprofile\nz = torch.ones(32, 32) @ torch.ones(32, 32)")
    run(shell, "%gpucheck --quick")
    run(shell, "%gpumonitor")
    run(shell, "%gpumonitor --stop")
    run(shell, "%tb")
    run(shell, "%debug")
    fake.release_hangs()
    HELD["OOM doctor, %gpumem, profile, check, monitor with hostile objects"] += 1


def test_an_oom_error_whose_message_cannot_be_made(shell):
    run(shell, "class BadOom(torch.OutOfMemoryError):\n    def __str__(self):\n        raise RuntimeError('no')")
    run(shell, "raise BadOom('x')", user_error=True)
    TRIED["exceptions whose str() raises"] += 1


# -- huge messages and environment values -------------------------------------------------------

def test_a_huge_oom_message(shell):
    nvml_module.set_default_session(NvmlSession(scenario("h200")))
    shell.user_ns["_gpunb_test"]["msg"] = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. <img src=x onerror=alert(1)> " + "7" * 1_000_000)
    t0 = time.monotonic()
    _, out = run(shell, OOM_CELL, user_error=True)
    assert time.monotonic() - t0 < 5 and "gpunb OOM doctor" in out
    TRIED["OOM messages of 1 MB"] += 1


HUGE_ENV = {
    "CUDA_VISIBLE_DEVICES": ["1" * 1_000_000, "GPU-" + "a" * 1_000_000, "," * 1_000_000, "<script>x</script>,0",
                             "0," * 200_000, "-" + "9" * 5000],
    "PYTORCH_CUDA_ALLOC_CONF": ["x" * 1_000_000, "expandable_segments:True," * 50_000,
                                "max_split_size_mb:" + "9" * 5000, "<img src=x onerror=alert(1)>:1"],
    "CUDA_DEVICE_ORDER": ["<script>alert('nvml')</script>" * 1000],
    "GPUNB_KEEP_TRACEBACK": ["1" * 1_000_000],
}


@pytest.mark.parametrize("name, value", [(k, v) for k, vs in HUGE_ENV.items() for v in vs],
                         ids=lambda v: v if len(v) < 30 else f"{v[:12]}…{len(v)}")
def test_huge_and_hostile_environment_values(name, value):
    import gpunb
    from gpunb.views.check_view import render_html, render_text

    nvml_module.set_default_session(NvmlSession(scenario("two-gpus")))
    try:
        t0 = time.monotonic()
        report = gpunb.check(quick=True, environ={**os.environ, name: value})
        took = time.monotonic() - t0
        text, html, data = render_text(report), render_html(report), report.to_json()
    finally:
        nvml_module.set_default_session(None)
    assert took < 2.0
    valid_text(text)
    valid_html(html)
    valid_json(data)
    assert len(text) + len(html) + len(data) < 200_000  # the value is not repeated at length
    TRIED["huge or hostile environment values"] += 1


def test_unknown_fake_scenario_of_a_megabyte(monkeypatch, ip):
    monkeypatch.setenv("GPUNB_FAKE_NVML", "x" * 1_000_000)
    nvml_module.set_default_session(None)
    try:
        _, out = run(ip, "%gpucheck --quick")
        assert "GPUNB_FAKE_NVML" in out and len(out) < 100_000
    finally:
        nvml_module.set_default_session(None)
    TRIED["huge or hostile environment values"] += 1


def test_garbage_in_every_field_of_every_reading():
    """Each garbage value in each NVML function in turn: the checklist and the monitor stay valid."""
    import gpunb
    from gpunb.views.check_view import render_html

    functions = [n for n in dir(scenario("h200")) if n.startswith("nvmlDevice") and n != "nvmlDeviceGetCount"]
    garbage = [None, math.nan, -1, 2**70, "<script>alert('nvml')</script>", object()]
    for i, name in enumerate(functions):
        fake = scenario("h200")
        fake.gpus[0].garbage[name] = garbage[i % len(garbage)]
        nvml_module.set_default_session(NvmlSession(fake))
        report = gpunb.check(quick=True)
        valid_html(render_html(report))
        valid_json(report.to_json())
        sampler = Sampler(nvml_module.default_session())
        for _ in range(3):
            sampler.tick()
        assert len({len(v) for v in sampler.samples().values()}) == 1
        TRIED["garbage values, one function at a time"] += 1
    nvml_module.set_default_session(None)


LINK_FUNCTIONS = ("nvmlDeviceGetFieldValues", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkVersion",
                  "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkRemotePciInfo",
                  "nvmlDeviceGetP2PStatus", "nvmlDeviceGetTopologyCommonAncestor")


@pytest.mark.parametrize("name", LINK_FUNCTIONS)
def test_garbage_in_the_links_between_gpus(name):
    """The multi-GPU readings (readings/links.py) go through the same shapes: garbage in any of
    them is a gap in gpu_links, never a crash; the checklist's HTML and JSON stay valid."""
    from gpunb.analysis.checks.checklist import check
    from gpunb.readings.nvml_values import SHAPES
    from gpunb.views.check_view import render_html

    assert name in SHAPES  # a new NVML function needs its shape (or its value goes unchecked)
    for value in RandomFaults.GARBAGE:
        fake = scenario("h200x2-nvlink")
        fake.gpus[0].garbage[name] = value
        report = check(quick=True, nvml=NvmlSession(fake), environ={})
        links = report["gpu_links"]
        assert "error" not in links.measured and "gpunb bug" not in links.cause, links.to_dict()
        valid_html(render_html(report))
        valid_json(report.to_json())
        TRIED["garbage values in the links between GPUs"] += 1


@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_in_the_links_between_gpus(seed):
    from gpunb.analysis.checks.checklist import check
    from gpunb.views.check_view import render_html

    fake = scenario("h200x2-nvlink")
    fake.random_faults = RandomFaults(seed, error_rate=0.2, garbage_rate=0.2, hang_rate=0.0, spare=("nvmlInit",))
    report = check(quick=True, nvml=NvmlSession(fake), environ={})
    links = report["gpu_links"]
    assert "error" not in links.measured and "gpunb bug" not in links.cause, links.to_dict()
    valid_html(render_html(report))
    valid_json(report.to_json())
    TRIED["random NVML errors and garbage in the links between GPUs"] += sum(fake.random_faults.counts.values())
