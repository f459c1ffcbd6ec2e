"""The overhead benchmarks' shared training loops (``benchmarks/training_loops.py``), on the CPU."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def loops():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("training_loops")
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("name", ["launch-bound", "compute-bound"])
def test_a_loop_is_built_as_its_shape_says_and_trains(loops, name):
    loop = loops.build_loop(name, "cpu")
    shape = loops.SHAPES[(name, "cpu")]
    linears = [m for m in loop.model if isinstance(m, torch.nn.Linear)]
    assert len(linears) == shape.depth
    assert all(m.in_features == m.out_features == shape.width for m in linears)
    assert all((m.bias is not None) == shape.bias for m in linears)
    assert {p.dtype for p in loop.model.parameters()} == {getattr(torch, shape.dtype)}
    before = [p.detach().clone() for p in loop.model.parameters()]
    loop.run(2)
    loop.sync()
    assert all(not torch.equal(a, p) for a, p in zip(before, loop.model.parameters(), strict=True))
    assert loop.optimizer.state[linears[0].weight]["step"].item() == 2


def test_the_same_seed_builds_the_same_loop(loops):
    a, b = loops.build_loop("launch-bound", "cpu"), loops.build_loop("launch-bound", "cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))


def test_the_gpu_shapes_are_the_ones_the_readme_reports(loops):
    # benchmarks/README.md: launch-bound 8x1024 MLP (AdamW), compute-bound 4x8192^2 bf16
    assert loops.SHAPES[("launch-bound", "cuda")] == loops.LoopShape(1024, 8, 64, "float32", True)
    assert loops.SHAPES[("compute-bound", "cuda")] == loops.LoopShape(8192, 4, 8192, "bfloat16", False)
    assert {name for name, _ in loops.SHAPES} == set(loops.LOOPS)


def test_bad_names_are_refused_with_the_choices(loops):
    with pytest.raises(ValueError, match="launch-bound, compute-bound"):
        loops.build_loop("small", "cpu")
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        loops.build_loop("launch-bound", "mps")


def test_both_overhead_benchmarks_build_their_loops_here(loops):
    for script in ("profile_overhead", "monitor_overhead"):
        module = importlib.import_module(script)  # benchmarks/ is on sys.path (fixture)
        assert module.build_loop is loops.build_loop and module.LOOPS is loops.LOOPS, script


def test_run_as_a_script_it_only_lists_the_loops(tmp_path):
    # scripts/gpu-box-run.sh runs every benchmarks/*.py with --out
    r = subprocess.run([sys.executable, str(BENCH / "training_loops.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "launch-bound" in r.stdout and "compute-bound" in r.stdout and list(tmp_path.iterdir()) == []
