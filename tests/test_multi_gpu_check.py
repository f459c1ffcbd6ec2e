"""%gpucheck on several GPUs: the links between them (NVML) and the NCCL all-reduce (--deep).

The links come from the fake NVML replaying what two H200s on an NVSwitch board said
(``h200x2-nvlink``) and from a PCIe-only pair built from it (``pcie-pair``). The all-reduce is
judged on the figures NCCL measured on that pair, and run for real here: subprocesses over gloo
(CI has no GPU), with a hard timeout that kills a hung rank and everything it started.
"""

from __future__ import annotations

import os
import stat
import textwrap
import time
from typing import ClassVar

import pytest

import gpunb.analysis.checks.checklist as checks_module
from gpunb.analysis.checks.checklist import CheckOptionError, check
from gpunb.readings.allreduce import AllReduceLaunch, AllReduceRun, AllReduceSize, run_allreduce
from gpunb.readings.gpu import read_snapshot
from gpunb.readings.links import read_link_map
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.torch_build import TorchBuild
from gpunb.testing import replay_allreduce, scenario

H200_TORCH = TorchBuild(True, "2.11.0+cu130", "13.0", None, "/site-packages/torch")


class ReplayedLaunch:
    """Stands in for the rank subprocesses: gives back a prepared run."""

    made: ClassVar[list] = []

    def __init__(self, world_size, *, backend, environ, timeout_s, **kw):
        self.world_size, self.backend = world_size, backend
        ReplayedLaunch.made.append(self)

    def start(self):
        return self

    def go(self):
        self.went = True

    def wait(self):
        return self.run

    def cancel(self):
        self.cancelled = True


@pytest.fixture
def cuda_torch(monkeypatch):
    monkeypatch.setattr(checks_module, "read_torch_build", lambda: H200_TORCH)
    monkeypatch.setattr(checks_module, "read_kernel_torch_state", lambda: None)
    ReplayedLaunch.made = []

    def with_run(run):
        ReplayedLaunch.run = run
        monkeypatch.setattr(checks_module, "AllReduceLaunch", ReplayedLaunch)

    return with_run


def run(name, **kw):
    kw.setdefault("environ", {})
    kw.setdefault("in_kernel", False)
    kw.setdefault("quick", not kw.get("deep", False))
    return check(nvml=NvmlSession(scenario(name)), **kw)


# -- links (NVML) ----------------------------------------------------------------------------

def test_the_recorded_h200_pair_is_18_nvlink_links_through_an_nvswitch():
    nvml = NvmlSession(scenario("h200x2-nvlink"))
    links = read_link_map(nvml, read_snapshot(nvml).gpus)
    assert [(g.link_count, len(g.active), g.link_speed_mbps) for g in links.gpus] == [(18, 18, 26562)] * 2
    pair = links.pair(1, 0)
    assert (pair.nvlinks, pair.via_switch, pair.topology_name) == (18, True, "PHB")
    assert pair.nvlink_gbps == pytest.approx(18 * 26.562)
    assert {k: pair.p2p_ok(k) for k in ("read", "write", "nvlink", "atomics")} == dict.fromkeys(
        ("read", "write", "nvlink", "atomics"), True)


def test_gpu_links_check_on_nvlink_is_ok_and_says_what_it_read():
    c = run("h200x2-nvlink")["gpu_links"]
    assert c.status == "ok"
    assert c.summary == ("GPU0↔GPU1: NVLink 4.0 × 18 through NVSwitch, 478 GB/s per direction; "
                         "peer access ok (read, write, atomics)")
    assert c.measured["gpu0-gpu1"]["nvlinks"] == 18


def test_gpu_links_check_on_a_pcie_pair_warns_about_peer_access():
    c = run("pcie-pair")["gpu_links"]
    assert c.status == "warn"
    assert "PCIe, NODE (across PCIe host bridges within one NUMA node)" in c.summary
    assert "peer access not supported for this PCIe topology" in c.summary
    assert "copies through host memory" in c.cause and "PIX/PXB" in c.fix
    assert "no_sync" in c.tip


def test_a_down_nvlink_link_is_a_warning():
    fake = scenario("h200x2-nvlink")
    fake.gpus[1].fields.pop("165")  # no batched link state: each link's state is asked one by one
    fake.gpus[1].nvlinks[3]["state"] = 0
    report = check(nvml=NvmlSession(fake), environ={}, in_kernel=False, quick=True)
    c = report["gpu_links"]
    assert c.status == "warn" and "1 NVLink link(s)" in c.cause and "nvidia-smi nvlink -s" in c.fix
    assert "× 17 of 18 through NVSwitch" in c.summary


def test_one_gpu_has_no_links_to_check():
    assert run("h200")["gpu_links"].status == "skip"
    assert run("h200x2-nvlink", device=1)["gpu_links"].status == "skip"


def test_gpus_without_link_readings_are_skipped_not_crashed():
    c = run("two-gpus")["gpu_links"]  # the older two-GPU fake: NVML refuses every link query
    assert c.status in ("ok", "skip")
    assert "PCIe path unknown" in c.summary or c.status == "skip"


# -- the all-reduce, judged -------------------------------------------------------------------

def test_without_deep_the_allreduce_says_how_to_run_it(cuda_torch):
    cuda_torch(replay_allreduce())
    c = run("h200x2-nvlink")["nccl_allreduce"]
    assert c.status == "skip" and "--deep" in c.summary and "2 GPUs" in c.summary
    assert ReplayedLaunch.made == []


def test_deep_judges_the_recorded_nccl_run_against_the_nvlink_rate(cuda_torch, monkeypatch):
    cuda_torch(replay_allreduce())
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    report = run("h200x2-nvlink", deep=True)
    c = report["nccl_allreduce"]
    assert c.status == "ok", c.to_dict()
    assert c.summary.startswith("2 ranks over NCCL 2.28: busbw 149 GB/s at 8 MiB, 264 GB/s at 64 MiB, "
                                "293 GB/s at 256 MiB, 327 GB/s at 1 GiB; every element of the sum correct")
    assert "68% of the 478 GB/s the link carries: 18 NVLink links through NVSwitch × 26.6 GB/s" in c.summary
    assert "NCCL_DEBUG=INFO" in c.tip and "NCCL_P2P_DISABLE=1" in c.tip and "timeout" in c.tip
    assert "runs out of data" in c.tip
    assert ReplayedLaunch.made[0].world_size == 2 and ReplayedLaunch.made[0].went  # one rank per GPU, started
    assert report.deep and "--deep" in str(report).splitlines()[1]  # the counts line, under the finding


def test_low_bus_bandwidth_on_nvlink_is_a_warning(cuda_torch, monkeypatch):
    slow = AllReduceRun("nccl", 2, [AllReduceSize(2**28, 20.0, 13.4, 13.4, 0)], nccl_version="2.28")
    cuda_torch(slow)
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    c = run("h200x2-nvlink", deep=True)["nccl_allreduce"]
    assert c.status == "warn" and "only 3% of the link's rate" in c.cause
    assert "NCCL_DEBUG=INFO" in c.fix


def test_pcie_pair_is_judged_against_its_pcie_link(cuda_torch, monkeypatch):
    cuda_torch(AllReduceRun("nccl", 2, [AllReduceSize(2**28, 10.0, 26.8, 26.8, 0)]))
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    c = run("pcie-pair", deep=True)["nccl_allreduce"]
    assert "43% of the 63 GB/s the link carries: PCIe gen5 x16" in c.summary and c.status == "ok"


def test_wrong_sums_fail(cuda_torch, monkeypatch):
    cuda_torch(AllReduceRun("nccl", 2, [AllReduceSize(2**23, 0.06, 149.0, 149.0, 12)]))
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    c = run("h200x2-nvlink", deep=True)["nccl_allreduce"]
    assert c.status == "fail" and "12 element(s) summed wrong" in c.summary and "corrupted" in c.cause


def test_a_hang_fails_with_where_each_rank_was_and_the_hang_advice(cuda_torch, monkeypatch):
    hung = AllReduceRun("nccl", 2, timed_out=True, last_step={0: "first all_reduce", 1: "init_process_group"},
                        error="not finished within 90 s (killed); where each rank was: rank 0: first all_reduce; "
                              "rank 1: init_process_group")
    cuda_torch(hung)
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    c = run("h200x2-nvlink", deep=True)["nccl_allreduce"]
    assert c.status == "fail" and "rank 1: init_process_group" in c.cause
    assert "NCCL_DEBUG=INFO" in c.fix and "same number of batches" in c.fix


def test_quick_and_deep_exclude_each_other():
    with pytest.raises(CheckOptionError, match="exclude each other"):
        check(nvml=NvmlSession(scenario("h200x2-nvlink")), quick=True, deep=True, environ={})


def test_deep_on_one_chosen_gpu_skips_the_allreduce(cuda_torch, monkeypatch):
    cuda_torch(replay_allreduce())
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    c = run("h200x2-nvlink", deep=True, device=0)["nccl_allreduce"]
    assert c.status == "skip" and ReplayedLaunch.made == []


def test_the_ranks_are_cancelled_when_the_check_fails_midway(cuda_torch, monkeypatch):
    cuda_torch(replay_allreduce())

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(checks_module, "kernel_pids", broken)
    with pytest.raises(RuntimeError):
        run("h200x2-nvlink", deep=True)
    assert ReplayedLaunch.made[0].cancelled


def test_a_link_reader_crash_leaves_the_rest_of_the_checklist(cuda_torch, monkeypatch):
    """A bug in the link reader is gpu_links' skip naming it; the all-reduce and the rest still run."""
    cuda_torch(replay_allreduce())

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(checks_module, "read_link_map", broken)
    report = run("h200x2-nvlink", deep=True)
    c = report["gpu_links"]
    assert c.status == "skip" and "RuntimeError: boom" in c.summary and "gpunb bug" in c.cause
    assert report["nccl_allreduce"].status != "skip" and not hasattr(ReplayedLaunch.made[0], "cancelled")


# -- the all-reduce, run for real (gloo between CPU processes) -------------------------------------

def test_deep_check_runs_real_rank_processes_over_gloo_with_the_fake_gpus(monkeypatch):
    """CPU torch and the recorded GPUs: the subprocess path runs for real over gloo, and the
    report says these are not GPU figures."""
    monkeypatch.setattr(checks_module, "run_probe", lambda **kw: None)
    report = run("h200x2-nvlink", deep=True)
    c = report["nccl_allreduce"]
    assert c.status == "ok", c.to_dict()
    assert c.summary.startswith("2 ranks over gloo: busbw ")
    assert "every element of the sum correct (2 sizes)" in c.summary
    assert "not GPU figures" in c.summary
    assert all(s["busbw_gbs"] > 0 and s["wrong"] == 0 for s in c.measured["sizes"])


def _fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_rank_is_killed_with_everything_it_started(tmp_path):
    pids = tmp_path / "pids"
    python = _fake_python(tmp_path, f"""
        echo '{{"event": "step", "step": "init_process_group"}}'
        sleep 600 &
        echo $! >> {pids}
        wait
    """)
    t = time.monotonic()
    result = run_allreduce(2, backend="gloo", python=python, timeout_s=1.0)
    assert time.monotonic() - t < 10
    assert result.timed_out and not result.ok
    assert "rank 0: init_process_group" in result.error and "killed" in result.error
    grandchildren = [int(x) for x in pids.read_text().split()]
    assert len(grandchildren) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in grandchildren)


def test_a_rank_that_dies_ends_the_run_and_is_named(tmp_path):
    python = _fake_python(tmp_path, """
        case "$2" in
          --rank=1) echo "CUDA error: out of memory" >&2; exit 3 ;;
          *) echo '{"event": "step", "step": "init_process_group"}'; sleep 600 ;;
        esac
    """)
    t = time.monotonic()
    result = run_allreduce(2, backend="gloo", python=python, timeout_s=60.0)
    assert time.monotonic() - t < 10  # rank 0 would wait for rank 1 forever: it is killed at once
    assert not result.timed_out
    assert "rank 1 at 'starting': CUDA error: out of memory" in result.error


def test_ranks_wait_for_the_start_signal_and_cancel_cleanly(tmp_path):
    launch = AllReduceLaunch(2, backend="gloo", sizes_mib=(1,), iters=2, warmup=1).start()
    try:
        assert all(r.ready.wait(120) for r in launch._ranks)  # torch imported, waiting for go
        assert all(r.proc.poll() is None for r in launch._ranks)
    finally:
        launch.cancel()
    for r in launch._ranks:
        r.proc.wait(10)
        assert r.proc.returncode is not None


def test_multicast_stays_off_in_the_ranks_environment(tmp_path):
    out = tmp_path / "env"
    python = _fake_python(tmp_path, f"""
        env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS' | sort > {out}.$$
        echo '{{"event": "done"}}'
    """)
    run_allreduce(2, backend="gloo", python=python, environ={**os.environ, "NCCL_NVLS_ENABLE": "1"})
    seen = {path.read_text() for path in tmp_path.glob("env.*")}
    assert seen == {"NCCL_NVLS_ENABLE=0\nNVSHMEM_DISABLE_NVLS=1\nTORCH_SYMM_MEM_DISABLE_MULTICAST=1\n"}


def test_the_magic_and_the_terminal_refuse_quick_with_deep(ip, capsys):
    from IPython.core.error import UsageError

    from gpunb.cli import main

    with pytest.raises(UsageError, match="--quick and --deep exclude each other"):
        ip.run_line_magic("gpucheck", "--quick --deep")
    assert main(["check", "--quick", "--deep"]) == 2
    assert "exclude each other" in capsys.readouterr().err
