"""The public API twins (gpunb/shells/api.py) find the shell and hand the analysis layer
what it needs: the in-kernel flag, the notebook's namespace, a progress line; and display
where the magics display. Outside IPython they work as plain Python functions."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import gpunb
from gpunb.analysis.checks import checklist as checks_module
from gpunb.shells import api
from gpunb.shells.session import ProgressLine


def _record_check_calls(monkeypatch):
    calls = []

    def fake_check(*args, **kwargs):
        calls.append(kwargs)
        return "report"

    monkeypatch.setattr(checks_module, "check", fake_check)
    return calls


def test_check_says_in_kernel_inside_ipython_only(monkeypatch, ip):
    calls = _record_check_calls(monkeypatch)
    gpunb.check(quick=True)
    monkeypatch.setattr(api, "current_shell", lambda: None)
    gpunb.check(quick=True)
    gpunb.check(quick=True, in_kernel=True)
    assert [c["in_kernel"] for c in calls] == [True, False, True]


def test_in_a_fresh_process_check_reports_the_kernel_only_inside_ipython():
    # torch not imported: the kernel_cuda check is "ok" in a kernel and skipped elsewhere
    code = textwrap.dedent("""
        import gpunb
        from gpunb.analysis.checks.checklist import check as analysis_check
        print("plain", gpunb.check(quick=True)["kernel_cuda"].status)
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance()
        print("ipython", gpunb.check(quick=True)["kernel_cuda"].status)
        print("analysis", analysis_check(quick=True)["kernel_cuda"].status)  # told nothing: not a kernel
    """)
    out = _run(code)
    assert out.splitlines() == ["plain skip", "ipython ok", "analysis skip"]


def test_memory_names_the_notebooks_variables_without_being_told(ip, fake_nvml):
    pytest.importorskip("torch")
    ip.run_cell("import torch\nnotebook_tensor = torch.ones(8)")
    try:
        report = gpunb.memory()
        assert report.census.find("notebook_tensor").nbytes == 32
        assert gpunb.memory(namespace={}).census.find("notebook_tensor") is None
    finally:
        ip.user_ns.pop("notebook_tensor", None)


def test_diagnose_oom_reads_the_notebook_and_checks_its_input(ip, fake_nvml):
    torch = pytest.importorskip("torch")
    ip.user_ns["held"] = torch.zeros(1024)
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "79.10 GiB of which 1.00 GiB is free.")
    try:
        d = gpunb.diagnose_oom(err)
        assert d.census is not None and d.census.find("held").nbytes == 4096
        assert d.message.requested_bytes == 2 * 2**30
        with pytest.raises(ValueError, match="needs a CUDA out-of-memory error: got KeyError"):
            gpunb.diagnose_oom(KeyError("x"))
    finally:
        ip.user_ns.pop("held", None)


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GPUNB_FAKE_NVML": "no-driver"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_outside_ipython_the_twins_are_plain_functions():
    code = textwrap.dedent("""
        import sys
        import gpunb
        with gpunb.profile(record=False):  # show=None outside IPython: nothing shown
            sum(range(100))
        print("---")
        with gpunb.profile(record=False, show=True):  # asked for: the text view, printed
            pass
        print("---")
        try:
            gpunb.diagnose_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), release=True)
        except RuntimeError as exc:
            print("release:", exc)
        print("IPython imported:", "IPython" in sys.modules)
    """)
    lines = _run(code).splitlines()
    assert lines[0] == "---" and lines[1].startswith("gpuprofile block: no training loop seen")
    assert lines[lines.index("---", 1) + 1].startswith(
        "release: diagnose_oom(release=True) needs an IPython/Jupyter session")
    assert lines[-1] == "IPython imported: False"


def test_profile_displays_itself_at_the_end_of_the_block_in_ipython(ip, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    with gpunb.profile(record=False) as p:
        sum(range(100))
    with gpunb.profile(record=False, show=False):
        pass
    assert shown == [p.result]


def test_the_progress_line_updates_in_place_in_ipython(ip, monkeypatch):
    calls = []

    class Handle:
        def update(self, bundle, raw):
            calls.append(("update", bundle["text/plain"]))

    def display(bundle, raw=False, display_id=False):
        calls.append(("display", bundle["text/plain"]))
        return Handle()

    monkeypatch.setattr("IPython.display.display", display)
    say = ProgressLine("gpunb %gpufit: ")
    assert calls == []  # nothing before the first message
    say("trial 1")
    say("trial 2")
    assert calls == [("display", "gpunb %gpufit: trial 1"), ("update", "gpunb %gpufit: trial 2")]


def test_the_progress_line_prints_outside_ipython(monkeypatch, capsys):
    monkeypatch.setattr("gpunb.shells.session.current_shell", lambda: None)
    say = ProgressLine("gpunb %gpufit: ")
    say("trial 1")
    say("done")
    assert capsys.readouterr().out == "gpunb %gpufit: trial 1\ngpunb %gpufit: done\n"


def test_fit_batch_size_hands_its_progress_to_the_analysis(monkeypatch):
    from gpunb.analysis.fit import search as batch_fit

    seen = []
    monkeypatch.setattr(batch_fit, "fit_batch_size", lambda step, **kw: seen.append(kw["progress"]))
    gpunb.fit_batch_size(lambda b: None)
    gpunb.fit_batch_size(lambda b: None, progress=False)
    gpunb.fit_batch_size(lambda b: None, progress=print)
    assert isinstance(seen[0], ProgressLine) and seen[1] is None and seen[2] is print
