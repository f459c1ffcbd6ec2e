"""The OOM doctor's reading of real messages and allocator stats (recorded on the H200)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis import oom as oom_mod  # noqa: E402
from gpunb.analysis.oom import (  # noqa: E402
    FRAGMENTATION, LEFTOVERS, OTHER_PROCESSES, TOO_LARGE_FOR_GPU, WORKING_SET, diagnose, process_memory,
)
from gpunb.analysis.oom_message import find_oom, parse_oom_message, size_to_bytes  # noqa: E402
from gpunb.analysis.tensor_census import take_census  # noqa: E402
from gpunb.readings.nvml import NvmlSession  # noqa: E402
from gpunb.readings.torch_memory import from_stats  # noqa: E402
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
    assert find_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")) is None
    assert find_oom(RuntimeError("shape mismatch")) is None
    assert find_oom(None) is None


def test_diagnosis_of_the_recorded_oom_uses_allocator_stats():
    stats = dict(TRACE["memory_stats_after_train"])
    stats.update(TRACE["oom_stats"])
    mem = from_stats(0, stats, total_bytes=TRACE["facts"]["memory_total"])
    assert mem.num_ooms == 1 and mem.reserved_bytes == TRACE["oom_stats"]["reserved_bytes.all.current"]
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
    assert "asked 30.00 GiB" in text and "free 12.88 GiB" in text and "[working-set]" in text
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
    d2 = diagnose(message=_msg(4 * GiB, 1 * GiB, 40 * GiB, 20 * GiB, 1 * GiB), allocator_conf="expandable_segments:True")
    assert not any("expandable" in f.title for f in d2.fixes)


def test_a_request_larger_than_the_gpu_cannot_be_fixed_by_freeing():
    d = diagnose(message=_msg(200 * GiB, 138 * GiB, 139.8 * GiB, 1 * GiB, 0))
    assert d.primary_cause == TOO_LARGE_FOR_GPU
    assert d.fixes[0].severity == 2 and "chunk" in d.fixes[0].how


def test_other_processes_from_fake_nvml_busy_scenario():
    nvml = NvmlSession(scenario("busy", clock=lambda: 200.0))  # in the recorded "train" phase
    mine, others = process_memory(nvml, 0, pid=TRACE["pid"])
    assert mine is not None and mine > 0  # the recorded kernel's own memory
    assert [(p.pid, p.used_bytes, p.name) for p in others] == [(999_001, 40 * GiB, "python3")]
    d = diagnose(message=_msg(30 * GiB, 12 * GiB, 139.8 * GiB, 80 * GiB, 0), other_processes=others)
    assert d.primary_cause == OTHER_PROCESSES
    assert "999001" in d.fixes[0].reason


def test_leftovers_from_earlier_cells_are_named_with_their_variable():
    ns = {"model": torch.nn.Linear(256, 256), "junk": torch.zeros(1024, 1024)}
    census = oom_mod.relabel_earlier(take_census(ns, torch=torch), {"junk": id(ns["junk"])}, ns)
    entry = census.find("junk")
    assert entry.source == oom_mod.EARLIER_CELLS
    # message scaled to the CPU tensors' sizes: junk (4 MiB) >= half of the 6 MiB asked
    d = diagnose(message=_msg(6 * 2**20, 2**20, 512 * 2**20, 5 * 2**20, 0), census=census)
    codes = [c.code for c in d.causes]
    assert LEFTOVERS in codes and codes.index(LEFTOVERS) < codes.index(WORKING_SET)
    free_fix = next(f for f in d.fixes if f.title.startswith("Free leftovers"))
    assert "%gpumem --free junk" in free_fix.how
    # the same leftovers are not blamed for an OOM they could not have caused
    d2 = diagnose(message=_msg(64 * 2**20, 2**20, 8 * GiB, 5 * 2**20, 0), census=census)
    assert LEFTOVERS not in {c.code for c in d2.causes}


def test_diagnose_oom_api_refuses_non_oom_with_a_clear_message():
    from gpunb.analysis.oom import diagnose_oom

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
    nvml = NvmlSession(scenario("busy", clock=lambda: 200.0))
    now = nvml.lib.gpus[0].sample_at(200.0)  # the recorded reading at that time: torch reserve and NVML
    assert now["torch_reserved"] and now["processes"]
    mine, others = process_memory(nvml, 0, pid=-1, torch_reserved=now["torch_reserved"])
    assert [p.pid for p in others] == [999_001] and mine == now["processes"][0]["used_gpu_memory"]


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
