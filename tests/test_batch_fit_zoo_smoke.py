"""The batch-size benchmark's whole pipeline on the CPU, before the GPU run that cannot be repeated.

``benchmarks/batch_fit_zoo.py --smoke`` runs every stage as on the H200 (child processes, the
quick search, the fresh-process bisection, %gpufit, Lightning's tuner, accelerate's decorator,
the same- and fresh-process checks, JSON and markdown, then ``--truth-from`` that report) on the
zoo's CPU twins, which charge a simulated caching allocator. The GPU models' own code is run one
step on the CPU too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import batch_fit_zoo  # noqa: E402
import memory_zoo  # noqa: E402


@pytest.mark.parametrize("name", sorted(memory_zoo.ZOO))
def test_every_gpu_model_of_the_zoo_trains_a_step_on_the_cpu(name):
    model = memory_zoo.build(name, device="cpu")
    before = [p.detach().clone() for p in model.module.parameters()]
    model.step(1)
    assert model.calls >= 1 and model.optimizer.state  # AdamW ran and made its state
    assert any(not torch.equal(a, p) for a, p in zip(before, model.module.parameters()))


def test_the_memory_cap_passes_torchs_own_argument_checks(monkeypatch):
    # the real set_per_process_memory_fraction validates its arguments before it reaches the
    # driver: run it with only the driver calls replaced (this machine has no GPU)
    set_to = []
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_setMemoryFraction", lambda f, d: set_to.append((f, d)), raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**30, 140 * 2**30))
    assert memory_zoo.cap_memory("conv_bn") == 6 * 2**30
    assert set_to == [(6 / 140, 0)]


def test_lightning_teardown_is_undone_before_the_same_process_run():
    import batch_size_finders

    model = memory_zoo.build("mlp", smoke=True)
    model.step(4)
    model.device = torch.device("meta")  # stands for the GPU Lightning moved everything off
    batch_size_finders._back_on_device(model)
    assert all(p.device.type == "meta" for p in model.module.parameters())
    for state in model.optimizer.state.values():
        assert state["exp_avg"].device.type == "meta" and state["step"].device.type == "cpu"


def test_the_twins_raise_a_cuda_like_oom_above_their_budget():
    model = memory_zoo.build("varlen", smoke=True)
    model.step(8)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        model.step(10**6)


def test_next_probes_split_the_bracket_or_grow_from_it():
    assert batch_fit_zoo.next_probes(100, 200, 3) == [125, 150, 175]
    assert batch_fit_zoo.next_probes(100, None, 3) == [115, 130, 150]
    assert batch_fit_zoo.next_probes(0, 100, 2) == [60, 80]
    assert batch_fit_zoo.next_probes(100, 101, 3) == []


def test_library_modules_run_as_scripts_do_nothing_harmful(tmp_path):
    # scripts/gpu-box-run.sh runs every benchmarks/*.py with --out
    for script in ("memory_zoo.py", "batch_size_finders.py"):
        r = subprocess.run([sys.executable, str(BENCH / script), "--out", str(tmp_path)], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr


def test_a_truth_from_another_kind_of_run_or_no_report_is_refused(tmp_path):
    run1 = ROOT / "benchmarks" / "results" / "h200x2_batch_fit_zoo_run1.json"
    run1_models = [m["model"] for m in json.loads(run1.read_text())["models"]]
    args = batch_fit_zoo.parse(["--truth-from", str(run1), "--finders", "gpufit"])  # its models, not the zoo's
    assert args.models == run1_models and set(args.truth_models) == set(run1_models)
    assert args.truth_label == "run of 2026-11-30 10:38"
    # a model run 1 did not have (bn_convnet, added for issue 24) has no ground truth there
    r = subprocess.run([sys.executable, str(BENCH / "batch_fit_zoo.py"), "--truth-from", str(run1), "--models",
                        "bn_convnet"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "it has no ground truth for bn_convnet" in r.stderr
    for argv, words in ((["--smoke"], "it was a GPU run"), (["--steps", "20"], "had 50 steps, not --steps 20")):
        r = subprocess.run([sys.executable, str(BENCH / "batch_fit_zoo.py"), "--truth-from", str(run1), *argv],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 2 and words in r.stderr and "Run without --truth-from" in r.stderr
    (tmp_path / "x.json").write_text("{}")
    r = subprocess.run([sys.executable, str(BENCH / "batch_fit_zoo.py"), "--truth-from", str(tmp_path / "x.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "not a batch_fit_zoo.json report" in r.stderr


def test_bad_arguments_name_the_choices():
    r = subprocess.run([sys.executable, str(BENCH / "batch_fit_zoo.py"), "--smoke", "--models", "resnet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "unknown model or finder: resnet" in r.stderr and "conv_bn" in r.stderr


def test_the_smoke_pipeline_runs_end_to_end_then_again_on_its_ground_truth(tmp_path):
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    first = tmp_path / "first"
    cmd = [sys.executable, str(BENCH / "batch_fit_zoo.py"), "--smoke", "--out", str(first), "--models", "varlen",
           "--finders", "gpufit,lightning_binsearch,accelerate", "--probes", "2", "--precision", "0.05",
           "--steps", "20", "--budget-s", "500"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((first / "batch_fit_zoo.json").read_text())
    (model,) = report["models"]
    truth = model["truth"]
    # the long batch (x1.6, every 10th step) sets the sustained maximum: 20 steps always meet it
    assert truth["max"] and truth["failed_at"] and truth["failed_at"] - truth["max"] <= 0.05 * truth["max"] + 1
    assert not truth["passed_above_a_failure"]
    fit = model["finders"]["gpufit"]
    assert fit["answer"] <= truth["max"] and fit["trial_count"] <= 6
    assert fit["same_process"]["ok"] and fit["fresh_process"]["ok"]
    for name in ("lightning_binsearch", "accelerate"):
        f = model["finders"][name]
        assert f["answer"] and f["trial_count"] >= 2 and "fresh_process" in f and "same_process" in f, f
    s = model["summary"]["gpufit"]
    assert s["pct_of_max"] == pytest.approx(100 * fit["answer"] / truth["max"])
    md = (first / "batch_fit_zoo.md").read_text()
    assert md.splitlines()[0].startswith("| model | cap | sustained max (fresh process) | %gpufit |")
    assert "| varlen | 6 GiB |" in md and md in r.stdout
    assert report["environment"]["smoke"] is True and report["processes"] >= 8

    # again, %gpufit only, on that ground truth: no quick search, no bisection, the columns merged
    again = tmp_path / "again"
    r = subprocess.run([sys.executable, str(BENCH / "batch_fit_zoo.py"), "--smoke", "--out", str(again), "--models",
                        "varlen", "--finders", "gpufit", "--steps", "20", "--truth-from",
                        str(first / "batch_fit_zoo.json")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    second = json.loads((again / "batch_fit_zoo.json").read_text())
    (model2,) = second["models"]
    assert second["processes"] == 2  # %gpufit and the fresh-process check of its answer
    assert model2["truth"]["max"] == truth["max"] and model2["truth"]["from"] == f"run of {report['date']}"
    assert set(model2["earlier_summary"]) == {"lightning_binsearch", "accelerate"}
    assert model2["earlier_summary"]["accelerate"] == model["summary"]["accelerate"]
    head, _, row = (again / "batch_fit_zoo.md").read_text().splitlines()[:3]
    run1 = f"run of {report['date']}"
    assert f"sustained max (fresh process, {run1})" in head and f"%gpufit (this run, {second['date']})" in head
    assert f"Lightning binsearch ({run1})" in head and f"accelerate ({run1})" in head
    assert row.startswith(f"| varlen | 6 GiB | {truth['max']}") and row.count("trials") == 3


def test_the_pool_starts_a_child_only_when_its_cap_fits_beside_the_others(monkeypatch):
    # an H200 holds six 20 GiB children (and their CUDA contexts), not eight
    import threading
    import time

    running, most = [0], [0]
    lock = threading.Lock()

    def fake_run(self, task, gpu):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return {"ok": True, "gpu": gpu}

    monkeypatch.setattr(batch_fit_zoo.Pool, "_run", fake_run)
    pool = batch_fit_zoo.Pool(["0"], 8, time.monotonic() + 60, lambda text: None, room_gib={"0": 133.0})
    task = {"model": "bn_convnet", "smoke": False, "steps": 1, "kind": "sustain", "batch": 1}
    results = batch_fit_zoo.in_threads([lambda: pool.run(task)] * 8)
    assert all(r["ok"] for r in results) and most[0] == 6  # 6 x (20 + 1) GiB <= 133 GiB < 7 x 21
    small = {**task, "model": "mlp"}  # 4 GiB caps: all eight at once
    most[0] = 0
    batch_fit_zoo.in_threads([lambda: pool.run(small)] * 8)
    assert most[0] == 8
