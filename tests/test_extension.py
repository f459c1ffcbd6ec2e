"""The extension's promises: a cheap load with no torch, symmetric unload, a pinned API."""

import subprocess
import sys
import textwrap

import gpunb


def test_public_api_is_pinned():
    assert sorted(gpunb.__all__) == sorted([
        "__version__", "load_ipython_extension", "unload_ipython_extension", *gpunb._LAZY])
    assert {"check"} <= set(gpunb._LAZY)
    for name in gpunb._LAZY:
        assert callable(getattr(gpunb, name)), name


def test_load_imports_no_torch_and_creates_no_cuda_context():
    code = textwrap.dedent("""
        import sys
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpunb")
        heavy = [m for m in ("torch", "matplotlib", "pynvml") if m in sys.modules]
        print(",".join(heavy) or "none")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "none"


def test_reload_leaves_one_registration(ip):
    before = {name: len(cbs) for name, cbs in ip.events.callbacks.items()}
    for _ in range(3):
        ip.run_line_magic("reload_ext", "gpunb")
    after = {name: len(cbs) for name, cbs in ip.events.callbacks.items()}
    assert after == before


def test_unload_removes_every_event_and_magic(ip):
    baseline_magics = set(ip.magics_manager.magics["line"])
    ip.run_line_magic("unload_ext", "gpunb")
    gone = baseline_magics - set(ip.magics_manager.magics["line"])
    assert "gpucheck" in gone
    from gpunb.shells.extension import state_of

    assert state_of(ip) is None
    assert not any(getattr(cb, "__module__", "").startswith("gpunb")
                   for cbs in ip.events.callbacks.values() for cb in cbs)
    ip.run_line_magic("load_ext", "gpunb")
