"""GPU identity and memory ownership (readings/devices.py), and every feature agreeing on them.

NVML numbers GPUs by bus and ignores CUDA_VISIBLE_DEVICES; torch numbers what the variable
shows, in its order. Each case below builds two recorded H200s (or a MIG one) where only one
GPU holds this kernel's memory, so a feature that looks at the wrong GPU, or counts the wrong
processes as this kernel's, gives a different number than the others and than the recording.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.fit import search as batch_fit  # noqa: E402
from gpunb.analysis.memory import report as memory_report  # noqa: E402
from gpunb.analysis.memory.oom import gather_readings  # noqa: E402
from gpunb.analysis.monitor.sampler import MIB, Sampler  # noqa: E402
from gpunb.analysis.profile.cell import ProfileSession  # noqa: E402
from gpunb.readings import devices, torch_state  # noqa: E402
from gpunb.readings import nvml as nvml_module  # noqa: E402
from gpunb.readings.devices import (  # noqa: E402
    MATCH_TORCH_UUID,
    OWN_BY_RESERVE,
    OWN_CHILD_PID,
    OWN_NOT_LISTED,
    OWN_PID,
    OWN_PID_AND_CHILDREN,
    OWN_UNKNOWN,
    GpuIdentity,
    attribute_processes,
    map_devices,
    namespace_pids,
    read_device_map,
    read_identities,
    read_ownership,
)
from gpunb.readings.gpu import GpuProcess, MigDevice  # noqa: E402
from gpunb.readings.nvml import NvmlSession, Unavailable  # noqa: E402
from gpunb.testing import load_trace, scenario  # noqa: E402
from tests.simulated_cuda import SimulatedCuda, SimulatedTorch  # noqa: E402

GiB = 2**30
TRACE = load_trace()
T = 17.1  # a moment of the recorded training phase: PID 412 holds ~8.8 GiB, torch reserved ~8.1 GiB
NOW = next(s for s in reversed(TRACE["samples"]) if s["t"] <= T)
RECORDED_BYTES = NOW["processes"][0]["used_gpu_memory"]
SECOND_UUID = "GPU-0b7c3f51-9a2e-4d6b-8f10-2c4e6a8b0d12"  # the two-gpus scenario's second H200
HOST_PID = 2**22 + 412  # above any pid_max (PID_MAX_LIMIT): no process here has it, like a container's host PID
STRANGER = 2**22 + 999_001


class Table:
    """This PID namespace as a test wants it: visible PIDs and their parents."""

    def __init__(self, parents: dict[int, int]) -> None:
        self.parents = parents

    def ancestors(self, pid):
        if pid not in self.parents:
            return None
        chain = []
        while pid in self.parents and len(chain) < 16:
            pid = self.parents[pid]
            chain.append(pid)
        return tuple(chain)

    def holds_gpu(self, pid):
        return None if pid not in self.no_gpu else False

    no_gpu: frozenset = frozenset()


def gpu(index, uuid, name="NVIDIA H200", migs=()):
    return GpuIdentity(index, name, uuid, bool(migs), tuple(MigDevice(u, 71 * GiB) for u in migs))


H200S = (gpu(0, TRACE["facts"]["uuid"]), gpu(1, SECOND_UUID))


# -- identity, pure ------------------------------------------------------------------------------

def test_reversed_indices_map_cuda0_to_nvml1():
    m = map_devices(H200S, {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert [m.nvml_index(i) for i in (0, 1)] == [1, 0]
    assert m.cuda_indices(1) == (0,) and m.device(0).visible_entry == "1" and m.device(0).gpu_uuid == SECOND_UUID
    assert all(d.certain for d in m.devices) and not m.uncertain


@pytest.mark.parametrize("entry", [SECOND_UUID, SECOND_UUID[:12]])
def test_a_uuid_or_its_prefix_names_the_gpu(entry):
    m = map_devices(H200S, {"CUDA_VISIBLE_DEVICES": entry})
    (d,) = m.devices
    assert d.nvml_index == 1 and d.gpu_uuid == SECOND_UUID and d.certain
    assert d.matched_by == ("CUDA_VISIBLE_DEVICES UUID" if entry == SECOND_UUID else "CUDA_VISIBLE_DEVICES UUID prefix")
    assert m.find(SECOND_UUID.removeprefix("GPU-")) is d  # torch's spelling finds it too


def test_a_mig_instance_maps_to_its_parent_gpu():
    migs = ("MIG-4f2d8a61-3b7e-5c90-a1d4-7e6f5b3c2a10", "MIG-9c1e7b24-6d3a-5f81-b2c7-0a9d8e4f6b35")
    gpus = (gpu(0, TRACE["facts"]["uuid"], migs=migs),)
    (d,) = map_devices(gpus, {"CUDA_VISIBLE_DEVICES": migs[1]}).devices
    assert (d.nvml_index, d.mig_uuid, d.gpu_uuid, d.certain) == (0, migs[1], TRACE["facts"]["uuid"], True)
    unset = map_devices(gpus, {})  # CUDA picks the instances itself: say so
    assert not unset.devices[0].certain and "MIG" in unset.uncertain
    confirmed = map_devices(gpus, {}, torch_uuids=[migs[0].removeprefix("MIG-")])
    assert confirmed.devices[0].mig_uuid == migs[0] and confirmed.devices[0].certain and not confirmed.uncertain


def test_mixed_models_are_uncertain_until_torch_confirms():
    mixed = (gpu(0, "GPU-aaaa0000-0000-0000-0000-000000000000", "NVIDIA RTX A4000"),
             gpu(1, "GPU-bbbb0000-0000-0000-0000-000000000000", "NVIDIA H200"))
    guess = map_devices(mixed, {})
    assert not any(d.certain for d in guess.devices) and "fastest-first" in guess.uncertain
    assert map_devices(mixed, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).uncertain == ""
    by_uuid = map_devices(mixed, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa"})
    assert by_uuid.uncertain == "" and [d.nvml_index for d in by_uuid.devices] == [1, 0]
    # CUDA put the fast H200 first: torch's UUIDs say so, and the map follows them
    fixed = map_devices(mixed, {}, torch_uuids=["bbbb0000-0000-0000-0000-000000000000",
                                                "aaaa0000-0000-0000-0000-000000000000"])
    assert [d.nvml_index for d in fixed.devices] == [1, 0] and fixed.confirmed_by_torch
    assert {d.matched_by for d in fixed.devices} == {MATCH_TORCH_UUID} and fixed.uncertain == ""


H200X2 = json.loads((Path(__file__).parent / "data" / "h200x2_identity.json").read_text())


@pytest.mark.parametrize("visible", list(H200X2["torch_uuids_by_cuda_visible_devices"]))
def test_the_map_predicts_what_torch_saw_on_two_h200s(visible):
    """Recorded on two H200s: torch's device UUIDs under each CUDA_VISIBLE_DEVICES value. The map
    from NVML and the environment alone (no CUDA) must name the same GPUs in the same order, and
    torch's UUIDs (bare, as torch prints them) must confirm it."""
    gpus = tuple(gpu(g["index"], g["uuid"], g["name"]) for g in H200X2["nvml_gpus"])
    env = {} if visible == "None" else {"CUDA_VISIBLE_DEVICES": visible}
    torch_saw = H200X2["torch_uuids_by_cuda_visible_devices"][visible]
    guess = map_devices(gpus, env)
    assert [devices.uuid_key(d.gpu_uuid) for d in guess.devices] == torch_saw and not guess.uncertain
    confirmed = map_devices(gpus, env, torch_uuids=torch_saw)
    assert [d.nvml_index for d in confirmed.devices] == [d.nvml_index for d in guess.devices]
    assert confirmed.confirmed_by_torch and all(d.matched_by == MATCH_TORCH_UUID for d in confirmed.devices)


def test_an_invalid_entry_ends_the_map_there():
    m = map_devices(H200S, {"CUDA_VISIBLE_DEVICES": "1,7,0"})
    assert [d.nvml_index for d in m.devices] == [1] and m.visible.problems


def test_the_map_is_read_from_nvml_without_torch():
    nvml = NvmlSession(scenario("two-gpus"))
    assert [g.uuid for g in read_identities(nvml)] == [TRACE["facts"]["uuid"], SECOND_UUID]
    m = read_device_map(nvml, {"CUDA_VISIBLE_DEVICES": "1"}, torch=None)
    assert m.nvml_index(0) == 1 and not m.confirmed_by_torch
    assert read_identities(NvmlSession(scenario("no-driver"))) == ()


# -- ownership, pure -----------------------------------------------------------------------------

ME = 5000


def procs(*pairs):
    return tuple(GpuProcess(pid, used) for pid, used in pairs)


def test_this_process_and_its_children_are_the_kernels():
    table = Table({ME: 1, 5001: ME, 5002: 5001, 77: 1})  # a worker's worker is still ours
    own = attribute_processes(0, procs((ME, 9 * GiB), (5002, 2 * GiB), (77, 5 * GiB)), {ME}, 8 * GiB, table)
    assert own.how == OWN_PID_AND_CHILDREN and (own.self_bytes, own.children_bytes, own.own_bytes) == (
        9 * GiB, 2 * GiB, 11 * GiB)
    assert [p.pid for p in own.others] == [77] and own.others_bytes == 5 * GiB
    only_children = attribute_processes(0, procs((5001, GiB)), {ME}, None, table)
    assert only_children.how == OWN_CHILD_PID and only_children.self_bytes == 0 and only_children.own_bytes == GiB


def test_in_a_container_the_process_holding_torchs_reserve_is_this_one():
    table = Table({ME: 1})  # NVML's host PIDs are not visible here
    listed = procs((HOST_PID, 9 * GiB), (STRANGER, 40 * GiB))
    own = attribute_processes(0, listed, {ME}, int(8.5 * GiB), table)
    assert own.how == OWN_BY_RESERVE and own.self_bytes == 9 * GiB and own.others_bytes == 40 * GiB
    assert "PID 4194716" in own.note
    # two candidates fit: nothing is claimed, and the answer is unknown, not 0
    twins = attribute_processes(0, procs((HOST_PID, 9 * GiB), (STRANGER, 9 * GiB)), {ME}, int(8.5 * GiB), table)
    assert twins.how == OWN_UNKNOWN and twins.self_bytes is None and twins.own_bytes is None
    # a visible process of another user is never taken for this one, whatever it holds
    visible = attribute_processes(0, procs((77, 9 * GiB)), {ME}, int(8.5 * GiB), Table({ME: 1, 77: 1}))
    assert visible.how == OWN_UNKNOWN and [p.pid for p in visible.others] == [77]
    # ...unless it holds no NVIDIA device: then its number is a host PID that also exists here
    lookalike = Table({ME: 1, 77: 1})
    lookalike.no_gpu = frozenset({77})
    matched = attribute_processes(0, procs((77, 9 * GiB)), {ME}, int(8.5 * GiB), lookalike)
    assert matched.how == OWN_BY_RESERVE and matched.self_bytes == 9 * GiB and matched.others == ()
    # torch has no CUDA here: this process holds nothing on the GPU
    idle = attribute_processes(0, listed, {ME}, None, table)
    assert idle.how == OWN_NOT_LISTED and idle.self_bytes == 0 and idle.others_bytes == 49 * GiB


def test_without_per_process_memory_the_share_is_unknown_not_zero():
    mig = attribute_processes(0, procs((ME, None), (77, None)), {ME}, 8 * GiB, Table({ME: 1, 77: 1}))
    assert mig.how == OWN_PID and mig.self_bytes is None and mig.own_bytes is None and mig.others_bytes is None
    assert "per-process memory" in mig.note
    lost = attribute_processes(0, Unavailable("GPU is lost", 15), {ME}, 8 * GiB)
    assert lost.how == OWN_UNKNOWN and lost.own_bytes is None and "GPU is lost" in lost.note


def test_this_process_is_found_by_its_own_pid_and_its_namespace_pids():
    assert os.getpid() in namespace_pids(os.getpid())
    own = read_ownership(NvmlSession(_fake_with_me()), 0, torch=_NoCuda())
    assert own.how == OWN_PID and own.self_bytes == RECORDED_BYTES


class _NoCuda:
    class cuda:  # noqa: N801
        @staticmethod
        def is_initialized() -> bool:
            return False


def _fake_with_me():
    fake = scenario("h200", clock=lambda: T)
    fake.gpus[0].pid_map = {412: os.getpid()}
    return fake


# -- every feature, one answer -------------------------------------------------------------------

def _two_h200s(ours: int, self_pid: int, extra_ours=(), extra_other=()):
    """Two recorded H200s; the recorded training process is on GPU ``ours`` as ``self_pid``."""
    fake = scenario("two-gpus", clock=lambda: T)
    for i, g in enumerate(fake.gpus):
        g.pid_map = {412: self_pid if i == ours else None}
        g.extra_processes = list(extra_ours) if i == ours else [{"pid": STRANGER, "used_gpu_memory": 40 * GiB}]
        if i == ours:
            g.extra_processes += list(extra_other)
    return fake


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def case(name, child_pid=None):
    """(fake NVML, environment, torch's device UUIDs, NVML index of cuda:0, expected answer)."""
    h200, second = TRACE["facts"]["uuid"], SECOND_UUID
    me = os.getpid()
    if name == "1,0":
        return _two_h200s(1, me), {"CUDA_VISIBLE_DEVICES": "1,0"}, [second, h200], 1, (
            OWN_PID, RECORDED_BYTES, 0, 0)
    if name == "uuid":
        return _two_h200s(1, me), {"CUDA_VISIBLE_DEVICES": second}, [second], 1, (OWN_PID, RECORDED_BYTES, 0, 0)
    if name == "uuid-prefix":
        return _two_h200s(1, me), {"CUDA_VISIBLE_DEVICES": second[:12]}, [second], 1, (
            OWN_PID, RECORDED_BYTES, 0, 0)
    if name == "container":  # NVML speaks host PIDs: ours and a stranger's, neither visible here
        fake = _two_h200s(1, HOST_PID, extra_other=[{"pid": STRANGER, "used_gpu_memory": 40 * GiB}])
        return fake, {"CUDA_VISIBLE_DEVICES": "1,0"}, [second, h200], 1, (
            OWN_BY_RESERVE, RECORDED_BYTES, 0, 40 * GiB)
    if name == "children":  # a rank this kernel started holds what the recorded model phase held
        rank = TRACE["samples"][40]["processes"][0]["used_gpu_memory"]
        fake = _two_h200s(0, me, extra_ours=[{"pid": child_pid, "used_gpu_memory": rank}],
                          extra_other=[{"pid": 1, "used_gpu_memory": 40 * GiB}])  # init: visible, not ours
        return fake, {}, [h200, second], 0, (OWN_PID_AND_CHILDREN, RECORDED_BYTES, rank, 40 * GiB)
    if name == "mig":
        fake = scenario("mig", clock=lambda: T)
        fake.gpus[0].pid_map = {412: me}
        mig = fake.gpus[0].mig_devices[1]["uuid"]
        return fake, {"CUDA_VISIBLE_DEVICES": mig}, [mig], 0, (OWN_PID, None, 0, 0)
    raise ValueError(name)


@pytest.mark.parametrize("name", ["1,0", "uuid", "uuid-prefix", "container", "children", "mig"])
def test_every_feature_gives_the_same_answer(name, monkeypatch, request, ip):
    child_pid = request.getfixturevalue("child") if name == "children" else None
    fake, env, uuids, nvml_index, (how, self_bytes, children_bytes, others_bytes) = case(name, child_pid)
    stats = dict(TRACE["memory_stats_after_train"])
    stats["allocated_bytes.all.current"] = NOW["torch_allocated"]
    stats["reserved_bytes.all.current"] = NOW["torch_reserved"]
    sim = SimulatedTorch(SimulatedCuda(uuids, stats, TRACE["facts"]["memory_total"]))
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nvml = NvmlSession(fake)
    nvml_module.set_default_session(nvml)
    try:
        own_bytes = None if self_bytes is None else self_bytes + children_bytes
        truth = read_ownership(nvml, nvml_index)
        assert (truth.how, truth.self_bytes, truth.children_bytes, truth.others_bytes) == (
            how, self_bytes, children_bytes, others_bytes)
        assert read_device_map(nvml).nvml_index(0) == nvml_index

        # the sampler (%gpumonitor): this kernel's share of the GPU, its processes and their children
        sampler = Sampler(nvml, clock=lambda: T, process_refresh_s=0)
        sampler.tick()
        share = sampler.samples()[f"gpu{nvml_index}_mem_own_mib"][-1]
        assert share == (None if own_bytes is None else pytest.approx(own_bytes / MIB, rel=1e-6))

        # %%gpuprofile's GPU part
        session = ProfileSession(nvml=nvml).start()
        part = session.stop().gpu
        assert (part.nvml_index, part.process_match, part.nvml_process_bytes, part.child_processes_bytes,
                part.other_processes_bytes) == (nvml_index, how, self_bytes, children_bytes, others_bytes)

        # %gpumem
        row = memory_report.memory(namespace={}, nvml=nvml).gpus[0]
        assert (row.index, row.nvml_index, row.process_match, row.process_bytes, row.child_processes_bytes,
                row.other_processes_bytes) == (0, nvml_index, how, self_bytes, children_bytes, others_bytes)

        # the OOM doctor, called directly and after a failed cell (the shell hook and its release)
        message = "CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity of 139.80 GiB."
        d = gather_readings(torch.OutOfMemoryError(message), namespace={}, nvml=nvml)
        others = [p.used_bytes for p in d.other_processes]
        assert d.this_process_bytes == self_bytes
        assert (sum(others) if None not in others else None) == others_bytes
        ip.user_ns["_gpunb_test"] = {"msg": message}
        ip.run_cell("import torch\nraise torch.OutOfMemoryError(_gpunb_test['msg'])")
        hooked = ip._gpunb_extension_state.kernel.last_oom
        assert hooked.this_process_bytes == self_bytes and hooked.release.before.nvml_process_bytes == self_bytes

        # %gpufit's NVML reader
        assert batch_fit._nvml_process_bytes(sim, 0)() == self_bytes
    finally:
        nvml_module.set_default_session(None)
        devices._confirmed.clear()
