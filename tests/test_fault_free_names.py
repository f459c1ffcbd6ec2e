"""``%gpumem --free`` refuses Python's and IPython's own names before deleting anything.

Before: ``--free Out`` deleted the output history (every later cell ending in an expression
failed with ``KeyError: '_oh'``), ``--free In`` the input history, and
``--free a __builtins__`` deleted ``a`` and then raised IPython's raw ``ValueError``.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import gpunb
from gpunb.analysis.memory.report import session_names

SESSION = ["Out", "In", "_oh", "_ih", "_dh", "_", "__", "___", "__builtins__", "__name__", "get_ipython",
           "exit", "quit", "_i", "_ii", "_iii", "_i1", "_1"]


@pytest.mark.parametrize("name", SESSION)
def test_free_refuses_a_session_name_and_deletes_nothing(ip, name):
    ip.run_cell("mine = [1, 2, 3]")
    ip.run_cell("40 + 2")  # Out[n], _, _n exist
    with capture_output():
        result = ip.run_cell(f"%gpumem --free mine {name}")
    err = result.error_in_exec
    assert isinstance(err, UsageError), repr(err)
    assert name in str(err) and "nothing was deleted" in str(err)
    assert "mine" in ip.user_ns  # all or nothing: the user's own name before it stays too
    for kept in ("Out", "In", "_oh", "_ih", "__builtins__", "get_ipython"):
        assert kept in ip.user_ns
    later = ip.run_cell("6 * 7")  # a cell ending in an expression still works
    assert later.success and later.result == 42


def test_the_api_refuses_them_too(ip):
    ip.user_ns["mine"] = 1
    with pytest.raises(ValueError, match="not freeing Out"):
        gpunb.memory(free=["mine", "Out"], namespace=ip.user_ns, shell=ip)
    assert "mine" in ip.user_ns and "Out" in ip.user_ns


def test_the_users_own_names_are_not_refused(ip):
    names = ["x", "_private", "model_1", "Output", "In2", "_x1", "i", "out"]
    assert session_names(names, ip.user_ns, ip.user_ns_hidden) == []
    ip.user_ns.update({"_private": 1, "out": 2})
    with capture_output():
        result = ip.run_cell("%gpumem --free _private out")
    assert result.success and "_private" not in ip.user_ns and "out" not in ip.user_ns
