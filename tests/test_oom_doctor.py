"""The OOM doctor's reading of real messages and allocator stats (recorded on the H200)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.memory import oom as oom_mod  # noqa: E402
from gpunb.analysis.memory.census import EXCEPTION as EXCEPTION_SRC  # noqa: E402
from gpunb.analysis.memory.census import take_census  # noqa: E402
from gpunb.analysis.memory.oom import (  # noqa: E402
    FRAGMENTATION,
    LEFTOVERS,
    OTHER_PROCESSES,
    TOO_LARGE_FOR_GPU,
    WORKING_SET,
    OtherProcess,
    diagnose,
)
from gpunb.analysis.memory.oom_message import find_oom, parse_oom_message, size_to_bytes  # noqa: E402
from gpunb.readings.devices import OWN_BY_RESERVE, OWN_PID, attribute_processes, read_ownership  # noqa: E402
from gpunb.readings.gpu import read_processes  # noqa: E402
from gpunb.readings.nvml import NvmlSession  # noqa: E402
from gpunb.readings.torch_state import allocator_from_stats  # noqa: E402
from gpunb.testing import scenario  # noqa: E402
from gpunb.testing.fake_nvml import load_trace  # noqa: E402

GiB = 2**30
TRACE = load_trace()
REAL = TRACE["oom_message"]


def test_real_h200_message_is_parsed_to_the_byte():
    m = parse_oom_message(REAL)
    assert m.kind == "cuda" and m.device == 0
    assert m.requested_bytes == 30 * GiB
    assert m.total_bytes == size_to_bytes("139.80", "GiB")
    assert m.free_bytes == size_to_bytes("12.88", "GiB")
    assert m.process_bytes == size_to_bytes("126.92", "GiB")
    assert m.allocated_bytes == size_to_bytes("126.19", "GiB")
    assert m.reserved_unallocated_bytes == size_to_bytes("2.23", "MiB")
    # context + non-torch = process - (allocated + unallocated reserve): ~0.73 GiB on the H200
    assert 0.6 * GiB < m.non_torch_bytes < 0.8 * GiB
    # the message's total agrees with NVML's total minus the driver's reservation (same machine)
    nvml_total = TRACE["facts"]["memory_total"] - TRACE["facts"]["memory_reserved"]
    assert abs(m.total_bytes - nvml_total) < 0.01 * nvml_total


def test_old_message_and_other_processes_are_parsed():
    old = ("CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
           "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)")
    m = parse_oom_message(old)
    assert m.requested_bytes == 36 * 2**20 and m.reserved_bytes == 188 * 2**20
    assert m.allocated_bytes == size_to_bytes("130.35", "MiB") and m.free_bytes == size_to_bytes("47.06", "MiB")
    shared = ("CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a total capacity of 93.02 GiB of which "
              "1.18 GiB is free. Process 2752205 has 91.82 GiB memory in use. Of the allocated memory 90.63 GiB is "
              "allocated by PyTorch, and 120.54 MiB is reserved by PyTorch but unallocated.")
    m = parse_oom_message(shared)
    assert m.device == 1 and m.other_processes == ((2752205, size_to_bytes("91.82", "GiB")),)


def test_recognises_wrapped_and_library_errors_but_not_host_ram():
    real = torch.OutOfMemoryError(REAL)
    assert find_oom(real) is real
    try:
        try:
            raise real
        except Exception as inner:
            raise ValueError("trainer failed") from inner
    except ValueError as outer:
        assert find_oom(outer) is real
    try:  # implicit chaining (__context__)
        try:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
        except RuntimeError:
            raise KeyError("x")  # noqa: B904
    except KeyError as ctx:
        assert find_oom(ctx) is not None and parse_oom_message(str(find_oom(ctx))).kind == "cudnn"
    assert find_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")) is not None
    assert find_oom(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")) is not None
    cpu_oom = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
    assert find_oom(RuntimeError(cpu_oom)) is None
    assert find_oom(RuntimeError("shape mismatch")) is None
    assert find_oom(None) is None


def test_diagnosis_of_the_recorded_oom_uses_allocator_stats():
    stats = dict(TRACE["memory_stats_after_train"])
    stats.update(TRACE["oom_stats"])
    mem = allocator_from_stats(0, stats, total_bytes=TRACE["facts"]["memory_total"])
    assert mem.ooms == 1 and mem.reserved_bytes == TRACE["oom_stats"]["reserved_bytes.all.current"]
    d = diagnose(torch.OutOfMemoryError(REAL), torch_memory=mem)
    assert d.primary_cause == WORKING_SET
    assert {c.code for c in d.causes} == {WORKING_SET}  # 2 MiB unallocated: not fragmentation
    titles = [f.title for f in d.fixes]
    assert titles[0] == "Use a smaller batch"  # the fix that surely ends this failure comes first
    # 30 GiB asked with 12.88 free: 17.12 GiB missing of ~156 GiB needed
    small = d.fixes[0]
    assert small.gain == pytest.approx((30 - 12.88) / (126.19 + 30), rel=0.01)
    assert "Train in bf16 autocast" in titles and "Use activation checkpointing" in titles
    text = d._repr_mimebundle_()["text/plain"]
    assert "asked 30.00 GiB" in text and "free 12.88 GiB" in text and "Why: the cell's own working set" in text
    assert "[working-set]" not in text  # the cause's code is the program's, not the reader's
    assert d.to_dict()["message"]["requested_bytes"] == 30 * GiB


def _msg(requested, free, total, allocated, unalloc, process=None):
    process = process if process is not None else allocated + unalloc + GiB // 2
    def f(n):  # torch's c10 format_size
        return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.2f} MiB"
    return (f"CUDA out of memory. Tried to allocate {f(requested)}. GPU 0 has a total capacity of {f(total)} of "
            f"which {f(free)} is free. Including non-PyTorch memory, this process has {f(process)} memory in use. "
            f"Of the allocated memory {f(allocated)} is allocated by PyTorch, and {f(unalloc)} is reserved by "
            "PyTorch but unallocated.")


def test_fragmentation_is_named_and_expandable_segments_offered():
    d = diagnose(message=_msg(4 * GiB, 1 * GiB, 40 * GiB, 20 * GiB, 10 * GiB), allocator_conf="")
    assert FRAGMENTATION in {c.code for c in d.causes}
    fix = next(f for f in d.fixes if "expandable" in f.title)
    assert fix.severity == 2 and "expandable_segments:True" in fix.how
    # already on: not offered again
    d2 = diagnose(message=_msg(4 * GiB, 1 * GiB, 40 * GiB, 20 * GiB, 1 * GiB),
                  allocator_conf="expandable_segments:True")
    assert not any("expandable" in f.title for f in d2.fixes)


def test_a_request_larger_than_the_gpu_cannot_be_fixed_by_freeing():
    d = diagnose(message=_msg(200 * GiB, 138 * GiB, 139.8 * GiB, 1 * GiB, 0))
    assert d.primary_cause == TOO_LARGE_FOR_GPU
    assert d.fixes[0].severity == 2 and "chunk" in d.fixes[0].how


def test_other_processes_from_fake_nvml_busy_scenario():
    nvml = NvmlSession(scenario("busy", clock=lambda: 200.0))  # in the recorded "train" phase
    own = read_ownership(nvml, 0, pids=[TRACE["pid"]])  # be the recorded training process
    assert own.how == OWN_PID and own.self_bytes > 0  # the recorded kernel's own memory
    others = tuple(OtherProcess(p.pid, p.used_bytes, p.name) for p in own.others)
    assert [(p.pid, p.used_bytes, p.name) for p in others] == [(999_001, 40 * GiB, "python3")]
    d = diagnose(message=_msg(30 * GiB, 12 * GiB, 139.8 * GiB, 80 * GiB, 0), other_processes=others)
    assert d.primary_cause == OTHER_PROCESSES
    assert "999001" in d.fixes[0].reason


def test_other_processes_are_named_by_notebook_when_the_jupyter_server_says():
    import time

    from gpunb.readings import server_sessions as ss
    from gpunb.views.oom_view import diagnosis_text

    now = time.time()
    row = {"gpu_index": 0, "pid": 999_001, "used_bytes": 40 * GiB, "kind": "kernel", "kernel_id": "k1",
           "path": "lesson3.ipynb", "execution_state": "idle", "last_activity_unix": now - 40 * 60}
    answer = {"t_unix": now, "gpus": [{"index": 0, "processes": [row]}], "kernels": [], "notes": []}
    link = ss.ServerLink("http://127.0.0.1:1/", "t", None, "k2", "parent process")
    ss.set_default_sessions(ss.ServerSessions(find=lambda: link, fetch=lambda *args: answer))
    try:
        others = oom_mod.name_holders((oom_mod.OtherProcess(999_001, 40 * GiB, "python3"),
                                       oom_mod.OtherProcess(31_337, GiB, "python3")))
    finally:
        ss.set_default_sessions(None)
    assert [p.holder for p in others] == ["lesson3.ipynb (idle 40 min)", ""]
    d = diagnose(message=_msg(30 * GiB, 12 * GiB, 139.8 * GiB, 80 * GiB, 0), other_processes=others)
    assert d.primary_cause == OTHER_PROCESSES
    assert "lesson3.ipynb (idle 40 min): 40.00 GiB, PID 31337 (python3): 1.00 GiB" in d.causes[0].summary
    assert "held by lesson3.ipynb (idle 40 min), 31337" in d.fixes[0].reason
    assert "PID 999001 python3 = lesson3.ipynb (idle 40 min): 40.00 GiB" in diagnosis_text(d)
    assert oom_mod.name_holders(()) == ()  # nothing to name: the server is not asked


def _as_if_on_gpu(census):
    """The census of CPU tensors, relabelled as on cuda:0 (only GPU tensors count toward savings)."""
    from dataclasses import replace

    from gpunb.analysis.memory.census import Census

    return Census(tuple(replace(e, device="cuda:0") for e in census.entries))


def test_leftovers_from_earlier_cells_are_named_with_their_variable():
    ns = {"model": torch.nn.Linear(256, 256), "junk": torch.zeros(1024, 1024)}
    census = oom_mod.relabel_earlier(take_census(ns, torch=torch), {"junk": id(ns["junk"])}, ns)
    entry = census.find("junk")
    assert entry.source == oom_mod.EARLIER_CELLS
    census = _as_if_on_gpu(census)
    # message scaled to the CPU tensors' sizes: junk (4 MiB) >= half of the 6 MiB asked
    # 2 MiB free + junk's 4 MiB would have held the 6 MiB asked
    d = diagnose(message=_msg(6 * 2**20, 2 * 2**20, 512 * 2**20, 5 * 2**20, 0), census=census)
    codes = [c.code for c in d.causes]
    assert LEFTOVERS in codes and codes.index(LEFTOVERS) < codes.index(WORKING_SET)
    free_fix = next(f for f in d.fixes if f.title.startswith("Free leftovers"))
    assert "%gpumem --free junk" in free_fix.how
    # the same leftovers are not blamed for an OOM they could not have caused
    d2 = diagnose(message=_msg(64 * 2**20, 2**20, 8 * GiB, 5 * 2**20, 0), census=census)
    assert LEFTOVERS not in {c.code for c in d2.causes}


def test_diagnose_oom_api_refuses_non_oom_with_a_clear_message():
    from gpunb import diagnose_oom

    with pytest.raises(ValueError, match="needs a CUDA out-of-memory error"):
        diagnose_oom(KeyError("x"))


def test_html_escapes_user_controlled_names():
    ns = {"d": {"<img src=x onerror=alert(1)>": torch.zeros(10)}}
    census = take_census(ns, torch=torch)
    d = diagnose(message=REAL, census=census)
    html = d._repr_mimebundle_()["text/html"]
    assert "<img src=x" not in html and "&lt;img src=x" in html


def test_in_a_container_our_own_process_is_recognised_by_its_memory():
    # NVML reports host PIDs inside containers: torch then lists us as "Process N"
    text = ("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "2.00 GiB is free. Process 3652628 has 120.60 GiB memory in use. Process 77 has 17.00 GiB memory in use. "
            "Of the allocated memory 119.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but "
            "unallocated.")
    d = diagnose(message=text)
    assert [p.pid for p in d.other_processes] == [77]
    assert d.this_process_bytes == size_to_bytes("120.60", "GiB")
    assert d.primary_cause == OTHER_PROCESSES  # the 17 GiB of PID 77 is real
    fake = scenario("busy", clock=lambda: 200.0)
    host_pid = 2**22 + TRACE["pid"]  # above any pid_max: no process here has it, like a host PID
    fake.gpus[0].pid_map = {TRACE["pid"]: host_pid}
    nvml = NvmlSession(fake)
    now = fake.gpus[0].sample_at(200.0)  # the recorded reading at that time: torch reserve and NVML
    assert now["torch_reserved"] and now["processes"]
    own = attribute_processes(0, read_processes(nvml, 0), {-1}, now["torch_reserved"])
    assert own.how == OWN_BY_RESERVE and [p.pid for p in own.processes] == [host_pid]
    assert [p.pid for p in own.others] == [999_001] and own.self_bytes == now["processes"][0]["used_gpu_memory"]


def test_a_per_process_cap_is_the_limit_not_the_device():
    text = ("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "119.20 GiB is free. Including non-PyTorch memory, this process has 20.52 GiB memory in use. 24.00 GiB "
            "allowed; Of the allocated memory 10.00 GiB is allocated by PyTorch, and 10.00 GiB is reserved by "
            "PyTorch but unallocated.")
    m = parse_oom_message(text)
    assert m.allowed_bytes == 24 * GiB and m.free_bytes == size_to_bytes("119.20", "GiB")
    d = diagnose(message=text, allocator_conf="")
    assert d.primary_cause == FRAGMENTATION
    assert d.fixes[0].title == "Turn on expandable segments"
    assert "with 4.00 GiB free" in d.causes[-1].summary  # what was left under the cap, not the device's 119
    big = diagnose(message=text.replace("Tried to allocate 6.00 GiB", "Tried to allocate 30.00 GiB"))
    assert big.primary_cause == TOO_LARGE_FOR_GPU and "allowed budget" in big.causes[0].summary


# The three OOMs of tests/gpu/test_oom_gpu.py on the H200 (run 2), messages verbatim. Another
# process (the pytest runner, PID 429, 10.05 GiB) was on the GPU in each: it is real, but freeing
# it could not have made any of these requests fit, so it must not come first.
H200_TAIL = (" If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
H200_TOO_LARGE_BATCH = (
    "CUDA out of memory. Tried to allocate 61.04 GiB. GPU 0 has a total capacity of 139.80 GiB of which 5.37 GiB is "
    "free. Process 429 has 10.05 GiB memory in use. Including non-PyTorch memory, this process has 124.36 GiB memory "
    "in use. Of the allocated memory 123.63 GiB is allocated by PyTorch, and 640.00 KiB is reserved by PyTorch but "
    "unallocated." + H200_TAIL)
H200_LEFTOVERS = (
    "CUDA out of memory. Tried to allocate 4.90 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.44 GiB is "
    "free. Process 429 has 10.05 GiB memory in use. Including non-PyTorch memory, this process has 128.29 GiB memory "
    "in use. Of the allocated memory 127.56 GiB is allocated by PyTorch, and 2.45 MiB is reserved by PyTorch but "
    "unallocated." + H200_TAIL)
H200_FRAGMENTATION = (
    "CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 109.23 GiB is "
    "free. Process 429 has 10.05 GiB memory in use. Including non-PyTorch memory, this process has 20.51 GiB memory "
    "in use. 24.00 GiB allowed; Of the allocated memory 10.00 GiB is allocated by PyTorch, and 10.00 GiB is reserved "
    "by PyTorch but unallocated." + H200_TAIL)
PYTEST_RUNNER = (oom_mod.OtherProcess(429, 10796138496, "python3"),)  # NVML's reading of PID 429


def _census(*entries):
    from gpunb.analysis.memory.census import Census, TensorEntry

    return Census(tuple(TensorEntry(name, n, (n,), dt, "cuda:0", role, src) for name, n, dt, role, src in entries))


MLP_STATE = [("model.0.0.weight", 537001984, "float32", "parameter", "namespace"),  # the recorded census by role
             ("opt.state[model.0.0.weight].exp_avg", 1074003968, "float32", "optimizer state", "namespace")]


def test_h200_too_large_batch_blames_the_working_set_not_the_other_process():
    census = _census(("train_step() local x", 65536000000, "float32", "other", EXCEPTION_SRC), *MLP_STATE)
    d = diagnose(message=H200_TOO_LARGE_BATCH, census=census, other_processes=PYTEST_RUNNER, allocator_conf="",
                 batch_size=("train_step() bs", 4_000_000))
    codes = [c.code for c in d.causes]
    # 5.37 GiB free + 10.05 GiB of PID 429 is still far from 61.04 GiB: only a smaller batch helps
    assert codes == [WORKING_SET, OTHER_PROCESSES], codes
    assert d.fixes[0].title == "Use a smaller batch" and d.fixes[0].severity == 2
    other_fix = next(f for f in d.fixes if f.title == "Free the GPU from other processes")
    assert other_fix.severity == 1 and "not have been enough" in other_fix.reason


def test_h200_leftovers_outrank_the_other_process():
    census = _census(("junk", 102630604800, "uint8", "other", oom_mod.EARLIER_CELLS),
                     ("Out[6]", 1073741824, "float32", "other", "output history"),
                     ("train_step() local x", 5263097856, "float32", "other", EXCEPTION_SRC), *MLP_STATE)
    d = diagnose(message=H200_LEFTOVERS, census=census, other_processes=PYTEST_RUNNER, allocator_conf="")
    codes = [c.code for c in d.causes]
    # both would suffice alone (1.44 + 10.05 >= 4.90 GiB), and the leftovers are ten times larger
    assert codes[:2] == [LEFTOVERS, OTHER_PROCESSES], codes
    assert d.fixes[0].title == "Free leftovers from earlier cells"


def test_h200_fragmentation_under_a_cap_comes_before_other_processes():
    d = diagnose(message=H200_FRAGMENTATION, other_processes=PYTEST_RUNNER, allocator_conf="")
    codes = [c.code for c in d.causes]
    # under the 24 GiB cap the other process's memory does not count; the 10 GiB cached in pieces does
    assert codes[0] == FRAGMENTATION and codes[-1] == OTHER_PROCESSES, codes
    assert d.fixes[0].title == "Turn on expandable segments" and d.fixes[0].severity == 2
    other_fix = next(f for f in d.fixes if f.title == "Free the GPU from other processes")
    assert other_fix.gain == 0 and other_fix.severity == 1
    # without the cap the same 10 GiB of PID 429 would have been enough, and it is the largest
    uncapped = H200_FRAGMENTATION.replace(" 24.00 GiB allowed;", "").replace("109.23 GiB is free", "1.00 GiB is free")
    d2 = diagnose(message=uncapped, other_processes=(oom_mod.OtherProcess(429, 12 * GiB, "python3"),),
                  allocator_conf="")
    assert [c.code for c in d2.causes][:2] == [OTHER_PROCESSES, FRAGMENTATION]


def test_other_processes_first_when_they_alone_would_have_made_it_fit():
    # the H200 leftovers OOM without leftovers: 1.44 GiB free, 4.90 asked, PID 429 holds 10.05 GiB
    d = diagnose(message=H200_LEFTOVERS, census=_census(*MLP_STATE), other_processes=PYTEST_RUNNER,
                 allocator_conf="")
    assert d.primary_cause == OTHER_PROCESSES, [c.code for c in d.causes]
    assert d.fixes[0].title == "Free the GPU from other processes" and d.fixes[0].severity == 2


# -- issue 13: the shortfall first, only GPU tensors, fixes sized to the shortfall ------------------

PICTURE = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
           "3.2 GiB is free.")  # the review picture's error (shared/review/oom-doctor-fixes.png)


def _picture_census():
    ns = {"model": torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)),
          "X": torch.zeros(16000, 256)}
    ns["opt"] = torch.optim.Adam(ns["model"].parameters())
    ns["model"](ns["X"][:8]).sum().backward()
    ns["opt"].step()
    return take_census(ns, torch=torch)


def test_the_first_line_states_the_shortfall():
    d = diagnose(message=PICTURE)
    assert d.headline == "asked 20.00 GiB, 3.20 GiB free: short by 16.80 GiB"
    assert d.shortfall_bytes == 20 * GiB - size_to_bytes("3.2", "GiB")
    bundle = d._repr_mimebundle_()
    assert bundle["text/plain"].splitlines()[0] == (
        "gpunb OOM doctor: OutOfMemoryError: asked 20.00 GiB, 3.20 GiB free: short by 16.80 GiB")
    assert "<b>asked 20.00 GiB, 3.20 GiB free: short by 16.80 GiB</b>" in bundle["text/html"]
    assert d.to_dict()["shortfall_bytes"] == d.shortfall_bytes
    # under a per-process cap what was left under the cap is the free memory
    capped = diagnose(message=H200_FRAGMENTATION, allocator_conf="")
    assert capped.headline == "asked 6.00 GiB, 4.00 GiB free: short by 2.00 GiB"


def test_cpu_tensors_never_count_toward_savings():
    census = _picture_census()  # model, gradients, Adam state and X: all on the CPU, as in the picture
    assert census.total_bytes(role="optimizer state") > 0
    d = diagnose(message=PICTURE, census=census, batch_size=("bs", 512))
    titles = [f.title for f in d.fixes]
    assert not any("set_to_none" in t or "lighter optimizer" in t or "leftovers" in t.lower() for t in titles)
    assert titles[:3] == ["Use a smaller batch", "Train in bf16 autocast", "Use activation checkpointing"]
    small = d.fixes[0]
    # without the allocator's numbers the request is the working set's lower bound: at most 16 % fits
    assert small.severity == 2 and small.saving_bytes == d.shortfall_bytes
    assert "at least 20.00 GiB" in small.reason and "≈16 %" in small.reason and "bs = 512 → at most ≈81" in small.reason
    assert "%gpufit step" in small.how
    text = d._repr_mimebundle_()["text/plain"]
    assert "saves ≈16.80 GiB: covers the 16.80 GiB short" in text
    assert "saves ≈10.00 GiB of the 16.80 GiB short: not enough alone" in text  # bf16: half of 20 GiB
    assert "KiB" not in text.split("What to do")[1].split("Details")[0]  # no saving computed from CPU tensors
    # the order a reader needs: the shortfall, why, the fixes; the table of CPU tensors last, in the details
    assert text.index("short by") < text.index("Why:") < text.index("What to do") < text.index("Largest live")
    html = d._repr_mimebundle_()["text/html"]
    assert html.index("What to do") < html.index("<details") < html.index("Largest live tensors")
    assert "namespace" not in html and "namespace" not in text  # the tensors' holder in plain words


def test_working_set_fixes_come_first_with_savings_from_the_measured_activations():
    census = _census(("train_step() local x", 65536000000, "float32", "other", EXCEPTION_SRC), *MLP_STATE)
    d = diagnose(message=H200_TOO_LARGE_BATCH, census=census, other_processes=PYTEST_RUNNER, allocator_conf="",
                 batch_size=("train_step() bs", 4_000_000))
    titles = [f.title for f in d.fixes]
    assert titles[:3] == ["Use a smaller batch", "Train in bf16 autocast", "Use activation checkpointing"], titles
    m = d.message
    fixed = 537001984 + 1074003968  # the census's parameters and optimizer state on the GPU
    need = m.requested_bytes + m.allocated_bytes - fixed  # activations alive at the failure + the request
    short = m.requested_bytes - m.free_bytes
    small, bf16, ckpt = d.fixes[:3]
    assert small.saving_bytes == short and small.severity == 2
    assert bf16.saving_bytes == need // 2 and bf16.severity == 2  # half of 183 GiB covers 55.67 GiB
    assert ckpt.saving_bytes == need // 2
    other = next(f for f in d.fixes if f.title == "Free the GPU from other processes")
    assert other.severity == 1 and d.fixes.index(other) > 2


def test_fixes_are_ranked_by_whether_they_cover_the_shortfall():
    # leftovers primary: freeing them covers and comes first; fixes that cannot cover come last
    census = _census(("junk", 102630604800, "uint8", "other", oom_mod.EARLIER_CELLS),
                     ("train_step() local x", 5263097856, "float32", "other", EXCEPTION_SRC), *MLP_STATE,
                     ("model.0.0.weight.grad", 537001984, "float32", "gradient", "namespace"))
    d = diagnose(message=H200_LEFTOVERS, census=census, other_processes=PYTEST_RUNNER, allocator_conf="")
    severities = [f.severity for f in d.fixes]
    assert severities == sorted(severities, reverse=True), [(f.title, f.severity) for f in d.fixes]
    assert d.fixes[0].title == "Free leftovers from earlier cells"
    covering = [f for f in d.fixes if f.severity == 2]
    assert all(f.saving_bytes is None or f.saving_bytes >= d.shortfall_bytes for f in covering)
    grads = next(f for f in d.fixes if "set_to_none" in f.title)
    assert grads.saving_bytes == 537001984 and grads.severity == 1  # 0.5 GiB of 3.46 GiB short


def test_gpufit_value_of_this_kernel_is_offered():
    from gpunb.analysis.fit import search as batch_fit

    fit = batch_fit.BatchFit(True, recommended=363, capacity_bytes=20 * GiB, steps=50, step_name="step")
    d = diagnose(message=PICTURE, last_fit=fit)
    small = next(f for f in d.fixes if f.title == "Use a smaller batch")
    assert small.how.startswith("batch_size = 363   # %gpufit step measured it trains 50 steps in 20.00 GiB")
    unfitted = next(f for f in diagnose(message=PICTURE).fixes if f.title == "Use a smaller batch")
    assert unfitted.how.startswith("%gpufit step")


def test_the_oom_hook_quotes_this_kernels_last_fit(monkeypatch):
    from gpunb.analysis.fit import search as batch_fit
    from gpunb.shells import api

    fit = batch_fit.BatchFit(True, recommended=363, capacity_bytes=20 * GiB, steps=50, step_name="step")
    monkeypatch.setattr(batch_fit, "_LAST", [fit])
    seen = {}

    def gather(exc, **kw):
        seen.update(kw)
        return diagnose(exc, last_fit=kw["last_fit"])

    monkeypatch.setattr("gpunb.analysis.memory.oom.gather_readings", gather)
    api.diagnose_oom(RuntimeError(PICTURE), namespace={})
    assert seen["last_fit"] is fit
