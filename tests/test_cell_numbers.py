"""A profiled cell's number is IPython's own ``In [n]``: in the report, the history and the
traceback, on IPython 8 (adds one to ``execution_count`` after a cell) and 9 (before it).

CI runs this module twice: in the dev venv (IPython 9) and in ``.venv-ipython8``
(``scripts/setup-ipython8.sh``), so both orders are covered. It needs no torch.
"""

from __future__ import annotations

import re

import pytest
from IPython.utils.capture import capture_output

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def shown(out) -> str:
    """Everything a cell printed and displayed, without terminal colours."""
    displayed = [o.data.get("text/plain", "") for o in out.outputs]
    return ANSI.sub("", "\n".join([out.stdout, out.stderr, *displayed]))


def run(ip, cell: str, **kwargs):
    with capture_output() as out:
        result = ip.run_cell(cell, **kwargs)
    return result, shown(out)


def stored_input(ip, n: int) -> str:
    return ip.history_manager.input_hist_raw[n]


def test_report_and_result_carry_the_cells_in_number(ip):
    run(ip, "_gpunb_a = 1", store_history=True)
    result, text = run(ip, "%%gpuprofile -o _gpunb_test\n_gpunb_b = 2\n", store_history=True)
    n = result.execution_count
    assert stored_input(ip, n).startswith("%%gpuprofile -o _gpunb_test")  # n is this cell's In [n]
    assert ip.user_ns["_gpunb_test"].cell == n
    assert text.strip().startswith(f"gpuprofile In [{n}]:") and f"cell In [{n}] ·" in text
    assert f"In [{n + 1}]" not in text


def test_traceback_names_the_cell_as_ipython_does(ip):
    run(ip, "_gpunb_a = 1", store_history=True)
    result, text = run(ip, "%%gpuprofile\n_gpunb_b = 2\nraise ValueError('from the cell')\n", store_history=True)
    n = result.execution_count
    assert isinstance(result.error_in_exec, ValueError)
    assert f"Cell In[{n}], line 3" in text
    # The next cell's traceback gets the next number: two cells never share a label.
    after, text_after = run(ip, "raise KeyError('next')", store_history=True)
    assert after.execution_count == n + 1 and f"Cell In[{n + 1}], line 1" in text_after


def test_history_lists_the_profiled_cells_by_their_numbers(ip):
    ip.run_line_magic("gpuprofile", "history --clear")
    first, _ = run(ip, "%%gpuprofile --label first\n_gpunb_x = sum(range(10))\n", store_history=True)
    run(ip, "_gpunb_y = 3", store_history=True)  # an unprofiled cell in between
    second, _ = run(ip, "%%gpuprofile --label second\n_gpunb_x = sum(range(20))\n", store_history=True)
    _, text = run(ip, "%gpuprofile history -o _gpunb_test", store_history=True)
    cells = [p.cell for p in ip.user_ns["_gpunb_test"].entries]
    assert cells == [first.execution_count, second.execution_count]
    assert re.search(rf"^1\s+\[{first.execution_count}\]\s+first", text, re.M)
    assert re.search(rf"^2\s+\[{second.execution_count}\]\s+second", text, re.M)


def test_a_cell_kept_out_of_the_history_is_named_as_ipython_names_it(ip):
    """Without store_history IPython compiles the cell under ``execution_count`` (not
    incremented); the profile and the traceback use that same number."""
    _result, text = run(ip, "%%gpuprofile -o _gpunb_test\nraise ValueError('unstored')\n", store_history=False)
    n = ip.execution_count
    assert ip.user_ns["_gpunb_test"].cell == n
    assert f"Cell In[{n}], line 2" in text


def test_the_running_number_outside_a_cell_is_ipythons_next(ip):
    from gpunb.shells.cell_numbers import running_cell_number

    assert running_cell_number(ip) == ip.execution_count
    result, _ = run(ip, "from gpunb.shells.cell_numbers import running_cell_number as _gpunb_n\n"
                        "_gpunb_test = _gpunb_n(get_ipython())", store_history=True)
    assert ip.user_ns["_gpunb_test"] == result.execution_count


def test_in_a_real_kernel_report_and_traceback_match_the_prompt():
    """Through ipykernel, the numbers the frontend shows (``execution_count``) are the ones
    in the report and in the traceback."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext gpunb",
        "x = 1",
        "%%gpuprofile --label ok\ny = 2",
        "%%gpuprofile\nz = 3\nraise ValueError('from the user')",
    )]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True)
    client.execute()
    ok, failed = nb.cells[2], nb.cells[3]
    ok_text = "".join(o.get("data", {}).get("text/plain", "") for o in ok.outputs)
    assert ok.execution_count == 3 and "gpuprofile In [3]:" in ok_text and "cell In [3] · ok" in ok_text
    failed_text = "".join(o.get("data", {}).get("text/plain", "") for o in failed.outputs)
    error = [o for o in failed.outputs if o.output_type == "error"]
    assert failed.execution_count == 4 and "gpuprofile In [4]:" in failed_text
    assert error and "Cell In[4], line 3" in ANSI.sub("", "".join(error[0].traceback))
