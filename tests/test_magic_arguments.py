"""Every magic fails loudly on a bad argument: the cell fails with IPython's UsageError
(shown as a message, no traceback), the message names the bad value, what is allowed and
``%magic?``, and a ``%%gpuprofile`` cell with a bad argument does not run its body."""

from __future__ import annotations

import argparse

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpunb.shells.arguments import cuda_device, decimal, variable_name, whole_number


def fails_with_usage(ip, cell: str) -> str:
    """Run ``cell``; assert it failed with a UsageError and no traceback; return the message."""
    with capture_output() as out:
        result = ip.run_cell(cell)
    error = result.error_in_exec or result.error_before_exec
    assert isinstance(error, UsageError), f"{cell!r} did not fail with a UsageError: {result!r}"
    assert not result.success
    assert "Traceback" not in out.stdout + out.stderr
    return str(error)


BAD = [
    # %gpucheck
    ("%gpucheck --bogus", ["unrecognized arguments: --bogus"]),
    ("%gpucheck --device x", ["--device: 'x' is not a whole number", "allowed: 0 or more"]),
    ("%gpucheck --device -1", ["--device: -1 is out of range", "allowed: 0 or more"]),
    ("%gpucheck --quick --device 7", ["device 7 does not exist"]),
    ("%gpucheck -o 1bad", ["'1bad' is not a Python variable name"]),
    ("%gpucheck -o for", ["'for' is a Python keyword"]),
    ("%gpucheck -o list", ["'list' would hide Python's built-in list"]),
    ("%gpucheck -o Out", ["'Out' is IPython's own"]),
    ("%gpucheck -o _3", ["'_3' is IPython's own"]),
    # %gpumonitor
    ("%gpumonitor --bogus", ["unrecognized arguments: --bogus"]),
    ("%gpumonitor --hz fast", ["--hz: 'fast' is not a number", "allowed: from 0.5 to 10"]),
    ("%gpumonitor --hz nan", ["--hz: 'nan' is not a number"]),
    ("%gpumonitor --hz 0.1", ["--hz: 0.1 is out of range", "allowed: from 0.5 to 10"]),
    ("%gpumonitor --hz 11", ["--hz: 11 is out of range"]),
    ("%gpumonitor --window 0.5", ["--window: 0.5 is out of range", "allowed: from 1 to 86400"]),
    ("%gpumonitor --window 1e9", ["--window: 1e+09 is out of range"]),
    ("%gpumonitor --device -1", ["--device: -1 is out of range", "allowed: 0 or more"]),
    ("%gpumonitor --device 3", ["there is no GPU 3", "indices 0"]),
    ("%gpumonitor -o 1bad", ["'1bad' is not a Python variable name"]),
    ("%gpumonitor --stop --hz 5", ["--stop takes no other options", "--hz"]),
    # %gpuprofile, line form
    ("%gpuprofile", ["say what to do: on, off or history"]),
    ("%gpuprofile bogus", ["invalid choice: 'bogus'", "'on', 'off', 'history'"]),
    ("%gpuprofile on --steps abc", ["--steps: 'abc' is not a whole number", "allowed: 0 or more"]),
    ("%gpuprofile on --label x", ["`%gpuprofile on` takes only --no-reset", "(got --label)"]),
    ("%gpuprofile off -o x", ["`%gpuprofile off` takes no options", "(got -o)"]),
    ("%gpuprofile history --no-timeline", ["`%gpuprofile history` takes only --clear, -o", "--timeline"]),
    ("%gpuprofile history --clear -o h", ["binds nothing"]),
    ("%gpuprofile on --clear", ["(got --clear)"]),
    ("%gpuprofile history -o for", ["'for' is a Python keyword"]),
    # %gpumem
    ("%gpumem --bogus", ["unrecognized arguments: --bogus"]),
    ("%gpumem --top 0", ["--top: 0 is out of range", "allowed: 1 or more"]),
    ("%gpumem --top many", ["--top: 'many' is not a whole number"]),
    ("%gpumem -o for", ["'for' is a Python keyword"]),
    ("%gpumem --keep-traceback maybe", ["invalid choice: 'maybe'", "'on', 'off'"]),
    # %gpufit
    ("%gpufit", ["missing STEP: the name of a function step(batch_size)"]),
    ("%gpufit step --stesp 3", ["unknown option --stesp: did you mean --steps?"]),
    ("%gpumem --tpo 3", ["unknown option --tpo: did you mean --top?"]),
    ("%gpuprofile histroy", ["invalid choice: 'histroy'", "did you mean history?"]),
    ("%gpucheck --quik", ["unknown option --quik: did you mean --quick?"]),
    ("%gpufit step --start 0", ["--start: 0 is out of range", "allowed: 1 or more"]),
    ("%gpufit step --start many", ["--start: 'many' is not a whole number"]),
    ("%gpufit step --margin 5", ["--margin: 5 is out of range", "allowed: from 0 to below 0.9"]),
    ("%gpufit step --margin 0.9", ["--margin: 0.9 is out of range"]),
    ("%gpufit step --margin -0.1", ["--margin: -0.1 is out of range"]),
    ("%gpufit step --max-trials 0", ["--max-trials: 0 is out of range", "allowed: 2 or more"]),
    ("%gpufit step --max-trials 1", ["--max-trials: 1 is out of range"]),
    ("%gpufit step --steps 0", ["--steps: 0 is out of range", "allowed: 1 or more"]),
    ("%gpufit step --max-batch 0", ["--max-batch: 0 is out of range"]),
    ("%gpufit step --start 8 --max-batch 4", ["--max-batch 4 is below --start 8"]),
    ("%gpufit step --device gpu0", ["--device: 'gpu0' is not a CUDA device", "cuda, cuda:N or N"]),
    ("%gpufit step -o for", ["'for' is a Python keyword"]),
    ("%gpufit no_such_step", ["STEP 'no_such_step' is not defined"]),
    ("%gpufit not_a_function", ["STEP 'not_a_function' is a number (int), not a function",
                                "`def step(batch_size): ...` then `%gpufit step`"]),
    ("%gpufit 42", ["STEP '42' is a number (int), not a function"]),
    ('%gpufit step --label "unclosed', ["cannot read the arguments"]),
]


@pytest.mark.parametrize("cell, words", BAD, ids=[c for c, _ in BAD])
def test_every_bad_argument_fails_the_cell(ip, fake_nvml, cell, words):
    ip.user_ns.update(step=lambda batch_size: None, not_a_function=3)
    message = fails_with_usage(ip, cell)
    for word in words:
        assert word in message
    name = cell.split()[0].lstrip("%")
    assert f"usage: %{name}" in message and f"See %{name}? for every option." in message


BAD_CELLS = [
    ("%%gpuprofile --bogus", "unrecognized arguments: --bogus"),
    ("%%gpuprofile bogus", "invalid choice: 'bogus'"),
    ("%%gpuprofile --steps abc", "--steps: 'abc' is not a whole number"),
    ("%%gpuprofile --steps -1", "--steps: -1 is out of range"),
    ("%%gpuprofile -o for", "'for' is a Python keyword"),
    ("%%gpuprofile -o print", "would hide Python's built-in print"),
    ("%%gpuprofile on", "is for the line magic"),
    ("%%gpuprofile history", "is for the line magic"),
    ("%%gpuprofile --clear", "--clear is for `%gpuprofile history`"),
    ("%%gpuprofile --timeline --no-timeline", "--timeline and --no-timeline exclude each other"),
    ("%%gpuprofile --no-timeline --timeline", "--no-timeline and --timeline exclude each other"),
    ('%%gpuprofile --label "unclosed', "cannot read the arguments"),
]


@pytest.mark.parametrize("first_line, words", BAD_CELLS, ids=[c for c, _ in BAD_CELLS])
def test_a_profiled_cell_with_a_bad_argument_fails_and_does_not_run(ip, first_line, words):
    ip.user_ns.pop("_gpunb_ran", None)
    message = fails_with_usage(ip, f"{first_line}\n_gpunb_ran = True\n")
    assert words in message and "See %gpuprofile? for every option." in message
    assert "_gpunb_ran" not in ip.user_ns


HELPS = ["%gpucheck --help", "%gpumonitor -h", "%gpumem --help", "%gpufit --help", "%gpufit -h",
         "%gpuprofile --help", "%gpufit step --top 3 -h"]


@pytest.mark.parametrize("line", HELPS)
def test_help_prints_the_usage_and_does_nothing_else(ip, fake_nvml, line):
    name = line.split()[0].lstrip("%")
    with capture_output() as out:
        result = ip.run_cell(line)
    assert result.success, result
    assert out.stdout.lstrip().startswith(f"%{name} ["), out.stdout[:200]
    assert "options:" in out.stdout and "-o NAME, --output NAME" in out.stdout
    assert "::" not in out.stdout.splitlines()[0]


def test_help_on_a_profiled_cell_does_not_run_it(ip):
    ip.user_ns.pop("_gpunb_ran", None)
    with capture_output() as out:
        result = ip.run_cell("%%gpuprofile --help\n_gpunb_ran = True\n")
    assert result.success and "%gpuprofile [" in out.stdout and "the cell did not run" in out.stdout
    assert "_gpunb_ran" not in ip.user_ns


def test_good_arguments_still_work(ip, fake_nvml):
    from gpunb.shells.monitor import stop_all

    with capture_output():
        for cell in ("%gpumonitor --hz 0.5 --window 1 --device 0 -o match", "%gpuprofile on --no-reset",
                     "%gpuprofile off", "%%gpuprofile --steps 0 --no-timeline --label 'two words' -o _gpunb_test\n"
                     "_gpunb_ran = 1", "%gpumem --top 1 -o _gpunb_mem"):
            result = ip.run_cell(cell)
            assert result.success, (cell, result)
    assert ip.user_ns["match"].hz == 0.5 and ip.user_ns["match"].window_s == 1  # a soft keyword is a fine name
    assert ip.user_ns["_gpunb_test"].label == "two words" and ip.user_ns["_gpunb_ran"] == 1
    stop_all(ip._gpunb_extension_state.kernel)
    for name in ("match", "_gpunb_mem", "_gpunb_ran"):
        ip.user_ns.pop(name, None)


def test_gpufit_refuses_a_device_torch_does_not_have(ip, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ip.user_ns["step"] = lambda batch_size: None
    message = fails_with_usage(ip, "%gpufit step --device cuda:2")
    assert "--device cuda:2: no such GPU (allowed: cuda:0 to cuda:1; torch sees 2)" in message
    message = fails_with_usage(ip, "%gpufit step --device 5")  # a bare index means cuda:N
    assert "--device cuda:5: no such GPU" in message


def test_value_types():
    assert whole_number(0)("3") == 3 and decimal(0.5, 10)("10") == 10.0
    assert decimal(0, 0.9, high_open=True)("0") == 0.0
    assert [cuda_device(t) for t in ("cuda", "cuda:1", "2", " cuda:0 ")] == ["cuda", "cuda:1", "cuda:2", "cuda:0"]
    for name in ("model_fit", "match", "_private", "résultat", "Out2"):
        assert variable_name(name) == name
    for bad in ("1x", "a-b", "", "for", "None", "len", "In", "_", "__", "_i", "_i7", "_oh", "get_ipython"):
        with pytest.raises(argparse.ArgumentTypeError):
            variable_name(bad)
    for text in ("inf", "-inf", "nan", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a number"):
            decimal(0, 1)(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"'1.5' is not a whole number \(allowed: 1 or more\)"):
        whole_number(1)("1.5")
    with pytest.raises(argparse.ArgumentTypeError, match=r"allowed: 10 or less"):
        whole_number(None, 10)("11")


def test_every_magic_takes_its_output_name_from_the_one_helper(ip):
    """-o is declared once (arguments.output_option) and therefore checked the same way everywhere."""
    for name in ("gpucheck", "gpumonitor", "gpumem", "gpufit", "gpuprofile"):
        parser = ip.find_magic(name).parser
        option = next(a for a in parser._actions if "-o" in a.option_strings)
        assert option.type is variable_name and option.option_strings == ["-o", "--output"], name


def test_in_a_real_kernel_a_bad_magic_argument_stops_the_notebook():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext gpunb",
        "%%gpuprofile --steps abc\nprint('the body ran')",
        "print('must not run')",
    )]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="UsageError") as caught:
        client.execute()
    assert "--steps: 'abc' is not a whole number" in str(caught.value)
    # IPython shows a UsageError as a message on stderr (no traceback); the reply says error.
    outputs = nb.cells[1].outputs
    assert [(o.output_type, o.get("name")) for o in outputs] == [("stream", "stderr")]
    assert outputs[0].text.startswith("UsageError: %gpuprofile: --steps: 'abc' is not a whole number")
    assert "the body ran" not in outputs[0].text and nb.cells[2].outputs == []


# -- a misspelt option of any magic is named, with the option meant -------------------------

def _misspelt(option: str) -> str:
    """--steps -> --stpes: two letters of the name swapped (the commonest typo)."""
    name = option[2:]
    i = len(name) // 2
    return "--" + name[:i - 1] + name[i] + name[i - 1] + name[i + 1:]


def test_every_magics_misspelt_option_gets_a_did_you_mean(ip):
    from gpunb.shells.arguments import parse_args

    magics = {fn for kind in ("line", "cell") for fn in ip.magics_manager.magics[kind].values()
              if getattr(fn, "__module__", "").startswith("gpunb") and hasattr(fn, "parser")}
    tried = 0
    for magic in magics:
        options = [o for o in magic.parser._option_string_actions if o.startswith("--") and len(o) >= 6]
        for option in options:
            wrong = _misspelt(option)
            if wrong in options or any(o.startswith(wrong) for o in options):
                continue
            with pytest.raises(UsageError) as err:  # a value after it, as users type them
                parse_args(magic, f"{wrong} 3")
            assert f"unknown option {wrong}: did you mean {option}?" in str(err.value), (magic.__name__, option)
            tried += 1
    assert tried > 30  # every gpunb magic's options, not a handful
