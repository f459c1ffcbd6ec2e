"""After an OOM in a cell: the traceback is shown, the diagnosis follows, the pinned memory is freed.

The OOM is a real ``torch.OutOfMemoryError`` carrying the message recorded on the H200,
raised on CPU; the object pinned by the failed frame is a plain object watched by a weakref.
"""

from __future__ import annotations

import gc
import sys

import pytest

torch = pytest.importorskip("torch")

from gpunb.testing.fake_nvml import load_trace  # noqa: E402
from tests.oom_cells import failing_oom_cell, oom_cell_definitions  # noqa: E402

MSG = load_trace()["oom_message"]

FAILING_CELL = failing_oom_cell(512, 4096)


@pytest.fixture
def shell(ip):
    ip.reset(new_session=False)  # the shell is a process-wide singleton: start from an empty namespace
    ip.user_ns["_gpunb_test"] = {"msg": MSG}
    kernel = ip._gpunb_extension_state.kernel
    kernel.oom_keep_traceback = None
    yield ip
    kernel.oom_keep_traceback = None
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)


def test_traceback_shown_then_diagnosis_then_memory_released(shell, capsys):
    result = shell.run_cell(FAILING_CELL)
    out = capsys.readouterr().out
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)  # not swallowed, not replaced
    assert not result.success
    assert "Traceback" in out and "train_step" in out and "Tried to allocate 30.00 GiB" in out
    assert out.index("Traceback") < out.index("gpunb OOM doctor")  # the diagnosis comes below
    assert "train_step() local acts" in out  # the failed frame's tensor, named
    gc.collect()
    assert shell.user_ns["_gpunb_test"]["ref"]() is None, "the failed frame's objects must be freed"
    assert not hasattr(sys, "last_value") and shell.InteractiveTB.tb is None  # %debug then says so itself
    d = shell._gpunb_extension_state.kernel.last_oom
    assert d.release is not None and not d.release.kept_traceback
    assert d.census.find("train_step() local acts").nbytes == 4096 * 64 * 4
    smaller = next(f for f in d.fixes if f.title == "Use a smaller batch")
    assert "train_step() bs = 4096 → at most" in smaller.reason  # the batch size, read from the failed frame
    # the released line says how much each holder had: acts (1 MiB) and the payload (1 MiB) in the frames
    assert any(c.startswith("locals of") and c.endswith("traceback frames (2.0 MiB of tensors)")
               for c in d.release.cleared), d.release.cleared
    assert "traceback frames (2.0 MiB of tensors)" in out


def test_keep_traceback_keeps_frames_for_debug_until_release(shell, capsys):
    shell.run_line_magic("gpumem", "--keep-traceback on")
    shell.run_cell(FAILING_CELL)
    out = capsys.readouterr().out
    assert "KEPT for %debug" in out
    gc.collect()
    ref = shell.user_ns["_gpunb_test"]["ref"]
    assert ref() is not None, "frames kept for %debug"
    assert sys.last_traceback is not None  # %debug would open the failing frame
    tb = sys.last_traceback
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert "pinned" in tb.tb_frame.f_locals
    del tb
    shell.run_line_magic("gpumem", "--release")
    gc.collect()
    assert ref() is None
    shell.run_line_magic("gpumem", "--keep-traceback off")
    assert shell._gpunb_extension_state.kernel.oom_keep_traceback is False


def test_keep_traceback_from_environment(shell, monkeypatch, capsys):
    monkeypatch.setenv("GPUNB_KEEP_TRACEBACK", "1")
    shell.run_cell(FAILING_CELL)
    gc.collect()
    assert shell.user_ns["_gpunb_test"]["ref"]() is not None
    shell.run_line_magic("gpumem", "--release")
    gc.collect()
    assert shell.user_ns["_gpunb_test"]["ref"]() is None


def test_other_errors_are_left_alone(shell, capsys):
    shell.run_cell("def f():\n    x = object()\n    raise KeyError('nope')\nf()")
    out = capsys.readouterr().out
    assert "KeyError" in out and "gpunb" not in out
    assert isinstance(sys.last_value, KeyError)  # %debug still works for ordinary errors


def test_wrapped_oom_is_recognised(shell, capsys):
    shell.run_cell("import torch\ntry:\n    raise torch.OutOfMemoryError(_gpunb_test['msg'])\n"
                   "except Exception as e:\n    raise RuntimeError('trainer crashed') from e")
    out = capsys.readouterr().out
    assert "trainer crashed" in out and "gpunb OOM doctor" in out


def test_output_history_holding_tensors_is_dropped_on_oom(shell, capsys):
    shell.run_cell("import torch\ntorch.ones(1000, 1000)", store_history=True)
    n = shell.execution_count - 1
    assert n in shell.user_ns["Out"]
    shell.run_cell(FAILING_CELL, store_history=True)
    out = capsys.readouterr().out
    assert f"Out[{n}] (3.8 MiB of tensors)" in out  # the released line says how much it held
    assert n not in shell.user_ns["Out"]


def test_successful_cells_print_nothing(shell, capsys):
    shell.run_cell("x = 1 + 1")
    assert "gpunb" not in capsys.readouterr().out


def test_release_clears_locals_snapshots_of_function_frames():
    """Python 3.11/3.12 cache f_locals on the frame; frame.clear() alone left objects alive."""
    import weakref

    from gpunb.analysis.memory.release import clear_exception_frames

    class Big:
        pass

    refs = []

    def f():
        b = Big()
        refs.append(weakref.ref(b))
        raise RuntimeError("x")

    try:
        f()
    except RuntimeError as e:
        err = e
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    _ = tb.tb_frame.f_locals  # what traceback formatters and the census do
    del tb, _
    assert clear_exception_frames(err) == 1  # f; this test's own frame is still running
    gc.collect()
    assert refs[0]() is None
    assert "err" in dir()  # the exception itself stays


CAUGHT_CELL = """
import gpunb
try:
    train_step(4096)
except torch.OutOfMemoryError as caught:
    err = caught
diagnosis = gpunb.diagnose_oom(err, release=True)
"""


def test_api_twin_releases_an_error_the_user_caught(shell):
    shell.run_cell(oom_cell_definitions(512))  # define it, don't fail yet
    result = shell.run_cell(CAUGHT_CELL)
    assert result.success
    gc.collect()
    assert shell.user_ns["_gpunb_test"]["ref"]() is None, "the caught error's frames must be released"
    d = shell.user_ns["diagnosis"]
    assert d.release is not None and "train_step() local acts" in str(d)
    assert isinstance(shell.user_ns["err"], torch.OutOfMemoryError)  # the user's exception object stays


def test_api_twin_without_release_frees_nothing(shell):
    shell.run_cell(oom_cell_definitions(512))
    shell.run_cell(CAUGHT_CELL.replace("release=True", "release=False"))
    gc.collect()
    assert shell.user_ns["_gpunb_test"]["ref"]() is not None
    assert shell.user_ns["diagnosis"].release is None
