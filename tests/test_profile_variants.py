"""`%gpuprofile history --vs LABEL`: variants the user names, compared like for like, in one sentence.

Before: the history compared a cell only with an earlier run of the same cell, so batch 16 vs 128
and fp32 vs bf16 (tutorial 03) read "no earlier run to compare with" on every machine.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")

from gpunb.analysis.profile.history import like_for_like, variant_sentence  # noqa: E402

_SENTENCE = re.compile(r'"([^"]+)" took ([\d.]+)× the (time per sample|time per step|wall time) of "([^"]+)"\.')


@pytest.fixture
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpunb")
    shell.run_cell("%gpuprofile history --clear")
    yield shell
    shell.run_cell("%gpuprofile history --clear")
    shell.run_line_magic("unload_ext", "gpunb")
    for name in ("_gpunb_test", "_gpunb_model", "_gpunb_opt", "_gpunb_data"):
        shell.user_ns.pop(name, None)


def _setup(ip):
    ip.run_cell("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\ntorch.manual_seed(0)\n"
                "_gpunb_model = torch.nn.Linear(64, 1)\n"
                "_gpunb_opt = torch.optim.SGD(_gpunb_model.parameters(), lr=0.01)\n"
                "_gpunb_data = TensorDataset(torch.randn(1024, 64), torch.randn(1024, 1))\n"
                "def _gpunb_step(x, y):\n"
                "    loss = (_gpunb_model(x) - y).pow(2).mean(); _gpunb_opt.zero_grad(); loss.backward()\n"
                "    _gpunb_opt.step()\n")


def _sentences(text: str) -> list[tuple[str, float, str, str]]:
    return [(m.group(1), float(m.group(2)), m.group(3), m.group(4)) for m in _SENTENCE.finditer(text)]


def test_batch_sizes_are_compared_per_sample_in_one_sentence(ip, capsys):
    _setup(ip)
    for batch in (8, 128):
        r = ip.run_cell(f'%%gpuprofile --label "batch {batch}"\n'
                        f"for x, y in DataLoader(_gpunb_data, batch_size={batch}):\n    _gpunb_step(x, y)\n")
        assert r.success
    capsys.readouterr()
    ip.run_cell('%gpuprofile history --vs "batch 8" -o _gpunb_test')
    out = capsys.readouterr().out
    report = ip.user_ns["_gpunb_test"]
    small, large = report.entries
    assert report.baselines == (None, 0) and report.versus == "batch 8"
    [(later, ratio, what, earlier)] = _sentences(out)
    assert (later, what, earlier) == ("batch 128", "time per sample", "batch 8")
    expected = small.steps.samples_per_s / large.steps.samples_per_s  # later's time per sample / earlier's
    assert ratio == pytest.approx(expected, abs=0.006 if expected < 10 else 0.06)
    assert "vs #1: samples/s" in out  # the table's compared column says the same, as a rate


def test_two_variants_at_one_batch_are_compared_per_step_and_the_baseline_may_come_later(ip, capsys):
    _setup(ip)
    x = "x, y = _gpunb_data.tensors\nx, y = x[:64], y[:64]\n"
    ip.run_cell(f'%%gpuprofile --label bf16\n{x}for _ in range(12):\n    _gpunb_step(x, y)\n')
    ip.run_cell(f'%%gpuprofile --label fp32\n{x}for _ in range(12):\n    _gpunb_step(x, y)\n')
    capsys.readouterr()
    ip.run_cell("%gpuprofile history --vs fp32 -o _gpunb_test")
    out = capsys.readouterr().out
    bf16, fp32 = ip.user_ns["_gpunb_test"].entries
    [(later, ratio, what, earlier)] = _sentences(out)
    assert (later, what, earlier) == ("bf16", "time per step", "fp32")
    assert ratio == pytest.approx(bf16.steps.median_ms / fp32.steps.median_ms, abs=0.006)


def test_an_unknown_label_and_the_cell_form_say_what_to_do(ip):
    _setup(ip)
    ip.run_cell('%%gpuprofile --label fp32\n_gpunb_step(*_gpunb_data.tensors)\n')
    with pytest.raises(UsageError, match='no profiled cell is labelled "fp16"; the labels are: "fp32"'):
        ip.run_line_magic("gpuprofile", "history --vs fp16")
    r = ip.run_cell("%%gpuprofile --vs fp32\n_gpunb_step(*_gpunb_data.tensors)\n")
    assert not r.success and "--vs is for `%gpuprofile history`" in str(r.error_in_exec)
    with pytest.raises(UsageError, match="leave out --vs"):
        ip.run_line_magic("gpuprofile", "history --clear --vs fp32")


def _entry(rng: random.Random, label: str):
    steps = rng.random() < 0.8
    batch = rng.choice([None, 16, 128]) if steps else None
    median = rng.uniform(0.1, 500.0) if steps else None
    rate = 1000.0 / rng.uniform(0.1, 500.0) if steps else None
    return SimpleNamespace(
        label=label, wall_s=rng.uniform(0.01, 100.0), gpu=None, peak_rss_bytes=1, peak_vram_bytes=None,
        steps=SimpleNamespace(median_ms=median, batch_size=batch,
                              samples_per_s=rate * batch if rate and batch else None) if steps else None)


def test_generated_pairs_compare_only_like_with_like_and_the_sentence_is_the_ratio():
    rng = random.Random(28)
    kinds = set()
    for _ in range(400):
        a, b = _entry(rng, "a"), _entry(rng, "b")
        if a.steps is None:  # a one-line cell: no steps attribute at all
            del a.steps
        if b.steps is None:
            del b.steps
        alike = like_for_like(a, b)
        sentence = variant_sentence(a, b, 0, 1)
        sa, sb = getattr(a, "steps", None), getattr(b, "steps", None)
        if sa and sb and sa.samples_per_s and sb.samples_per_s:
            assert alike is not None and alike[2] == "sample"
        elif sa and sb and sa.batch_size != sb.batch_size:
            assert alike is None and "not alike" in sentence  # steps of different or half-known batches
        elif (sa is None) != (sb is None):
            assert alike is None
        if alike is not None:
            [(later, ratio, what, earlier)] = _sentences(sentence)
            t0, t1, per = alike
            kinds.add(per)
            assert (later, earlier) == ("b", "a") and what.endswith(per if per != "cell" else "wall time")
            assert ratio == pytest.approx(t1 / t0, rel=0.06, abs=0.006)
    assert kinds == {"sample", "step", "cell"}
