"""The extension's promises: a cheap load with no torch, symmetric unload, a pinned API."""

import subprocess
import sys
import textwrap

import gpunb

# The public surface, written out: adding, renaming or dropping a name must change this list.
PUBLIC_API = [
    "__version__",
    "check",
    "diagnose_oom",
    "energy",
    "fit_batch_size",
    "load_ipython_extension",
    "memory",
    "monitor",
    "plan",
    "profile",
    "trace_memory",
    "unload_ipython_extension",
]


def test_public_api_is_pinned():
    assert sorted(gpunb.__all__) == PUBLIC_API
    assert sorted(dir(gpunb)) == PUBLIC_API
    for name in PUBLIC_API:
        value = getattr(gpunb, name)
        assert isinstance(value, str) if name == "__version__" else callable(value), name


# Parameters (name=default, * before keyword-only ones) of each API twin, as users call them.
PUBLIC_SIGNATURES = {
    "check": "(quick=False, device=None, *, deep=False, environ=None, nvml=None, progress=None, in_kernel=None, "
             "probe_timeout_s=180.0, require_gpu=False)",
    "profile": "(label='', *, warmup_steps=1, reset_peak=True, timeline=True, show=None, record=True, flops=True, "
               "ops=False, trace_dir=None, ranks=True, energy=True, tokens_per_sample=None, leak=True, "
               "namespace=None)",
    "memory": "(*, free=(), top=20, all_devices=False, namespace=None, shell=None, nvml=None)",
    "diagnose_oom": "(exc=None, *, release=False, namespace=None, nvml=None)",
    "fit_batch_size": "(step_fn, *, start=2, max_batch=None, margin=0.0, device=None, steps=50, tolerance=0.05, "
                      "max_trials=6, progress=True, plan=True)",
    "energy": "(*, price=None, carbon=None, forget=False, state=None)",
    "monitor": "(hz=None, window_s=120.0, device=None, *, frontend='auto')",  # None: the rate already running
    "trace_memory": "(label='', *, save=None, max_entries=None, show=None, namespace=None)",
    "plan": "(step_fn, batch_size, gpus=None, *, model=None, optimizer=None)",
}


def test_public_signatures_are_pinned():
    import inspect

    for name, expected in PUBLIC_SIGNATURES.items():
        sig = inspect.signature(getattr(gpunb, name))
        plain = sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
                            return_annotation=inspect.Signature.empty)
        assert str(plain) == expected, name


def test_the_api_twins_live_in_the_shells_layer():
    """They find the shell and display; the analysis layer below them only measures."""
    for name in ("check", "profile", "memory", "diagnose_oom", "fit_batch_size", "monitor", "energy",
                 "trace_memory", "plan"):
        assert getattr(gpunb, name).__module__.startswith("gpunb.shells."), name


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


def test_kernel_state_is_one_typed_object_owned_by_the_extension(ip):
    import dataclasses

    from gpunb.shells.extension import kernel_state, state_of
    from gpunb.shells.kernel_state import STANDALONE_STATE, KernelState

    extension = state_of(ip)
    assert isinstance(extension.kernel, KernelState) and kernel_state(ip) is extension.kernel
    assert extension.kernel is not STANDALONE_STATE and not hasattr(extension, "shared")
    fields = {f.name: f.type for f in dataclasses.fields(KernelState)}
    assert {"sampler", "monitors", "profile_history", "one_line_meter", "oom_keep_traceback", "last_oom",
            "names_before_cell", "extra_oom_types"} <= set(fields)
    assert all(t not in ("Any", "dict[str, Any]") for t in fields.values())  # named and typed, not a bag
    import gpunb.analysis.profile.history as history_module
    import gpunb.shells.monitor as monitor_module

    assert not hasattr(history_module, "HISTORY") and not hasattr(monitor_module, "_STANDALONE")


def test_unload_empties_the_kernel_state_and_stops_its_thread(ip, fake_nvml):
    import threading

    from gpunb.analysis.monitor.sampler import THREAD_NAME
    from gpunb.shells.extension import state_of

    kernel = state_of(ip).kernel
    for line in ("%gpumonitor", "%gpuprofile on", "%gpumem --keep-traceback on"):
        assert ip.run_cell(line).success
    assert kernel.sampler is not None and kernel.monitors and kernel.one_line_meter is not None
    ip.run_line_magic("unload_ext", "gpunb")
    assert kernel.sampler is None and kernel.monitors == [] and kernel.one_line_meter is None
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    ip.run_line_magic("load_ext", "gpunb")
    fresh = state_of(ip).kernel
    assert fresh is not kernel and fresh.oom_keep_traceback is None and fresh.one_line_meter is None


def test_profiled_cells_stay_with_the_kernel_across_unload_and_reload(ip):
    from gpunb.shells.extension import kernel_state
    from gpunb.shells.kernel_state import STANDALONE_STATE

    def labels(state):
        return [p.label for p in state.profile_history]

    ip.run_line_magic("gpuprofile", "history --clear")
    STANDALONE_STATE.profile_history.clear()
    assert ip.run_cell("%%gpuprofile --label loaded\n_gpunb_x = 1").success
    assert labels(kernel_state(ip)) == ["loaded"]
    ip.run_line_magic("unload_ext", "gpunb")
    assert kernel_state(ip) is STANDALONE_STATE and labels(STANDALONE_STATE) == ["loaded"]
    with gpunb.profile(label="plain python", show=False):  # the API twin without the extension
        pass
    ip.run_line_magic("load_ext", "gpunb")
    assert labels(kernel_state(ip)) == ["loaded", "plain python"] and labels(STANDALONE_STATE) == []
    with gpunb.profile(label="twin", show=False):  # with it: into the extension's history
        pass
    assert labels(kernel_state(ip))[-1] == "twin" and labels(STANDALONE_STATE) == []
