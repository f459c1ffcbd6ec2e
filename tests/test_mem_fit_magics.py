"""%gpumem and %gpufit flags in an in-process IPython shell; the API twins; cheap import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")


@pytest.fixture
def ip(ip):
    ip.reset(new_session=False)  # the shell is a process-wide singleton: start from an empty namespace
    return ip


def test_gpumem_names_tensors_and_binds_result(ip, capsys):
    ip.run_cell("import torch\nnet = torch.nn.Linear(128, 64)\nbatch = {'x': torch.zeros(256, 128)}")
    ip.run_line_magic("gpumem", "--top 5 -o mem")
    out = capsys.readouterr().out
    assert "batch['x']" in out and "net.weight" in out
    mem = ip.user_ns["mem"]
    d = mem.to_dict()
    names = [e["name"] for e in d["census"]["entries"]]
    assert names[0] == "batch['x']" and d["census"]["by_role"]["parameter"] == (128 * 64 + 64) * 4
    html = mem._repr_mimebundle_()["text/html"]
    assert "batch[&#x27;x&#x27;]" in html
    first = out.splitlines()[0]
    assert first.startswith("gpunb memory: ") and "160.2 KiB in 3 live tensors" in first  # the conclusion first


def test_gpumem_sums_up_small_tensors_after_naming_the_largest():
    import torch

    import gpunb

    namespace = {"big": torch.zeros(256, 1024)} | {f"tiny{i}": torch.zeros(16) for i in range(10)}
    text = str(gpunb.memory(namespace=namespace, all_devices=True))
    listed = [line.split()[2] for line in text.splitlines() if line.startswith("  ") and "float32" in line]
    assert listed[0] == "big" and len(listed) == 5  # the largest, and at least five names
    assert "… 6 more tensors (each 64 B or less): 384 B in all" in text


def test_gpumem_shows_only_columns_with_values_and_says_why_once(ip, fake_nvml, capsys):
    ip.run_line_magic("gpumem", "-o mem")
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if x.startswith("GPU "))
    assert "torch" not in header and "context" not in header and "total" in header  # no column of n/a
    assert "n/a" not in out and out.count("torch holds no CUDA memory in this kernel") == 1


def test_memory_bar_parts_add_up_to_the_gpu():
    from gpunb.analysis.memory.records import GpuMemoryRow
    from gpunb.views.memory_view import memory_bar_html, memory_parts
    from tests.chart_html import images

    GiB = 2**30
    row = GpuMemoryRow(0, "NVIDIA H200", 140 * GiB, 60 * GiB, 30 * GiB, 20 * GiB, 28 * GiB, 25 * GiB)
    parts = memory_parts(row)
    assert [(w, n // GiB) for w, n, _ in parts] == [
        ("torch allocated", 20), ("reserved, not allocated", 8), ("CUDA context and other libraries", 2),
        ("other processes", 25), ("used, not attributed", 5), ("free", 80)]
    assert sum(n for _, n, _ in parts) == row.total_bytes
    [bar] = images(memory_bar_html(row), "gpunb-chart")
    assert "torch allocated 20.00 GiB" in bar["alt"] and "free 80.00 GiB" in bar["alt"]


def test_gpumem_free_deletes_and_reports(ip, capsys):
    ip.run_cell("import torch\nbig = torch.zeros(1024, 1024)\nsmall = torch.zeros(4)")
    ip.run_line_magic("gpumem", "--free big nosuchvar")
    out = capsys.readouterr().out
    assert "big" not in ip.user_ns and "small" in ip.user_ns
    assert "freed big: 4.0 MiB of tensors" in out and "not defined: nosuchvar" in out


def test_gpumem_bad_flags_show_usage(ip):
    with pytest.raises(UsageError, match=r"usage: %gpumem|%gpumem \["):
        ip.run_line_magic("gpumem", "--bogus")
    with pytest.raises(UsageError, match="variable name"):
        ip.run_line_magic("gpumem", "-o 1x")
    with pytest.raises(UsageError):
        ip.run_line_magic("gpumem", "--keep-traceback maybe")
    with pytest.raises(UsageError, match=r"--top: 0 is out of range \(allowed: 1 or more\)"):
        ip.run_line_magic("gpumem", "--top 0")


def test_help_is_the_docstring(ip):
    for name in ("gpumem", "gpufit"):
        fn = ip.find_line_magic(name)
        assert fn is not None and "Example" in fn.__doc__ and "--" in fn.parser.format_help()


def test_gpufit_on_cpu_says_plainly_it_needs_cuda(ip, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    ip.run_cell("def step(bs):\n    pass")
    ip.run_line_magic("gpufit", "step -o fit")
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "Traceback" not in out
    assert ip.user_ns["fit"].ok is False


def test_gpufit_argument_errors(ip):
    with pytest.raises(UsageError, match="not defined"):
        ip.run_line_magic("gpufit", "no_such_step")
    ip.user_ns["notfn"] = 3
    with pytest.raises(UsageError, match="not a function"):
        ip.run_line_magic("gpufit", "notfn")
    with pytest.raises(UsageError):
        ip.run_line_magic("gpufit", "")
    with pytest.raises(UsageError):
        ip.run_line_magic("gpufit", "step --start many")


def test_memory_api_twin(ip):
    import gpunb

    ip.run_cell("import torch\nw = torch.ones(10)")
    report = gpunb.memory(shell=ip)
    assert report.census.find("w").nbytes == 40
    with pytest.raises(ValueError, match="top"):
        gpunb.memory(top=0, shell=ip)


def test_public_names():
    import gpunb

    for name in ("memory", "diagnose_oom", "fit_batch_size"):
        assert name in gpunb.__all__ and callable(getattr(gpunb, name))


def test_loading_the_extension_imports_no_torch_or_matplotlib():
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpunb')\n"
        "ip.run_cell('x = 1')\n"
        "ip.run_cell('raise RuntimeError(\"CUDA out of memory. Tried to allocate 2.00 GiB\")')\n"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "clean" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("fake_nvml", ["second-gpu-lost"], indirect=True)
def test_gpumem_names_a_lost_gpu(fake_nvml):
    import gpunb

    report = gpunb.memory(namespace={})
    text = report._repr_mimebundle_()["text/plain"]
    assert "GPU 1 has fallen off the bus" in text and "GPU 0 has fallen off" not in text


def test_keep_traceback_alone_changes_the_setting_with_another_option_also_reports(ip, capsys):
    kernel = ip._gpunb_extension_state.kernel
    ip.run_line_magic("gpumem", "--keep-traceback off")
    out = capsys.readouterr().out
    assert kernel.oom_keep_traceback is False and "frames are released" in out and "gpunb memory" not in out
    ip.run_line_magic("gpumem", "--keep-traceback on --top 3 -o mem")
    assert kernel.oom_keep_traceback is True and ip.user_ns["mem"].to_dict()["census"] is not None
    kernel.oom_keep_traceback = None


def test_gpumem_headline_says_how_full_and_what_fills_it_once():
    """The finding first ("GPU 0: … of … used … most of it optimizer state"); empty GPUs said in
    one line; the per-GPU table one click away; holders in plain words (no "namespace")."""
    import torch

    import gpunb
    from gpunb.analysis.memory.records import GpuMemoryRow
    from gpunb.views.memory_view import memory_headline, memory_html

    GiB = 2**30
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.Adam(model.parameters())
    model(torch.zeros(2, 256)).sum().backward()
    opt.step()
    opt.state[model.weight]["extra"] = torch.zeros(4, 256, 256)  # optimizer state is the largest part
    base = gpunb.memory(namespace={"model": model, "opt": opt}, all_devices=True)
    rows = [GpuMemoryRow(0, "NVIDIA H200", 140 * GiB, 31 * GiB, 31 * GiB, 28 * GiB, 30 * GiB, 0)]
    rows += [GpuMemoryRow(i, "NVIDIA H200", 140 * GiB, 0, None, None, None, 0) for i in range(1, 8)]
    report = type(base)(tuple(rows), base.census, devices_shown="all")
    first = memory_headline(report)
    assert first.startswith("gpunb memory: GPU 0: 31.00 GiB of 140.00 GiB used; 7 GPUs empty")
    assert first.endswith("most of it optimizer state")
    html = memory_html(report)
    assert html.count("gpunb-chart") == 1  # a bar for the GPU in use, one line for the 7 empty ones
    assert "GPU 1, GPU 2, GPU 3, GPU 4, GPU 5, GPU 6, GPU 7: empty, 140.00 GiB each" in html
    assert html.index("<details") < html.index("used (NVML)")  # the table is behind a click
    assert "namespace" not in html and "namespace" not in str(report)


def test_gpumem_says_identical_gpus_once():
    from gpunb.analysis.memory.records import GpuMemoryRow, MemoryReport
    from gpunb.views.memory_view import memory_headline, memory_html

    GiB = 2**30
    rows = tuple(GpuMemoryRow(i, "NVIDIA H200", 140 * GiB, 9 * GiB, None, None, None, 9 * GiB) for i in range(8))
    report = MemoryReport(rows, None)
    assert memory_headline(report) == ("gpunb memory: all 8 GPUs: 9.00 GiB of 140.00 GiB used, 9.00 GiB by other "
                                       "processes · no CUDA tensors")
    html = memory_html(report)
    assert html.count("gpunb-chart") == 1 and "GPU 0, 1, 2, 3, 4, 5, 6, 7, each" in html
