"""%%gpuprofile on a multi-GPU cell: the worker processes report per rank (CPU, gloo).

Real launches, as a notebook makes them: ``torch.multiprocessing`` with fork and torchrun
(fresh interpreters) training DDP over gloo, ``accelerate.notebook_launcher`` (fork). On a GPU
the same paths time steps with CUDA events and read NVML (tests/gpu/test_multi_gpu.py).

Every forked child starts with ``torch.set_num_threads(1)``: this pytest process has run CPU
tensor work in earlier tests, which starts libgomp's OpenMP thread pool, and a child forked
after that hangs in its first parallel region (the same without gpunb: GNU OpenMP is not
fork-safe). A notebook that forks ranks after CPU tensor work needs the same line.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpunb.analysis.profile.rank_verdict import judge_ranks  # noqa: E402
from gpunb.analysis.ranks.channel import BOOT_DIR, RankChannel  # noqa: E402
from gpunb.analysis.ranks.records import RanksPart  # noqa: E402
from gpunb.analysis.ranks.summary import build_ranks, rank_stats  # noqa: E402
from gpunb.readings.nvml import NvmlSession  # noqa: E402
from gpunb.testing import scenario  # noqa: E402
from gpunb.views.ranks_view import ranks_html, ranks_text  # noqa: E402

DDP_FORK = '''
import os, time, tempfile, torch, torch.distributed as dist, torch.multiprocessing as mp

def work(rank, world, path, steps, slow_rank, workers):
    torch.set_num_threads(1)  # see the module's docstring: OpenMP after fork
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * 32, 64)),
                                       batch_size=32, num_workers=workers)
    for (x,) in data:
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if rank == slow_rank:
            time.sleep(0.03)  # this rank does more per step: the other waits for it at the all-reduce
    dist.destroy_process_group()
'''


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpunb")
    yield ip
    ip.run_line_magic("unload_ext", "gpunb")
    for name in ("p", "work", "r"):
        ip.user_ns.pop(name, None)


def test_forked_ddp_ranks_report_their_steps_and_the_slowest_is_named(shell, tmp_path):
    before = dict(os.environ)
    shell.run_cell(DDP_FORK)
    shell.run_cell_magic("gpuprofile", "-o p", (
        f"mp.start_processes(work, args=(2, {str(tmp_path / 'rdv')!r}, 30, 1, 1), nprocs=2, start_method='fork')\n"
        "import os; seen_channel = os.environ.get('GPUNB_RANK_CHANNEL')\n"))
    p = shell.user_ns["p"]
    assert p.steps.count == 0  # the kernel itself trained nothing: its hooks left the children
    ranks = p.ranks
    assert isinstance(ranks, RanksPart)
    assert [r.rank for r in ranks.ranks] == [0, 1]  # one record each, the DataLoader workers wrote none
    assert all(r.steps == 30 and r.finished and r.launcher == "fork" and r.backend == "gloo" for r in ranks.ranks)
    assert all(r.ddp is not None and r.ddp.backward_comm_ms is not None for r in ranks.ranks)
    assert ranks.world_size == 2
    assert ranks.slowest_by == "all-reduce wait" and ranks.ranks[ranks.slowest].rank == 1
    assert not ranks.balanced and ranks.wait_ms > 5  # 30 ms of extra work a step, minus timing noise
    # gloo ranks on the CPU: no GPU took part, so not "multi-gpu" beside "GPU absent"
    assert p.verdict.kind == "multi-process" and "the slowest: rank 1" in p.verdict.headline
    assert "2 ranks trained on the CPU" in p.verdict.headline
    assert any(a.title == "Find out why rank 1 is slower" for a in p.advice)
    text = str(p)
    assert "2 ranks reported" in text and "1 (slowest)" in text and "none in this process" in text
    data = json.loads(json.dumps(p.to_dict()))  # JSON-safe, ranks included
    assert [r["steps"] for r in data["ranks"]["ranks"]] == [30, 30] and data["ranks"]["ranks"][0]["ddp"]["iterations"]
    # the channel is gone and the environment is as before the cell
    channel = shell.user_ns["seen_channel"]
    assert channel and not os.path.exists(channel)
    assert {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "GPUNB_RANK_CHANNEL")} == \
           {k: v for k, v in before.items() if k in ("PYTHONPATH", "GPUNB_RANK_CHANNEL")}


def test_torchrun_ranks_are_fresh_interpreters_and_other_sitecustomize_still_runs(shell, tmp_path):
    own = tmp_path / "site"
    own.mkdir()
    marks = tmp_path / "marks"
    (own / "sitecustomize.py").write_text(f"import os\nopen({str(marks)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(20):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        del model, opt, loss
        dist.destroy_process_group()
        # torch 2.13's CPU build aborts now and then in the interpreter's teardown after DDP over
        # gloo ("terminate called without an active exception" after destroy_process_group
        # returned on both ranks: 11 of 40 runs here without gpunb, also with the model deleted,
        # which cost a CI run). So the script runs the atexit handlers itself (gpunb's last rank
        # record is one of them) and leaves without the teardown: 0 of 24.
        import atexit, os, sys
        sys.stdout.flush(); sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(0)
    """))
    shell.user_ns.update(script=str(script), own_site=str(own))
    shell.run_cell_magic("gpuprofile", "-o p", (
        "import os, subprocess, sys\n"
        "env = dict(os.environ, OMP_NUM_THREADS='1')\n"
        "env['PYTHONPATH'] = env['PYTHONPATH'] + os.pathsep + own_site\n"
        "r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',"
        " script], env=env, capture_output=True, text=True)\n"))
    assert shell.user_ns["r"].returncode == 0, shell.user_ns["r"].stderr[-2000:]
    ranks = shell.user_ns["p"].ranks
    assert [(r.rank, r.steps, r.launcher) for r in ranks.ranks] == [(0, 20, "fresh interpreter"),
                                                                      (1, 20, "fresh interpreter")]
    pids = {int(x) for x in marks.read_text().split()}
    assert {r.pid for r in ranks.ranks} <= pids  # the ranks ran the sitecustomize gpunb's chained to


def test_no_ranks_leaves_the_environment_alone(shell):
    shell.run_cell_magic("gpuprofile", "--no-ranks -o p",
                         "import os\nseen = (os.environ.get('GPUNB_RANK_CHANNEL'), os.environ.get('PYTHONPATH', ''))\n")
    channel, path = shell.user_ns["seen"]
    assert channel is None and BOOT_DIR not in path
    assert shell.user_ns["p"].ranks is None


def test_a_fork_outside_a_profiled_cell_records_nothing(shell, tmp_path):
    shell.run_cell_magic("gpuprofile", "", "x = 1")  # the fork handler is registered from here on
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        from gpunb.analysis.ranks import recorder as rank_recorder

        os.write(w, b"1" if rank_recorder.active() is None else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)


def test_uneven_step_counts_are_a_hang_risk_named_first(shell):
    shell.run_cell(textwrap.dedent("""
        import torch, torch.multiprocessing as mp
        def solo(rank, steps):
            torch.set_num_threads(1)
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps[rank]):
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    """))
    shell.run_cell_magic("gpuprofile", "-o p",
                         "mp.start_processes(solo, args=([15, 11],), nprocs=2, start_method='fork')")
    p = shell.user_ns["p"]
    assert sorted(r.steps for r in p.ranks.ranks) == [11, 15]
    first = p.advice[0]
    assert first.title == "Give every rank the same number of batches" and first.severity == 2
    assert "DistributedSampler" in first.how and "join" in first.how


def test_accelerate_notebook_launcher_ranks_report(shell):
    pytest.importorskip("accelerate")
    shell.run_cell(textwrap.dedent("""
        def train_fn(steps):
            import torch
            torch.set_num_threads(1)
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.AdamW(model.parameters())
            for _ in range(steps):
                model(torch.randn(16, 8)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        from accelerate import notebook_launcher
    """))
    shell.run_cell_magic("gpuprofile", "-o p", "notebook_launcher(train_fn, args=(14,), num_processes=2)")
    ranks = shell.user_ns["p"].ranks
    assert [(r.rank, r.steps, r.launcher) for r in ranks.ranks] == [(0, 14, "fork"), (1, 14, "fork")]


def test_a_killed_rank_keeps_what_it_wrote_and_the_report_says_so(shell):
    shell.run_cell(textwrap.dedent("""
        import os, torch, torch.multiprocessing as mp
        def killed(rank):
            torch.set_num_threads(1)
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(13):   # a record is written after step 12
                model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
            os._exit(0)           # no exit handlers: as if killed
    """))
    shell.run_cell_magic("gpuprofile", "-o p", "mp.start_processes(killed, nprocs=1, start_method='fork', join=True)")
    (rank,) = shell.user_ns["p"].ranks.ranks
    assert rank.steps == 12 and not rank.finished
    assert "had not exited when the cell ended" in " ".join(shell.user_ns["p"].ranks.notes)


# -- the records, judged (no processes) ---------------------------------------------------------

def _record(rank, steps, step_ms, **kw):
    base = {"version": 1, "pid": 1000 + rank, "rank": rank, "world_size": 2, "launcher": "fresh interpreter",
            "device": rank, "gpu": {"name": "NVIDIA H200", "nvml_index": rank, "total_bytes": 150 * 2**30},
            "steps": steps, "step_ms": step_ms, "step_ms_offset": 0, "source": "CUDA events",
            "first_step_ms": step_ms[0], "batches": steps, "data_wait_s": 0.0, "batch_size": 64, "first_batch_s": 0.5,
            "last_step_s": 0.5 + steps * 0.05,
            "peak_allocated_bytes": 10 * 2**30, "peak_reserved_bytes": 12 * 2**30, "nvml_peak_bytes": 13 * 2**30,
            "ddp": None, "backend": "nccl", "final": True, "started_unix": 1.0}
    base.update(kw)
    return base


def _ddp(comm, overlap, iterations=(2, 3, 4, 5, 6, 7, 8, 9, 10)):
    return {"iteration": iterations[-1], "iterations": list(iterations), "forward_ms": 10.0,
            "backward_compute_ms": 20.0, "backward_comm_ms": comm, "overlap_ms": overlap}


def test_gradient_sync_over_pcie_is_advised_with_the_pcie_remedies():
    nvml = NvmlSession(scenario("pcie-pair"))
    records = [_record(0, 50, [500.0] + [50.0] * 49, ddp=_ddp(25.0, 5.0)),
               _record(1, 50, [500.0] + [50.0] * 49, ddp=_ddp(25.5, 5.0))]
    part = build_ranks(records, nvml=nvml)
    assert part.link == "PCIe (NODE), peer access not supported for this PCIe topology" and part.link_is_pcie
    assert part.balanced  # 0.5 ms apart: within the noise
    verdict, advice = judge_ranks(part)
    (comm,) = [a for a in advice if "cross PCIe" in a.title]
    assert "20.00 ms of it not hidden" in comm.reason and "40% of the step" in comm.reason
    assert "no_sync" in comm.how and "bf16_compress_hook" in comm.how
    assert "keep the same pace" in verdict.reason


def test_on_nvlink_the_advice_is_to_hide_the_allreduce():
    nvml = NvmlSession(scenario("h200x2-nvlink"))
    records = [_record(r, 50, [500.0] + [50.0] * 49, ddp=_ddp(20.0, 5.0)) for r in (0, 1)]
    part = build_ranks(records, nvml=nvml, traffic={0: 12 * 10**9, 1: 12 * 10**9})
    assert part.link == "NVLink × 18 through NVSwitch, 478 GB/s per direction"
    _, advice = judge_ranks(part)
    assert any(a.title == "Hide more of the gradient all-reduce" and "bucket_cap_mb" in a.how for a in advice)
    traffic = "NVLink traffic during the cell (NVML counters): GPU 0 12.00 GB, GPU 1 12.00 GB"
    assert traffic in "\n".join(ranks_text(part))


def test_the_rank_the_others_wait_for_is_the_slowest_though_step_times_match():
    """Under DDP the steps come out alike; the waiting shows in the all-reduce time."""
    records = [_record(0, 50, [500.0] + [60.0] * 49, ddp=_ddp(18.0, 2.0)),
               _record(1, 50, [500.0] + [60.0] * 49, ddp=_ddp(4.0, 2.0))]
    part = build_ranks(records)
    assert part.ranks[part.slowest].rank == 1 and part.wait_ms == pytest.approx(14.0)
    assert part.spread == pytest.approx(14.0 / 60.0)
    verdict, advice = judge_ranks(part)
    assert verdict.headline == "2 ranks trained, 60.00 ms per step; the slowest: rank 1"
    assert "wait 14.00 ms for it at each all-reduce (23% of a step)" in verdict.reason
    slow = next(a for a in advice if a.title == "Find out why rank 1 is slower")
    assert "rank 0 waited 14.00 ms more than it" in slow.reason and "9 sampled iterations (2-10)" in slow.reason


def test_more_memory_on_one_rank_and_different_batches_are_named():
    records = [_record(0, 50, [50.0] * 50, peak_allocated_bytes=30 * 2**30, batch_size=96),
               _record(1, 50, [50.0] * 50, peak_allocated_bytes=10 * 2**30)]
    _, advice = judge_ranks(build_ranks(records))
    titles = [a.title for a in advice]
    assert "Even out memory: rank 0 holds more" in titles
    assert "Use the same per-GPU batch size on every rank" in titles


def test_rank_stats_leave_out_the_warmup_and_the_view_escapes():
    stats = rank_stats(_record(0, 5, [900.0, 10.0, 11.0, 12.0, 13.0], gpu={"name": "<b>GPU</b>"}), warmup_steps=1)
    assert stats.median_ms == 11.5 and stats.first_ms == 900.0
    part = build_ranks([_record(0, 5, [900.0, 10.0, 11.0, 12.0, 13.0], gpu={"name": "x<script>"}, world_size=1)])
    html = ranks_html(part)
    assert "<script>" not in html and "x&lt;script&gt;" in html and "1 rank reported" in html


def test_the_channel_restores_what_the_cell_changed_itself(monkeypatch, tmp_path):
    env = {"PYTHONPATH": "/a"}
    channel = RankChannel(env).open()
    assert env["PYTHONPATH"] == BOOT_DIR + os.pathsep + "/a" and os.path.isdir(env["GPUNB_RANK_CHANNEL"])
    env["PYTHONPATH"] += os.pathsep + "/b"  # the cell appended its own entry
    (tmp_path / "x").mkdir()
    with open(os.path.join(channel.path, "rank-1.json"), "w") as f:
        json.dump(_record(0, 3, [1.0, 2.0, 3.0], group={"backend": "gloo", "world_size": 2, "rendezvous": ""}), f)
    with open(os.path.join(channel.path, "rank-2.json"), "w") as f:
        f.write('{"half a reco')  # a worker killed while writing
    path = channel.path
    records = channel.close()
    assert [r["rank"] for r in records] == [0]
    assert channel.notes == ["1 worker record(s) left out, unreadable or not gpunb's: rank-2.json (is not valid JSON "
                             "(half-written, or not gpunb's))"]
    assert env == {"PYTHONPATH": "/a" + os.pathsep + "/b"}
    assert not os.path.exists(path)


def _run_with_boot(code: str, **env_extra: str) -> str:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUNB_RANK")}
    env["PYTHONPATH"] = BOOT_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return out.stdout.strip() + out.stderr.strip()


def _channel_env(path) -> dict[str, str]:
    st = os.stat(path)
    return {"GPUNB_RANK_CHANNEL": str(path), "GPUNB_RANK_CHANNEL_ID": f"{st.st_dev}:{st.st_ino}"}


def test_the_boot_file_is_no_package_and_loads_gpunb_only_in_a_process_that_imports_torch(tmp_path):
    assert not os.path.exists(os.path.join(BOOT_DIR, "__init__.py"))
    loaded = "import sys; print('gpunb' in sys.modules)"
    with_torch = "import sys, torch; print('gpunb.analysis.ranks.recorder' in sys.modules)"
    assert _run_with_boot(loaded) == "False"  # without a channel the hook does nothing
    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    assert _run_with_boot(loaded, **_channel_env(channel)) == "False"  # an unrelated child: no gpunb at all
    assert _run_with_boot(with_torch, **_channel_env(channel)) == "True"
    assert _run_with_boot(with_torch, GPUNB_RANK_CHANNEL=str(channel)) == "False"  # no identity: not the cell's
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    assert _run_with_boot(with_torch, **dict(_channel_env(channel), GPUNB_RANK_CHANNEL=str(other))) == "False"
    os.chmod(channel, 0o755)
    assert _run_with_boot(with_torch, **_channel_env(channel)) == "False"


def test_the_users_sitecustomize_errors_show_as_python_shows_them(tmp_path):
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import no_such_module_gpunb_test\n")
    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUNB_RANK")}
    import subprocess

    without = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True,
                             env=dict(env, PYTHONPATH=str(own))).stderr
    with_boot = _run_with_boot("print('ran')", PYTHONPATH=BOOT_DIR + os.pathsep + str(own), **_channel_env(channel))
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nModuleNotFoundError: No module named " \
           "'no_such_module_gpunb_test'" in without
    assert with_boot == "ran" + without.strip()
    (own / "sitecustomize.py").write_text("raise ImportError('a broken site')\n")
    assert "ImportError: a broken site" in _run_with_boot("pass", PYTHONPATH=BOOT_DIR + os.pathsep + str(own))


def test_gpunbs_pythonpath_entry_never_outlives_the_cell_also_when_the_cell_prepends():
    env = {"PYTHONPATH": "/a"}
    channel = RankChannel(env).open()
    env["PYTHONPATH"] = "/mine" + os.pathsep + env["PYTHONPATH"]  # sys.path idiom: the cell's first
    channel.close()
    assert env == {"PYTHONPATH": "/mine" + os.pathsep + "/a"}
    env = {}
    channel = RankChannel(env).open()
    env["PYTHONPATH"] = "/mine" + os.pathsep + env["PYTHONPATH"]
    channel.close()
    assert env == {"PYTHONPATH": "/mine"}


def test_an_unrelated_training_script_started_from_the_cell_is_not_a_rank(shell, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        torch.set_num_threads(1)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(15):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    """))
    shell.user_ns["script"] = str(script)
    shell.run_cell_magic("gpuprofile", "-o p", (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, script], capture_output=True, text=True)\n"))
    assert shell.user_ns["r"].returncode == 0, shell.user_ns["r"].stderr[-2000:]
    assert shell.user_ns["p"].ranks is None  # it trained, but joined no process group of the cell


def test_a_rank_with_cuda_up_records_events_its_gpu_and_nvml_memory(tmp_path, monkeypatch):
    """The CUDA path of a rank on the CPU: the user's torch with CUDA up (simulated: host-clock
    events, the recorded H200 allocator counters), the fake NVML listing this process on the
    recorded pair's GPU 0 with the memory the trace recorded for the training process."""
    from gpunb.analysis.ranks.recorder import RankRecorder
    from gpunb.readings import nvml as nvml_module
    from gpunb.readings import torch_state
    from gpunb.testing import load_trace
    from gpunb.testing.fake_nvml import load_nvlink_pair
    from tests.simulated_cuda import SimulatedCuda, SimulatedTorch

    trace = load_trace()
    t_train = next(s["t"] for s in trace["samples"] if s["phase"] == "train" and s["processes"])
    fake = scenario("h200x2-nvlink", clock=lambda: t_train)
    fake.gpus[0].pid_map = {trace["pid"]: os.getpid()}
    nvml_module.set_default_session(NvmlSession(fake))
    uuids = [g["facts"]["uuid"] for g in load_nvlink_pair()["gpus"]]
    sim = SimulatedTorch(SimulatedCuda(uuids, dict(trace["memory_stats_after_train"]), trace["facts"]["memory_total"]))
    monkeypatch.setattr(torch_state, "imported_torch", lambda: sim)
    try:
        rec = RankRecorder(sim, str(tmp_path), "fork")
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(15):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        rec.finish()
        rec.instruments.remove()
    finally:
        nvml_module.set_default_session(None)
    record = json.loads((tmp_path / f"rank-{os.getpid()}.json").read_text())
    assert record["final"] and record["steps"] == 15 and record["source"] == "CUDA events"
    assert record["device"] == 0 and record["gpu"]["uuid"] == uuids[0].removeprefix("GPU-")
    assert record["gpu"]["nvml_index"] == 0
    listed = next(s for s in trace["samples"] if s["t"] == t_train)["processes"][0]["used_gpu_memory"]
    assert record["nvml_peak_bytes"] == listed
    assert record["peak_allocated_bytes"] == trace["memory_stats_after_train"]["allocated_bytes.all.peak"]
    stats = rank_stats(record)
    assert stats.nvml_index == 0 and stats.gpu_name == "NVIDIA H200" and stats.median_ms > 0


def test_the_verdict_says_multi_gpu_only_when_a_rank_trained_on_a_gpu():
    on_gpus = [_record(r, 20, [500.0] + [50.0] * 19) for r in (0, 1)]
    on_cpus = [_record(r, 20, [500.0] + [50.0] * 19, device=None, gpu=None, backend="gloo") for r in (0, 1)]
    mixed = [on_gpus[0], on_cpus[1]]
    kinds = {name: judge_ranks(build_ranks(records))[0] for name, records in
             (("gpus", on_gpus), ("cpus", on_cpus), ("mixed", mixed))}
    assert kinds["gpus"].kind == "multi-gpu" and "on the CPU" not in kinds["gpus"].headline
    assert kinds["cpus"].kind == "multi-process" and kinds["cpus"].headline.startswith("2 ranks trained on the CPU")
    assert kinds["mixed"].kind == "multi-gpu"


def test_the_advice_gains_of_a_rank_are_shares_of_one_loop_and_add_up_to_at_most_all_of_it():
    """Data wait is a share of the loop; the all-reduce's was a share of the step, so on a laptop
    "up to 94 %" and "up to 43 %" of the loop stood side by side (137 %). Generated ranks."""
    import random

    rng = random.Random(28)
    for _ in range(200):
        steps = rng.randint(5, 60)
        step_ms = [rng.uniform(1, 100) for _ in range(steps)]
        loop_s = sum(step_ms) / 1000
        wait = rng.uniform(0, 3 * loop_s)  # data wait lies inside the loop: the loop grows with it
        comm = rng.uniform(0, 80)
        ddp = _ddp(comm, rng.uniform(0, comm))
        ddp["forward_ms"], ddp["backward_compute_ms"] = rng.uniform(0.1, 40), rng.uniform(0.1, 80)
        records = [_record(r, steps, step_ms, ddp=ddp, data_wait_s=wait, first_batch_s=0.0,
                           last_step_s=loop_s + wait) for r in (0, 1)]
        _, advice = judge_ranks(build_ranks(records))
        gains = [a.gain for a in advice if a.gain]
        assert sum(gains) <= 1.0 + 1e-9, [(a.title, a.gain) for a in advice]
