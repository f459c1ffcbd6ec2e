"""A Ctrl-C at any point of a profiled cell's start or stop leaves nothing of gpunb installed.

Not random signals: the start and the stop are run once to count the lines of gpunb's code
they execute, then once per line k, with a ``KeyboardInterrupt`` raised by a trace function
at line k (the way a SIGINT lands between two statements). After each: the exception came
out, and the process holds no hook of gpunb's (optimizer hooks, wrapped methods, streams,
import finders, environment entries, dispatch modes, the profiler, threads, temp dirs).
A real SIGINT during the install or removal is held back until it is done (``deferred_sigint``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.profile.cell import ProfileSession  # noqa: E402
from gpunb.analysis.ranks import recorder as rank_recorder  # noqa: E402
from gpunb.analysis.steps.instruments import SYNC_METHODS, Instruments  # noqa: E402
from gpunb.readings.interrupts import deferred_sigint  # noqa: E402
from tests.line_injector import LineInjector  # noqa: E402


def _optimizer_module():
    import torch.optim.optimizer as module

    return module


def process_state() -> dict[str, object]:
    """Everything a profiled cell may change in the process, by identity."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    optim = _optimizer_module()
    return {
        "tensor methods": {name: torch.Tensor.__dict__.get(name) for name in SYNC_METHODS},
        "dataloader next": _BaseDataLoaderIter.__dict__.get("__next__"),
        "optimizer post hooks": dict(optim._global_optimizer_post_hooks),
        "optimizer _get_value": {name: getattr(sys.modules[name], "_get_value", None)
                                 for name in list(sys.modules) if name.startswith("torch.optim")},
        "stdout": (sys.stdout, getattr(sys.stdout, "__dict__", {}).get("write")),
        "stderr": (sys.stderr, getattr(sys.stderr, "__dict__", {}).get("write")),
        "meta_path": list(sys.meta_path),
        "environment": {key: os.environ.get(key) for key in ("GPUNB_RANK_CHANNEL", "PYTHONPATH")},
        "rank recorder": rank_recorder._kernel_instruments,
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "profiler on": torch.autograd.profiler._is_profiler_enabled,
    }


def settled_threads(before: set[str]) -> set[str]:
    """The threads alive that were not before (waits a little for short-lived NVML reads)."""
    deadline = time.monotonic() + 2.0
    while True:
        extra = {t.name for t in threading.enumerate()} - before
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.02)


def training_cell() -> None:
    """A cell touching every hook: DataLoader batches, .item() reads, print, optimizer steps."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                                       batch_size=4)
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # a host read
        sys.stdout.write("")  # a timed write


@pytest.fixture(autouse=True)
def sigint_handler_back():
    """An exception injected inside ``deferred_sigint`` itself (between installing its noting
    handler and putting the old one back) leaves the noting handler in place, which no real
    SIGINT can do (that handler never raises). Put the handler back, or later tests' Ctrl-Cs
    are only noted."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.fixture
def session_factory(fake_nvml, tmp_path):
    def make(ops: bool) -> ProfileSession:
        return ProfileSession(label="t", ops=ops, trace_dir=tmp_path)

    # warm up once: caches (module lists, the NVML worker) are not part of a cell's state
    warm = make(True).start()
    training_cell()
    warm.stop()
    return make


def _points(make, phase: str) -> list[tuple[str, int, int]]:
    session = make(True)
    recorder = LineInjector()
    if phase == "start":
        with recorder:
            session.start()
        session.stop()
    else:
        session.start()
        training_cell()
        with recorder:
            session.stop()
    return recorder.points


@pytest.mark.parametrize("phase", ["start", "stop"])
def test_a_ctrl_c_at_every_line_of_start_and_stop_leaves_no_hook(session_factory, phase):
    make = session_factory
    before = process_state()
    threads = {t.name for t in threading.enumerate()}
    points = _points(make, phase)
    assert len(points) > 50, f"the {phase} ran only {len(points)} lines of gpunb: the tracer did not see it"
    missed, leaks, fired = [], [], 0
    for k, point in enumerate(points, 1):
        session = make(True)
        injector = LineInjector(at=point)
        raised = None
        if phase == "start":
            try:
                with injector:
                    session.start()
            except KeyboardInterrupt as exc:
                raised = exc
        else:
            session.start()
            training_cell()
            assert session.channel is not None
            channel_dir = Path(session.channel.path)
            try:
                with injector:
                    session.stop()
            except KeyboardInterrupt as exc:
                raised = exc
            if injector.fired and channel_dir.exists():
                leaks.append(f"point {k} ({injector.where}): the rank channel's directory {channel_dir} left")
        if not injector.fired:  # not reached this time (a cache warmed): finish normally
            if phase == "start":
                session.stop()
            continue
        fired += 1
        if raised is None:
            missed.append(injector.where)  # swallowed: the user's Ctrl-C must reach the cell
        after = process_state()
        changed = [key for key in before if after[key] != before[key]]
        if changed:
            leaks.append(f"point {k} ({injector.where}): {', '.join(changed)} left changed")
            ProfileSession.abort(session)  # clean up for the next point
    assert fired > len(points) * 0.9, f"only {fired} of {len(points)} points were reached again"
    assert not leaks, f"{len(leaks)} of {fired} injections left hooks in:\n" + "\n".join(leaks[:20])
    assert not missed, f"a KeyboardInterrupt was swallowed at {missed[:10]}"
    assert not settled_threads(threads), "threads of gpunb's left running"
    # and gpunb still works afterwards
    session = make(False).start()
    training_cell()
    assert session.stop().steps.count == 4


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt), as in a kernel; another test's shell
    may have left a different one."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_real_sigint_during_the_removal_waits_until_every_hook_is_out(monkeypatch, python_sigint):
    before = process_state()
    ins = Instruments(torch)
    ins.install(False)
    fired: list[bool] = []

    def remove_then_sigint(original=ins._unwrap_tensor_syncs):
        signal.raise_signal(signal.SIGINT)  # lands here: held back until remove() is done
        fired.append(True)
        original()

    ins._undo[ins._undo.index(ins._unwrap_tensor_syncs)] = remove_then_sigint
    with pytest.raises(KeyboardInterrupt):
        ins.remove()
    assert fired == [True], "the SIGINT interrupted the removal instead of waiting for its end"
    assert process_state() == before


def test_deferred_sigint_delivers_once_after_the_block(python_sigint):
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred_sigint():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        steps.append("block ran to its end")
    assert steps == ["block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_injected_interrupt_inside_an_undo_runs_it_again_and_the_rest():
    before = process_state()
    ins = Instruments(torch)
    ins.install(False)
    calls = []

    def interrupted_once(original=ins._undo[0]):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # before it did anything
        original()

    ins._undo[0] = interrupted_once
    with pytest.raises(KeyboardInterrupt):
        ins.remove()
    assert len(calls) == 2
    assert process_state() == before


def test_a_ctrl_c_in_the_magics_start_leaves_the_cell_unrun_and_nothing_installed(ip, fake_nvml, monkeypatch):
    ip.run_cell("pass")  # IPython's own first-cell changes (it sets sys.stdout.write) are not gpunb's
    before = process_state()
    real = Instruments.install

    def interrupted(self, cuda):
        real(self, cuda)
        raise KeyboardInterrupt  # after every hook went in, before the session knew it

    monkeypatch.setattr(Instruments, "install", interrupted)
    ip.user_ns.pop("ran", None)
    result = ip.run_cell("%%gpuprofile --no-flops\nran = True")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "ran" not in ip.user_ns
    assert process_state() == before


def test_host_reads_of_another_thread_are_not_the_cells():
    """The cell's own 20 reads are counted, a background thread's hundreds are not, and the
    background thread's reads cannot hide the cell's (the nested-read flag is per thread)."""
    ins = Instruments(torch)
    ins.install(False)
    stop = threading.Event()

    def background():
        t = torch.ones(1)
        while not stop.is_set():
            float(t)

    worker = threading.Thread(target=background)
    try:
        worker.start()
        t = torch.ones(1)
        for _ in range(20):
            float(t)
            time.sleep(0.001)
    finally:
        stop.set()
        worker.join()
        ins.remove()
    assert ins.sync_n == 20
