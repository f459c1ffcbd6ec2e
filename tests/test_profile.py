"""%%gpuprofile and gpunb.profile() on real small CPU training loops (torch CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import gpunb  # noqa: E402
from gpunb.analysis.profile.history import Comparison, compare  # noqa: E402
from gpunb.shells.extension import kernel_state  # noqa: E402


class SlowDataset(Dataset):
    """Each sample takes 5 ms to 'decode': the loop must be input-bound."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        time.sleep(0.005)
        return torch.randn(16), torch.randn(1)


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_slow_dataloader_is_input_bound():
    model, opt = _model()
    with gpunb.profile() as p:
        for x, y in DataLoader(SlowDataset(), batch_size=8):
            _step(model, opt, x, y)
    r = p.result
    assert r.steps.count == 6
    assert r.shares.batches == 6
    assert r.steps.batch_size == 8
    assert r.shares.data_wait_s >= 48 * 0.005 * 0.9  # every sleep is inside the DataLoader
    assert r.verdict.kind == "input-bound"
    assert r.advice[0].title.startswith("Load batches in worker processes")
    assert r.steps.samples_per_s and r.steps.samples_per_s < 8 / 0.04 * 1.5  # bounded by the 40 ms per batch
    assert r.gpu is None and "CPU-only build" in r.gpu_absent
    assert r.peak_rss_bytes and r.peak_rss_bytes > 10 * 2**20


def test_fast_loop_on_cpu_is_cpu_only_with_step_times():
    model, opt = _model()
    x, y = torch.randn(512, 16), torch.randn(512, 1)
    with gpunb.profile(warmup_steps=2) as p:
        for _ in range(30):
            _step(model, opt, x, y)
    r = p.result
    assert r.steps.count == 30 and r.steps.skipped == 2
    assert len(r.steps.step_ms) == 30
    assert r.steps.median_ms > 0 and r.steps.p90_ms >= r.steps.median_ms
    assert r.steps.source == "host clock"
    assert r.verdict.kind == "cpu-only"
    assert abs(sum(r.steps.step_ms) / 1000 - (r.step_marks_s[-1])) < 1e-6


def test_item_every_step_is_counted_as_host_reads():
    model, opt = _model()
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    losses = []
    with gpunb.profile() as p:
        for _ in range(25):
            losses.append(_step(model, opt, x, y).item())
        first = losses[0]
        _ = f"{_step(model, opt, x, y):.3f}"  # __format__ calls item(): counted once
    r = p.result
    assert r.shares.sync_by_method["item"] == 25
    assert r.shares.sync_by_method["__format__"] == 1
    assert r.shares.sync_n == 26
    assert r.shares.sync_gpu_n == 0  # CPU tensors: reads, not GPU syncs, so no sync-bound verdict
    assert r.verdict.kind != "sync-bound"
    assert isinstance(first, float)


def test_adam_step_counters_bypass_the_sync_wrappers(monkeypatch):
    """foreach AdamW reads two CPU step counters per parameter per step with .item(); for the
    cell they skip the wrapper (cheaper, and they are not the user's reads)."""
    from gpunb.analysis.steps.instruments import Instruments

    entered = []
    make_wrapper = Instruments._sync_wrapper

    def counting(self, name, original):
        wrapper = make_wrapper(self, name, original)

        def counted(t, *args, **kwargs):
            entered.append(name)
            return wrapper(t, *args, **kwargs)

        return counted

    monkeypatch.setattr(Instruments, "_sync_wrapper", counting)
    adam = sys.modules["torch.optim.adam"]
    get_value = adam._get_value
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(8, 16)
    with gpunb.profile(record=False, show=False) as p:
        for _ in range(3):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()  # 4 parameters: 8 counter reads per step, none through the wrapper
        value = loss.item()  # the user's read: through the wrapper, counted
    assert entered == ["item"] and p.result.shares.sync_n == 1 and isinstance(value, float)
    assert p.result.steps.count == 3
    assert adam._get_value is get_value  # restored after the cell


def test_an_optimizers_own_reads_are_not_counted_as_the_users():
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(64, 16), torch.randn(64, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with gpunb.profile(record=False, show=False) as p:
        for _ in range(3):
            opt.step(closure)  # LBFGS reads the loss and gradient norms itself (float(), bool())
        final = closure().item()  # the user's one read
    assert p.result.steps.count == 3
    assert p.result.shares.sync_n == 1 and p.result.shares.sync_by_method == {"item": 1}
    assert isinstance(final, float)


def test_a_scheduler_reading_the_users_metric_is_counted():
    model, opt = _model()
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with gpunb.profile(record=False, show=False) as p:
        for _ in range(3):
            # float(metric) inside the scheduler reads the user's tensor (detached: torch warns
            # about requires_grad once per process, and another test needs that warning)
            sched.step(_step(model, opt, x, y).detach())
    assert p.result.shares.sync_by_method == {"__float__": 3}


def test_printing_is_timed_as_output(capsys):
    model, opt = _model()
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with gpunb.profile() as p:
        for i in range(10):
            loss = _step(model, opt, x, y)
            print(f"step {i} loss {loss}")  # prints a tensor: a host read plus output
    r = p.result
    assert r.shares.output_writes >= 20  # print() writes the text and the newline
    assert r.shares.output_chars > 10 * len("step 0 loss tensor(")
    assert r.shares.sync_by_method.get("__repr__", 0) + r.shares.sync_by_method.get("__format__", 0) == 10
    assert "step 9 loss" in capsys.readouterr().out  # the user's output is not swallowed


def test_hooks_are_removed_after_the_block_even_when_it_raises():
    from torch.optim import optimizer as optim_module
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    before_next = _BaseDataLoaderIter.__dict__["__next__"]
    hooks_before = len(optim_module._global_optimizer_post_hooks)
    stdout_before = sys.stdout
    write_before = getattr(sys.stdout, "__dict__", {}).get("write")
    model, opt = _model()
    with pytest.raises(RuntimeError, match="boom"), gpunb.profile() as p:
        for i, (x, y) in enumerate(DataLoader(SlowDataset(), batch_size=8)):
            _step(model, opt, x, y)
            if i == 2:
                raise RuntimeError("boom")
    assert p.result.steps.count == 3 and p.result.error == "RuntimeError: boom"
    assert "item" not in torch.Tensor.__dict__ and torch.Tensor.item is torch._C.TensorBase.item
    assert _BaseDataLoaderIter.__dict__["__next__"] is before_next
    assert len(optim_module._global_optimizer_post_hooks) == hooks_before
    assert sys.modules["torch.optim.adam"]._get_value is optim_module._get_value
    assert sys.stdout is stdout_before and getattr(sys.stdout, "__dict__", {}).get("write") is write_before


@pytest.mark.parametrize("fake_nvml", ["h200"], indirect=True)
def test_cpu_build_with_a_visible_gpu_is_on_cpu(fake_nvml):
    model, opt = _model()
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with gpunb.profile() as p:
        for _ in range(5):
            _step(model, opt, x, y)
    r = p.result
    assert r.gpu_visible == "NVIDIA H200"
    assert r.verdict.kind == "on-cpu"
    top = r.advice[0]
    assert top.severity == 2 and "CPU-only build" in top.reason and "Install a CUDA build" in top.title


def test_comparison_words_name_what_they_compare():
    assert Comparison(1.8, "median step", 0.65, "peak VRAM").words() == "median step 1.8x faster, peak VRAM 35% less"
    assert Comparison(0.5, "median step", 1.2, "peak VRAM").words() == "median step 2.0x slower, peak VRAM 20% more"
    assert Comparison(1.01, "wall time", None, "peak RSS").words() == "wall time: same"
    assert Comparison(1.3, "samples/s", 1.0, "peak RSS").words() == "samples/s 1.3x higher, peak RSS: same"
    assert Comparison(0.5, "samples/s", None, "peak RSS").words() == "samples/s 2.0x lower"


def test_history_compares_two_real_runs():
    model, opt = _model()
    small, big = (torch.randn(32, 16), torch.randn(32, 1)), (torch.randn(65536, 16), torch.randn(65536, 1))
    with gpunb.profile(label="big") as slow:
        for _ in range(10):
            _step(model, opt, *big)
    with gpunb.profile(label="small") as fast:
        for _ in range(10):
            _step(model, opt, *small)
    c = compare(slow.result, fast.result)
    assert c.speed_basis == "median step" and c.speedup > 1.5
    assert "faster" in c.words()
    assert kernel_state().profile_history.entries()[-2:] == [slow.result, fast.result]


def test_history_compares_throughput_across_batch_sizes():
    from torch.utils.data import TensorDataset

    model, opt = _model()
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    runs = []
    for batch in (4, 64):
        with gpunb.profile(label=f"batch {batch}") as p:
            for x, y in DataLoader(data, batch_size=batch):
                _step(model, opt, x, y)
        runs.append(p.result)
    small, large = runs
    assert (small.steps.batch_size, large.steps.batch_size) == (4, 64)
    c = compare(small, large)
    # a larger batch takes longer per step, yet trains more samples per second
    assert c.speed_basis == "samples/s" and c.speedup > 1
    assert c.speedup == pytest.approx(large.steps.samples_per_s / small.steps.samples_per_s)


def test_api_arguments_are_checked():
    with pytest.raises(ValueError, match="warmup_steps"):
        gpunb.profile(warmup_steps=-1)
    with pytest.raises(TypeError, match="label"):
        gpunb.profile(label=3)


def test_report_html_escapes_and_to_dict():
    model, opt = _model()
    with gpunb.profile(label="<script>alert(1)</script>") as p:
        for _ in range(3):
            _step(model, opt, torch.randn(8, 16), torch.randn(8, 1))
    bundle = p._repr_mimebundle_()
    assert "<script>" not in bundle["text/html"] and "&lt;script&gt;" in bundle["text/html"]
    html = bundle["text/html"]
    assert "<svg" not in html and html.count('src="data:image/svg+xml;base64,') == 1  # the timeline, as an image
    assert bundle["text/plain"].startswith("gpuprofile block: cpu-only")  # the verdict comes first
    d = p.to_dict()
    assert d["steps"]["count"] == 3 and d["verdict"]["kind"] == "cpu-only"


def test_import_and_load_do_not_import_torch():
    code = ("import sys, gpunb\n"
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'gpunb')\n"
            "gpunb.profile\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "ip.run_cell('%%gpuprofile\\nx = sum(range(1000))')\n"
            "assert 'torch' not in sys.modules\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout and "torch is not imported" in out.stdout


# -- the magics, in-process ---------------------------------------------------------------

SETUP = """
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 24
    def __getitem__(self, i):
        time.sleep(0.005); return torch.randn(16), torch.randn(1)
model = torch.nn.Linear(16, 1); opt = torch.optim.SGD(model.parameters(), lr=0.01)
def step(x, y):
    loss = torch.nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step(); return loss
"""


def test_cell_magic_reports_binds_and_returns_the_value(ip, capsys):
    ip.run_cell(SETUP)
    r = ip.run_cell("%%gpuprofile -o _gpunb_test --label slow\n"
                    "for x, y in DataLoader(Slow(), batch_size=8):\n    step(x, y)\n41 + 1\n")
    assert r.success and r.result == 42
    prof = ip.user_ns["_gpunb_test"]
    assert prof.steps.count == 3 and prof.verdict.kind == "input-bound" and prof.label == "slow"
    out = capsys.readouterr().out
    first = out.strip().splitlines()[0]
    assert re.match(r"gpuprofile In \[\d+\]: input-bound — waiting for data$", first)  # the conclusion first
    assert "3 optimizer steps" in out and "the first ended" in out
    r = ip.run_cell("%%gpuprofile\n42;\n")
    assert r.success and r.result is None


def test_cell_magic_exception_is_shown_as_without_gpunb(ip, capsys):
    ip.run_cell(SETUP)
    r = ip.run_cell("%%gpuprofile -o _gpunb_test\n"
                    "for i, (x, y) in enumerate(DataLoader(Slow(), batch_size=8)):\n"
                    "    step(x, y)\n"
                    "    if i == 1:\n"
                    "        raise KeyError('stop here')\n")
    assert not r.success and isinstance(r.error_in_exec, KeyError)
    assert ip.user_ns["_gpunb_test"].steps.count == 2
    assert ip.user_ns["_gpunb_test"].error == "KeyError: 'stop here'"
    out = capsys.readouterr()
    text = out.out + out.err
    assert "KeyError" in text and "stop here" in text
    assert "profile_magic" not in text and "instruments" not in text  # no gpunb frame in the traceback
    assert "line 5" in text  # line numbers as in the notebook cell
    assert sys.last_value is r.error_in_exec


def test_cell_magic_syntax_error(ip, capsys):
    ip.user_ns.pop("_gpunb_ran", None)
    r = ip.run_cell("%%gpuprofile\n_gpunb_ran = 1\nfor x in\n")
    out = capsys.readouterr()
    assert not r.success and isinstance(r.error_before_exec, SyntaxError)
    assert "SyntaxError" in out.out + out.err and "_gpunb_ran" not in ip.user_ns


@pytest.mark.parametrize("line, message", [
    ("--bogus", "unrecognized arguments: --bogus"),
    ("--steps -2", "--steps: -2 is out of range (allowed: 0 or more)"),
    ("--steps x", "--steps: 'x' is not a whole number"),
    ("-o 1abc", "'1abc' is not a Python variable name"),
    ("", "say what to do"),
    ("sideways", "invalid choice: 'sideways'"),
])
def test_bad_flags_fail_the_cell_with_usage_not_a_traceback(ip, capsys, line, message):
    r = ip.run_cell(f"%gpuprofile {line}")
    out = capsys.readouterr()
    assert isinstance(r.error_in_exec, UsageError) and not r.success
    assert message in str(r.error_in_exec) and "usage: %gpuprofile" in str(r.error_in_exec)
    assert "Traceback" not in out.out + out.err


def test_bad_cell_flags_fail_and_do_not_run_the_cell(ip, capsys):
    ip.user_ns.pop("_gpunb_ran", None)
    r = ip.run_cell("%%gpuprofile --steps -1\n_gpunb_ran = True\n")
    assert "_gpunb_ran" not in ip.user_ns
    assert isinstance(r.error_in_exec, UsageError) and "--steps: -1 is out of range" in str(r.error_in_exec)
    r = ip.run_cell("%%gpuprofile on\n_gpunb_ran = True\n")
    assert "_gpunb_ran" not in ip.user_ns
    assert isinstance(r.error_in_exec, UsageError) and "for the line magic" in str(r.error_in_exec)


def test_one_line_mode_and_history(ip, capsys):
    ip.run_cell("%gpuprofile history --clear")
    ip.run_cell("%gpuprofile on")
    r = ip.run_cell("sum(range(100000))", store_history=True)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("gpuprofile In ["))
    assert line.startswith(f"gpuprofile In [{r.execution_count}]: ") and "peak RSS" in line
    assert "⏱" not in out  # a missing glyph in Debian's fonts
    ip.run_cell("%%gpuprofile\nsum(range(10))\n")
    out = capsys.readouterr().out
    assert out.count("gpuprofile In [") == 1  # the full report replaces the one-liner
    ip.run_cell("%gpuprofile off")
    capsys.readouterr()
    ip.run_cell("1 + 1")
    assert "gpuprofile" not in capsys.readouterr().out
    ip.run_cell("%%gpuprofile --label second\nsum(range(10))\n")
    ip.run_cell("%gpuprofile history -o _gpunb_test")
    out = capsys.readouterr().out
    # the one-line cell is in the history too, before the two profiled ones
    assert [e.label for e in ip.user_ns["_gpunb_test"].entries] == ["sum(range(100000))", "sum(range(10))", "second"]
    assert "one-line" in out and "median step" in out and "second" in out
    # only runs of the same cell are compared: #2 and #3 have the same code, #1 is another cell
    assert "vs #1" not in out and ("vs #2: median step" in out or "vs #2: wall time" in out)
    history = out[out.index("gpuprofile history: "):]
    assert history.startswith("gpuprofile history: 3 cells; the last against its earlier run #2: ")
    ip.run_cell("%gpuprofile history --clear")
    assert len(kernel_state(ip).profile_history) == 0


def test_unload_turns_one_line_mode_off(ip, capsys):
    ip.run_cell("%gpuprofile on")
    ip.run_line_magic("unload_ext", "gpunb")
    capsys.readouterr()
    ip.run_cell("1 + 1")
    assert "gpuprofile" not in capsys.readouterr().out
    ip.run_line_magic("load_ext", "gpunb")


def test_adam_internal_item_calls_are_not_counted_as_user_syncs():
    model, _ = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)  # calls .item() per parameter inside step()
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with gpunb.profile() as p:
        for _ in range(4):
            _step(model, opt, x, y)
        user = torch.tensor(1.0).item()
    assert p.result.shares.sync_by_method == {"item": 1} and user == 1.0
    assert p.result.steps.count == 4


def test_magic_help_is_the_docstring(ip, capsys):
    ip.run_cell("%gpuprofile?")
    out = capsys.readouterr().out
    assert "--no-reset" in out and "warm-up" in out and "gpunb.profile()" in out


def test_in_a_real_kernel_the_failed_cell_fails_and_output_is_kept():
    """Through ipykernel: the cell's stream output, the report, the error output without
    gpunb frames, and an error status (nbclient stops) as without gpunb."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext gpunb",
        "%%gpuprofile\nprint('before the error')\nraise ValueError('from the user')",
        "print('must not run')",
    )]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="from the user"):
        client.execute()
    outputs = nb.cells[1].outputs
    kinds = [o.output_type for o in outputs]
    # the report first: its place was kept when the cell started, then filled in (one output)
    assert kinds == ["display_data", "stream", "error"]
    assert outputs[1].text == "before the error\n"
    assert "the cell raised ValueError: from the user" in outputs[0].data["text/plain"]
    assert "running since" not in outputs[0].data["text/plain"]
    tb = "".join(outputs[2].traceback)
    assert "gpunb" not in tb and "line 3" in tb
    assert nb.cells[2].outputs == []


def test_nested_profiles_restore_each_other(capsys):
    write_before = getattr(sys.stdout, "__dict__", {}).get("write")
    model, opt = _model()
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with gpunb.profile(record=False, show=False) as outer:
        with gpunb.profile(record=False, show=False) as inner:
            _step(model, opt, x, y)
            print("inner")
        _step(model, opt, x, y)
        print("outer")
        torch.tensor(2.0).item()
    assert inner.result.steps.count == 1 and outer.result.steps.count == 2
    assert outer.result.shares.output_writes == 4 and inner.result.shares.output_writes == 2
    assert outer.result.shares.sync_by_method == {"item": 1}
    assert "item" not in torch.Tensor.__dict__ and getattr(sys.stdout, "__dict__", {}).get("write") is write_before


def test_torch_warnings_still_point_at_the_users_line():
    loss = (torch.randn(3, requires_grad=True) * 2).sum()
    with pytest.warns(UserWarning, match="requires_grad=True to a scalar") as record, gpunb.profile(record=False) as p:
        value = float(loss)  # torch warns from C++ at the calling Python line
    assert record[0].filename == __file__ and isinstance(value, float)
    assert p.result.shares.sync_by_method == {"__float__": 1}


def test_overhead_benchmark_runs_on_cpu(tmp_path):
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_overhead.py"
    out = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--device", "cpu", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "profile_overhead.json").read_text())
    assert [r["loop"] for r in data["results"]] == ["launch-bound", "compute-bound"]
    for r in data["results"]:
        assert set(r["median_ms"]) == {"none", "gpuprofile", "one-line", "torch.profiler"}
        assert all(v > 0 for v in r["median_ms"].values())
    assert "overhead" in out.stdout


def test_in_a_real_kernel_the_report_stays_above_what_the_cell_prints():
    """The verdict's place is kept when the cell starts (a display_id), filled at the end: a cell
    that prints every step does not push it down. The one-line mode does the same."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext gpunb",
        "%%gpuprofile\nfor i in range(200):\n    print('step', i)",
        "%gpuprofile on",
        "print('a line of my own')",
        "%gpuprofile off",
    )]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    profiled = nb.cells[1].outputs
    assert profiled[0].output_type == "display_data" and profiled[0].data["text/plain"].startswith("gpuprofile In [")
    assert "running since" not in profiled[0].data["text/plain"]
    assert [o.output_type for o in profiled[1:]] == ["stream"] * (len(profiled) - 1)
    assert "step 199" in "".join(o.text for o in profiled[1:])
    one_line = nb.cells[3].outputs
    assert one_line[0].output_type == "display_data" and one_line[0].data["text/plain"].startswith("gpuprofile")
    assert one_line[1].text == "a line of my own\n"


def test_history_compares_a_cell_only_with_an_earlier_run_of_the_same_cell(ip, capsys):
    """A one-line evaluation after a training cell is another cell: no "290.4x faster"."""
    ip.run_cell("%gpuprofile history --clear")
    ip.run_cell("%%gpuprofile --label train\n_gpunb_t = sum(range(300000))\n")
    ip.run_cell("%%gpuprofile\n_gpunb_e = 1 + 1\n")  # another cell: nothing to compare with
    ip.run_cell("%gpuprofile history -o _gpunb_test")
    out = capsys.readouterr().out
    history = out[out.index("gpuprofile history: "):]
    assert "vs #" not in history and "faster" not in history and "slower" not in history
    assert "no earlier run to compare with" in history.splitlines()[0]
    assert ip.user_ns["_gpunb_test"].baselines == (None, None)
    # the same label with changed code is a run of the same cell; so is the same code again
    ip.run_cell("%%gpuprofile --label train\n_gpunb_t = sum(range(30000))\n")
    ip.run_cell("%%gpuprofile\n_gpunb_e = 1 + 1  \n\n")
    ip.run_cell("%gpuprofile history -o _gpunb_test")
    out = capsys.readouterr().out
    assert ip.user_ns["_gpunb_test"].baselines == (None, None, 0, 1)
    assert "vs #1: " in out and "vs #2: " in out and "its earlier run #2" in out
    ip.run_cell("%gpuprofile history --clear")
